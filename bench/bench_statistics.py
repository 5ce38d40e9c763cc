"""The lift statistics' fast paths against their references, timed side by side in one run.

    python bench/bench_statistics.py [--rounds 5] [--out bench/results/statistics_speed.json]

- **hull**: every draw of the means read against its own hull, `experiment.estimand.hull_values`
  (all draws at once) against `upper_hull(px[b], py[b])(x[b])` draw by draw (what
  `experiment.inference` did before), on 2,000 draws of 7 reference points and 40 models; the two
  must be equal bit for bit.
- **truth**: the calibration's population points, `experiment.calibration.true_points` (pass@k
  `1 − (1 − q)^k` by repeated squaring in the nodes' own memory) against the same quadrature with
  `−expm1(k·log1p(−q))` and fresh arrays (`reference_true_points`, what it was before), on one
  scan of `method_path` (161 sharpenings × 3 checkpoints × 64 seed nodes × 401 problem nodes) of
  the narrow design; largest absolute difference printed.

Each pair alternates `--rounds` times; the median of each is reported with their ratio
(reference / fast). Nothing else should run beside it.
"""

from __future__ import annotations

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy loads)

# isort: split
import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from experiment import calibration, estimand


def reference_true_points(d, a, b, s, noise=1.0):
    """`experiment.calibration.true_points` as it was: the same quadrature, pass@k by
    `−expm1(k·log1p(−q))` on fresh arrays."""
    from scipy import special

    theta, wt, q0 = calibration._base(d)
    z, wz = calibration._gauss(calibration._NODES["z"])
    u, wu = calibration._gauss(calibration._NODES["u"])
    bb = np.asarray(b, dtype=np.float64)
    s = np.atleast_1d(np.asarray(s, dtype=np.float64))[None, :, None, None, None]
    sr = s * np.exp(noise * d.sigma_along * z)[:, None, None]
    shift = a + np.atleast_1d(bb)[:, None, None, None, None] * (theta - d.mu)
    off = noise * float(np.hypot(d.sigma_off, d.sigma_seed))
    q = special.expit(theta + sr * shift + off * s * u[:, None])
    w = wz[:, None, None] * wu[:, None] * wt

    def pass_k(p):
        return -np.expm1(d.k * np.log1p(-np.clip(p, 0.0, 1.0 - 1e-15)))

    x = np.einsum("bnzuj,zuj->bn", q, w) - wt @ q0
    y = np.einsum("bnzuj,zuj->bn", pass_k(q), w) - wt @ pass_k(q0)
    return x, y


def _time(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _pair(fast, reference, rounds: int) -> dict:
    times: dict[str, list[float]] = {"fast": [], "reference": []}
    out = {}
    for _ in range(rounds):
        for name, fn in (("fast", fast), ("reference", reference)):
            t, out[name] = _time(fn)
            times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"fast_s": med["fast"], "reference_s": med["reference"],
            "ratio": med["reference"] / med["fast"], "outputs": out}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/statistics_speed.json")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    draws, refs, models = 2000, 7, 40
    px = rng.normal(0.03, 0.01, (draws, refs))
    py = -2 * px + rng.normal(0, 0.01, (draws, refs))
    x = rng.normal(0.03, 0.015, (draws, models))
    hull = _pair(lambda: estimand.hull_values(px, py, x),
                 lambda: np.stack([estimand.upper_hull(px[b], py[b])(x[b]) for b in range(draws)]),
                 args.rounds)  # fmt: skip
    same = bool(np.array_equal(hull["outputs"]["fast"], hull["outputs"]["reference"],
                               equal_nan=True))  # fmt: skip
    d = calibration.DESIGNS["narrow"]
    grid = calibration._sharpenings(d)
    passk = _pair(lambda: calibration.true_points(d, 0.02, grid, d.checkpoints),
                  lambda: reference_true_points(d, 0.02, grid, d.checkpoints), args.rounds)  # fmt: skip
    diff = float(max(np.abs(f - r).max() for f, r in zip(passk["outputs"]["fast"],
                                                          passk["outputs"]["reference"],
                                                          strict=True)))  # fmt: skip
    report = {
        "machine": platform.processor() or platform.machine(),
        "rounds": args.rounds,
        "hull": {k: v for k, v in hull.items() if k != "outputs"} | {"bit_equal": same},
        "truth": {k: v for k, v in passk.items() if k != "outputs"} | {"max_abs_diff": diff},
    }
    print(
        f"hull, {draws} draws x {models} models: fast {hull['fast_s']:.3f} s, per draw "
        f"{hull['reference_s']:.3f} s, ratio {hull['ratio']:.1f}x, equal bit for bit: {same}"
    )
    print(f"true_points, one scan ({grid.size} sharpenings): {passk['fast_s']:.3f} s, as before "
          f"{passk['reference_s']:.3f} s, ratio {passk['ratio']:.1f}x, largest difference "
          f"{diff:.1e}")  # fmt: skip
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
