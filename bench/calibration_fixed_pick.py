"""Where a design's confirmed intervals lose coverage: the lift's sampling spread at a fixed pick.

    python bench/calibration_fixed_pick.py --design narrow_seed [--replicates 150]
        [--set FIELD=VALUE ...] [--out bench/results/calibration_fixed_pick.json]

For each simulated method of the design (`experiment.calibration`), its truly best model (the
setting and checkpoint with the largest true lift) is confirmed `--replicates` times on fresh seeds
and problems (the design's confirmation size) beside GRPO's reference, and read by
`experiment.inference.lift_inference` (the procedure in force). No exploration, no pick, no Holm:
what is left is the estimator. Per method it prints the bias of the corrected lift and of the raw
one (before the bias correction), the standard deviation of each over the replicates, the root
mean square of the reported standard errors, the standard deviation of the z-scores and the
coverage of the intervals. A reported standard error that matches the raw lift's spread but not
the corrected one's says that the correction's own noise is what the interval misses. The last
column is the share of the correction that would minimise the mean squared error, `b² / (b² + V)`
with `b` the raw bias and `V` the variance the correction adds (`sd² − raw sd²`, floored at 0;
`mse_share`): 1 where the correction pays in full, near 0 where its noise outweighs the bias it
removes. Two correlations over the replicates say whether the hull's geometry drives the error:
the error's with the model's observed distance from the end of GRPO's pass@1 range (`x̄_m − x_max`,
negative inside it; `err_vs_end`) and the reported standard error's with the error's size
(`se_vs_abs_err`: near 0 or positive where the interval widens when it must). Two more look at
the draws the interval is built from (`lift_inference(..., keep_draws=True)`): the coverage of the
draws' percentile interval (their 2.5% and 97.5% quantiles, uncorrected; `percentile_coverage`),
and the coverage split by how many of the draws read the model on the facet of GRPO's hull the
observed points read it on (the same vertex or segment, the same side of the range's end):
below one half, one half to 0.7, 0.7 and above (`coverage_by_agreement`, with each part's
count).
Writes the table as JSON to `--out`.
"""

from __future__ import annotations

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy loads)

# isort: split
import argparse
import json
import time
from pathlib import Path

import numpy as np

from experiment import calibration as C
from experiment import estimand, inference

AGREEMENT = (0.5, 0.7)
"""The edges of `coverage_by_agreement`'s three parts."""


def fixed_picks(d: C.Design) -> list[tuple]:
    """Each simulated method's truly best model as a one-checkpoint path, with its true lift."""
    _, paths, truth = C.study_paths(d)
    best: dict[str, tuple] = {}
    for name, setting, a, b, amounts, noise in paths:
        for s in amounts:
            t = truth[(name, setting, round(100 * s))]
            if name not in best or t > best[name][0]:
                best[name] = (t, (name, setting, a, b, (s,), noise))
    return [p for _, p in best.values()]


def read_facet(hull: estimand.Hull, x: float) -> tuple:
    """Where `hull` reads a model at pass@1 `x`: its side of the range's end and the vertex (its
    position among the reference points given, `estimand.ORIGIN` for the base) or the segment
    (both ends) under the read point; ``("below",)`` below the range."""
    if x < hull.x_min:
        return ("below",)
    side = "above" if x > hull.x_max else "inside"
    on = np.flatnonzero(hull.vx == float(hull.read_at(x)))
    if on.size:
        return (side, int(hull.index[on[0]]))
    i, j, _ = hull.facet(x)
    return (side, int(hull.index[i]), int(hull.index[j]))


def agreement(res: inference.LiftResult, i: int) -> float:
    """The share of `res`'s draws whose own hull reads model `i` where the observed hull does
    (`read_facet`)."""
    n, ref, d = res.x.size, res.reference, res.mean_draws
    seen = read_facet(res.hull, float(res.x[i]))
    same = [read_facet(estimand.upper_hull(d[b, ref], d[b, n + ref]), float(d[b, i])) == seen
            for b in range(d.shape[0])]  # fmt: skip
    return float(np.mean(same))


