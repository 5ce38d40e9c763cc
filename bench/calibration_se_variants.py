"""Standard errors for the bias-corrected lift that carry the correction's own noise, calibrated.

    python bench/calibration_se_variants.py [--variant draws|delta|stein|floor ...] [--design D ...]
        [--replicates 200] [--out bench/results/calibration_se_variants.json]

The lift `experiment.inference` reports is bias-corrected, `T = 2·L − m` (`L` the plug-in lift,
`m` the mean of its draws around the observed means), but its standard error is the draws'
standard deviation, the spread of `L` alone (docs/statistics.md: at fixed picks in narrow_seed and
rule the corrected lift spreads 11-50% wider than the raw one, and the intervals under-cover).
This script runs the whole calibration (`experiment.calibration.calibrate`, every design's 200
studies) with the standard error replaced, for a variant at a time, inside this process only (the
package's `inference._over_hull` is wrapped; nothing in the package changes):

- ``draws``: the procedure in force (the draws' standard deviation), for comparison.
- ``delta``: the delta method on `T`: its gradient `g − ∇b` (`g` the lift's on its facet,
  `experiment.inference._gradient`; `∇b` the bias estimate's, by central differences over every
  reference mean and the model's own pass@1 with the same draws, a step of 0.2 of each mean's
  standard error), and the standard error rescaled by `√((g−∇b)'Σ(g−∇b) / g'Σg)`.
- ``floor``: the draws' standard deviation, but never below the lift's linearized standard error
  on its facet (`g'Σg`, rescaled as the procedure rescales): the draws add what the linearization
  misses and never subtract (where the lift is kinked, e.g. folded at GRPO's range end, draws
  around a point near the kink spread less than the estimate does).
- ``stein``: `Var(T) ≈ Var(L) + 3w`, with `w` the draws' lift variance left after a least-squares
  fit on the draws' reference means and the model's own means (the best linear predictor's slope
  is the mean gradient `∇m`, Stein's lemma; `m` linearized: `Var(T) = 4Var(L) − 3∇m'Σ∇m`).

``--toy``: the same question in one dimension, `L = min(θ₁, θ₂)` of two unit-variance normal means
`gap` apart (a lift read on one of two facets): the corrected estimator's variance over 4,000
samples against the mean of each variant's estimate (400 draws each), no calibration run. Then
the numerical delta method (Hong & Li 2018; at scale `s` the m-out-of-n bootstrap with
`m = n / s²`): the draws' deviations stretched by `s`, `D* = (L(θ̂ + s·ε*) − L(θ̂)) / s`, the
estimate `L(θ̂) − mean(D*)`, the interval that ± 1.96 sd(D*) and the percentile one `[L(θ̂) −
q₀.₉₇₅(D*), L(θ̂) − q₀.₀₂₅(D*)]`; `s = 1` is the procedure in force. Its bias and coverage per gap
and scale (``toy_numdelta`` in `--out`).

Prints, per variant and design, the coverage range over the methods, the family-wise false
"above" / "below" rates and the share of studies in which plus2 and plus5 are > 0 after Holm;
writes every design's full calibration output per variant to `--out`.
"""

from __future__ import annotations

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy loads)

# isort: split
import argparse
import json
import time
from pathlib import Path

import numpy as np
from scipy import stats

from experiment import calibration as C
from experiment import estimand, inference

_IN_FORCE = inference._over_hull
STEP = 0.2
"""The central differences' step, in units of each mean's standard error (``delta``)."""


def _mean_bias(py, dx, dy, pxr, pyr, pxt, targets, ref) -> np.ndarray:
    """The bias estimate `mean(L*) − L` of each target with the reference means (`pxr`, `pyr`)
    and the targets' pass@1 (`pxt`) moved, the draws `dx`, `dy` moved with them."""
    drawn = dy[:, targets] - estimand.hull_values(dx[:, ref], dy[:, ref], dx[:, targets])
    raw = py[targets] - estimand.hull_values(pxr[None], pyr[None], pxt[None])[0]
    fin = np.isfinite(drawn)
    return np.where(fin, drawn, 0.0).sum(0) / np.maximum(fin.sum(0), 1) - raw


