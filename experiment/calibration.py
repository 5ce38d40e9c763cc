"""Calibration of the whole study pipeline by simulation with a known truth.

A synthetic study, shaped like the package's (`Design`):

- problems with heterogeneous base success probabilities: problem `j`'s logit is `θ_j`, drawn from
  `Normal(mu, tau)`;
- a training *path* `(a, b)` moves every logit by `s · (a + b·(θ_j − mu))` at training amount `s`:
  `a > 0` raises pass@1 and `b > 0` sharpens (easy problems gain, hard ones lose, so pass@k at
  large k falls);
- a training seed moves a run along its path (`s · exp(σ_along · z)`, one `z` per run), off it
  on each problem (`σ_off · s · u_j`, one `u_j` per run and problem) and shifts all of the run's
  problems at once (`σ_seed · s · w`, one `w` per run: a seed whose policy is better everywhere;
  fitted to the committed studies' lift inputs by `experiment.fit.fit_seed_shift`);
- every model is evaluated on the same problems with `samples` samples each (binomial counts);
  `x` is the per-problem pass@1 gain over the base model and `y` the gain in the unbiased pass@k
  estimate (Chen et al. 2021), as in `llm.orchestrate.sweep`.

GRPO runs `ref_settings` paths, read at every checkpoint. The *true* lift of a model is its
population point (means over the problem distribution and over seeds) against the hull of the
population points of GRPO's models at those checkpoints and the base (`experiment.estimand`: the
same estimand the data are read with). Each compared method has settings (paths) solved so that
the largest true lift over a setting's checkpoints is a chosen value (`method_path`): inside
GRPO's range (`METHODS`: three nulls, +2, +5), above it (`ABOVE`: a null; `ESCAPE`: +8/+5 where
`Design.escape`), with one setting four times as noisy (`GAMBLE` where `Design.noisy`), and GRPO
itself trained one segment longer (`GRPO_MORE`). Every design has at least four null methods
(`NULLS`), the family-wise checks.

`calibrate` runs the whole pipeline on many simulated studies: explore (`explore_seeds` ×
`problems`), pick per method (`experiment.study.select` by `experiment.study.PICK_RULE`; every
rule of `PICK_RULES` scored on the same explorations), confirm the picks with GRPO's reference on
fresh seeds and problems (`confirm_seeds` × `confirm_problems`), Holm over the picks and the claim
words (`experiment.study.claim_verdicts`, claimed size `CLAIM_SIZE`). It reports the exploratory
estimates' range and coverage, the probability of picking the best setting and the picks' true
lifts per rule, the confirmed lifts' bias and coverage, the family-wise rate of false
"above"/"below" verdicts over the nulls and each claim word's rate per method. `DESIGNS` is the
library of regimes (`python -m experiment calibrate --json`).

Sources: the calibration of docs/statistics.md (the simulation designs, the whole-pipeline
calibration); pass@k's unbiased estimator is `theory.measures.pass_at_k` (Chen et al. 2021,
`docs/formulas.md` §5.1).
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

import numpy as np
from scipy import optimize, special
from scipy.special import ndtri
from tqdm.auto import tqdm

from experiment import estimand, frontier, report
from experiment import study as S
from theory.measures import pass_at_k_fast

__all__ = [
    "CLAIM_SIZE",
    "CONFIRM_FACTORS",
    "DESIGNS",
    "ESCAPE",
    "EXPLORE_SEEDS",
    "METHODS",
    "TARGETS",
    "Design",
    "calibrate",
    "design_from_fields",
    "method_path",
    "methods_of",
    "misses",
    "override",
    "simulate",
    "size_for",
]

# Quadrature of the population truth: a problem's logit at equal-mass nodes (the midpoint rule in
# its quantile, robust where a sharpened path makes success a step in the logit: Gauss-Hermite
# erred by 0.9 points there), a run's place along its path and its off-path noise on a problem
# at Gauss-Hermite nodes (a Monte Carlo of the off-path noise erred by up to 0.4 points).
_NODES = {"theta": 401, "z": 8, "u": 8}

NULL_TOL = 1e-6
"""A true lift within this of 0 (probability units) is 0: `method_path` solves a null setting's
lift to ~1e-10, either side of 0, and a false verdict on it counts in both families."""

CLAIM_SIZE = 0.03
"""The claimed size of every simulated method's claim (3 points of pass@k, the LLM studies')."""

METHODS = {
    "null": (0.0, -0.02, -0.04),
    "null_tie": (0.0, 0.0, -0.02),
    "null_low": (-0.01, -0.03, -0.05),
    "plus2": (0.02, 0.0, -0.02),
    "plus5": (0.05, 0.01, -0.01),
}
"""The simulated methods inside GRPO's range: the largest true lift of each of their three settings
(probability units). ``null``, ``null_tie`` and ``null_low`` do not beat GRPO anywhere
(``null_tie`` ties at two settings); ``plus5``'s best setting is 4 points better than its others (the pick-the-best
check)."""

ABOVE = {"null_above": (0.0, -0.02)}
"""A null method whose settings' best models lie *above* GRPO's pass@1 range (the hull continued
there: `experiment.estimand`): true lift 0 at its best setting, −2 at its other."""

INSIDE_NULL = {"null_mid": (0.0, -0.01, -0.03)}
"""A fourth null method inside GRPO's range, for the designs without `ABOVE` (``Design.above``
false), so that every design has at least four nulls."""

GRPO_MORE = "grpo_more"
"""GRPO trained one segment longer: each of GRPO's settings read at one more checkpoint, its last
training amount plus its last step (`Design.checkpoints`), above GRPO's range where GRPO still
gains pass@1. Its true lift is what the hull's continuation gives GRPO's own trade-off beyond its
end (negative where GRPO sharpens): a null method, the family-wise check of the continuation."""

NULLS = ("null", "null_tie", "null_low", "null_mid", "null_above", GRPO_MORE)
"""The null methods (no setting's true lift above 0; `GRPO_MORE` where GRPO's continuation has no
positive true lift in the design): the family-wise checks, at least four in every design."""

GAMBLE = {"gamble": (0.04, 0.0, -0.02)}
"""A method whose settings differ in precision as well as in truth (`Design.noisy`): its best
setting (+4 points) has the design's seed noise, its second (0) four times as much
(`GAMBLE_NOISE`), as the rule study's lr-3e-4 settings had 4-6 times the MDE of its lr-1e-4
ones: the largest of such estimates is often the noisiest (the pick rule's test)."""

GAMBLE_NOISE = (1.0, 4.0, 1.0)
"""`GAMBLE`'s settings' noise: the factor on the design's ``sigma_along``, ``sigma_off`` and
``sigma_seed``."""

ESCAPE = {"escape": (0.08, 0.05)}
"""A method whose settings' best models lie *above* GRPO's pass@1 range (lift v4: `experiment.
estimand` continues the hull there), for the designs whose GRPO stops at a ceiling (`Design.
escape`): the SmolLM2 study's DS-GRPO passed GRPO's one-rule collapse (docs/gpu.md). Only large
lifts are reachable there in the `real` design (a path that passes the ceiling keeps much of its
pass@k): +8 (its last checkpoint above the range, 2 points ahead of its others) and +5 (a near
tie with an inside checkpoint)."""


@dataclass(frozen=True)
class Design:
    """The shape of a simulated study (module docstring)."""

    problems: int = 128
    samples: int = 16
    k: int = 16
    explore_seeds: int = 3
    confirm_seeds: int = 8
    confirm_problems: int = 512
    mu: float = -1.2
    tau: float = 1.6
    checkpoints: tuple[float, ...] = (1.0, 2.0, 3.0)
    ref_settings: tuple[tuple[float, float], ...] = ((0.04, 0.16), (0.03, 0.1))
    """(a, b) of each reference path (GRPO's settings, e.g. two learning rates)."""
    sigma_along: float = 0.1
    sigma_off: float = 0.05
    sigma_seed: float = 0.0
    """A run's shift of every problem's logit, `σ_seed · s · w` (one `w` per run): a seed whose
    policy is better (or worse) everywhere, moving its models across GRPO's hull."""
    pushes: tuple[float, ...] = tuple(float(v) for v in np.arange(-10, 11) * 0.02)
    """The pushes `a` `method_path` tries for a method's path."""
    sharpenings: tuple[float, float] = (-2.0, 2.0)
    """The range of sharpenings `b` `method_path` searches."""
    escape: bool = False
    """Also simulate `ESCAPE` (a method whose best models pass GRPO's largest pass@1)."""
    noisy: bool = False
    """Also simulate `GAMBLE` (a method one of whose settings is four times as noisy)."""
    above: bool = True
    """Simulate `ABOVE` (a null method above GRPO's range); off where no path reaches a lift of 0
    there (`real`: a path past GRPO's collapse keeps much of its pass@k)."""


DESIGNS = {
    # make reproduce's sweep and the mild study's shape: GRPO +5 pass@1, -5 pass@16.
    "smooth": Design(),
    # The strong study's exploration: GRPO +0.4..+3 pass@1 while pass@16 falls 7-15; large seed
    # effects; explored on 3 seeds x 512 problems and confirmed on 16 x 1,280, as its re-registered
    # config (configs/study_countdown_strong.toml; 3 x 128 picked the best setting in 69%).
    "narrow": Design(
        problems=512,
        confirm_seeds=16,
        confirm_problems=1280,
        ref_settings=((-0.14, 0.35), (-0.06, 0.22)),
        sigma_along=0.3,
        sigma_off=0.2,
    ),
    # The strong study's seeds: `narrow` with a run-level seed shift, a seed moving all of a run's
    # problems, fitted to GRPO's models in the strong study's confirmation (16 seeds x 1,280
    # problems: seed sd 1.17 points of pass@1, 1.60 of pass@16, correlation +0.08, the seed
    # component 33% of a pass@1 mean's variance) by `python -m experiment.fit
    # figures/llm_study_countdown_strong/confirm_lift_inputs.npz --design narrow`
    # (`experiment.fit.fit_seed_shift`).
    "narrow_seed": Design(
        problems=512,
        confirm_seeds=16,
        confirm_problems=1280,
        ref_settings=((-0.14, 0.35), (-0.06, 0.22)),
        sigma_along=0.1905,
        sigma_off=0.2,
        sigma_seed=0.0424,
    ),
    # smooth's shape with a method one of whose settings is four times as noisy (`GAMBLE`).
    "noisy": Design(noisy=True),
    # The mild study: GRPO +2..+5 pass@1, -3..-7 pass@16.
    "mild": Design(ref_settings=((0.03, 0.18), (0.02, 0.12))),
    # The rule-regime study (configs/study_countdown_rule.toml: the designed tiny base, 2 updates
    # per rollout batch), fitted to its exploration's GRPO counts (both learning rates, steps 40,
    # 80, 120; 3 seeds x 256 problems): `python -m experiment fit-design
    # runs/llm_study/study_countdown_rule/explore/results.json` (`experiment.fit`). GRPO +4..+18
    # pass@1 (lr 1e-4) and +9..+17 (3e-4) with very large seed effects (one lr-3e-4 seed -1..+12
    # while the others reach +17..+24). Confirmed on 8 seeds x 1,024 problems, as the study.
    "rule": Design(
        problems=256,
        confirm_seeds=8,
        confirm_problems=1024,
        mu=-1.6629,
        tau=1.1678,
        ref_settings=((0.07846, 0.16144), (-0.07266, 1.24909)),
        sigma_along=0.9387,
        sigma_off=0.4820,
        pushes=tuple(float(v) for v in np.arange(-20, 21) * 0.01),
        sharpenings=(-2.0, 8.0),
    ),
    # SmolLM2-135M on Countdown (GPU): base pass@1 0.12, pass@32 0.79; GRPO +34 pass@1 and -33
    # pass@32 within its checkpoints, collapsing onto the problems one rule solves.
    "real": Design(
        problems=256,
        samples=32,
        k=32,
        confirm_seeds=4,
        confirm_problems=512,
        mu=-2.5,
        tau=0.9,
        checkpoints=(1.0, 2.0, 4.0),
        ref_settings=((-0.3, 5.0), (-0.15, 3.0)),
        sigma_along=0.15,
        sigma_off=0.3,
        pushes=tuple(float(v) for v in np.arange(-20, 21) * 0.01),
        sharpenings=(-2.0, 8.0),
        escape=True,
        above=False,
    ),
}
"""The library of regimes (shaped by eye after the committed studies' reports, except `rule`, fitted
to its study's counts, and `narrow_seed`'s seeds, fitted to the strong study's lift inputs): each is
explored on `problems` × `explore_seeds` and confirmed on `confirm_problems` × `confirm_seeds`;
every design carries `methods_of` (`METHODS`, `ABOVE`, `GRPO_MORE`; `ABOVE` unless `real`, `ESCAPE`
where `Design.escape`, `GAMBLE` where `Design.noisy`)."""


def methods_of(d: Design) -> dict[str, tuple[float, ...]]:
    """The simulated methods of design `d` with their settings' largest true lifts: `METHODS`,
    `ABOVE` where ``d.above`` (else `INSIDE_NULL`), `ESCAPE` where ``d.escape``, `GAMBLE` where ``d.noisy``, and `GRPO_MORE` (its
    settings' true lifts, `grpo_more_lifts`)."""
    return {**METHODS, **(ABOVE if d.above else INSIDE_NULL), **(ESCAPE if d.escape else {}),
            **(GAMBLE if d.noisy else {}),
            GRPO_MORE: tuple(float(t) for t in grpo_more_lifts(d))}  # fmt: skip


def noise_of(name: str, i: int) -> float:
    """The noise factor of method `name`'s setting `i` (`GAMBLE_NOISE`; 1 for the others)."""
    return GAMBLE_NOISE[i] if name in GAMBLE else 1.0


def grpo_more_amount(d: Design) -> float:
    """`GRPO_MORE`'s training amount: GRPO's last checkpoint plus its last step."""
    c = d.checkpoints
    return 2 * c[-1] - c[-2]


def grpo_more_lifts(d: Design) -> np.ndarray:
    """`(R,)` the true lift of each of GRPO's settings trained `grpo_more_amount` (`GRPO_MORE`)."""
    s = grpo_more_amount(d)
    hull = true_hull(d)
    return np.array([float(y[0] - hull(x)[0])
                     for x, y in (true_points(d, a, b, [s]) for a, b in d.ref_settings)])  # fmt: skip


def _power(base: np.ndarray, k: int) -> np.ndarray:
    """`base**k` for an integer `k ≥ 1` by repeated squaring: `log2 k` multiplications in place,
    overwriting `base` (5× faster than `exp(k·log(base))` on the truth's ~10⁷ nodes, and exact to
    ~k·1e-16)."""
    if k < 1:
        raise ValueError(f"k: expected an integer >= 1, got {k}")
    out = base.copy() if k & 1 else None
    k >>= 1
    while k:
        np.multiply(base, base, out=base)
        if k & 1 and out is None:
            out = base if k == 1 else base.copy()  # the last squaring: `base` is the power of two
        elif k & 1:
            np.multiply(out, base, out=out)
        k >>= 1
    return out


def _pass_at_k_prob(q: np.ndarray, k: int) -> np.ndarray:
    """Population pass@k, `1 − (1 − q)^k`, of problems with per-sample success probability `q`
    (any shape)."""
    return 1.0 - _power(np.array(1.0 - np.asarray(q, dtype=np.float64)), k)


@functools.cache
def _gauss(n: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` Gauss-Hermite nodes and weights of the standard normal distribution (read-only:
    computed once per `n`)."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    w = w / w.sum()
    x.flags.writeable = w.flags.writeable = False
    return x, w


def _base(d: Design) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The problem logits' equal-mass nodes `θ` `(J,)`, their weights `(J,)` and the base's success
    probabilities `(J,)`."""
    j = _NODES["theta"]
    theta = d.mu + d.tau * ndtri((np.arange(j) + 0.5) / j)
    return theta, np.full(j, 1.0 / j), special.expit(theta)


def true_points(d: Design, a: float, b: object, s: object,
                noise: float = 1.0) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The population points (pass@1 gain, pass@k gain) of the paths `(a, b)` (`b` a scalar or
    `(nb,)`) at the training amounts `s` `(n,)`, averaged over the problem distribution and over
    seeds (Gauss-Hermite in the problem's logit, the run's place along its path and its logit
    offset on a problem: the off-path noise and the run's shift, `σ_off·s·u + σ_seed·s·w`, whose
    sum is `s·√(σ_off² + σ_seed²)` times one standard normal on every problem; each seed term
    scaled by `noise`): `(x, y)`, each `(n,)` (or `(nb, n)`)."""
    theta, wt, q0 = _base(d)
    z, wz = _gauss(_NODES["z"])
    u, wu = _gauss(_NODES["u"])
    bb = np.asarray(b, dtype=np.float64)
    s = np.atleast_1d(np.asarray(s, dtype=np.float64))[None, :, None, None, None]  # (1,n,1,1,1)
    sr = s * np.exp(noise * d.sigma_along * z)[:, None, None]  # (1, n, Z, 1, 1)
    shift = a + np.atleast_1d(bb)[:, None, None, None, None] * (theta - d.mu)  # (nb,1,1,1,J)
    off = noise * float(np.hypot(d.sigma_off, d.sigma_seed))
    q = np.add(theta + sr * shift, off * s * u[:, None])  # (nb, n, Z, U, J)
    special.expit(q, out=q)
    w = wz[:, None, None] * wu[:, None] * wt  # (Z, U, J)
    x = np.einsum("bnzuj,zuj->bn", q, w) - wt @ q0
    miss = _power(np.subtract(1.0, q, out=q), d.k)  # (1 − q)^k, in q's memory (10⁷ nodes)
    y = 1.0 - np.einsum("bnzuj,zuj->bn", miss, w) - wt @ _pass_at_k_prob(q0, d.k)
    return (x[0], y[0]) if bb.ndim == 0 else (x, y)


_SAMPLING = ("problems", "samples", "explore_seeds", "confirm_seeds", "confirm_problems",
             "escape", "noisy", "above")  # fmt: skip
"""The fields of `Design` the population truth does not depend on (sample sizes, and which methods
are simulated)."""


def _truth_key(d: Design) -> Design:
    """`d` with the `_SAMPLING` fields at their defaults: the key of the truth's caches, so that
    copies of a design that differ in sample sizes (`quick`, ``calibrate --set explore_seeds=6``)
    solve its paths once."""
    return replace(d, **{f: Design.__dataclass_fields__[f].default for f in _SAMPLING})


def true_hull(d: Design) -> estimand.Hull:
    """The hull of GRPO's models' population points at the checkpoints (and the base)."""
    return _true_hull(_truth_key(d))


@functools.lru_cache(maxsize=16)
def _true_hull(d: Design) -> estimand.Hull:
    pts = [true_points(d, a, b, d.checkpoints) for a, b in d.ref_settings]
    return estimand.upper_hull(np.concatenate([p[0] for p in pts]),
                               np.concatenate([p[1] for p in pts]))  # fmt: skip


def true_lifts(d: Design, a: float, b: object, noise: float = 1.0) -> np.ndarray:
    """The true lift of path `(a, b)`'s model (seed noise scaled by `noise`) at every checkpoint,
    `(C,)` (or `(nb, C)` for `b` `(nb,)`); NaN below GRPO's range (above it the hull is
    continued: `experiment.estimand`)."""
    x, y = true_points(d, a, b, d.checkpoints, noise)
    return y - true_hull(d)(x)


def _lifts(d: Design, a: float, b: object, where: str, noise: float = 1.0,
           points: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:  # fmt: skip
    """`true_lifts`, NaN above GRPO's range too when ``where == "inside"`` (a method whose every
    checkpoint stays inside the range, as under lift v3: `METHODS`' paths are the same); `points`:
    the paths' `true_points` at the checkpoints, when already computed."""
    x, y = true_points(d, a, b, d.checkpoints, noise) if points is None else points
    hull = true_hull(d)
    t = y - hull(x)  # `true_lifts`, with the points computed once
    return np.where(x > hull.x_max, np.nan, t) if where == "inside" else t


def _best(t: np.ndarray) -> np.ndarray:
    """The largest lift over the checkpoints, `(...)` of `(..., C)` (NaN when one is below the
    range: a method's settings stay where their truth is defined)."""
    return t.max(-1)


def _sharpenings(d: Design) -> np.ndarray:
    """The grid of sharpenings `method_path` brackets its roots on."""
    return np.linspace(*d.sharpenings, 161)


@functools.lru_cache(maxsize=1024)
def _scan_points(d: Design, a: float, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """`true_points` of the paths `(a, b)` over `_sharpenings(d)` at the checkpoints, `(161, C)`
    each: once per push for both of `_scan`'s readings."""
    return true_points(d, a, _sharpenings(d), d.checkpoints, noise)


@functools.lru_cache(maxsize=1024)
def _scan(d: Design, a: float, where: str = "inside", noise: float = 1.0) -> np.ndarray:
    """`(161,)` the largest true lift of the paths `(a, b)` over `_sharpenings(d)` (NaN where a
    checkpoint leaves GRPO's range): computed once per push for every lift `method_path` solves."""
    points = _scan_points(d, a, noise)
    return _best(_lifts(d, a, _sharpenings(d), where, noise, points))


def method_path(d: Design, lift: float, where: str = "inside",
                noise: float = 1.0) -> tuple[float, float]:  # fmt: skip
    """A path `(a, b)` whose largest true lift over its checkpoints is `lift` (probability units):
    with ``where="inside"`` every checkpoint inside GRPO's range (the `METHODS`, as under lift v3),
    of the pushes `d.pushes` for which a sharpening `b` in `d.sharpenings` reaches it the one whose
    best model's pass@1 is nearest the middle of the range (a path that hardly moves, or whose best
    model sits at the range's edge, would test little); with ``where="above"`` (`ESCAPE`) no
    checkpoint below the range and the best model above it, nearest a third of the range beyond
    its end; `noise` scales the path's seed noise (`true_points`). Roots are bracketed on
    `_sharpenings`, then found by Brent's method.

    Raises:
        ValueError: no such path (the design leaves no room for the lift), or a bad `where`.
    """
    if where not in ("inside", "above"):
        raise ValueError(f"where: expected 'inside' or 'above', got {where!r}")
    return _method_path(_truth_key(d), lift, where, noise)


@functools.lru_cache(maxsize=128)
def _method_path(d: Design, lift: float, where: str, noise: float) -> tuple[float, float]:
    """`method_path` of a `_truth_key` design (cached)."""
    hull = true_hull(d)
    mid = (hull.x_min + hull.x_max) / 2
    if where == "above":
        mid = hull.x_max + (hull.x_max - hull.x_min) / 3
    grid = _sharpenings(d)
    found = []
    for a in d.pushes:

        def gap(b: float, a: float = a) -> float:
            return float(_best(_lifts(d, a, b, where, noise))) - lift

        g = _scan(d, a, where, noise) - lift
        ok = np.isfinite(g[:-1]) & np.isfinite(g[1:]) & (np.sign(g[:-1]) != np.sign(g[1:]))
        for i in np.flatnonzero(ok)[:1]:
            b = float(optimize.brentq(gap, grid[i], grid[i + 1], xtol=1e-10))
            x, _ = true_points(d, a, b, d.checkpoints, noise)
            t = _lifts(d, a, b, where, noise)
            best_x = x[int(np.nanargmax(t))]
            if where == "above" and best_x <= hull.x_max:
                continue
            found.append((abs(best_x - mid), float(a), b))
    if not found:
        raise ValueError(f"lift: no path (a, b) gives a true lift of {lift} {where} the reference")
    return min(found)[1:]


def simulate(
    d: Design,
    paths: list[tuple[str, str, float, float, tuple[float, ...], float]],
    rng: np.random.Generator,
    *,
    seeds: int,
    problems: int,
) -> tuple[np.ndarray, np.ndarray, frontier.Models]:
    """One stage's data: the base model (GRPO's step 0), then each path `(method, setting, a, b,
    training amounts, noise)` at those amounts (its seed terms `σ_along`, `σ_off`, `σ_seed` scaled
    by `noise`), `seeds` fresh seeds (runs) on `problems` fresh problems.

    Returns:
        `(x, y, models)`: `(M, seeds, problems)` gains in pass@1 and pass@k, and the `Models`
        (steps: 100 × the training amount).
    """
    theta = rng.normal(d.mu, d.tau, problems)
    base = rng.binomial(d.samples, special.expit(theta))
    bx, by = base / d.samples, pass_at_k_fast(d.samples, base, d.k)
    xs, ys = [np.zeros((seeds, problems))], [np.zeros((seeds, problems))]
    names, settings, steps = ["grpo"], ["base"], [0]
    for name, setting, a, b, amounts, noise in paths:
        z = rng.standard_normal(seeds)[:, None]
        u = rng.standard_normal((seeds, problems))
        w = rng.standard_normal(seeds)[:, None]  # (S, 1): the run's shift of every problem
        for s in amounts:
            q = special.expit(theta + s * np.exp(noise * d.sigma_along * z) * (a + b * (theta - d.mu))
                              + noise * s * (d.sigma_off * u + d.sigma_seed * w))  # fmt: skip
            counts = rng.binomial(d.samples, q)
            xs.append(counts / d.samples - bx)
            ys.append(pass_at_k_fast(d.samples, counts, d.k) - by)
            names.append(name)
            settings.append(setting)
            steps.append(round(100 * s))
    return np.stack(xs), np.stack(ys), frontier.Models(names, settings, steps)


def _section(x: np.ndarray, y: np.ndarray, models: frontier.Models, draws: int, seed: int) -> dict:
    rows = [{"label": m, "setting": s, "step": t}
            for m, s, t in zip(models.method, models.setting, models.step, strict=True)]  # fmt: skip
    section, _ = report.lift_analysis(x, y, models, rows, "grpo", k=1, num_resamples=draws,
                                      seed=seed)  # fmt: skip
    return section


def study_paths(
    d: Design, *, methods: bool = True
) -> tuple[list[tuple], list[tuple], dict[tuple[str, str, int], float]]:
    """GRPO's reference paths, the simulated methods' paths (`methods_of`: each setting a path
    `(method, setting, a, b, amounts, noise)` read at every checkpoint; `GRPO_MORE` GRPO's
    settings at `grpo_more_amount`) and the true lift of every method's model,
    ``{(method, setting, step): lift}`` (NaN below GRPO's range); without `methods`, GRPO's
    alone."""
    ref = [("grpo", f"a={a:g},b={b:g}", a, b, d.checkpoints, 1.0) for a, b in d.ref_settings]
    truth: dict[tuple[str, str, int], float] = {}
    paths: list[tuple] = []
    for name, lifts in methods_of(d).items() if methods else ():
        if name == GRPO_MORE:
            more = grpo_more_amount(d)
            for i, ((a, b), t) in enumerate(zip(d.ref_settings, lifts, strict=True)):
                paths.append((name, f"s{i}", a, b, (more,), 1.0))
                truth[(name, f"s{i}", round(100 * more))] = float(t)
            continue
        for i, lift in enumerate(lifts):
            noise = noise_of(name, i)
            where = "above" if name in ESCAPE or name in ABOVE else "inside"
            a, b = method_path(d, lift, where, noise)
            paths.append((name, f"s{i}", a, b, d.checkpoints, noise))
            for c, t in enumerate(true_lifts(d, a, b, noise)):
                truth[(name, f"s{i}", round(100 * d.checkpoints[c]))] = float(t)
    return ref, paths, truth


def _rate(v: list[bool]) -> tuple[float, float]:
    """A share and its Monte Carlo standard error."""
    p = float(np.mean(v)) if v else float("nan")
    return p, float(np.sqrt(p * (1 - p) / max(len(v), 1)))


def calibrate(d: Design, *, replicates: int = 200, seed: int = 0, draws: int = 1000,
              alpha: float = 0.05, rule: str | None = None,
              progress: str | None = None) -> dict:  # fmt: skip
    """Run the whole pipeline (module docstring) on `replicates` simulated studies of design `d`,
    the picks by `rule` (`experiment.study.select`; default its `PICK_RULE`), every rule of
    `experiment.study.PICK_RULES` scored on the same explorations; with `progress` (a label), a
    progress bar of the studies on standard error.

    Returns:
        ``{"design", "replicates", "explore": {"max_abs_lift" (points), "coverage",
        "best_picked" (the share of studies whose ``plus5`` pick is from its best setting),
        "best_picked_by" {method: that share for every method with one best setting},
        "rules": {rule: {"best_picked": {method: share}, "truth": {method: the pick's mean true
        lift, points}}}}, "confirm": {method: {"truth" (the picks' mean true lift, points),
        "bias", "bias_se", "coverage", "coverage_se", "supported" (> 0 after Holm),
        "words" {claim word: share}, "outside"}}, "familywise": {"above", "above_se", "below",
        "below_se", "nulls"} (Holm over all picks: a pick whose true lift is ≤ 0 called above;
        ≥ 0 called below, up to `NULL_TOL`; `NULLS` the null methods)}``.
    """
    rule = S.PICK_RULE if rule is None else rule
    rng = np.random.default_rng(seed)
    ref_paths, paths, truth = study_paths(d)
    methods = methods_of(d)
    best = {name: f"s{int(np.argmax(lifts))}" for name, lifts in methods.items()
            if len(lifts) > 1 and np.sum(np.isclose(lifts, max(lifts), atol=1e-9)) == 1}  # fmt: skip
    max_abs, cover_explore = [], []
    picked = {r: {name: [] for name in best} for r in S.PICK_RULES}
    pick_truth = {r: {name: [] for name in methods} for r in S.PICK_RULES}
    rec: dict[str, list[tuple[float, ...]]] = {name: [] for name in methods}
    words: dict[str, list[str]] = {name: [] for name in methods}
    fw_above, fw_below = [], []
    for r in tqdm(range(replicates), desc=progress, disable=progress is None, unit="study",
                  leave=False):  # fmt: skip
        x, y, models = simulate(d, ref_paths + paths, rng, seeds=d.explore_seeds,
                                problems=d.problems)  # fmt: skip
        explore = _section(x, y, models, draws, r)
        for m in explore["models"]:
            if not m["reference"] and m["lift"] is not None:
                t = truth[(m["label"], m["setting"], m["step"])]
                max_abs.append(abs(m["lift"]))
                cover_explore.append(m["lift_lo"] <= t <= m["lift_hi"])
        for rr in S.PICK_RULES:
            got = S.select(explore, rule=rr)
            for name, v in picked[rr].items():
                v.append(name in got and got[name]["setting"] == best[name])
            for name, p in got.items():
                pick_truth[rr][name].append(truth[(name, p["setting"], p["step"])])
        picks = S.select(explore, rule=rule)
        chosen = [next((n, st, a, b, (p["step"] / 100,), f) for n, st, a, b, _, f in paths
                       if n == lb and st == p["setting"]) for lb, p in picks.items()]  # fmt: skip
        x, y, models = simulate(d, ref_paths + chosen, rng, seeds=d.confirm_seeds,
                                problems=d.confirm_problems)  # fmt: skip
        conf = S.confirm(_section(x, y, models, draws, r), list(picks), alpha=alpha)
        said = S.claim_verdicts(conf, CLAIM_SIZE, alpha=alpha)  # Holm over the study's claims
        above = below = False
        for label, c in conf.items():
            t = truth[(label, c["setting"], c["step"])]
            words[label].append(said[label])
            above |= c["verdict"] == "above" and t <= NULL_TOL
            below |= c["verdict"] == "below" and t >= -NULL_TOL
            if c["lift"] is None:
                rec[label].append((t, np.nan, np.nan, np.nan, 0.0))
            else:
                rec[label].append((t, c["lift"], c["lo"], c["hi"], float(c["verdict"] == "above")))
        fw_above.append(above)
        fw_below.append(below)
    fa, fa_se = _rate(fw_above)
    fb, fb_se = _rate(fw_below)
    out = {
        "design": asdict(d),
        "replicates": replicates,
        "rule": rule,
        "explore": {"max_abs_lift": 100 * float(max(max_abs, default=0.0)),
                    "coverage": float(np.mean(cover_explore)),
                    "best_picked": float(np.mean(picked[rule]["plus5"])),
                    "best_picked_by": {n: float(np.mean(v)) for n, v in picked[rule].items()},
                    "rules": {rr: {"best_picked": {n: float(np.mean(v))
                                                   for n, v in picked[rr].items()},
                                   "truth": {n: 100 * float(np.nanmean(v)) if np.isfinite(v).any()
                                             else float("nan") for n, v in pick_truth[rr].items()}}
                              for rr in S.PICK_RULES}},
        "confirm": {},
        "familywise": {"above": fa, "above_se": fa_se, "below": fb, "below_se": fb_se,
                       "nulls": [n for n in NULLS if max(methods.get(n, (1.0,))) <= NULL_TOL]},
    }  # fmt: skip
    for label, rows in rec.items():
        t, e, lo, hi, supported = (np.array(c, dtype=np.float64) for c in zip(*rows, strict=True))
        ok = np.isfinite(e)
        err = 100 * (e[ok] - t[ok])
        cover = (lo[ok] <= t[ok]) & (t[ok] <= hi[ok])
        n = max(int(ok.sum()), 1)
        out["confirm"][label] = {
            "truth": 100 * float(np.nanmean(t)) if np.isfinite(t).any() else float("nan"),
            "n": int(ok.sum()), "outside": float(np.mean(~ok)),
            "bias": float(err.mean()) if ok.any() else float("nan"),
            "bias_se": float(err.std(ddof=1) / np.sqrt(n)) if ok.sum() > 1 else float("nan"),
            "coverage": float(cover.mean()) if ok.any() else float("nan"),
            "coverage_se": float(np.sqrt(cover.mean() * (1 - cover.mean()) / n)) if ok.any()
            else float("nan"),
            "supported": float(np.mean(supported)),
            "words": {w: words[label].count(w) / len(words[label])
                      for w in sorted(set(words[label]))},
        }  # fmt: skip
    return out


TARGETS = {"best": 0.80, "bias": 0.30, "coverage": (0.93, 0.97), "familywise": 0.05}
"""What a calibrated design holds (docs/statistics.md): the best setting picked in at least 80% of
studies (``best``, the ``plus5`` method's), every confirmed method's |bias| at most 0.3 points
(``bias``) and coverage in 0.93-0.97 (``coverage``), family-wise false "above" and "below" at most
0.05 over the nulls (``familywise``)."""


def misses(out: Mapping, *, slack: float = 2.0) -> set[str]:
    """The keys of `TARGETS` a `calibrate` output `out` misses: the family-wise rates and the
    best-setting share as estimated; each method's coverage and bias allowing `slack` of its Monte
    Carlo standard errors (methods read in fewer than 2 studies are not counted)."""
    lo, hi = TARGETS["coverage"]
    rows = _read_methods(out)
    held = {
        "familywise": all(out["familywise"][side] <= TARGETS["familywise"]
                          for side in ("above", "below")),
        "best": out["explore"]["best_picked"] >= TARGETS["best"],
        "coverage": all(lo - slack * r["coverage_se"] <= r["coverage"] <= hi + slack * r["coverage_se"]
                        for r in rows),
        "bias": all(abs(r["bias"]) <= TARGETS["bias"] + slack * r["bias_se"] for r in rows),
    }  # fmt: skip
    return {k for k, ok in held.items() if not ok}


def _read_methods(out: Mapping) -> list[Mapping]:
    """The confirmed methods of a `calibrate` output read in at least 2 studies (the ones a
    target is checked on)."""
    return [r for r in out["confirm"].values() if r["n"] > 1]


EXPLORE_SEEDS = (3, 6, 12, 24, 48)
"""The exploration seeds `size_for` tries (those above a design's own)."""
CONFIRM_FACTORS = (1, 2, 4, 8)
"""The multiples of a design's confirmation seeds `size_for` tries."""


def size_for(d: Design, *, replicates: int = 200, seed: int = 0, draws: int = 300,
             explore: tuple[int, ...] = EXPLORE_SEEDS,
             factors: tuple[int, ...] = CONFIRM_FACTORS, progress: str | None = None) -> dict:  # fmt: skip
    """The smallest study, in seeds, at which design `d` holds `TARGETS` (`misses`), by
    calibrating it at growing sizes: first its exploration seeds (`d`'s own, then each larger one
    of `explore`) until the best setting is picked often enough (the pick depends on the
    exploration alone), then, at that exploration, its confirmation seeds times each of `factors`
    until nothing is missed (bias, coverage and the family-wise rates depend on the confirmation
    and the pick). Every size is one `calibrate` (same `replicates`, `seed`, `draws`); problems
    stay `d`'s. A miss that no size in the grid removes is the estimator's, not the study's size.

    Returns:
        ``{"trials": [{"explore_seeds", "confirm_seeds", "misses" (sorted), "best_picked",
        "coverage" [min, max], "max_abs_bias" (points), "familywise" [above, below]}] in the
        order run, "size": {"explore_seeds", "confirm_seeds"} of the first trial that misses
        nothing, or None, "replicates"}``.
    """
    trials: list[dict] = []

    def run(explore_seeds: int, confirm_seeds: int) -> set[str]:
        out = calibrate(replace(d, explore_seeds=explore_seeds, confirm_seeds=confirm_seeds),
                        replicates=replicates, seed=seed, draws=draws,
                        progress=progress and f"{progress} {explore_seeds}x{confirm_seeds}")  # fmt: skip
        rows = _read_methods(out)
        missed = misses(out)
        trials.append({
            "explore_seeds": explore_seeds, "confirm_seeds": confirm_seeds,
            "misses": sorted(missed), "best_picked": out["explore"]["best_picked"],
            "coverage": [min(r["coverage"] for r in rows), max(r["coverage"] for r in rows)],
            "max_abs_bias": max(abs(r["bias"]) for r in rows),
            "familywise": [out["familywise"]["above"], out["familywise"]["below"]],
        })  # fmt: skip
        return missed

    sizes = [d.explore_seeds, *(e for e in explore if e > d.explore_seeds)]
    for e in sizes:
        missed = run(e, d.confirm_seeds)
        if "best" not in missed:
            break
    for f in (f for f in factors if f > 1):
        if not missed:
            break
        missed = run(e, d.confirm_seeds * f)
    last = trials[-1]
    size = None if missed else {k: last[k] for k in ("explore_seeds", "confirm_seeds")}
    return {"trials": trials, "size": size, "replicates": replicates}


def describe(d: Design) -> dict:
    """GRPO's true points per setting and checkpoint, and the base's pass@1 and pass@k (points):
    what a design looks like."""
    _, wt, q0 = _base(d)
    return {
        "base": {"pass@1": 100 * float(wt @ q0),
                 f"pass@{d.k}": 100 * float(wt @ _pass_at_k_prob(q0, d.k))},
        "grpo": {f"a={a:g},b={b:g}": [[round(100 * float(v), 2) for v in pt]
                                      for pt in zip(*true_points(d, a, b, d.checkpoints), strict=True)]
                 for a, b in d.ref_settings},
    }  # fmt: skip


def override(d: Design, assignments: list[str]) -> Design:
    """A copy of design `d` with fields set by ``FIELD=VALUE`` strings (``python -m experiment
    calibrate --set``), each value read as the field's type: ``explore_seeds=6``,
    ``sigma_seed=0.05``, ``checkpoints=1,2,4``, ``ref_settings=(0.03,0.1),(0.02,0.12)``,
    ``noisy=true`` (seeds, problems, samples and k at least 2, k at most samples, every number
    finite, the standard deviations at least 0, `tau` above 0, checkpoints positive and
    increasing, `sharpenings` an interval, `ref_settings` pairs; `_check_value`). What a design
    needs to reach a target (e.g. how many exploration seeds pick the best setting in 80% of
    studies) is read by calibrating copies of it.

    Raises:
        ValueError: an assignment without ``=``, an unknown field, or a value that is not the
            field's type or breaks its rule (naming the field and the value).
    """
    fields = asdict(d)
    changes: dict[str, object] = {}
    for item in assignments:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"--set: expected FIELD=VALUE, got {item!r}")
        if name not in fields:
            raise ValueError(f"--set: {name!r} is not a field of Design; fields: {sorted(fields)}")
        old = fields[name]
        try:
            if isinstance(old, bool):
                if text.strip().lower() not in ("true", "false"):
                    raise ValueError(text)
                value: object = text.strip().lower() == "true"
            elif isinstance(old, int):
                value = int(text)
            elif isinstance(old, float):
                value = float(text)
            else:  # a tuple of numbers or of pairs
                parsed = ast.literal_eval(f"({text},)")
                nested = bool(old) and isinstance(old[0], tuple)
                value = tuple(tuple(float(v) for v in p) if nested else float(p) for p in parsed)
        except (ValueError, TypeError, SyntaxError):
            kind = {bool: "true or false", int: "an integer", float: "a number"}.get(
                type(old), "a comma-separated list"
            )
            raise ValueError(f"--set: {name}={text!r}: expected {kind}, like {old!r}") from None
        _check_value(name, text, value)
        changes[name] = value
    out = replace(d, **changes)
    if out.k > out.samples:
        raise ValueError(f"--set: k={out.k} is more than samples={out.samples}")
    return out


def design_from_fields(fields: Mapping[str, object], where: str) -> Design:
    """A design from a JSON object of `Design` fields, every other field at `Design`'s default:
    `python -m experiment fit-design`'s output (its ``settings``, the reference settings' names,
    are not a field and are skipped) or any subset, checked by `override`'s rules (``python -m
    experiment calibrate --design-file FILE``: a user's own study shape, calibrated without
    editing `DESIGNS`).

    Raises:
        ValueError: not an object, an unknown field, or a value that is not the field's type or
            breaks its rule; naming `where`, the field and the value.
    """
    if not isinstance(fields, Mapping):
        raise ValueError(f"{where}: expected a JSON object of Design fields, got "
                         f"{type(fields).__name__}")  # fmt: skip
    assignments = []
    for name, value in fields.items():
        if name == "settings":
            continue
        if isinstance(value, bool):
            text = str(value).lower()
        elif isinstance(value, (list, tuple)):  # the items, as `--set` writes them
            text = json.dumps(value)[1:-1].replace("[", "(").replace("]", ")")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
        assignments.append(f"{name}={text}")
    try:
        return override(Design(), assignments)
    except ValueError as err:
        raise ValueError(f"{where}: {str(err).removeprefix('--set: ')}") from None


def _check_value(name: str, text: str, value: object) -> None:
    """`override`'s rules for a parsed value of field `name` (`text` as given).

    Raises:
        ValueError: naming the field and the value.
    """

    def bad(rule: str) -> ValueError:
        return ValueError(f"--set: {name}={text!r} {rule}")

    if type(value) is int and value < 2:  # seeds, problems, samples, k
        raise bad("must be >= 2")
    numbers = np.ravel(np.asarray(value, dtype=np.float64)) if isinstance(value, tuple) else [value]
    if not isinstance(value, bool) and not np.all(np.isfinite(numbers)):
        raise bad("must be finite")
    if name.startswith("sigma") and value < 0:
        raise bad("must be >= 0")
    if name == "tau" and value <= 0:
        raise bad("must be > 0 (the problems' spread of logits)")
    if isinstance(value, tuple) and not value:
        raise bad("must hold at least one value")
    if name == "checkpoints" and (min(value) <= 0 or np.any(np.diff(value) <= 0)):
        raise bad("must be positive training amounts in increasing order")
    if name == "sharpenings" and (len(value) != 2 or value[0] >= value[1]):
        raise bad("must be two values, the smaller first")
    if name == "ref_settings" and any(len(p) != 2 for p in value):
        raise bad("must be (a, b) pairs, one per reference setting")


def quick(d: Design) -> Design:
    """A smaller copy of `d` for tests: a quarter of the confirmation's problems."""
    return replace(d, confirm_problems=max(64, d.confirm_problems // 4))
