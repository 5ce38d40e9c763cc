"""Select, then confirm: the two stages of a study and the verdicts of the seeds' claims.

A study is an *exploratory* sweep (every method's coefficient swept, with the same tuning budget as
GRPO: its learning rates and checkpoints) and a *confirmation* sweep that re-trains only the picks
on fresh training seeds and evaluates them on fresh problems. Both stages are analysed by
`experiment.report.lift_analysis` (`experiment.inference.lift_inference`: the lift over GRPO's
concave hull):

- `select`: per method label, the exploratory model with the **largest lift estimate** (a rule
  fixed before the data; calibrated with the rest of the pipeline: `experiment.calibration`);
  a label none of whose models is inside GRPO's range gets the model nearest it;
- `confirm`: per picked label, its confirmation lift, interval, p-value, Holm's adjusted p-value
  over the picked labels (`experiment.inference.holm`) and the minimum detectable lift at 80% power
  at the first step of Holm's procedure (level `alpha / n`);
- `claim_verdicts` (one claim: `claim_verdict`): "X lifts the measure by at least `size`" in one
  of five words, each one meaning (`VERDICTS`): **supported** (the lift is > 0 after Holm and its
  interval reaches `size`), **smaller than claimed** (> 0 after Holm, and the claimed size is
  excluded after Holm: its interval lies below `size`), **not better than GRPO** (the claimed size
  excluded after Holm, the lift neither > 0 nor < 0 after Holm), **below GRPO** (< 0 after Holm,
  or, for a pick below GRPO's range, one of GRPO's models beats it on both axes: `dominated`),
  **not resolved** (none of these; the MDE says what the confirmation could detect). The claimed
  size is excluded by Holm over the one-sided tests of "lift ≥ size" of the study's claims
  (`size_p`, `size_tests`), so refutations are controlled across a study's claims as supports
  are; the words compare with GRPO as the study tuned it, whatever the budgets (an unequal budget
  marks the study's column instead: `claim_rows`' ``budget``);
- `sharpening_verdict`: the claim "GRPO sharpens" from GRPO's final checkpoint in the
  confirmation: pass@1 gain > 0 and the measure's gain < 0, both intervals excluding 0
  (`SHARPENING_VERDICTS`);
- `translate`: the five words for a study.json written with the words before them (*refuted*,
  *not better than tuned GRPO*: `OLD_VERDICTS`);
- `problems_for`, `design_for`: the power calculation (problems; seeds × problems by cost).

Only exploratory lifts are reported per comparison; every verdict comes from the confirmation.
The reports (verdicts.md, the claims table), provenance and publishing: `experiment.study_report`.
Sources: docs/statistics.md (the two-stage design, the verdict words); Holm (1979).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import special

from experiment import covariance, estimand, inference

__all__ = [
    "CLAIMS",
    "OLD_VERDICTS",
    "PICK_KEYS",
    "PICK_RULE",
    "PICK_RULES",
    "SHARPENING_VERDICTS",
    "VERDICTS",
    "claim_rows",
    "claim_verdict",
    "claim_verdicts",
    "conclude",
    "confirm",
    "design_for",
    "dominated",
    "pick",
    "problems_for",
    "reference_spread",
    "select",
    "sharpening_verdict",
    "shrunk_lifts",
    "size_p",
    "size_tests",
    "spread_row",
    "translate",
]

VERDICTS = (
    "supported",
    "smaller than claimed",
    "not better than GRPO",
    "below GRPO",
    "not resolved",
)
"""A method's claim words (`claim_verdict`), one meaning each (module docstring)."""

SHARPENING_VERDICTS = ("supported", "pass@k rises", "not resolved")
"""The words of "GRPO sharpens" (`sharpening_verdict`)."""

OLD_VERDICTS = {
    "refuted": "not better than GRPO",
    "not better than tuned GRPO": "not better than GRPO",
}
"""Words of study.json files written before the five claim words and the word each reads as
(`translate`; *below GRPO* where the record says so)."""

PICK_KEYS = ("setting", "step", "params", "lift", "lift_lo", "lift_hi")
"""What study.json keeps of a pick (its setting, checkpoint and exploratory lift)."""

