"""Theorem 3.4 / B.10 of seed 000: does differential smoothing dominate the entropy bonus?

Claim (r̂ = r, policy anchor): for `β > 0, η ≥ 0` and `ε = D(π_ent‖π_b)`, with
`π_ent = entropy_regularized(log_pb, r, β, η)`, some DS parameters `β' > 0, γ_p ≥ 0, 0 ≤ γ_n < β'`
give `D(π_DS‖π_b) ≤ ε`, `P(π_DS) ≥ P(π_ent)` and `V(π_DS) ≤ V(π_ent)`, for four divergences `D`.

The search uses a reparametrization of the policy-anchored DS optimum (Lemma B.5, derived in
docs/theorem_3_4.md). With `κ_C = β'/(β'+γ_p) ∈ (0, 1]`, `κ_N = β'/(β'−γ_n) ∈ [1, ∞)` and
`g_S(k) = log Σ_{τ∈S} π_b(τ)^k`, the optimum is

    π_DS = P · π_b^{κ_C}/e^{g_C(κ_C)}  on C,      (1 − P) · π_b^{κ_N}/e^{g_N(κ_N)}  off C,

where `P = P(π_DS)` and `β'` are linked by

    1/β' = F(P) = (1 + log P − g_C(κ_C))/κ_C − (1 + log(1 − P) − g_N(κ_N))/κ_N.

`F` increases from −∞ to +∞ on `(0, 1)`, so for fixed `(κ_C, κ_N)` the DS family reaches exactly
the correctness values `P > P*(κ_C, κ_N)`, the root of `F` (the limit `β' → ∞`, which is not `P(π_b)`).
`V(π_DS)` depends on `κ_C` only and is increasing in it (constant iff `π_b` is constant on `C`), so
`V(π_DS) ≤ V(π_ent)` iff `κ_C ≤ κ = β/(β+η)`. Every divergence splits by the chain rule into a
convex function of `P` plus within-set terms, so for fixed `(κ_C, κ_N)` the least divergence with
`P ≥ P(π_ent)` is at `max(P(π_ent), P*, P_unconstrained)`; a grid plus local refinement over the
square `(κ_C/κ, 1/κ_N) ∈ (0, 1]²` finds the minimum over the family.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit, log_expit, logsumexp

from theory._validate import correct_mask, finite, log_probs, positive
from theory.measures import correctness, divergence, normalized_variance
from theory.optimum import differential_smoothing, entropy_regularized

TheoremDivergence = Literal["kl", "kl_reverse", "chi2", "chi2_reverse"]

#: The four divergences of Theorem B.10: `D(π‖π_b)` for "kl"/"chi2", `D(π_b‖π)` for "*_reverse".
DIVERGENCES: tuple[TheoremDivergence, ...] = ("kl", "kl_reverse", "chi2", "chi2_reverse")

#: Relative and absolute tolerance of every inequality of the theorem.
RTOL, ATOL = 1e-9, 1e-12

# Bounds of the search square: κ_C ≥ _A_MIN·κ_max, κ_N ≤ 1/_B_MIN (the limits are approached
# continuously; the certificate test covers them separately).
_A_MIN, _B_MIN = 1e-6, 1e-6
# Largest β' a witness may use: P is raised above P* until 1/β' ≥ _F_MIN.
_F_MIN = 1e-9


def theorem_divergence(log_pi: object, log_pb: object, kind: TheoremDivergence) -> float:
    """`D(π‖π_b)` ("kl", "chi2") or `D(π_b‖π)` ("kl_reverse", "chi2_reverse"), via `theory.measures`.

    Args:
        log_pi, log_pb: `(M,)` normalized log-probabilities.

    Raises:
        ValueError: unknown `kind`, or invalid inputs (see `theory.measures.divergence`).
    """
    if kind not in DIVERGENCES:
        raise ValueError(f"kind must be one of {DIVERGENCES}, got {kind!r}")
    base = "kl" if kind.startswith("kl") else "chi2"
    if kind.endswith("_reverse"):
        return float(divergence(log_pb, log_pi, base))
    return float(divergence(log_pi, log_pb, base))


def _leq(x: float, bound: float) -> bool:
    return x <= bound + RTOL * abs(bound) + ATOL


@dataclass(frozen=True)
class _Split:
    """Base log-probabilities on `C` (`lc`, `(|C|,)`) and off `C` (`ln`, `(|N|,)`)."""

    lc: np.ndarray
    ln: np.ndarray

    @classmethod
    def of(cls, log_pb: object, correct: object) -> _Split:
        lpb = log_probs(log_pb, "log_pb", require_finite=True)
        if lpb.ndim != 1:
            raise ValueError(f"log_pb must be one distribution of shape (M,), got {lpb.shape}")
        c = correct_mask(correct, lpb.size, need_both=True)
        return cls(lpb[c], lpb[~c])

    @property
    def log_pb_c(self) -> float:
        return float(logsumexp(self.lc))

    @property
    def log_pb_n(self) -> float:
        return float(logsumexp(self.ln))

    @property
    def flat_on_c(self) -> bool:
        """`π_b` constant on `C`: then `V ≡ 0` for every `κ_C`."""
        return bool(np.ptp(self.lc) <= 1e-12)


def _g(lp: np.ndarray, k: np.ndarray) -> np.ndarray:
    """`g(k) = log Σ_i exp(k·lp_i)`, shape of `k`."""
    k = np.asarray(k, dtype=np.float64)
    return logsumexp(k[..., None] * lp, axis=-1)


def _within(lp: np.ndarray, k: np.ndarray, kind: TheoremDivergence) -> np.ndarray:
    """Within-set term for `q_k ∝ π_b^k` against `b = π_b` restricted to the set, shape of `k`.

    KL kinds: `KL(q_k‖b)` or `KL(b‖q_k)`; χ² kinds: `log(1 + χ²)` in the same direction.
    """
    k = np.asarray(k, dtype=np.float64)
    g1 = float(logsumexp(lp))
    gk = _g(lp, k)
    if kind == "kl":
        w = np.exp(k[..., None] * lp - gk[..., None])
        return np.maximum((k - 1.0) * np.sum(w * lp, axis=-1) - gk + g1, 0.0)
    if kind == "kl_reverse":
        mean_b = float(np.sum(np.exp(lp - g1) * lp))
        return np.maximum((1.0 - k) * mean_b + gk - g1, 0.0)
    if kind == "chi2":
        return np.maximum(_g(lp, 2.0 * k - 1.0) - 2.0 * gk + g1, 0.0)
    return np.maximum(_g(lp, 2.0 - k) + gk - 2.0 * g1, 0.0)


def _total(
    t: np.ndarray, wc: np.ndarray, wn: np.ndarray, lpc: float, lpn: float, kind: TheoremDivergence
) -> np.ndarray:
    """Divergence of `P·q_C ⊕ (1−P)·q_N` from `π_b`, with `P = expit(t)` and within-set terms `wc, wn`."""
    lp, lq = log_expit(t), log_expit(-t)
    if kind == "kl":
        p = expit(t)
        return p * (lp - lpc + wc) + (1.0 - p) * (lq - lpn + wn)
    if kind == "kl_reverse":
        pc, pn = np.exp(lpc), np.exp(lpn)
        return pc * (lpc - lp + wc) + pn * (lpn - lq + wn)
    if kind == "chi2":
        return np.expm1(np.logaddexp(2 * lp - lpc + wc, 2 * lq - lpn + wn))
    return np.expm1(np.logaddexp(2 * lpc - lp + wc, 2 * lpn - lq + wn))


def _t_unconstrained(
    wc: np.ndarray, wn: np.ndarray, lpc: float, lpn: float, kind: TheoremDivergence
) -> np.ndarray:
    """`logit P` minimizing `_total` for fixed within-set terms (each total is convex in `P`)."""
    base = lpc - lpn
    if kind == "kl":
        return base - wc + wn
    if kind == "kl_reverse":
        return np.full(np.shape(wc), base)
    if kind == "chi2":
        # d/dP [P² X_C/P_b + (1−P)² X_N/(1−P_b)] = 0  →  P/(1−P) = (X_N/(1−P_b)) / (X_C/P_b).
        return (wn - lpn) - (wc - lpc)
    return base + 0.5 * (wc - wn)


def _f_of_t(t: np.ndarray, kc, kn, gc, gn) -> np.ndarray:
    """`F(P) = 1/β'` at `P = expit(t)` (module docstring); increasing in `t`."""
    return (1.0 + log_expit(t) - gc) / kc - (1.0 + log_expit(-t) - gn) / kn


def _t_star(kc, kn, gc, gn) -> np.ndarray:
    """`logit P*(κ_C, κ_N)`: the root of `F` (vectorized bisection; `F` is increasing)."""
    kc, kn, gc, gn = np.broadcast_arrays(
        *(np.asarray(x, dtype=np.float64) for x in (kc, kn, gc, gn))
    )
    lo = np.full(kc.shape, -1.0)
    hi = np.full(kc.shape, 1.0)
    for _ in range(60):  # expand the bracket: F(t) ~ t/κ_C for t → −∞ and ~ t/κ_N for t → +∞
        bad_lo = _f_of_t(lo, kc, kn, gc, gn) > 0
        bad_hi = _f_of_t(hi, kc, kn, gc, gn) < 0
        if not (bad_lo.any() or bad_hi.any()):
            break
        lo = np.where(bad_lo, 4.0 * lo, lo)
        hi = np.where(bad_hi, 4.0 * hi, hi)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        up = _f_of_t(mid, kc, kn, gc, gn) > 0
        hi = np.where(up, mid, hi)
        lo = np.where(up, lo, mid)
    return hi


def reachable_correctness_bound(
    log_pb: object, correct: object, kappa_c: float, kappa_n: float
) -> float:
    """`P*(κ_C, κ_N)`: the DS optima with these exponents have exactly the correctness values `P > P*`.

    `P*` is the limit `β' → ∞` at fixed `(κ_C, κ_N)`; it equals `P(π_b)` only for `κ_C = κ_N = 1`.

    Args:
        log_pb: `(M,)` base log-probabilities, finite. correct: `(M,)` mask with both kinds.
        kappa_c: `β'/(β'+γ_p)` in `(0, 1]`. kappa_n: `β'/(β'−γ_n)` in `[1, ∞)`.

    Raises:
        ValueError: exponents out of range; invalid inputs.
    """
    s = _Split.of(log_pb, correct)
    kc, kn = _kappas(kappa_c, kappa_n)
    return float(expit(_t_star(kc, kn, _g(s.lc, kc), _g(s.ln, kn))))


def _kappas(kappa_c: float, kappa_n: float) -> tuple[float, float]:
    kc, kn = positive(kappa_c, "kappa_c"), finite(kappa_n, "kappa_n")
    if kc > 1.0 or kn < 1.0:
        raise ValueError(
            f"need 0 < kappa_c <= 1 and kappa_n >= 1 (gamma_p, gamma_n >= 0), got {kc}, {kn}"
        )
    return kc, kn


def ds_family_params(
    log_pb: object, correct: object, kappa_c: float, kappa_n: float, p: float
) -> tuple[float, float, float]:
    """DS parameters `(β', γ_p, γ_n)` whose policy-anchored optimum has exponents `κ_C, κ_N` and `P(π) = p`.

    `1/β' = F(p)`, `γ_p = β'(1/κ_C − 1)`, `γ_n = β'(1 − 1/κ_N)` (module docstring; seed 000, Lemma B.5).

    Raises:
        ValueError: `p ≤ P*(κ_C, κ_N)` (not reachable: `β'` would be `≤ 0` or infinite); bad inputs.
    """
    s = _Split.of(log_pb, correct)
    kc, kn = _kappas(kappa_c, kappa_n)
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    t = np.log(p) - np.log1p(-p)
    f = float(_f_of_t(t, kc, kn, _g(s.lc, kc), _g(s.ln, kn)))
    if not f > 0.0:
        raise ValueError(
            f"correctness {p!r} is not reachable with kappa_c={kc}, kappa_n={kn}: F(p) = {f:.3g} <= 0"
        )
    beta = 1.0 / f
    return beta, beta * (1.0 / kc - 1.0), beta * (1.0 - 1.0 / kn)


def construction_margin(log_pb: object, correct: object, beta: float, eta: float) -> float:
    """`β·F(P(π_ent))` at `κ_C = κ = β/(β+η)`, `κ_N = 1`: the paper's construction is reachable iff `> 0`.

    In closed form, with `Z = e^{1/(β+η)}·Σ_C π_b^κ + Σ_N π_b^κ`:

        margin = 1 + η·(1 − log Z) − β·log(Σ_N π_b^κ / Σ_N π_b).

    Then `β' = β/margin`, `γ_p = β'·η/β`, `γ_n = 0` give `π_DS = π_ent` on `C` (equal `P` and `V`) and
    `π_DS ∝ π_b` off `C`, whose divergence is at most `D(π_ent‖π_b)` for all four `D` (chain rule).

    Args:
        log_pb: `(M,)` finite base log-probabilities; correct: `(M,)` mask with both kinds.
        beta: `> 0`; eta: `≥ 0`.
    """
    s = _Split.of(log_pb, correct)
    beta, eta = _beta_eta(beta, eta)
    kappa = beta / (beta + eta)
    gc, gn = float(_g(s.lc, kappa)), float(_g(s.ln, kappa))
    log_z = float(np.logaddexp(1.0 / (beta + eta) + gc, gn))
    return 1.0 + eta * (1.0 - log_z) - beta * (gn - s.log_pb_n)


def _beta_eta(beta: float, eta: float) -> tuple[float, float]:
    beta, eta = positive(beta, "beta"), finite(eta, "eta")
    if eta < 0:
        raise ValueError(f"eta must be >= 0 (entropy bonus), got {eta!r}")
    return beta, eta


def paper_construction(
    log_pb: object, correct: object, beta: float, eta: float
) -> tuple[float, float, float] | None:
    """The proof's DS parameters `(β', γ_p, 0)` (keep `κ`, match `P`), or None where unreachable.

    Source: seed 000, Lemmas B.6–B.9, Step 3; reachability is `construction_margin > 0`.
    """
    margin = construction_margin(log_pb, correct, beta, eta)
    if not margin > 0:
        return None
    beta_ds = beta / margin
    return beta_ds, beta_ds * eta / beta, 0.0


@dataclass
class WitnessSearch:
    """Outcome of `search_witness` (JSON-serializable through `as_dict`).

    Attributes:
        found: a DS witness satisfies the three inequalities (checked on the full optimum).
        epsilon, p_ent, v_ent: `D(π_ent‖π_b)`, `P(π_ent)`, `V(π_ent)`.
        min_divergence: infimum of `D(π_DS)` over the searched family with `P ≥ P(π_ent)`,
            `V ≤ V(π_ent)`, including the limits `β' → ∞` (found iff `≤ ε` within tolerance).
        kappa_c, kappa_n, p: the minimizer in the `(κ_C, κ_N, P)` parametrization.
        params: `(β', γ_p, γ_n)` of the witness or, without one, of the best attempt (the minimizer,
            with `P` raised just above `P*` so that `β'` is finite).
        p_ds, v_ds, d_ds: `P`, `V`, `D` of `differential_smoothing(*params)`.
        residual: largest difference between the closed form and `theory.measures` at the points
            realized: of `D` relative to `max(1, D)`, and of `P`.
    """

    kind: str
    positive_only: bool
    found: bool
    epsilon: float
    p_ent: float
    v_ent: float
    min_divergence: float
    kappa_c: float
    kappa_n: float
    p: float
    params: tuple[float, float, float] | None
    p_ds: float
    v_ds: float
    d_ds: float
    residual: float

    def as_dict(self) -> dict:
        return asdict(self)


class _Objective:
    """Least divergence with `P ≥ P(π_ent)` at exponents `(κ_C, κ_N) = (a·κ_max, 1/b)`, vectorized."""

    def __init__(self, s: _Split, kappa_max: float, t_ent: float, kind: TheoremDivergence):
        self.s, self.kappa_max, self.t_ent, self.kind = s, kappa_max, t_ent, kind
        self.lpc, self.lpn = s.log_pb_c, s.log_pb_n

    def solve(self, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
        kc, kn = np.broadcast_arrays(
            np.asarray(a, dtype=np.float64) * self.kappa_max, 1.0 / np.asarray(b, dtype=np.float64)
        )
        gc, gn = _g(self.s.lc, kc), _g(self.s.ln, kn)
        wc = _within(self.s.lc, kc, self.kind)
        wn = _within(self.s.ln, kn, self.kind)
        t_unc = _t_unconstrained(wc, wn, self.lpc, self.lpn, self.kind)
        t = np.maximum(np.maximum(self.t_ent, _t_star(kc, kn, gc, gn)), t_unc)
        with np.errstate(over="ignore"):
            d = _total(t, wc, wn, self.lpc, self.lpn, self.kind)
        return {"kc": kc, "kn": kn, "gc": gc, "gn": gn, "wc": wc, "wn": wn, "t": t, "d": d}


def _grid_search(
    obj: _Objective, positive_only: bool, grid: int, zooms: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Evaluate `obj` on a log-spaced grid of `(a, b) ∈ [_A_MIN, 1] × [_B_MIN, 1]`, then zoom in.

    Each zoom level puts a 9×9 log-spaced grid, 4× narrower than the last, around each of the three
    best points so far. Returns all evaluated `a`, `b` and divergences, flat.
    """
    axis = np.concatenate([np.geomspace(_A_MIN, 1.0, grid - 1, endpoint=False), [1.0]])
    aa, bb = np.meshgrid(axis, [1.0] if positive_only else axis, indexing="ij")
    a_all, b_all = aa.ravel(), bb.ravel()
    d_all = obj.solve(a_all, b_all)["d"]
    width = np.log(axis[1] / axis[0])  # log-width of one coarse cell
    offsets = np.linspace(-1.0, 1.0, 9)
    for _ in range(zooms):
        best = np.argsort(d_all)[:3]
        la = np.log(a_all[best])[:, None, None] + width * offsets[None, :, None]
        lb = np.log(b_all[best])[:, None, None] + width * offsets[None, None, :]
        la, lb = np.broadcast_arrays(la, np.zeros(1) if positive_only else lb)
        a_new = np.clip(np.exp(la), _A_MIN, 1.0).ravel()
        b_new = np.clip(np.exp(lb), _B_MIN, 1.0).ravel()
        a_all = np.concatenate([a_all, a_new])
        b_all = np.concatenate([b_all, b_new])
        d_all = np.concatenate([d_all, obj.solve(a_new, b_new)["d"]])
        width /= 4.0
    return a_all, b_all, d_all


