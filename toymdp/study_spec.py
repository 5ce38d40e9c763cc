"""The toy study file (``python -m toymdp study --config FILE``): its keys, their validation, and
the confirmation stage's sweep (`toymdp.study` runs both stages).

A study file is a toy sweep file (`toymdp.sweep_spec`) plus a ``[study]`` table (`StudySpec`): the
confirmation's fresh dataset draws, training seeds and key root, a claim's size and the
family-wise level. `load_study` parses and checks it once; `confirmation_doc` is the
confirmation's sweep: GRPO's reference entries and one ``fixed`` entry per pick, re-trained on
the fresh keys and evaluated on fresh draws (new prompts and correct sets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment import two_stage
from experiment.schema import config_error, meta, option
from experiment.spec import confirmation_methods, untune
from toymdp.sweep import budgets
from toymdp.sweep_spec import SweepConfig, parse_config

__all__ = ["StudySpec", "confirmation_doc", "load_study"]


@dataclass(frozen=True)
class StudySpec(two_stage.StudyClaims):
    """``[study]``: the confirmation stage and the claims' rule (module docstring)."""

    name: str = "toy study"
    """the study's name in the tables"""
    confirm_draws: list[int] = field(
        default_factory=lambda: list(range(100, 108)), metadata=meta(ge=0, length=(2, None))
    )
    """dataset draws of the confirmation (fresh: not among env.draws)"""
    confirm_seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3], metadata=meta(ge=0, length=(1, None))
    )
    """training seeds of the confirmation (indices of keys split from confirm_key)"""
    confirm_key: int = option(1, ge=0)
    """root of the confirmation's training keys (≠ train.seed)"""
    claim_size: float = option(1.5, gt=0)
    """a claim's size: points of pass@k (MDE goal)"""


def load_study(path: Path) -> tuple[SweepConfig, StudySpec]:
    """The exploratory sweep (the file without ``[study]``, parsed once) and its `StudySpec`.

    Raises:
        ValueError: naming the file and key: a bad sweep or ``[study]`` key, confirmation draws
            that are also exploratory draws, a confirmation key root equal to ``train.seed``, or a
            method tuned otherwise than the reference without ``unequal_budget = true``.
    """
    doc, spec = two_stage.read_study(path, StudySpec)
    try:
        cfg = parse_config(doc)
    except ValueError as err:
        raise config_error(path, err) from None
    reused = sorted(set(spec.confirm_draws) & set(cfg.env.draws))
    if reused:
        raise ValueError(f"{path}: study.confirm_draws: {reused} are exploratory draws (env.draws)")
    if spec.confirm_key == cfg.train.seed:
        raise ValueError(f"{path}: study.confirm_key: {spec.confirm_key} equals train.seed")
    two_stage.study_budget(budgets(cfg), cfg.reference, spec, path)
    return cfg, spec


def _picked(entry: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """A pick's confirmation entry: its setting ``fixed``, its learning rate (``lr`` may not be
    fixed) the one point."""
    fixed = {**entry.get("fixed", {}), **params}
    lr = fixed.pop("lr", None)
    return {"method": entry["method"], "label": entry.get("label", entry["method"]),
            "fixed": fixed, **({"points": [{"lr": lr}]} if lr is not None else {})}  # fmt: skip


def confirmation_doc(
    cfg: SweepConfig, spec: StudySpec, picks: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The confirmation sweep of `cfg`: GRPO's reference entries and one per pick
    (`experiment.spec.confirmation_methods`), the fresh draws, seeds and key root."""
    out = untune(cfg.doc)
    out["env"] = {**out.get("env", {}), "draws": list(spec.confirm_draws)}
    out["train"] = {**out.get("train", {}), "seed": spec.confirm_key}
    out["seeds"] = list(spec.confirm_seeds)
    out["methods"] = confirmation_methods(out, cfg.reference, picks, _picked)
    return out