CLAIMS = (
    ("grpo_sharpens", "grpo", "pass_at_k", "GRPO sharpens: pass@1 rises while large-k pass@k falls"),
    ("ds_grpo", "ds_grpo", "pass_at_k", "DS-GRPO beats GRPO's trade-off (pass@k at matched pass@1)"),
    ("entropy_bonus", "entropy_bonus", "distinct_correct",
     "the entropy bonus keeps diversity (distinct correct) per unit of pass@1"),
    ("casp", "casp", "pass_at_k", "CaSP keeps the candidates' support (pass@k at matched pass@1)"),
    ("unlikeliness", "unlikeliness", "pass_at_k", "the unlikeliness reward keeps pass@k"),
    ("w_reinforce", "w_reinforce", "pass_at_k",
     "W-REINFORCE (down-weighted positive samples) keeps pass@k"),
    # The field's controls, each its source's claim:
    ("clip_cov", "clip_cov", "pass_at_k", "Clip-Cov keeps pass@k (Cui et al. 2025)"),
    ("kl_cov", "kl_cov", "pass_at_k", "KL-Cov keeps pass@k (Cui et al. 2025)"),
    ("clip_higher", "clip_higher", "distinct_correct",
     "clip-higher keeps diversity (DAPO: against entropy collapse)"),
    ("top_entropy", "top_entropy", "pass_at_k",
     "training on the high-entropy 20% of tokens keeps pass@k (Wang et al. 2025)"),
    ("adaptive_entropy", "adaptive_entropy", "distinct_correct",
     "an adaptive entropy coefficient keeps diversity (Skywork-OR1)"),
    ("outcome_ucb", "outcome_ucb", "pass_at_k",
     "outcome-based exploration keeps pass@k (Song et al. 2025)"),
)  # fmt: skip
"""The seeds' claims: `(id, method label, measure, text)`; the label is looked up in a study's
confirmation (a claim whose method a study lacks is left out of its table)."""


_WITH_LIFT = ("inside", "above")
"""The statuses a lift is defined at (`experiment.estimand`, lift v4: above the reference's range
its hull is continued)."""


def _inside(m: Mapping[str, Any]) -> bool:
    """A testable comparison: a lift (inside the reference's range or above it) with a p-value
    (standard error > 0)."""
    return m["status"] in _WITH_LIFT and m["lift"] is not None and m.get("lift_p") is not None


def _never_moved(m: Mapping[str, Any]) -> bool:
    """Inside the range with a lift but no p-value: its standard error is 0 (it never left the
    base)."""
    return m["status"] in _WITH_LIFT and m["lift"] is not None and m.get("lift_p") is None


PICK_RULES = ("estimate", "t", "shrunk")
"""The pick rules `select` knows: the largest lift estimate, the largest t (estimate / standard
error), the largest empirical-Bayes shrunk estimate (`shrunk_lifts`)."""

PICK_RULE = "estimate"
"""The pick rule of every study, chosen by the calibration over all its designs together: the
largest picks' mean true lift (docs/statistics.md, `experiment.calibration`)."""


def shrunk_lifts(lift: object, se: object) -> np.ndarray:
    """Empirical-Bayes estimates of the true lifts of one method's candidate models `(n,)`: each
    estimate `lift` (standard error `se`, both `(n,)`, > 0) pulled toward the candidates' common
    mean by its own precision, ``mu + tau² / (tau² + se²) · (lift − mu)``, with the normal prior's
    ``mu`` and ``tau²`` by DerSimonian & Laird's (1986) moment estimator (random-effects
    meta-analysis). With ``tau² = 0`` every candidate gets ``mu``.

    Raises:
        ValueError: `lift` and `se` not two `(n,)` arrays, or an `se` not finite and > 0.
    """
    lift, se = np.asarray(lift, dtype=np.float64), np.asarray(se, dtype=np.float64)
    if lift.shape != se.shape or lift.ndim != 1:
        raise ValueError(f"lift, se: expected two (n,) arrays, got {lift.shape} and {se.shape}")
    if not (np.all(np.isfinite(se)) and np.all(se > 0)):
        raise ValueError(f"se: expected finite values > 0, got {se}")
    w = 1.0 / se**2
    fixed = float(w @ lift / w.sum())
    q = float(w @ (lift - fixed) ** 2)
    denom = w.sum() - (w**2).sum() / w.sum()
    tau2 = max(0.0, (q - (lift.size - 1)) / denom) if lift.size > 1 and denom > 0 else 0.0
    w_re = 1.0 / (se**2 + tau2)
    mu = float(w_re @ lift / w_re.sum())
    return mu + tau2 / (tau2 + se**2) * (lift - mu)


def _scores(ms: Sequence[Mapping[str, Any]], rule: str) -> np.ndarray:
    """`(n,)` the pick rule's score of one label's candidate models (`PICK_RULES`)."""
    lift = np.array([m["lift"] for m in ms], dtype=np.float64)
    if rule == "estimate":
        return lift
    se = np.array([m["lift_se"] for m in ms], dtype=np.float64)
    if rule == "t":
        return lift / se
    return shrunk_lifts(lift, se)