def search_witness(
    log_pb: object,
    correct: object,
    beta: float,
    eta: float,
    kind: TheoremDivergence,
    *,
    positive_only: bool = False,
    grid: int = 25,
    zooms: int = 6,
) -> WitnessSearch:
    """Search the policy-anchored DS family for a witness of Theorem 3.4 / B.10 (seed 000).

    Minimizes `D(π_DS‖π_b)` (or the reverse) over `κ_C ∈ (0, κ_max]`, `κ_N ∈ [1, ∞)` (`κ_N = 1` if
    `positive_only`, i.e. `γ_n = 0`) and reachable `P ≥ P(π_ent)` (module docstring). For fixed
    exponents the best `P` is exact (`max(P(π_ent), P*, P_unconstrained)`, by convexity in `P`); the
    exponents are searched on a `grid × grid` log-spaced grid of `(κ_C/κ_max, 1/κ_N)` refined by
    `zooms` zoom levels. `κ_max = κ` (`V` is strictly increasing in `κ_C`), or 1 if `π_b` is constant on
    `C`. Among the grid points within `ε`, the best-conditioned (largest `min(κ_C/κ_max, 1/κ_N)`) is
    turned into `(β', γ_p, γ_n)` and checked on `theory.optimum.differential_smoothing`.

    Args:
        log_pb: `(M,)` finite base log-probabilities. correct: `(M,)` mask with both kinds.
        beta: `> 0`; eta: `≥ 0`; kind: one of `DIVERGENCES`.

    Returns:
        A `WitnessSearch`; `found` is True iff a verified witness exists.

    Raises:
        ValueError: bad inputs (empty or full correct set, `eta < 0`, unknown `kind`).
    """
    if kind not in DIVERGENCES:
        raise ValueError(f"kind must be one of {DIVERGENCES}, got {kind!r}")
    s = _Split.of(log_pb, correct)
    beta, eta = _beta_eta(beta, eta)
    lpb = np.asarray(log_pb, dtype=np.float64)
    c = np.asarray(correct, dtype=bool)
    log_ent = entropy_regularized(lpb, c.astype(np.float64), beta, eta, anchor="policy")
    eps = theorem_divergence(log_ent, lpb, kind)
    p_ent, v_ent = correctness(log_ent, c), normalized_variance(log_ent, c)
    kappa_max = 1.0 if s.flat_on_c else beta / (beta + eta)
    t_ent = float(logsumexp(log_ent[c]) - logsumexp(log_ent[~c]))
    obj = _Objective(s, kappa_max, t_ent, kind)

    a_all, b_all, d_all = _grid_search(obj, positive_only, grid, zooms)
    i_min = int(np.argmin(d_all))
    best = {k: float(v) for k, v in obj.solve(a_all[i_min], b_all[i_min]).items()}
    out = WitnessSearch(
        kind=kind,
        positive_only=positive_only,
        found=False,
        epsilon=eps,
        p_ent=p_ent,
        v_ent=v_ent,
        min_divergence=best["d"],
        kappa_c=best["kc"],
        kappa_n=best["kn"],
        p=float(expit(best["t"])),
        params=None,
        p_ds=np.nan,
        v_ds=np.nan,
        d_ds=np.nan,
        residual=0.0,
    )
    within = np.flatnonzero(d_all <= eps + RTOL * abs(eps) + ATOL)
    order = within[np.argsort(-np.minimum(a_all[within], b_all[within]), kind="stable")]
    # Try the best-conditioned points within ε first; without any, realize the minimizer as the
    # best attempt (reported, not a witness).
    for i in [*order[:3], i_min]:
        sol = {k: float(v) for k, v in obj.solve(a_all[i], b_all[i]).items()}
        t = _finite_beta_logit(sol)
        f = float(_f_of_t(t, sol["kc"], sol["kn"], sol["gc"], sol["gn"]))
        beta_ds = 1.0 / f
        params = (beta_ds, beta_ds * (1.0 / sol["kc"] - 1.0), beta_ds * (1.0 - 1.0 / sol["kn"]))
        log_ds = differential_smoothing(lpb, c, *params, anchor="policy")
        out.params = tuple(float(x) for x in params)
        out.p_ds, out.v_ds = correctness(log_ds, c), normalized_variance(log_ds, c)
        out.d_ds = theorem_divergence(log_ds, lpb, kind)
        fast = float(_total(t, sol["wc"], sol["wn"], obj.lpc, obj.lpn, kind))
        rel = abs(fast - out.d_ds) / max(1.0, abs(out.d_ds))
        out.residual = max(out.residual, rel, abs(float(expit(t)) - out.p_ds))
        out.found = _leq(out.d_ds, eps) and _leq(-out.p_ds, -p_ent) and _leq(out.v_ds, v_ent)
        if out.found or not within.size:
            break
    return out


