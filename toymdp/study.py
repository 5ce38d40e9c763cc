"""`python -m toymdp study --config FILE [--out DIR]`: a two-stage toy study with verdicts.

A study file is a toy sweep file (`toymdp.sweep`: the exploratory stage, every method's
coefficients swept against GRPO's own curve) plus a ``[study]`` table (`StudySpec`): the fresh
dataset draws, training seeds and key root of the confirmation stage, the claimed size of a lift
and the family-wise level. The stages (`experiment.study`):

1. **explore**: the sweep as written, every row read at every checkpoint (`toymdp.sweep.read_steps`:
   a method is early-stopped as GRPO is); per method label and measure, the (setting,
   checkpoint) with the largest (bias-corrected) estimate of its lift (`experiment.study.select`; one pick per
   label, by the pass@k lift). Every method must get the tuning of GRPO's reference (its learning
   rates, ``kl_coef`` values and checkpoints: `budgets`, checked by
   `experiment.spec.check_budget`; a top-level ``tune`` table gives it to all), unless
   ``unequal_budget = true`` says otherwise, which study.json's ``design.budget`` then records;
2. **confirm**: the reference entries as written plus one ``fixed`` entry per pick, trained on
   the fresh keys and evaluated on fresh draws (new prompts and correct sets); per measure, each
   pick's lift at its picked checkpoint with Holm over the picks (`experiment.study.confirm`),
   the minimum detectable lift, and the verdict of every claim of `experiment.study.CLAIMS`
   whose method the study has.

Outputs in OUT (default ``runs/toy_study/<config stem>``): ``explore/`` and ``confirm/`` (each a
sweep folder: results.json, lifts.md, frontier.png), ``study.json`` (provenance: git commit,
config hash, CPU model, numerics level; the picks, the confirmed lifts, the verdicts and the
problems the design would need for the MDE goal) and ``verdicts.md``. Each stage is cached like a
sweep, so a rerun costs only the analysis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment import store, two_stage
from experiment.schema import meta, option
from experiment.spec import Budget, check_budget, untune
from toymdp import sweep as SW
from toymdp import sweep_spec

__all__ = [
    "TUNING_KEYS",
    "StudySpec",
    "ToyLeg",
    "budgets",
    "confirmation_doc",
    "load_study",
    "run_study",
    "study_budget",
]


@dataclass(frozen=True)
class StudySpec(two_stage.StudyClaims):
    """``[study]``: the confirmation stage and the claims' rule (module docstring)."""

    name: str = option("toy study", "the study's name in the tables")
    confirm_draws: list[int] = field(default_factory=lambda: list(range(100, 108)), metadata=meta(
        "dataset draws of the confirmation (fresh: not among env.draws)", ge=0,
        length=(2, None)))  # fmt: skip
    confirm_seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3], metadata=meta(
        "training seeds of the confirmation (indices of keys split from confirm_key)", ge=0,
        length=(1, None)))  # fmt: skip
    confirm_key: int = option(1, "root of the confirmation's training keys (≠ train.seed)", ge=0)
    claim_size: float = option(1.5, "a claim's size: points of pass@k (MDE goal)", gt=0)


COSTS = {"run": 0.0, "problem": 1.0, "unit": "draw × seed trainings"}
"""The toy's cost model for `experiment.study.design_for`: every (draw, seed) cell is one training
(vectorized together), so a design costs seeds × draws."""


TUNING_KEYS = ("lr", "kl_coef")
"""A setting's keys that tune it rather than shape it (`budgets`)."""


def budgets(cfg: sweep_spec.SweepConfig) -> list[Budget]:
    """Each row's tuning (`experiment.spec.Budget`): its learning rate and ``kl_coef`` (the row's
    value, else its entry's ``fixed``, else ``[train]``'s) and the updates its models are read at
    (`toymdp.sweep.read_steps`)."""
    fixed = {m.label: m.fixed for m in cfg.methods}
    out = []
    for r in SW.all_rows(cfg):
        kl = r.values.get("kl_coef", fixed[r.label].get("kl_coef", cfg.train.kl_coef))
        own = {k: v for k, v in r.values.items() if k not in TUNING_KEYS}
        axes = {"lr": float(r.values.get("lr", cfg.train.lr)), "kl_coef": float(kl),
                "checkpoints": SW.read_steps(cfg, r.label)}  # fmt: skip
        out.append(Budget(r.label, SW.Run(r.label, r.method, own, {}).setting(), axes))
    return out


def study_budget(cfg: sweep_spec.SweepConfig, spec: StudySpec) -> tuple[str, str | None]:
    """The study's tuning budget (`experiment.spec.check_budget` of `budgets`) and, when it is
    unequal, how (`experiment.spec.budget_difference`).

    Raises:
        ValueError: a method tuned otherwise than the reference without ``unequal_budget``.
    """
    return check_budget(budgets(cfg), cfg.reference, unequal=spec.unequal_budget)