def select(
    section: Mapping[str, Any], labels: Sequence[str] | None = None, rule: str = PICK_RULE
) -> dict[str, dict]:
    """The exploratory picks: per non-reference label (or each of `labels`), its model (record of
    `lift_analysis`'s section) with the largest score of `rule` among models with a lift (inside
    the reference's pass@1 range or above it; ties: the first). The default, the largest
    estimate, is chosen by the calibration over all its designs together (docs/statistics.md):
    its picks' mean true lift is +2.65 points over the 16 (method, design) cells with a better
    setting, against +2.53 for the largest t and +2.47 for shrinkage (a model's standard error
    grows with how far it moved, and so does a good setting's lift, so shrinkage picks
    less-moved models whose true lift is smaller); a lower bound prefers models whose position
    gives a small standard error, not a large lift (in an earlier version's calibration it picked
    the best of three settings in 50-74% of studies, the largest estimate in 84-87%). A label
    none of whose models has a lift, but some below the range (less pass@1 than the base and
    every GRPO model), gets its model nearest the range: the largest share
    of draws with a lift (``inside_fraction``), then the largest pass@1; the curve-free check
    decides its claim (`dominated`). A label with neither is left out (its models never left the
    base).

    Args:
        section: one measure's section of `experiment.report.lift_analysis`.
        rule: one of `PICK_RULES` (default `PICK_RULE`): the score a label's models are ranked
            by (ties: the first model).

    Raises:
        ValueError: an unknown `rule`.
    """
    if rule not in PICK_RULES:
        raise ValueError(f"rule: expected one of {PICK_RULES}, got {rule!r}")
    cands: dict[str, list[dict]] = {}
    nearest: dict[str, tuple[tuple[float, float], dict]] = {}
    order: list[str] = []
    for m in section["models"]:
        label = m["label"]
        if m["reference"] or (labels is not None and label not in labels):
            continue
        if label not in order:
            order.append(label)
        if _inside(m):
            cands.setdefault(label, []).append(m)
        elif m["status"] == "below":
            near = (m.get("inside_fraction") or 0.0, m["x"])
            if label not in nearest or near > nearest[label][0]:
                nearest[label] = (near, m)
    best = {label: ms[int(np.argmax(_scores(ms, rule)))] for label, ms in cands.items()}
    return {label: best[label] if label in best else nearest[label][1]
            for label in order if label in best or label in nearest}  # fmt: skip


def confirm(
    section: Mapping[str, Any], labels: Sequence[str], *, alpha: float = 0.05, power: float = 0.8
) -> dict[str, dict]:
    """Per picked label, its confirmation result: ``{lift, lo, hi, se, df, p, p_holm, mde,
    verdict ("above" | "below" | "none"), x, y, setting, step, dominated_by, dominance_level
    (alpha over the picks, the curve-free check's level)}`` (lift, interval and MDE in the
    measure's units; None where the model fell below the reference's range, which counts as
    not resolved). Holm is over the labels with a lift.

    Args:
        section: one measure's section of the confirmation's `lift_analysis`; each label must have
            exactly one non-reference model in it (the pick).

    Raises:
        ValueError: a label with no model or with several in `section`.
    """
    models: dict[str, dict] = {}
    for label in labels:
        found = [m for m in section["models"] if m["label"] == label and not m["reference"]]
        if len(found) != 1:
            raise ValueError(f"confirmation: label {label!r} has {len(found)} models, expected 1")
        models[label] = found[0]
    p = np.array([m["lift_p"] if _inside(m) else np.nan for m in models.values()], dtype=float)
    adj = inference.holm(p)
    n = int(np.isfinite(p).sum())
    out = {}
    for (label, m), a in zip(models.items(), adj, strict=True):
        ok = _inside(m)
        mde = None
        if ok:
            level = alpha / max(n, 1)
            mde = float(covariance.minimum_detectable(m["lift_se"], m["lift_df"], alpha=level,
                                                    power=power))  # fmt: skip
        verdict = "none"
        if ok and a <= alpha:
            verdict = "above" if m["lift"] > 0 else "below"
        out[label] = {
            "setting": m["setting"], "step": m["step"], "x": m["x"], "y": m["y"],
            "lift": m["lift"] if ok else None, "lo": m["lift_lo"] if ok else None,
            "hi": m["lift_hi"] if ok else None, "se": m["lift_se"] if ok else None,
            "df": m["lift_df"] if ok else None, "p": m["lift_p"] if ok else None,
            "p_holm": float(a) if ok else None, "mde": mde, "verdict": verdict,
            "components": m.get("lift_var") if ok else None, "level": alpha / max(n, 1),
            "status": "se 0" if _never_moved(m) else m["status"],
            "dominated_by": m.get("dominated_by"), "dominance_level": alpha / len(models),
        }  # fmt: skip
    return out