def _finite_beta_logit(sol: dict[str, float]) -> float:
    """The least `logit P ≥ sol["t"]` on a ladder of steps with `F ≥ _F_MIN`, i.e. `β' ≤ 1/_F_MIN`.

    `F` is increasing and unbounded, so the ladder (relative steps up to 10^30) always ends."""
    args = (sol["kc"], sol["kn"], sol["gc"], sol["gn"])
    scale = max(1.0, abs(sol["t"]))
    for step in [0.0, *(scale * 10.0 ** np.arange(-12.0, 31.0))]:
        if float(_f_of_t(sol["t"] + step, *args)) >= _F_MIN:
            return sol["t"] + step
    raise AssertionError("F is unbounded above: unreachable")


def _entropy_tempered(lp: np.ndarray, k: float) -> float:
    """Entropy of `q_k ∝ exp(k·lp)`; decreasing in `k > 0`, `log(len(lp))` at `k = 0`."""
    z = k * lp - logsumexp(k * lp)
    return float(-np.sum(np.exp(z) * z))


def _sup_f(s: _Split, kappa_max: float, t: float) -> float:
    """`sup F(P)` over `κ_C ∈ (0, κ_max]`, `κ_N ∈ [1, ∞)` at `P = expit(t)` (`+inf` if unbounded).

    `F = T_C(κ_C) + T_N(κ_N)` separates. With `v = 1/κ_C`, `T_C = v(1 + log P) − v·g_C(1/v)` is
    concave with derivative `1 + log P − H(q_{κ_C})` (`H` the entropy of `q_{κ_C} ∝ π_b^{κ_C}` on `C`,
    decreasing in `κ_C`): its sup is at `κ_C = κ_max` or where `H(q_{κ_C}) = 1 + log P`. With
    `u = 1/κ_N`, `T_N = −u(1 + log(1−P)) + u·g_N(1/u)` is convex (a perspective), so its sup over
    `u ∈ (0, 1]` is at `u = 1` or the limit `u → 0`, `max_N log π_b`.
    """
    target = 1.0 + float(log_expit(t))
    if _entropy_tempered(s.lc, kappa_max) >= target:
        k = kappa_max
    elif np.log(s.lc.size) <= target:
        return np.inf
    else:
        k = brentq(lambda x: _entropy_tempered(s.lc, x) - target, 0.0, kappa_max, xtol=1e-15)
    sup_c = (target - float(_g(s.lc, k))) / k
    sup_n = max(float(np.max(s.ln)), s.log_pb_n - 1.0 - float(log_expit(-t)))
    return sup_c + sup_n


