"""`python -m toymdp study --config FILE [--out DIR]`: a two-stage toy study with verdicts.

A study file is a toy sweep file (`toymdp.sweep`) plus a ``[study]`` table (`StudySpec`): the
confirmation's fresh dataset draws, training seeds and key root, a claim's size and the
family-wise level. The stages are `experiment.two_stage`'s: the exploration is the sweep as
written, every row read at every checkpoint (`toymdp.sweep.read_steps`), its tuning budgets
`toymdp.sweep.budgets`; the confirmation (`confirmation_doc`) re-trains the reference entries and
one ``fixed`` entry per pick on the fresh keys and evaluates them on fresh draws (new prompts and
correct sets).

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

from experiment import two_stage
from experiment.schema import meta, option
from experiment.spec import untune
from toymdp import sweep as SW
from toymdp import sweep_spec

__all__ = ["StudySpec", "ToyLeg", "confirmation_doc", "load_study", "run_study"]


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


def load_study(path: Path) -> tuple[dict[str, Any], StudySpec]:
    """The exploratory sweep document (the file without ``[study]``) and its `StudySpec`; the
    tuning budgets are checked (`experiment.two_stage.study_budget` of `toymdp.sweep.budgets`).

    Raises:
        ValueError: naming the file and key: a bad ``[study]`` key, confirmation draws that are
            also exploratory draws, a confirmation key root equal to ``train.seed``, or a method
            tuned otherwise than the reference without ``unequal_budget = true``.
    """
    doc, spec = two_stage.read_study(path, StudySpec)
    try:
        cfg = sweep_spec.parse_config(doc)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    reused = sorted(set(spec.confirm_draws) & set(cfg.env.draws))
    if reused:
        raise ValueError(f"{path}: study.confirm_draws: {reused} are exploratory draws (env.draws)")
    if spec.confirm_key == cfg.train.seed:
        raise ValueError(f"{path}: study.confirm_key: {spec.confirm_key} equals train.seed")
    two_stage.study_budget(SW.budgets(cfg), cfg.reference, spec, path)
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
        self.budget = two_stage.study_budget(SW.budgets(self.cfg), self.cfg.reference, self.spec)
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
