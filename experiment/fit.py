"""Fit a calibration design (`experiment.calibration.Design`) to a sweep's per-problem counts.

The calibration's designs are fitted from measured per-problem counts where they exist, not by eye.
The model is `experiment.calibration`'s; each parameter is fitted by the simplest estimator that
identifies it:

- the base's problem logits `θ_j ~ Normal(mu, tau)`: maximum likelihood of the base model's counts
  `c_j ~ Binomial(n, expit(θ_j))` (the logit-normal binomial; Gauss-Hermite in `θ`, 64 nodes);
- each reference setting's path `(a, b)`: least squares of its mean points (pass@1 gain, pass@k
  gain) at the checkpoints against `calibration.true_points` (training amount `s` = step / the
  first checkpoint's step);
- `sigma_along` (a seed's place along its path, `s·exp(σ·z)`): the seed-to-seed variance of a
  checkpoint's pass@1 gain, less its binomial part, over `(s·∂x/∂s)²` (the delta method), pooled
  over settings and checkpoints;
- `sigma_off` (a seed's per-problem departure from its path, `σ·s·u_j` on the logit): the
  seed-to-seed variance of a problem's rate beyond binomial noise and beyond the seed's shift
  over all problems, over `(s·q(1 − q))²` (the delta method), pooled the same way.

The paths are refitted once after the two sigmas (they move the population points a little).
`python -m experiment calibrate --fit RESULTS.json` prints the fitted design.

Sources: the delta method (e.g. Casella & Berger 2002, §5.5.4).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize, special

from experiment import calibration as C
from experiment import cli, reread
from theory.measures import pass_at_k_fast

__all__ = ["counts_from_results", "fit_base", "fit_design", "fit_seed_shift", "seed_moments"]

_GH = 64
"""Gauss-Hermite nodes of the base's marginal likelihood."""


def counts_from_results(
    results: Mapping[str, Any], label: str = "grpo"
) -> tuple[np.ndarray, int, dict[str, dict[int, np.ndarray]]]:
    """A sweep's counts in `fit_design`'s layout, from its results.json document (``models``:
    one record per model with ``label``, ``params``, ``seed``, ``step``, ``n`` and ``correct``
    `(P,)`; the base's label is ``"base"``).

    Returns:
        ``(base (P,), n, {setting: {step: (S, P) counts}})``, settings named by their params.

    Raises:
        ValueError: no base record, no record of `label`, or counts of different lengths.
    """
    records = results.get("models") if isinstance(results, Mapping) else None
    if not isinstance(records, list):
        raise ValueError("results: no 'models' list (a sweep's results.json has one)")
    base = [m for m in records if m.get("label") == "base"]
    if not base:
        raise ValueError("results: no base model record (label 'base')")
    runs: dict[str, dict[int, dict[int, list[int]]]] = {}
    for m in records:
        if m.get("label") != label:
            continue
        setting = json.dumps(m.get("params") or {}, sort_keys=True)
        runs.setdefault(setting, {}).setdefault(int(m["step"]), {})[int(m["seed"])] = m["correct"]
    if not runs:
        raise ValueError(f"results: no model with label {label!r}")
    b = np.asarray(base[0]["correct"], dtype=np.int64)
    out = {}
    for setting, steps in runs.items():
        out[setting] = {}
        for step, seeds in sorted(steps.items()):
            arr = np.asarray([seeds[s] for s in sorted(seeds)], dtype=np.int64)
            if arr.shape[1:] != b.shape:
                raise ValueError(f"results: {label} {setting} step {step}: {arr.shape[1]} "
                                 f"problems, the base has {b.size}")  # fmt: skip
            out[setting][step] = arr
    return b, int(base[0]["n"]), out