def _family_min_logit(s: _Split, kappa_max: float) -> float:
    """`logit P_min` (see `family_min_correctness`)."""
    lo, hi = -1.0, 1.0
    while _sup_f(s, kappa_max, lo) > 0:
        lo *= 2.0
    while _sup_f(s, kappa_max, hi) <= 0:
        hi *= 2.0
    return brentq(lambda t: _sup_f(s, kappa_max, t), lo, hi, xtol=1e-13, rtol=1e-15)


def family_min_correctness(log_pb: object, correct: object, kappa_max: float) -> float:
    """`inf P(π_DS)` over all policy-anchored DS optima with `κ_C ≤ κ_max` (`γ_p, γ_n ≥ 0`).

    The family reaches exactly `P > P_min`, `P_min` the root of the increasing `sup F` (`_sup_f`).
    With `κ_max = κ` this is every DS optimum with `V(π_DS) ≤ V(π_ent)` (unless `π_b` is flat on `C`).
    """
    s = _Split.of(log_pb, correct)
    kappa_max = positive(kappa_max, "kappa_max")
    if kappa_max > 1.0:
        raise ValueError(f"kappa_max must be <= 1 (gamma_p >= 0), got {kappa_max!r}")
    return float(expit(_family_min_logit(s, kappa_max)))