def _delta_ratio(px, py, draws, root, ref, targets, hull) -> np.ndarray:
    """`(T,)` the variance ratio `(g−∇b)'Σ(g−∇b) / g'Σg` of each target (``delta``)."""
    n = px.size
    dx, dy = draws[:, :n], draws[:, n:]
    sd = np.sqrt((root**2).sum(1))
    grad_b = np.zeros((targets.size, 2 * n))
    for pos, j in enumerate(ref):
        for k in (j, n + j):
            h = STEP * sd[k]
            if h <= 0:
                continue
            vals = []
            for sign in (1.0, -1.0):
                ddx, ddy, pxr, pyr = dx.copy(), dy.copy(), px[ref].copy(), py[ref].copy()
                if k < n:
                    ddx[:, j] += sign * h
                    pxr[pos] += sign * h
                else:
                    ddy[:, j] += sign * h
                    pyr[pos] += sign * h
                vals.append(_mean_bias(py, ddx, ddy, pxr, pyr, px[targets], targets, ref))
            grad_b[:, k] = (vals[0] - vals[1]) / (2 * h)
    h = STEP * sd[targets]
    vals = []
    for sign in (1.0, -1.0):
        ddx = dx.copy()
        ddx[:, targets] += sign * h
        vals.append(_mean_bias(py, ddx, dy, px[ref], py[ref], px[targets] + sign * h, targets, ref))
    own = np.where(h > 0, (vals[0] - vals[1]) / (2 * np.where(h > 0, h, 1.0)), 0.0)
    ratio = np.full(targets.size, np.nan)
    for t, m in enumerate(targets):
        g = inference._gradient(hull, ref, int(m), px, n)
        gb = np.nan_to_num(grad_b[t])
        gb[m] += own[t]
        lin = float(np.sum((g @ root) ** 2))
        ratio[t] = float(np.sum(((g - gb) @ root) ** 2)) / lin if lin > 0 else 1.0
    return ratio


def _stein_ratio(px, py, draws, root, ref, targets) -> np.ndarray:
    """`(T,)` the variance ratio `1 + 3w / Var(L*)` of each target (``stein``)."""
    n = px.size
    dx, dy = draws[:, :n], draws[:, n:]
    sd = np.sqrt((root**2).sum(1))
    drawn = dy[:, targets] - estimand.hull_values(dx[:, ref], dy[:, ref], dx[:, targets])
    base = [int(c) for c in np.concatenate([ref, n + ref]) if sd[c] > 0]
    ratio = np.full(targets.size, np.nan)
    for t, m in enumerate(targets):
        cols = base + [c for c in (int(m), n + int(m)) if sd[c] > 0 and c not in base]
        fin = np.isfinite(drawn[:, t])
        if fin.sum() <= len(cols) + 2:
            continue
        lift = drawn[fin, t] - drawn[fin, t].mean()
        x = draws[fin][:, cols] - draws[fin][:, cols].mean(0)
        coef, *_ = np.linalg.lstsq(x, lift, rcond=None)
        w = float(np.sum((lift - x @ coef) ** 2)) / (fin.sum() - len(cols) - 1)
        var = float(lift @ lift) / (fin.sum() - 1)
        ratio[t] = 1.0 + 3.0 * w / var if var > 0 else 1.0
    return ratio