def fit_base(correct: object, n: int) -> tuple[float, float]:
    """`(mu, tau)` of the problems' logits by maximum likelihood of the base's counts `(P,)` of
    `n` samples each (module docstring).

    Raises:
        ValueError: counts outside [0, n], fewer than 2 problems.
    """
    c = np.asarray(correct, dtype=np.float64)
    if c.ndim != 1 or c.size < 2 or (c < 0).any() or (c > n).any():
        raise ValueError(f"correct: expected (P >= 2,) counts in [0, {n}], got shape {c.shape}")
    z, w = np.polynomial.hermite_e.hermegauss(_GH)
    w = w / w.sum()

    values, freq = np.unique(c, return_counts=True)  # a count's likelihood once per value

    def nll(p: np.ndarray) -> float:
        theta = p[0] + np.exp(p[1]) * z  # (G,)
        logp = special.log_expit(theta)[None, :] * values[:, None]
        logq = special.log_expit(-theta)[None, :] * (n - values)[:, None]
        return -float(freq @ special.logsumexp(logp + logq, b=w[None, :], axis=1))

    rate = np.clip(c.mean() / n, 1e-3, 1 - 1e-3)
    res = optimize.minimize(nll, np.array([special.logit(rate), 0.0]), method="Nelder-Mead",
                            options={"xatol": 1e-6, "fatol": 1e-9, "maxiter": 2000})  # fmt: skip
    return float(res.x[0]), float(np.exp(res.x[1]))


def _points(d: C.Design, counts: np.ndarray, base: np.ndarray, n: int) -> tuple[float, float]:
    """The mean (pass@1, pass@k) gains of `(S, P)` counts over the base's `(P,)`."""
    x = counts / n - base / n
    y = pass_at_k_fast(n, counts, d.k) - pass_at_k_fast(n, base, d.k)
    return float(x.mean()), float(y.mean())


