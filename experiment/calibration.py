"""Calibration of the lift procedure by simulation with a known truth (issue 20, item 1).

A synthetic frontier study, shaped like the package's designs (`Design`):

- `P` problems with heterogeneous base success probabilities: problem `j`'s logit is `θ_j`, drawn
  from `Normal(mu, tau)`;
- a training *path* of a method setting moves every logit by `s · (a + b·(θ_j − mu))` at
  training amount `s`: `a > 0` raises pass@1 and `b > 0` is sharpening (easy problems gain,
  hard ones lose, so pass@k at large k falls);
- a training seed moves a run along its path (`s · exp(σ_along · z)`, one `z` per run) and off it
  (`σ_off · s · u_j`, one `u_j` per run and problem);
- every model is evaluated on the same problems with `n` samples each (binomial counts); `x` is
  the per-problem pass@1 gain over the base model and `y` the gain in the unbiased pass@k
  estimate (Chen et al. 2021), as in `llm.sweep`.

The reference (GRPO) runs `ref_settings` paths, each evaluated at `checkpoints`. The *true
reference curve* is the monotone upper envelope of the population points (means over the
problem distribution and over seeds) of the reference's paths evaluated densely in `s`; a
method model's *true lift* is its population pass@k gain minus that curve at its population
pass@1 gain. `method_path` builds a method whose model at a given checkpoint has a chosen true
lift (0, +2, +3, +6 points) at its middle checkpoint by solving for its sharpening `b`.

`calibrate` runs a lift procedure (`Procedure`: the package's `curve_procedure`, or the earlier
`bootstrap_procedure`) on many simulated studies and reports its bias, per-comparison coverage, the family-wise rate of
false "above"/"below" verdicts under the null, and the power to see a positive lift.

Sources: the question and the simulation design are issue 20's; pass@k's unbiased estimator is
`theory.measures.pass_at_k` (Chen et al. 2021, `docs/formulas.md` §5.1).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, special, stats

from experiment import frontier

__all__ = [
    "DESIGNS",
    "STRESS_DESIGNS",
    "Design",
    "Study",
    "bootstrap_procedure",
    "calibrate",
    "curve_procedure",
    "method_path",
    "minimum_detectable_lift",
    "simulate",
    "true_point",
]

# Population quadrature: the problem distribution Normal(mu, tau) at this many equal-mass nodes.
_NODES = 1001
# Seed quadrature of the population truth: equal-mass nodes of z (along) x a Monte Carlo of u.
_SEED_NODES = 16


@dataclass(frozen=True)
class Design:
    """The shape of a synthetic study (module docstring). Defaults: the LLM sweep of
    `make reproduce` (`DESIGNS`; base pass@1 ≈ 0.30, pass@16 ≈ 0.85, 128 problems × 16 samples, 3 seeds,
    3 checkpoints; GRPO's path gains ≈ 5 points of pass@1 and loses ≈ 6 of pass@16, as measured;
    binomial evaluation noise alone gives the observed seed-to-seed sd of pass@1 ≈ 1 point and of
    pass@16 ≈ 3 points, so the seed noise is small)."""

    problems: int = 128
    samples: int = 16
    k: int = 16
    seeds: int = 3
    mu: float = -1.2
    tau: float = 1.6
    checkpoints: tuple[float, ...] = (1.0, 2.0, 3.0)
    ref_settings: tuple[tuple[float, float], ...] = ((0.04, 0.16), (0.03, 0.1))
    """(a, b) of each reference path (GRPO and e.g. GRPO with a KL penalty)."""
    sigma_along: float = 0.1
    sigma_off: float = 0.05
    pushes: tuple[float, ...] = tuple(float(v) for v in np.arange(1, 11) * 0.04)
    """The pushes `a` `method_path` tries for a method's path (negative ones where the reference
    barely raises pass@1)."""


DESIGNS = {
    "reproduce": Design(),
    "study": Design(problems=512),
}
"""The committed LLM designs: `make reproduce`'s sweep (128 problems × 16 samples × 3 seeds) and the
study's confirmation stage (4× the problems: 512 × 16 × 3, for a minimum detectable lift ≤ 3
points)."""


_BOTH_WAYS = tuple(float(v) for v in np.arange(-5, 6) * 0.04)

STRESS_DESIGNS = {
    "strong_one_path": Design(problems=512, seeds=8, ref_settings=((-0.1, 0.4),),
                              sigma_along=0.35, sigma_off=0.3, pushes=_BOTH_WAYS),
    "strong_two_paths": Design(problems=512, seeds=8, ref_settings=((-0.1, 0.4), (0.03, 0.2)),
                               sigma_along=0.35, sigma_off=0.3, pushes=_BOTH_WAYS),
    "short_dominant": Design(problems=512, seeds=8, ref_settings=((-0.1, 0.4), (0.01, 0.1)),
                             sigma_along=0.35, sigma_off=0.3, pushes=_BOTH_WAYS),
}  # fmt: skip
"""Designs shaped like the strong LLM study's confirmation (512 problems × 16 samples × 8 seeds;
GRPO's pass@1 +5 and pass@16 −17 at the last checkpoint, seed effects along and off the path 3-6×
the default designs'), with one reference path, or two whose trade-offs differ (lr 2e-4 and a
milder one that dominates it and reaches further, as lr 1e-4 in the study's reference).
`python -m experiment calibrate --design strong_two_paths --procedure pooled` measures what one
quadratic through *all* reference points does when a setting is dominated: docs/statistics.md.
``short_dominant``: the milder setting dominates but stops short in pass@1 (3.9 points against
5.3), so the maximum of the per-setting curves drops by ~6 points where it ends; a model near that
edge is measured against either curve as the noise moves the edge. Without the edge rule
(`curve_lift(edge_z=0)`) coverage falls to ~0.1; with it, a test on both sides, ~0.97
(docs/statistics.md)."""


@dataclass(frozen=True)
class Study:
    """One simulated study in `experiment.frontier`'s layout plus the truth of every model."""

    x: np.ndarray  # (M, S, P) pass@1 gains
    y: np.ndarray  # (M, S, P) pass@k gains
    models: frontier.Models
    true_lift: np.ndarray  # (M,) NaN for reference models
    reference: str = "grpo"
    extra: dict = field(default_factory=dict)