def _floor_ratio(px, py, draws, root, ref, targets, hull) -> np.ndarray:
    """`(T,)` the variance ratio `max(1, g'Σg / Var(L*))` of each target (``floor``): the standard
    error never below the lift's linearized one on its facet."""
    n = px.size
    dx, dy = draws[:, :n], draws[:, n:]
    drawn = dy[:, targets] - estimand.hull_values(dx[:, ref], dy[:, ref], dx[:, targets])
    ratio = np.full(targets.size, np.nan)
    for t, m in enumerate(targets):
        fin = np.isfinite(drawn[:, t])
        if fin.sum() < 2 or not np.isfinite(px[m]) or px[m] < hull.x_min:
            continue
        var = float(drawn[fin, t].var(ddof=1))
        lin = float(np.sum((inference._gradient(hull, ref, int(m), px, n) @ root) ** 2))
        ratio[t] = max(1.0, lin / var) if var > 0 else 1.0
    return ratio


def toy(replicates: int = 4000, draws: int = 400, seed: int = 0) -> list[dict]:
    """``--toy`` (module docstring): per gap, `Var(T)`, `Var(L)` and the means of the draws'
    variance (``draws``) and of `Var(L*) + 3w` (``stein``)."""
    rng = np.random.default_rng(seed)
    rows = []
    for gap in (0.0, 0.5, 1.0, 3.0):
        theta = rng.standard_normal((replicates, 2)) + np.array([0.0, gap])
        eps = rng.standard_normal((replicates, draws, 2))
        drawn = np.minimum(*np.moveaxis(theta[:, None, :] + eps, -1, 0))
        lift = np.minimum(theta[:, 0], theta[:, 1])
        corrected = 2 * lift - drawn.mean(1)
        x = eps - eps.mean(1, keepdims=True)
        dev = drawn - drawn.mean(1, keepdims=True)
        coef = np.linalg.solve(
            np.einsum("rbi,rbj->rij", x, x), np.einsum("rbi,rb->ri", x, dev)[..., None]
        )[..., 0]
        w = ((dev - np.einsum("rbi,ri->rb", x, coef)) ** 2).sum(1) / (draws - 3)
        var = dev.var(1, ddof=1)
        rows.append({"gap": gap, "var_corrected": float(corrected.var()),
                     "var_raw": float(lift.var()), "draws": float(var.mean()),
                     "stein": float((var + 3 * w).mean())})  # fmt: skip
    return rows


SCALES = (1.0, 2.0, 3.0, 5.0)
"""The numerical delta method's scales `s` of ``--toy`` (module docstring)."""


def toy_numdelta(replicates: int = 4000, draws: int = 400, seed: int = 1) -> list[dict]:
    """``--toy``'s numerical delta rows (module docstring): per gap and scale, the estimate's bias
    and the coverage of both intervals over `replicates` samples."""
    rng = np.random.default_rng(seed)
    rows = []
    for gap in (0.0, 0.5, 1.0, 2.0, 3.0, 5.0):
        theta = rng.standard_normal((replicates, 2)) + np.array([0.0, gap])
        eps = rng.standard_normal((replicates, draws, 2))
        lift = theta.min(1)  # the truth is min(0, gap) = 0
        for s in SCALES:
            d = ((theta[:, None, :] + s * eps).min(2) - lift[:, None]) / s
            est, sd = lift - d.mean(1), d.std(1, ddof=1)
            lo, hi = lift - np.quantile(d, 0.975, axis=1), lift - np.quantile(d, 0.025, axis=1)
            rows.append({"gap": gap, "scale": s, "bias": float(est.mean()),
                         "sd": float(est.std()), "se": float(sd.mean()),
                         "coverage_se": float(np.mean(np.abs(est) <= 1.96 * sd)),
                         "coverage_percentile": float(np.mean((lo <= 0) & (0 <= hi)))})  # fmt: skip
    return rows