def _fit_path(d: C.Design, s: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> tuple[float, float]:
    """Least-squares `(a, b)` of a path through the mean points `(xs, ys)` at amounts `s`."""

    def resid(p: np.ndarray) -> np.ndarray:
        x, y = C.true_points(d, float(p[0]), float(p[1]), s)
        return np.concatenate([x - xs, y - ys])

    return tuple(float(v) for v in optimize.least_squares(resid, [0.05, 0.0]).x)  # type: ignore[return-value]


def fit_design(
    base: object,
    n: int,
    runs: Mapping[str, Mapping[int, object]],
    *,
    k: int | None = None,
    confirm_seeds: int = 8,
    confirm_problems: int = 1024,
) -> C.Design:
    """A `calibration.Design` fitted to a sweep's counts (module docstring).

    Args:
        base: `(P,)` the base model's correct counts of `n` samples. runs: per reference setting,
            per checkpoint step, `(S, P)` counts (`counts_from_results`); every setting has the
            same steps. k: pass@k's k (default `n`). confirm_seeds, confirm_problems: the
            confirmation stage the design simulates.

    Raises:
        ValueError: no settings, settings with different steps, fewer than 2 seeds.
    """
    base = np.asarray(base, dtype=np.int64)
    if not runs:
        raise ValueError("runs: no reference settings")
    steps = sorted(next(iter(runs.values())))
    for setting, by_step in runs.items():
        if sorted(by_step) != steps:
            raise ValueError(f"runs: {setting} has steps {sorted(by_step)}, another {steps}")
    mu, tau = fit_base(base, n)
    s = np.asarray(steps, dtype=np.float64) / steps[0]
    counts = {st: {step: np.asarray(c, dtype=np.int64) for step, c in by.items()}
              for st, by in runs.items()}  # fmt: skip
    seeds = next(iter(next(iter(counts.values())).values())).shape[0]
    if seeds < 2:
        raise ValueError(f"runs: {seeds} seed(s); the seed effects need at least 2")
    d = replace(C.Design(), problems=int(base.size), samples=n, k=n if k is None else k,
                confirm_seeds=confirm_seeds, confirm_problems=confirm_problems, mu=mu, tau=tau,
                checkpoints=tuple(float(v) for v in s), sigma_along=0.0, sigma_off=0.0)  # fmt: skip
    means = {
        st: np.array([_points(d, by[step], base, n) for step in steps]) for st, by in counts.items()
    }
    for _ in range(2):  # paths, the sigmas at those paths, the paths again
        paths = {st: _fit_path(d, s, m[:, 0], m[:, 1]) for st, m in means.items()}
        along, off = [], []
        for st, (a, b) in paths.items():
            h = 1e-4
            x_hi, _ = C.true_points(d, a, b, s * (1 + h))
            x_lo, _ = C.true_points(d, a, b, s * (1 - h))
            slope = (x_hi - x_lo) / (2 * h)  # s · ∂x/∂s
            for i, step in enumerate(steps):
                rate = counts[st][step] / n  # (S, P)
                binom = (rate * (1 - rate)).mean() / (n - 1)  # unbiased per-problem binomial part
                per_seed = rate.mean(1)
                if abs(slope[i]) > 1e-9:
                    along.append((per_seed.var(ddof=1) - binom / base.size) / slope[i] ** 2)
                dev = rate - rate.mean(0) - (per_seed - per_seed.mean())[:, None]
                extra = dev.var(0, ddof=1).mean() - binom
                q = rate.mean(0)
                off.append(extra / (s[i] ** 2 * np.mean((q * (1 - q)) ** 2)))
        d = replace(d, ref_settings=tuple(paths.values()),
                    sigma_along=float(np.sqrt(max(np.mean(along), 0.0))),
                    sigma_off=float(np.sqrt(max(np.mean(off), 0.0))))  # fmt: skip
    return d


def describe_fit(d: C.Design, settings: Sequence[str]) -> dict:
    """The fitted design as JSON-able fields (the `calibration.Design` constructor's arguments)
    with the reference settings' names."""
    return {"settings": list(settings),
            **{f: getattr(d, f) for f in ("problems", "samples", "k", "mu", "tau", "checkpoints",
                                          "ref_settings", "sigma_along", "sigma_off")}}  # fmt: skip


def _cross_mean_squares(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The seed, problem and residual mean cross-products of `a` and `b` `(M, S, P)`, each `(M,)`
    (`experiment.covariance`'s mean squares when ``a is b``)."""
    s, p = a.shape[-2:]
    ga, gb = a.mean((1, 2))[:, None], b.mean((1, 2))[:, None]
    ra, rb = a.mean(2) - ga, b.mean(2) - gb  # (M, S)
    ca, cb = a.mean(1) - ga, b.mean(1) - gb  # (M, P)
    ea = a - ra[:, :, None] - ca[:, None, :] - ga[:, :, None]
    eb = b - rb[:, :, None] - cb[:, None, :] - gb[:, :, None]
    return (p * (ra * rb).sum(1) / (s - 1), s * (ca * cb).sum(1) / (p - 1),
            (ea * eb).sum((1, 2)) / ((s - 1) * (p - 1)))  # fmt: skip


def seed_moments(x: object, y: object) -> dict[str, float]:
    """How much the training seed moves a run as a whole, from per-problem gains `x`, `y`
    `(M models, S seeds, P problems)` in pass@1 and pass@k (trained models only), pooled over the
    models: the seed component `Σ_seed` `(2, 2)` of (pass@1, pass@k) by the method of moments,
    `(MS_seed − MS_e)/P` of the mean cross-products, summed over models.

    Returns:
        ``{"models", "sd_x", "sd_y"`` (the seed components' standard deviations, points),
        ``"corr"`` (the correlation of a seed's pass@1 and pass@k deviations), ``"share_x",
        "share_y"`` (the seed component's share of the variance of a model's mean,
        `(σ²_seed/S) / Var(mean)`, pooled)``}``.

    Raises:
        ValueError: shapes that differ or are not `(M, S ≥ 2, P ≥ 2)`.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 3 or min(x.shape[1:]) < 2:
        raise ValueError(f"x, y: expected two (M, S >= 2, P >= 2) arrays, got {x.shape}, {y.shape}")
    _, s, p = x.shape
    comp, total = np.zeros((2, 2)), np.zeros(2)
    for i, u in enumerate((x, y)):
        for j, v in enumerate((x, y)):
            a, b, e = _cross_mean_squares(u, v)
            comp[i, j] = float(np.sum((a - e) / p))
            if i == j:
                total[i] = float(np.sum((a + b - e) / (s * p)))
    m = x.shape[0]
    prod = comp[0, 0] * comp[1, 1]
    return {"models": m, "sd_x": 100 * float(np.sqrt(max(comp[0, 0], 0.0) / m)),
            "sd_y": 100 * float(np.sqrt(max(comp[1, 1], 0.0) / m)),
            "corr": float(comp[0, 1] / np.sqrt(prod)) if prod > 0 else float("nan"),
            "share_x": float(comp[0, 0] / s / total[0]), "share_y": float(comp[1, 1] / s / total[1])}  # fmt: skip


def study_seed_moments(path: str | Path, label: str = "grpo") -> dict[str, float]:
    """`seed_moments` of a stage's lift inputs (`experiment.reread.load_inputs`), pass@k, of the
    trained models of `label` (the reference's by default).

    Raises:
        ValueError: no trained model of `label`, or as `load_inputs`."""
    a = reread.load_inputs(path)["measures"]["pass_at_k"]
    models = a["models"]
    keep = [
        i for i in range(len(models.method)) if models.method[i] == label and models.step[i] > 0
    ]
    if not keep:
        raise ValueError(f"label: no trained model {label!r} in {path}")
    return seed_moments(a["x"][keep], a["y"][keep])


def fit_seed_shift(d: C.Design, target: Mapping[str, float], *, replicates: int = 4,
                   seed: int = 0) -> C.Design:  # fmt: skip
    """`d` with `sigma_along` (a seed's place along its path) and `sigma_seed` (a seed's shift of
    every problem's logit) fitted so that GRPO's models in `d`'s confirmation (`confirm_seeds` ×
    `confirm_problems`, `replicates` simulated stages, common random numbers) have `target`'s
    `seed_moments`: the seed components' standard deviations (on the log scale) and the
    correlation of a seed's pass@1 and pass@k deviations, by Nelder-Mead from `d`'s values.
    Along-path seeds move pass@1 and pass@k in opposite directions on a sharpening path, a shift
    moves them together, so the correlation tells the two apart."""

    def moments(log_sig: np.ndarray) -> np.ndarray:
        e = replace(d, sigma_along=float(np.exp(log_sig[0])), sigma_seed=float(np.exp(log_sig[1])))
        ref = C.study_paths(e, methods=False)[0]
        rng = np.random.default_rng(seed)
        got = []
        for _ in range(replicates):
            x, y, _ = C.simulate(e, ref, rng, seeds=e.confirm_seeds, problems=e.confirm_problems)
            got.append(seed_moments(x[1:], y[1:]))
        return np.array([np.mean([g[k] for g in got]) for k in ("sd_x", "sd_y", "corr")])

    want = np.array([target["sd_x"], target["sd_y"], target["corr"]])

    def loss(log_sig: np.ndarray) -> float:
        m = moments(log_sig)
        return float(np.sum(np.log(m[:2] / want[:2]) ** 2) + (m[2] - want[2]) ** 2)

    start = np.log([max(d.sigma_along, 1e-3), max(d.sigma_seed, 0.05)])
    res = optimize.minimize(loss, start, method="Nelder-Mead",
                            options={"xatol": 1e-3, "fatol": 1e-6, "maxiter": 200})  # fmt: skip
    return replace(d, sigma_along=round(float(np.exp(res.x[0])), 4),
                   sigma_seed=round(float(np.exp(res.x[1])), 4))  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m experiment.fit SEED_INPUTS.npz ... [--design NAME] [--debug]``: the
    `seed_moments` of GRPO's models in each stage's lift inputs, printed as JSON; with
    ``--design``, that design of `experiment.calibration.DESIGNS` with `fit_seed_shift` to the
    first file's moments. Errors as every command's (`experiment.cli.run`)."""
    return cli.run(_main, None if argv is None else list(argv))


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiment.fit")
    parser.add_argument("inputs", nargs="+", help="lift inputs (figures/*/confirm_lift_inputs.npz)")
    parser.add_argument("--design", choices=sorted(C.DESIGNS), help="fit this design's seeds")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {str(f): study_seed_moments(f) for f in args.inputs}
    if args.design:
        d = fit_seed_shift(C.DESIGNS[args.design], out[str(args.inputs[0])])
        out["fit"] = {"design": args.design, "sigma_along": d.sigma_along,
                      "sigma_seed": d.sigma_seed}  # fmt: skip
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