def size_p(result: Mapping[str, Any], size: float) -> float | None:
    """The one-sided p-value of "lift ≥ `size`" of a `confirm` record: `F_t((lift − size) / se)`
    with its Satterthwaite df (the t of its interval and of its Holm test), None without a lift or
    a standard error > 0.

    Args:
        result: ``{lift, se, df}`` in the measure's units. size: the claimed lift, same units.
    """
    lift, se, df = result.get("lift"), result.get("se"), result.get("df")
    if lift is None or se is None or df is None or not se > 0:
        return None
    return float(special.stdtr(df, (lift - size) / se))  # stats.t.cdf's kernel


def size_tests(
    results: Mapping[str, Mapping[str, Any]], sizes: Mapping[str, float]
) -> dict[str, tuple[float | None, float | None]]:
    """Per claim of `results` (``{claim: confirm record}``, one family: a study's claims),
    `size_p` at its claimed size (`sizes`, same keys) and that p adjusted by Holm over the family
    (`experiment.inference.holm`; the claims without a p are not in the family):
    ``{claim: (p, p_holm)}`` (None, None without a p)."""
    keys = list(results)
    p = [size_p(results[k], sizes[k]) for k in keys]
    adj = inference.holm(np.array([np.nan if v is None else v for v in p], dtype=float))
    return {k: (v, None if v is None else float(a)) for k, v, a in zip(keys, p, adj, strict=True)}


def claim_verdicts(
    results: Mapping[str, Mapping[str, Any]],
    size: float | Mapping[str, float],
    *,
    alpha: float = 0.05,
) -> dict[str, str]:
    """Every claim's word (`claim_verdict`) of one family (a study's claims, or a simulated
    study's picks: `experiment.calibration`), the claimed size excluded by Holm over the family.

    Args:
        results: ``{claim: confirm record}``. size: the claimed lift of every claim, or
            ``{claim: size}``, in the records' units. alpha: the family-wise level (`confirm`'s).
    """
    sizes = dict(size) if isinstance(size, Mapping) else dict.fromkeys(results, float(size))
    tests = size_tests(results, sizes)
    return {k: claim_verdict(r, sizes[k], alpha=alpha, size_p_holm=tests[k][1])
            for k, r in results.items()}  # fmt: skip


def claim_verdict(
    result: Mapping[str, Any],
    size: float,
    *,
    alpha: float = 0.05,
    size_p_holm: float | None = None,
) -> str:
    """The word of "the method lifts the measure by at least `size`" from its `confirm` record
    (one of `VERDICTS`; module docstring). Each word needs its test and its interval:

    - *supported*: ``verdict`` "above" (> 0 after Holm), ``lo`` > 0 and ``hi`` ≥ `size`;
    - *smaller than claimed*: "above", ``lo`` > 0, ``hi`` < `size` and `size_p_holm` ≤ `alpha`/2
      (the claimed size excluded after Holm, at the interval's one-sided level);
    - *below GRPO*: ``verdict`` "below" (< 0 after Holm) and ``hi`` < 0; without a lift (below
      GRPO's range), one of GRPO's models beats it on both axes (`dominated`);
    - *not better than GRPO*: not "above", ``hi`` < `size` and `size_p_holm` ≤ `alpha`/2;
    - *not resolved*: otherwise (e.g. > 0 after Holm with an interval below `size` that Holm does
      not exclude).

    Args:
        result: a `confirm` record (``lift, lo, hi, se, df, verdict`` in the measure's units;
            ``dominated_by``, ``dominance_level`` without a lift).
        size: the claimed lift (> 0), in the measure's units.
        alpha: the family-wise level the record's ``verdict`` was decided at.
        size_p_holm: `size_p` adjusted over the study's claims (`size_tests`, `claim_verdicts`);
            None: the claim's own `size_p` (a family of one).

    Raises:
        ValueError: a `size` or `alpha` that is not > 0.
    """
    if not size > 0:
        raise ValueError(f"size: the claimed lift must be > 0, got {size}")
    if not alpha > 0:
        raise ValueError(f"alpha: must be > 0, got {alpha}")
    if result["lift"] is None:
        return "below GRPO" if dominated(result) else "not resolved"
    lo, hi = result["lo"], result["hi"]
    q = size_p(result, size) if size_p_holm is None else size_p_holm
    excluded = hi < size and q is not None and q <= alpha / 2
    if result["verdict"] == "above":
        if lo > 0 and hi >= size:
            return "supported"
        return "smaller than claimed" if lo > 0 and excluded else "not resolved"
    if result["verdict"] == "below" and hi < 0:
        return "below GRPO"
    return "not better than GRPO" if excluded else "not resolved"