def divergence_lower_bound(
    log_pb: object, correct: object, beta: float, eta: float, kind: TheoremDivergence
) -> float:
    """A proven lower bound on `D` over every DS optimum with `P ≥ P(π_ent)` and `V ≤ V(π_ent)`.

    By the chain rule `D = φ(P) + (within-C term) + (within-N term)`; the within-`C` term is
    decreasing in `κ_C` on `(0, 1]` for all four divergences, so it is at least its value at
    `κ_max`; the within-`N` term is `≥ 0`; every reachable `P` exceeds `family_min_correctness`;
    and the remaining function of `P` is convex. If the bound exceeds `ε = D(π_ent‖π_b)`, no witness
    exists: a certificate for a counterexample to Theorem 3.4 / B.10 (seed 000).

    Args:
        log_pb: `(M,)` finite base log-probabilities; correct: `(M,)` mask with both kinds.
        beta: `> 0`; eta: `≥ 0`; kind: one of `DIVERGENCES`.
    """
    s = _Split.of(log_pb, correct)
    beta, eta = _beta_eta(beta, eta)
    kappa_max = 1.0 if s.flat_on_c else beta / (beta + eta)
    lpb = np.asarray(log_pb, dtype=np.float64)
    c = np.asarray(correct, dtype=bool)
    log_ent = entropy_regularized(lpb, c.astype(np.float64), beta, eta, anchor="policy")
    t_ent = float(logsumexp(log_ent[c]) - logsumexp(log_ent[~c]))
    wc = _within(s.lc, np.asarray(kappa_max), kind)
    wn = np.zeros(())
    t_unc = float(_t_unconstrained(wc, wn, s.log_pb_c, s.log_pb_n, kind))
    t = max(t_ent, _family_min_logit(s, kappa_max), t_unc)
    with np.errstate(over="ignore"):
        return float(_total(np.asarray(t), wc, wn, s.log_pb_c, s.log_pb_n, kind))