def _pass_at_k_prob(q: np.ndarray, k: int) -> np.ndarray:
    """Population pass@k of a problem with per-sample success probability q."""
    return -np.expm1(k * np.log1p(-np.clip(q, 0.0, 1.0 - 1e-15)))


@functools.lru_cache(maxsize=8)
def _quadrature(d: Design) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Equal-mass nodes of the problem logits `θ` `(J,)` and of a seed's place along its path `z`
    `(R,)`, and a fixed Monte Carlo draw of the off-path noise `u` `(R, J)`."""
    theta = d.mu + d.tau * stats.norm.ppf((np.arange(_NODES) + 0.5) / _NODES)
    z = stats.norm.ppf((np.arange(_SEED_NODES) + 0.5) / _SEED_NODES)
    u = np.random.default_rng(12345).standard_normal((_SEED_NODES, _NODES))
    return theta, z, u


def _true_points(d: Design, a: float, b: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
    """`true_point` for every sharpening of `b` `(n,)`: `(x (n,), y (n,))`."""
    theta, z, u = _quadrature(d)  # (J,), (R,), (R, J)
    sr = s * np.exp(d.sigma_along * z)[:, None]  # (R, 1)
    b = np.asarray(b, dtype=np.float64)[:, None, None]  # (n, 1, 1)
    q = special.expit(theta + sr * (a + b * (theta - d.mu)) + d.sigma_off * s * u)  # (n, R, J)
    q0 = special.expit(theta)
    x = q.mean(axis=(1, 2)) - q0.mean()
    y = _pass_at_k_prob(q, d.k).mean(axis=(1, 2)) - _pass_at_k_prob(q0, d.k).mean()
    return x, y


def true_point(d: Design, a: float, b: float, s: float) -> tuple[float, float]:
    """The population point (pass@1 gain, pass@k gain) of the model at training amount `s` on
    path `(a, b)`, averaged over the problem distribution and over seeds (module docstring)."""
    x, y = _true_points(d, a, np.array([b]), s)
    return float(x[0]), float(y[0])


@functools.lru_cache(maxsize=8)
def _true_reference(d: Design, dense: int = 121) -> frontier.Envelope:
    s_max = max(d.checkpoints)
    px, py = [np.zeros(1)], [np.zeros(1)]
    for a, b in d.ref_settings:
        for s in np.linspace(0.0, s_max, dense)[1:]:
            x, y = _true_points(d, a, np.array([b]), s)
            px.append(x)
            py.append(y)
    px, py = np.concatenate(px), np.concatenate(py)
    return frontier.upper_envelope(px, py)


def _true_lift(d: Design, ref: frontier.Envelope, a: float, b: float, s: float) -> float:
    x, y = true_point(d, a, b, s)
    return float(y - ref(x))


def _lift_checkpoint(d: Design) -> float:
    """The checkpoint whose model carries a method's chosen true lift: the middle one, so that its
    pass@1 lies well inside the reference's range."""
    return d.checkpoints[len(d.checkpoints) // 2]


@functools.lru_cache(maxsize=64)
def method_path(d: Design, lift: float, *, s: float | None = None) -> tuple[float, float]:
    """A method path `(a, b)` whose model at checkpoint `s` (default: the middle one) has true lift
    `lift` (in probability units: 0.03 is +3 points) inside the reference's pass@1 range: of the
    pushes `a` of `d.pushes` (default 0.04, 0.08, ..., 0.4) for which some sharpening `b` in
    [-1, 1] reaches it (`b` solved to 1e-10), the one whose model's pass@1 is nearest the middle
    of that range.

    Raises:
        ValueError: no such path (the design leaves no room for the lift).
    """
    s = _lift_checkpoint(d) if s is None else s
    ref = _true_reference(d)
    grid = np.linspace(-1.0, 1.0, 81)
    found = []
    for a in d.pushes:

        def gap(b: float, a: float = a) -> float:
            return _true_lift(d, ref, a, b, s) - lift

        gx, gy = _true_points(d, a, grid, s)
        g = gy - ref(gx) - lift
        ok = np.isfinite(g[:-1]) & np.isfinite(g[1:]) & (np.sign(g[:-1]) != np.sign(g[1:]))
        if ok.any():
            i = int(np.flatnonzero(ok)[0])
            b = float(optimize.brentq(gap, grid[i], grid[i + 1], xtol=1e-10))
            found.append((abs(true_point(d, a, b, s)[0] - ref.x_max / 2), float(a), b))
    if found:
        # The path whose model sits nearest the middle of the reference's pass@1 range: a model
        # near its edge falls outside in many studies, and the ones kept are a biased selection.
        return min(found)[1:]
    raise ValueError(f"lift: no path (a, b) gives a true lift of {lift} inside the reference")


def _pass_at_k_hat(c: np.ndarray, n: int, k: int) -> np.ndarray:
    """Unbiased pass@k from `c` correct of `n` (vectorized `theory.measures.pass_at_k`)."""
    c = np.asarray(c)
    out = 1.0 - special.comb(n - c, k, exact=False) / special.comb(n, k, exact=False)
    return np.where(n - c < k, 1.0, out)


def simulate(
    d: Design,
    methods: Sequence[tuple[str, float, float]],
    rng: np.random.Generator,
    truth: dict | None = None,
) -> Study:
    """One study: the base model, the reference paths at every checkpoint and each method path
    `(name, a, b)` at every checkpoint, `d.seeds` seeds, on `d.problems` fresh problems.

    Args:
        truth: memo of true lifts per `(a, b, s)` (filled on first use; pass the same dict to
            every study of one design).
    """
    theta = rng.normal(d.mu, d.tau, d.problems)  # (P,)
    base_c = rng.binomial(d.samples, special.expit(theta))  # (P,) one shared base evaluation
    bx, by = base_c / d.samples, _pass_at_k_hat(base_c, d.samples, d.k)
    paths = [("grpo", a, b) for a, b in d.ref_settings] + list(methods)
    xs, ys = [np.zeros((d.seeds, d.problems))], [np.zeros((d.seeds, d.problems))]
    names, settings, steps = ["grpo"], ["base"], [0]
    params: list[tuple[float, float, float] | None] = [None]
    for name, a, b in paths:
        z = rng.standard_normal(d.seeds)[:, None]  # (S, 1): a seed's place along its path
        u = rng.standard_normal((d.seeds, d.problems))  # off the path
        for s in d.checkpoints:
            sr = s * np.exp(d.sigma_along * z)
            q = special.expit(theta + sr * (a + b * (theta - d.mu)) + d.sigma_off * s * u)
            c = rng.binomial(d.samples, q)  # (S, P)
            xs.append(c / d.samples - bx)
            ys.append(_pass_at_k_hat(c, d.samples, d.k) - by)
            names.append(name)
            settings.append(f"a={a:g},b={b:.4g}")
            steps.append(round(100 * s))
            params.append(None if name == "grpo" else (a, b, s))
    truth = {} if truth is None else truth
    lifts = []
    for key in params:
        if key is not None and key not in truth:
            truth[key] = _true_lift(d, _true_reference(d), *key)
        lifts.append(np.nan if key is None else truth[key])
    return Study(np.stack(xs), np.stack(ys), frontier.Models(names, settings, steps),
                 np.array(lifts))  # fmt: skip


Procedure = Callable[[Study, np.random.Generator], tuple[np.ndarray, ...]]
"""A lift procedure: a study → `(lift, lo, hi, p)`, each `(M,)` (NaN for reference models; `p`, the
two-sided p-value of lift 0, all NaN when the procedure gives none)."""


def bootstrap_procedure(num_resamples: int = 200, level: float = 0.95) -> Procedure:
    """The earlier procedure, kept for comparison: `experiment.frontier.bootstrap_lift` (the
    envelope of the reference's noisy points, a paired percentile bootstrap over seeds and
    problems)."""

    def run(study: Study, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        res = frontier.bootstrap_lift(
            study.x, study.y, study.models, study.reference, num_resamples=num_resamples,
            level=level, seed=int(rng.integers(2**31)),
        )  # fmt: skip
        return res.lift, res.lo, res.hi, np.full(res.lift.shape, np.nan)

    return run


def curve_procedure(
    num_resamples: int = 20,
    level: float = 0.95,
    degree: int = 2,
    per_setting: bool = True,
    bias_correct: bool = True,
    edge_z: float = frontier.EDGE_Z,
    edge_drop: float = frontier.EDGE_DROP,
) -> Procedure:
    """The calibrated procedure the tables use: `experiment.frontier.curve_lift` (the maximum of
    one quadratic per reference setting through the base, a t interval with the delta method's
    crossed seeds × problems standard error; `num_resamples` only feeds its `inside_fraction`);
    with `bias_correct`, the estimated bias of the maximum of close settings' noisy curves
    subtracted (`experiment.frontier.curve_lift`; without it the reproduce design's lifts are
    biased by −0.4 to −0.8 points); with `edge_z` > 0, a model near a drop of that maximum
    larger than `edge_drop` standard errors tested on both sides of it (0 turns the rule off);
    without `per_setting`, one quadratic pooled over the settings (biased up when
    their trade-offs differ: `STRESS_DESIGNS`)."""

    def run(study: Study, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        res = frontier.curve_lift(
            study.x, study.y, study.models, study.reference, degree=degree,
            num_resamples=num_resamples, level=level, seed=int(rng.integers(2**31)),
            per_setting=per_setting, bias_correct=bias_correct, edge_z=edge_z,
            edge_drop=edge_drop,
        )  # fmt: skip
        return res.lift, res.lo, res.hi, res.p

    return run


def calibrate(
    d: Design,
    procedure: Procedure,
    *,
    lifts: Sequence[float] = (0.0, 0.02, 0.03, 0.06),
    per_lift: int = 3,
    replicates: int = 200,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict:
    """Run `procedure` on `replicates` studies, each with `per_lift` method models of every true
    lift of `lifts` (one path each, evaluated at every checkpoint; the middle checkpoint's model
    has the lift and is the one scored), and report per true lift: mean bias (points), coverage,
    the rate of "above" / "below" verdicts (interval excluding 0) per comparison, and family-wise
    over the null models of a study: unadjusted, and with Holm at `alpha` over them (the complete
    null of a confirmation family) where the procedure gives p-values.

    Returns:
        ``{"design": ..., "replicates": R, "by_lift": {lift: {bias, bias_se, coverage,
        coverage_se, above, below, n}}, "familywise_null": {"above", "below"},
        "familywise_holm": {"above", "below"}}`` with lifts and biases in percentage points
        (``familywise_holm`` only with p-values).
    """
    rng = np.random.default_rng(seed)
    solved = {lift: method_path(d, lift) for lift in lifts}
    paths = [(f"m{round(1000 * lift)}_{i}", *solved[lift])
             for lift in lifts for i in range(per_lift)]  # fmt: skip
    truth: dict = {}
    rows = []  # (true lift, estimate, lo, hi, Holm-adjusted p over the study's null models, replicate)
    last = round(100 * _lift_checkpoint(d))
    for r in range(replicates):
        study = simulate(d, paths, rng, truth)
        est, lo, hi, p = procedure(study, rng)
        scored = [m for m in range(len(study.models))
                  if study.models.method[m] != "grpo" and study.models.step[m] == last]  # fmt: skip
        null = [m for m in scored if abs(study.true_lift[m]) < 1e-6]
        adj = np.full(len(study.models), np.nan)
        adj[null] = frontier.holm(p[null])
        rows.extend((study.true_lift[m], est[m], lo[m], hi[m], adj[m], r) for m in scored)
    t, e, lo, hi, adj, rep = (np.array(c, dtype=np.float64) for c in zip(*rows, strict=True))
    out: dict = {"design": d.__dict__, "replicates": replicates, "by_lift": {}}
    for lift in lifts:
        sel = np.isclose(t, lift, atol=1e-6)
        ok = sel & np.isfinite(e)
        err = 100 * (e[ok] - t[ok])
        cover = (lo[ok] <= t[ok]) & (t[ok] <= hi[ok])
        out["by_lift"][f"{100 * lift:g}"] = {
            "n": int(ok.sum()), "outside_range": int((sel & ~np.isfinite(e)).sum()),
            "bias": float(err.mean()), "bias_se": float(err.std(ddof=1) / np.sqrt(err.size)),
            "sd": float(err.std(ddof=1)),
            "coverage": float(cover.mean()),
            "coverage_se": float(np.sqrt(cover.mean() * (1 - cover.mean()) / cover.size)),
            "above": float(np.mean(lo[ok] > 0)), "below": float(np.mean(hi[ok] < 0)),
        }  # fmt: skip
    null = np.isclose(t, 0.0, atol=1e-6)
    fw_above = [np.any(lo[null & (rep == r)] > 0) for r in range(replicates)]
    fw_below = [np.any(hi[null & (rep == r)] < 0) for r in range(replicates)]
    out["familywise_null"] = {"above": float(np.mean(fw_above)), "below": float(np.mean(fw_below))}
    if np.isfinite(adj[null]).any():
        hit = null & (adj <= alpha)
        out["familywise_holm"] = {
            "above": float(np.mean([np.any(hit & (e > 0) & (rep == r)) for r in range(replicates)])),
            "below": float(np.mean([np.any(hit & (e < 0) & (rep == r)) for r in range(replicates)])),
        }  # fmt: skip
    return out


def minimum_detectable_lift(report: dict, power: float = 0.8, level: float = 0.95) -> float:
    """The lift (points) a two-sided test at `level` detects with probability `power`, from the
    estimator's Monte Carlo sd under the null in a `calibrate` report: `(z_{1−α/2} + z_power)·sd`
    (normal approximation)."""
    sd = report["by_lift"]["0"]["sd"]
    return float((stats.norm.ppf(0.5 + level / 2) + stats.norm.ppf(power)) * sd)