def dominated(result: Mapping[str, Any]) -> bool:
    """Whether a `confirm` record's pick is beaten on both axes by one of GRPO's models: its
    curve-free check's p (Bonferroni over GRPO's models) ≤ ``dominance_level`` (alpha over the
    picks). False for a pick with a lift (the curve decides there) and for a record without the
    check or the level."""
    d, level = result.get("dominated_by"), result.get("dominance_level")
    return result["lift"] is None and d is not None and level is not None and d["p"] <= level


def sharpening_verdict(
    section: Mapping[str, Any],
    label: str,
    *,
    level: float = 0.95,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """ "GRPO sharpens" from the final checkpoint of one of `label`'s settings in a section of
    `lift_analysis` (t intervals of its point; one claim, no family): *supported* when its pass@1
    gain and its measure's gain have intervals on either side of 0 (up and down), *pass@k rises*
    when the measure's gain interval lies above 0, *not resolved* otherwise
    (`SHARPENING_VERDICTS`).

    The setting is GRPO as configured: the first whose ``params`` agree with `defaults` (the base
    training config's values of the tuned keys, e.g. ``{"lr": 0.3, "kl_coef": 0.0}``; a key a
    setting does not name takes its default); without `defaults`, or when none agrees, the first
    setting. (With a ``tune`` table the first setting is the first tuning combination, e.g. the
    smallest learning rate, not the configured one.)"""
    ms = [m for m in section["models"] if m["label"] == label and m["step"] > 0]  # not the base
    if not ms:
        raise ValueError(f"sharpening: no trained model with label {label!r}")

    def agrees(m: Mapping[str, Any]) -> bool:
        params = m.get("params") or {}
        return all(params.get(k, v) == v for k, v in (defaults or {}).items())

    setting = next((m for m in ms if agrees(m)), ms[0])["setting"]
    m = max((m for m in ms if m["setting"] == setting), key=lambda m: m["step"])
    if m["x_lo"] > 0 and m["y_hi"] < 0:
        verdict = "supported"
    elif m["y_lo"] > 0:
        verdict = "pass@k rises"
    else:
        verdict = "not resolved"
    return {"setting": setting, "step": m["step"], "x": m["x"], "x_lo": m["x_lo"],
            "x_hi": m["x_hi"], "y": m["y"], "y_lo": m["y_lo"], "y_hi": m["y_hi"],
            "verdict": verdict}  # fmt: skip


def problems_for(mde: float, problems: int, target: float) -> int:
    """The problems (the crossed problem units) a comparison with minimum detectable lift `mde` at
    `problems` needs for `target`, assuming its standard error scales as `1/√problems` (the
    problem and evaluation components dominate; the seed component does not shrink)."""
    if not (mde > 0 and target > 0 and problems > 0):
        raise ValueError(f"problems_for: need positive mde, problems, target; got {mde}, "
                         f"{problems}, {target}")  # fmt: skip
    return math.ceil(problems * (mde / target) ** 2)


SEEDS_GRID = tuple(range(2, 65))
"""The training seeds `design_for` considers."""
PROBLEMS_GRID = tuple(int(v) for v in np.unique(np.round(np.geomspace(2, 16384, 60))))
"""The problems (or dataset draws) `design_for` considers: 60 values from 2 to 16,384, spaced
geometrically."""


def design_for(
    components: Sequence[float],
    target: float,
    *,
    level: float,
    cost_run: float,
    cost_problem: float,
    power: float = 0.8,
    seeds: Sequence[int] = SEEDS_GRID,
    problems: Sequence[int] = PROBLEMS_GRID,
) -> dict[str, float] | None:
    """The cheapest confirmation design whose predicted MDE reaches `target`.

    Over every `seeds` × `problems` pair, the comparison's MDE at `level` (the first Holm step:
    `alpha / n`) and `power` is predicted from its `components` `(σ²_seed, σ²_problem, σ²_e)`
    (`experiment.covariance.design_mde`) and its cost is `S·(cost_run + P·cost_problem)` (per
    setting: S training runs, each evaluated on P problems); ties go to fewer seeds.

    Args:
        components: the comparison's variance components, in the squared units of `target`.
        target: the MDE goal (the claim's size), in the measure's units.
        cost_run, cost_problem: core-seconds (or any one unit) of one training run and of
            evaluating one problem at every read checkpoint; ≥ 0, not both 0.

    Returns:
        ``{"seeds", "problems", "mde", "cost"}``, or None when no design in the grid reaches
        `target` (or a component is not finite: one seed).

    Raises:
        ValueError: a non-positive `target`, a negative or all-zero cost.
    """
    if not target > 0:
        raise ValueError(f"target: need > 0, got {target}")
    if cost_run < 0 or cost_problem < 0 or cost_run + cost_problem <= 0:
        raise ValueError(f"cost_run, cost_problem: need ≥ 0 and not both 0, got {cost_run}, "
                         f"{cost_problem}")  # fmt: skip
    comp = np.asarray(components, dtype=np.float64)
    if not np.all(np.isfinite(comp)):
        return None
    s = np.asarray(seeds, dtype=np.float64)[:, None]
    p = np.asarray(problems, dtype=np.float64)[None, :]
    mde = covariance.design_mde(comp, s, p, alpha=level, power=power)
    cost = np.broadcast_to(s * (cost_run + p * cost_problem), mde.shape)
    ok = np.isfinite(mde) & (mde <= target)
    if not ok.any():
        return None
    flat = np.flatnonzero(ok.ravel())
    best = flat[np.lexsort((np.broadcast_to(s, mde.shape).ravel()[flat], cost.ravel()[flat]))[0]]
    i, j = np.unravel_index(best, cost.shape)
    return {"seeds": int(s[i, 0]), "problems": int(p[0, j]), "mde": float(mde[i, j]),
            "cost": float(cost[i, j])}  # fmt: skip


def pick(explore: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, dict]]:
    """`select` on every measure of an exploratory sweep's ``frontier``; the picks the
    confirmation re-trains are ``["pass_at_k"]`` (one per label, by its pass@k lift)."""
    return {measure: select(section) for measure, section in explore.items()}