def wrapped(variant: str):
    """`inference._over_hull` with the standard error of `variant` (module docstring)."""

    def over_hull(px, py, v, draws, root, ref, targets, level, span):
        out = _IN_FORCE(px, py, v, draws, root, ref, targets, level, span)
        if variant == "draws":
            return out
        if variant == "delta":
            ratio = _delta_ratio(px, py, draws, root, ref, targets, out["hull"])
        elif variant == "floor":
            ratio = _floor_ratio(px, py, draws, root, ref, targets, out["hull"])
        else:
            ratio = _stein_ratio(px, py, draws, root, ref, targets)
        se = out["se"].copy()
        se[targets] = se[targets] * np.sqrt(np.where(np.isfinite(ratio), ratio, 1.0))
        ok = np.isfinite(se) & np.isfinite(out["df"])
        dfs = np.where(ok, out["df"], 1.0)
        half = np.where(ok, stats.t.ppf(0.5 + level / 2, dfs) * np.where(ok, se, 0.0), 0.0)
        lift, inside = out["lift"], np.isfinite(out["lift"])
        out.update(
            se=se,
            lo=np.where(inside, np.clip(lift - half, -span, span), np.nan),
            hi=np.where(inside, np.clip(lift + half, -span, span), np.nan),
            p=np.where(ok, 2 * stats.t.sf(np.abs(lift) / np.where(ok, se, 1.0), dfs), np.nan),
        )
        return out

    return over_hull


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", choices=("draws", "delta", "stein", "floor"))
    parser.add_argument("--design", action="append", choices=sorted(C.DESIGNS))
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--out", default="bench/results/calibration_se_variants.json")
    parser.add_argument("--toy", action="store_true", help="the one-dimensional check alone")
    args = parser.parse_args()
    path = Path(args.out)
    doc = json.loads(path.read_text()) if path.exists() else {}
    if args.toy:
        print("| gap (standard errors) | Var(T) | Var(L) | draws: mean Var(L*) | "
              "stein: mean Var(L*) + 3w |")  # fmt: skip
        print("|---|---|---|---|---|")
        doc["toy"] = toy()
        for r in doc["toy"]:
            print(f"| {r['gap']:g} | {r['var_corrected']:.3f} | {r['var_raw']:.3f} | "
                  f"{r['draws']:.3f} | {r['stein']:.3f} |")  # fmt: skip
        print("\n| gap | scale s | bias | sd of the estimate | mean se | coverage: ± 1.96 se, "
              "percentile |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        doc["toy_numdelta"] = toy_numdelta()
        for r in doc["toy_numdelta"]:
            print(f"| {r['gap']:g} | {r['scale']:g} | {r['bias']:+.3f} | {r['sd']:.3f} | "
                  f"{r['se']:.3f} | {r['coverage_se']:.3f}, {r['coverage_percentile']:.3f} |")  # fmt: skip
        path.write_text(json.dumps(doc, indent=1) + "\n")
        return
    print("| variant | design | coverage (every method) | family-wise above / below | "
          "plus2, plus5 > 0 after Holm |")  # fmt: skip
    print("|---|---|---|---|---|")
    for variant in args.variant or ["draws", "delta", "stein"]:
        inference._over_hull = wrapped(variant)
        for name in args.design or list(C.DESIGNS):
            start = time.perf_counter()
            out = C.calibrate(C.DESIGNS[name], replicates=args.replicates, draws=args.draws,
                              progress=f"{variant} {name}")  # fmt: skip
            cov = [r["coverage"] for r in out["confirm"].values() if r["n"] > 1]
            fw = out["familywise"]
            sup = "/".join(f"{out['confirm'][m]['supported']:.3f}" for m in ("plus2", "plus5"))
            print(f"| {variant} | {name} | {min(cov):.3f}-{max(cov):.3f} | "
                  f"{fw['above']:.3f} / {fw['below']:.3f} | {sup} |", flush=True)  # fmt: skip
            out["seconds"] = round(time.perf_counter() - start, 1)
            doc.setdefault(variant, {})[name] = out
            path.write_text(json.dumps(doc, indent=1) + "\n")
    inference._over_hull = _IN_FORCE


if __name__ == "__main__":
    main()