def run(d: C.Design, replicates: int, seed: int, draws: int) -> dict:
    """The table of the module docstring, ``{method: {...}}`` (points)."""
    ref, _, truth = C.study_paths(d)
    picks = fixed_picks(d)
    rng = np.random.default_rng(seed)
    rows: dict[str, list[tuple]] = {p[0]: [] for p in picks}
    for r in range(replicates):
        x, y, models = C.simulate(d, ref + picks, rng, seeds=d.confirm_seeds,
                                  problems=d.confirm_problems)  # fmt: skip
        res = inference.lift_inference(x, y, models, "grpo", num_draws=draws, seed=r,
                                       keep_draws=True)  # fmt: skip
        for i, name in enumerate(models.method):
            if name != "grpo" and np.isfinite(res.lift[i]):
                t = truth[(name, models.setting[i], models.step[i])]
                drawn = res.lift_draws[:, i]
                q_lo, q_hi = np.quantile(drawn[np.isfinite(drawn)], [0.025, 0.975])
                rows[name].append((t, res.lift[i], res.bias[i], res.se[i], res.lo[i], res.hi[i],
                                   res.x[i] - res.hull.x_max, q_lo, q_hi, agreement(res, i)))  # fmt: skip
    out = {}
    for name, v in rows.items():
        t, lift, bias, se, lo, hi, above, q_lo, q_hi, agree = (
            np.array(c) for c in zip(*v, strict=True)
        )
        raw, err = lift + bias, lift - t
        covered = (lo <= t) & (t <= hi)
        parts = np.digitize(agree, AGREEMENT)
        out[name] = {
            "n": len(v), "truth": 100 * float(t.mean()),
            "bias": 100 * float((lift - t).mean()), "raw_bias": 100 * float((raw - t).mean()),
            "sd": 100 * float(lift.std(ddof=1)), "raw_sd": 100 * float(raw.std(ddof=1)),
            "rms_se": 100 * float(np.sqrt((se**2).mean())),
            "z_sd": float(((lift - t) / se).std(ddof=1)),
            "coverage": float(covered.mean()),
            "err_vs_end": _corr(err, above), "se_vs_abs_err": _corr(se, np.abs(err)),
            "percentile_coverage": float(np.mean((q_lo <= t) & (t <= q_hi))),
            "coverage_by_agreement": [
                {"n": int(np.sum(parts == k)),
                 "coverage": float(covered[parts == k].mean()) if np.any(parts == k) else None}
                for k in range(len(AGREEMENT) + 1)
            ],
        }  # fmt: skip
    return out


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's correlation of `a` and `b` (NaN where either is constant)."""
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def _by_agreement(parts: list[dict]) -> str:
    return " / ".join("-" if p["coverage"] is None else f"{p['coverage']:.2f} ({p['n']})"
                      for p in parts)  # fmt: skip


def mse_share(r: dict) -> float:
    """The share `c` of the bias correction that minimises the corrected lift's mean squared error,
    `b² / (b² + V)`: `b` the raw lift's bias, `V` the variance the correction adds (`sd² − raw
    sd²`, floored at 0); 1 when both are 0."""
    b2, v = r["raw_bias"] ** 2, max(r["sd"] ** 2 - r["raw_sd"] ** 2, 0.0)
    return 1.0 if b2 + v == 0 else b2 / (b2 + v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--design", default="narrow_seed", choices=sorted(C.DESIGNS))
    parser.add_argument("--replicates", type=int, default=150)
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--out", default="bench/results/calibration_fixed_pick.json")
    args = parser.parse_args()
    d = C.override(C.DESIGNS[args.design], args.set)
    start = time.perf_counter()
    table = run(d, args.replicates, args.seed, args.draws)
    print(f"{args.design} {' '.join(args.set)}: {args.replicates} confirmations of each method's "
          f"truly best model ({d.confirm_seeds} seeds x {d.confirm_problems} problems), points")  # fmt: skip
    print("| method | truth | bias | raw bias | sd | raw sd | rms se | z sd | coverage | "
          "correction's MSE share | error vs distance from GRPO's end | se vs abs error | "
          "percentile coverage | coverage by facet agreement <0.5 / 0.5-0.7 / >=0.7 (n) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in table.items():
        r["mse_share"] = mse_share(r)
        print(f"| {name} | {r['truth']:+.2f} | {r['bias']:+.2f} | {r['raw_bias']:+.2f} | "
              f"{r['sd']:.2f} | {r['raw_sd']:.2f} | {r['rms_se']:.2f} | {r['z_sd']:.2f} | "
              f"{r['coverage']:.3f} | {r['mse_share']:.2f} | {r['err_vs_end']:+.2f} | "
              f"{r['se_vs_abs_err']:+.2f} | {r['percentile_coverage']:.3f} | "
              f"{_by_agreement(r['coverage_by_agreement'])} |")  # fmt: skip
    path = Path(args.out)
    doc = json.loads(path.read_text()) if path.exists() else {}
    key = " ".join([args.design, *args.set])
    doc[key] = {"replicates": args.replicates, "draws": args.draws, "seed": args.seed,
                "seconds": round(time.perf_counter() - start, 1), "methods": table}  # fmt: skip
    path.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