SPREAD_TEXT = (
    "GRPO's best setting against the hull of GRPO's other settings (pass@k at matched pass@1; "
    "not a claim: what tuning GRPO adds)"
)
"""The claims table's row of `reference_spread`."""


def reference_spread(section: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each reference setting's largest lift over its trained checkpoints against the hull of the
    reference's *other* settings (one measure's section of the confirmation's `lift_analysis`,
    whose reference models are read that way: `experiment.inference.lift_inference`): what that
    setting adds to GRPO's trade-off, i.e. what tuning GRPO buys.

    Returns:
        ``{"label setting": {label, setting, step, lift, lo, hi}}`` in the measure's units, for
        the reference settings with a lift inside the others' range.
    """
    out: dict[str, dict[str, Any]] = {}
    for m in section["models"]:
        if not m["reference"] or m["step"] <= 0 or m["lift"] is None:
            continue
        key = f"{m['label']} {m['setting']}"
        if key not in out or m["lift"] > out[key]["lift"]:
            out[key] = {"label": m["label"], "setting": m["setting"], "step": m["step"],
                        "lift": m["lift"], "lo": m["lift_lo"], "hi": m["lift_hi"]}  # fmt: skip
    return out


def spread_row(name: str, spread: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The claims table's row of the pass@k `reference_spread`: its largest entry, in points."""
    if not spread:
        return None
    best = max(spread.values(), key=lambda r: r["lift"])
    return {"study": name, "claim": "grpo_spread", "text": SPREAD_TEXT, "verdict": "",
            "lift": 100 * best["lift"], "lo": 100 * best["lo"], "hi": 100 * best["hi"],
            "mde": None, "size": 0.0, "unit": "points",
            "where": f"{best['setting']}, step {best['step']}"}  # fmt: skip


PENDING = "pending"
"""The claims table's word for a claim whose pick the confirmation did not train (a re-read's
``pending``: `experiment.reread`): no verdict until the study is re-run."""


def pending_rows(doc: Mapping[str, Any], claims: Sequence[Sequence[str]] = CLAIMS) -> list[dict]:
    """One record per claim of `claims` whose method label a study.json `doc` lists under
    ``pending`` (`experiment.reread`): ``{study, claim, text, verdict: PENDING, lift: None,
    status: "pending"}``, for `experiment.study_report.claims_table`."""
    pending = doc.get("pending") or {}
    return [{"study": doc.get("study"), "claim": cid, "text": text, "verdict": PENDING,
             "lift": None, "status": "pending"}
            for cid, label, _, text in claims if label in pending]  # fmt: skip