def load_study(path: Path) -> tuple[dict[str, Any], StudySpec]:
    """The exploratory sweep document (the file without ``[study]``) and its `StudySpec`; the
    tuning budgets are checked (`study_budget`).

    Raises:
        ValueError: naming the file and key: a bad ``[study]`` key, confirmation draws that are
            also exploratory draws, a confirmation key root equal to ``train.seed``, or a method
            tuned otherwise than the reference without ``unequal_budget = true``.
    """
    doc = dict(store.read_toml(path))
    table = doc.pop("study", {})
    try:
        spec = sweep_spec.build_table(StudySpec, "study", table)
        cfg = sweep_spec.parse_config(doc)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    reused = sorted(set(spec.confirm_draws) & set(cfg.env.draws))
    if reused:
        raise ValueError(f"{path}: study.confirm_draws: {reused} are exploratory draws (env.draws)")
    if spec.confirm_key == cfg.train.seed:
        raise ValueError(f"{path}: study.confirm_key: {spec.confirm_key} equals train.seed")
    try:
        study_budget(cfg, spec)
    except ValueError as err:
        raise ValueError(f"{path}: study: {err}") from None
    return doc, spec


def confirmation_doc(
    doc: Mapping[str, Any], spec: StudySpec, picks: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The confirmation sweep: `doc`'s reference entries (with ``tune`` crossed in,
    `experiment.spec.untune`), one fixed entry per picked label (its picked setting, its tuning
    values included), the fresh draws, seeds and key root."""
    cfg = sweep_spec.parse_config(doc)
    out = untune(doc)
    out["env"] = {**out.get("env", {}), "draws": list(spec.confirm_draws)}
    out["train"] = {**out.get("train", {}), "seed": spec.confirm_key}
    out["seeds"] = list(spec.confirm_seeds)
    methods = []
    for m in cfg.methods:
        if m.label in cfg.reference:
            methods.append(
                next(e for e in out["methods"] if e.get("label", e["method"]) == m.label)
            )
        elif m.label in picks:
            fixed = {**m.fixed, **picks[m.label]["params"]}
            lr = fixed.pop("lr", None)
            entry = {"method": m.method, "label": m.label, "fixed": fixed}
            if lr is not None:
                entry["points"] = [{"lr": lr}]
            methods.append(entry)
    out["methods"] = methods
    return out


@dataclass
class ToyLeg:
    """The toy's `experiment.two_stage.Leg`: each stage a toy sweep (`toymdp.sweep.sweep_config`),
    the confirmation on fresh dataset draws and training keys (`confirmation_doc`)."""

    doc: dict[str, Any]
    spec: StudySpec
    out: Path
    use_cache: bool = True
    progress: bool = True
    unit: str = "Dataset draws"

    def __post_init__(self) -> None:
        self.cfg = sweep_spec.parse_config(self.doc)
        self.budget = study_budget(self.cfg, self.spec)
        self.reading = {"reference": self.cfg.reference[0],
                        "problems": len(self.spec.confirm_draws),
                        "defaults": {"lr": self.cfg.train.lr, "kl_coef": self.cfg.train.kl_coef},
                        "by_step": True}  # fmt: skip

    def _sweep(self, cfg: sweep_spec.SweepConfig, stage: str) -> dict[str, Any]:
        got = SW.sweep_config(cfg, self.out / stage, use_cache=self.use_cache,
                              progress=self.progress)  # fmt: skip
        return got["doc"]

    def explore(self) -> dict[str, Any]:
        return self._sweep(self.cfg, "explore")

    def confirm(self, picks: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        cdoc = confirmation_doc(self.doc, self.spec, picks)
        return self._sweep(sweep_spec.parse_config(cdoc), "confirm")

    def design(self, confirm: Mapping[str, Any]) -> dict[str, Any]:
        s = self.spec
        return {"explore_draws": list(self.cfg.env.draws), "explore_seeds": list(self.cfg.seeds),
                "confirm_draws": list(s.confirm_draws), "confirm_seeds": list(s.confirm_seeds),
                "confirm_key": s.confirm_key, "checkpoints": list(self.cfg.eval_steps[1:])}  # fmt: skip

    def stages(self, confirm: Mapping[str, Any]) -> tuple[str, str]:
        d = self.design(confirm)
        return (f"draws {d['explore_draws']}, seeds {d['explore_seeds']}, checkpoints "
                f"{d['checkpoints']}",
                f"those picks and GRPO's reference entries re-trained on fresh keys (root "
                f"{d['confirm_key']}, seeds {d['confirm_seeds']}) and evaluated on fresh draws "
                f"{d['confirm_draws']} (the problem units of the lift)")  # fmt: skip

    def costs(self) -> dict[str, Any]:
        return COSTS

    def extras(self, explore: Mapping[str, Any], confirm: Mapping[str, Any]) -> dict[str, Any]:
        return {}


def run_study(
    config_path: Path, out: Path | None = None, *, use_cache: bool = True, progress: bool = True
) -> dict[str, Any]:
    """Both stages of the study in `config_path` (module docstring; `experiment.two_stage.run`
    of a `ToyLeg`); returns study.json's dict.

    Raises:
        ValueError: naming the file and key of a bad configuration.
    """
    config_path = Path(config_path)
    doc, spec = load_study(config_path)
    out = Path(out) if out is not None else Path("runs/toy_study") / config_path.stem
    return two_stage.run(ToyLeg(doc, spec, out, use_cache, progress), out, config_path)