def claim_rows(
    name: str,
    confirmed: Mapping[str, Mapping[str, Any]],
    sharp: Mapping[str, Any],
    *,
    size: float,
    size_distinct: float,
    equal_budget: bool = True,
    claims: Sequence[Sequence[str]] = CLAIMS,
    alpha: float = 0.05,
) -> list[dict[str, Any]]:
    """One record per claim of `claims` (default `CLAIMS`: the seeds' and the field's; an
    extension adds its own methods', `experiment.extend.claims_for`) the study has
    (`experiment.study_report.claims_table`'s rows): GRPO's sharpening and each method's word
    (`claim_verdict`) at the claimed `size` (points of pass@k) or `size_distinct` (distinct
    correct solutions per problem), the claimed sizes excluded by Holm over the study's method
    claims (`size_tests`) at the family-wise `alpha` the confirmation used.

    A method's record: ``{study, claim, text, verdict, lift, lo, hi, mde, size, unit, status,
    dominated_by, p_size, p_size_holm, range, budget}`` (lift, interval and MDE in points or per
    problem; ``p_size``, ``p_size_holm``: the test of "lift ≥ size" and its Holm p; ``range``:
    `experiment.estimand.range_label` above GRPO's range, else None; ``budget``: ``"equal"`` or
    ``"unequal"``, `equal_budget`: the words compare with GRPO as the study tuned it)."""
    found = {}
    for cid, label, measure, _ in claims:
        r = confirmed.get(measure, {}).get(label)
        if cid != "grpo_sharpens" and r is not None:
            scale, claimed = (100.0, size) if measure == "pass_at_k" else (1.0, size_distinct)
            found[cid] = (r, claimed / scale, claimed)
    tests = size_tests({c: f[0] for c, f in found.items()}, {c: f[1] for c, f in found.items()})
    rows = []
    for cid, _, measure, text in claims:
        if cid == "grpo_sharpens":
            rows.append({"study": name, "claim": cid, "text": text, "verdict": sharp["verdict"],
                         "lift": sharp["y"] * 100, "lo": sharp["y_lo"] * 100,
                         "hi": sharp["y_hi"] * 100, "mde": None, "size": 0.0,
                         "unit": "pass@k gain, points"})  # fmt: skip
            continue
        if cid not in found:
            continue
        r, claimed, shown = found[cid]
        scale = 100.0 if measure == "pass_at_k" else 1.0
        p, p_holm = tests[cid]

        def scaled(v: float | None, scale: float = scale) -> float | None:
            return None if v is None else scale * v

        verdict = claim_verdict(r, claimed, alpha=alpha, size_p_holm=p_holm)
        sign = {"above": 1, "below": -1}.get(r["verdict"], 0)
        what = "pass@k" if measure == "pass_at_k" else "distinct correct"
        rows.append({"study": name, "claim": cid, "text": text, "verdict": verdict,
                     "lift": scaled(r["lift"]),
                     "lo": scaled(r["lo"]), "hi": scaled(r["hi"]), "mde": scaled(r["mde"]),
                     "size": shown, "status": r.get("status", "inside"),
                     "dominated_by": r.get("dominated_by") if dominated(r) else None,
                     "unit": "points" if measure == "pass_at_k" else "per problem",
                     "p_size": p, "p_size_holm": p_holm,
                     "range": estimand.range_label(r.get("status"), sign, what),
                     "budget": "equal" if equal_budget else "unequal"})  # fmt: skip
    return rows


def translate(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The claim records of a study.json (``claims``) in the five words: a record written with a
    word before them (`OLD_VERDICTS`; GRPO's *refuted*: *pass@k rises*) reads *below GRPO* where
    its study said so (a pick below GRPO's range beaten on both axes, or its confirmation's
    ``verdict`` "below": < 0 after Holm), else the word `OLD_VERDICTS` names, and keeps its old
    word under ``verdict_was``; every other record is returned as it is. Only the words change:
    the tests are the ones its procedure ran (an old study's refutation was not controlled across
    its claims; re-read it, ``python -m experiment reread``, for the procedure in force).

    Raises:
        ValueError: a record whose word is none of `VERDICTS`, `SHARPENING_VERDICTS` and
            `OLD_VERDICTS` (naming its claim and word).
    """
    claims = {c[0]: c for c in (doc.get("reading") or {}).get("claims") or CLAIMS}
    known = set(VERDICTS) | set(SHARPENING_VERDICTS) | {""}
    out = []
    for row in doc["claims"]:
        word = row.get("verdict", "")
        if word in known:
            out.append(dict(row))
            continue
        if row.get("claim") == "grpo_sharpens" and word == "refuted":
            out.append({**row, "verdict": "pass@k rises", "verdict_was": word})
            continue
        if word not in OLD_VERDICTS:
            raise ValueError(f"claims: {row.get('claim')!r} has the verdict {word!r}, none of "
                             f"{VERDICTS + SHARPENING_VERDICTS} or {tuple(OLD_VERDICTS)}")  # fmt: skip
        c = claims.get(row.get("claim"))
        rec = (doc.get("confirmed") or {}).get(c[2], {}).get(c[1], {}) if c else {}
        below = row.get("lift") is None and row.get("dominated_by") is not None
        below |= rec.get("verdict") == "below"
        out.append({**row, "verdict": "below GRPO" if below else OLD_VERDICTS[word],
                    "verdict_was": word})  # fmt: skip
    return out


def conclude(
    name: str,
    picks: Mapping[str, Mapping[str, Mapping[str, Any]]],
    confirmation: Mapping[str, Mapping[str, Any]],
    *,
    reference: str,
    alpha: float,
    size: float,
    size_distinct: float,
    problems: int,
    design: Mapping[str, Any],
    provenance: Mapping[str, Any],
    by_step: bool,
    costs: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    claims: Sequence[Sequence[str]] = CLAIMS,
) -> dict[str, Any]:
    """The study's result (study.json) from its picks (`pick`) and the confirmation sweep's
    ``frontier``: per measure `confirm` (with `by_step`, each pick's model at its picked step;
    otherwise the label's only non-reference model), GRPO's `sharpening_verdict` (first reference
    label, its setting at `defaults`: the base training config's values of the tuned keys), the
    `claim_rows`, and per pick the problems (`problems_for`, from `problems`) that its
    MDE needs for the claimed `size`; with `costs` ``{"run", "problem", "unit"}`` (the cost of a
    training run and of one problem's evaluation, and their unit, e.g. ``"core-s"``) also per pick and
    measure the cheapest design of seeds × problems that reaches the claimed size (`design_for`,
    ``designs_for_goal``)."""
    chosen = picks["pass_at_k"]
    confirmed = {}
    for measure, section in confirmation.items():
        models = [m for m in section["models"] if m["reference"] or (m["label"] in chosen
                  and (not by_step or m["step"] == chosen[m["label"]]["step"]))]  # fmt: skip
        confirmed[measure] = confirm({**section, "models": models}, list(chosen), alpha=alpha)
    sharp = sharpening_verdict(confirmation["pass_at_k"], reference, defaults=defaults)
    need = {label: problems_for(100 * r["mde"], problems, size)
            for label, r in confirmed["pass_at_k"].items() if r["mde"]}  # fmt: skip
    designs: dict[str, dict[str, Any]] = {}
    if costs is not None:
        for measure, rows in confirmed.items():
            scale, claimed = (100.0, size) if measure == "pass_at_k" else (1.0, size_distinct)
            designs[measure] = {
                label: design_for(r["components"], claimed / scale, level=r["level"],
                                  cost_run=costs["run"], cost_problem=costs["problem"])
                for label, r in rows.items() if r.get("components") is not None
            }  # fmt: skip
    spread = {measure: reference_spread(section) for measure, section in confirmation.items()}
    claims = claim_rows(
        name,
        confirmed,
        sharp,
        size=size,
        size_distinct=size_distinct,
        equal_budget=design.get("budget") == "equal",
        claims=claims,
        alpha=alpha,
    )
    row = spread_row(name, spread.get("pass_at_k", {}))
    return {
        "study": name,
        "procedure": inference.PROCEDURE,
        "provenance": dict(provenance),
        "design": {**design, "alpha": alpha, "claim_size": size, "claim_size_distinct": size_distinct},
        "picks": {m: {label: {k: p.get(k) for k in PICK_KEYS} for label, p in ps.items()}
                  for m, ps in picks.items()},
        "confirmed": confirmed,
        "grpo_sharpens": sharp,
        "claims": claims + ([row] if row is not None else []),
        "reference_spread": spread,
        "problems_for_goal": need,
        **({"costs": dict(costs), "designs_for_goal": designs}
           if costs is not None else {}),
    }  # fmt: skip
