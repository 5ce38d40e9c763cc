"""The LLM study file (``python -m llm study --config FILE``): its keys, their validation, and the
confirmation stage's sweep (`llm.orchestrate.study` runs both stages).

A study file is an LLM sweep file (`llm.orchestrate.sweep_spec`) plus a ``[study]`` table
(`StudySpec`): the confirmation's fresh training seeds and held-out problems (how many, and how
many of the stream to skip: the exploratory ones), train-config overrides of the confirmation
alone, a claim's size and the family-wise level. `load_study` parses and checks it once;
`confirmation` is the confirmation's sweep: GRPO's reference entries and one entry per pick,
trained on the fresh seeds and evaluated on the fresh problems at the same checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment import two_stage
from experiment.schema import config_error, meta, option
from experiment.spec import confirmation_methods, untune
from llm.orchestrate.sweep_spec import (
    MAX_EVAL_STREAM,
    SweepSpec,
    budgets,
    merge_tables,
    sweep_from_dict,
)

__all__ = ["UNIT", "StudySpec", "confirmation", "confirmation_doc", "load_study"]

UNIT = "Problems"
"""The problem unit of an LLM study's lift (a study.json's ``reading.unit``): held-out
problems, crossed with the seeds."""


@dataclass(frozen=True)
class StudySpec(two_stage.StudyClaims):
    """``[study]``: the confirmation stage and the claims' rule (module docstring)."""

    name: str = "LLM study"
    """the study's name in the tables"""
    confirm_seeds: list[int] = field(
        default_factory=lambda: [10, 11, 12], metadata=meta(ge=0, length=(1, None))
    )
    """training seeds of the confirmation (fresh: not among the sweep's seeds)"""
    confirm_problems: int = option(512, ge=2)
    """held-out problems of the confirmation"""
    confirm_offset: int = option(0, ge=0)
    """problems of the held-out stream to skip (0: the exploratory ones)"""
    confirm_train: dict[str, Any] = field(default_factory=dict)
    """train-config overrides of the confirmation alone, set over [train] (e.g. eval = { dtype =
    'bfloat16' } to sample faster on a GPU): every confirmation run shares them, GRPO's reference
    included, so its comparisons stay like for like"""


def load_study(path: str | Path) -> tuple[SweepSpec, StudySpec]:
    """The exploratory sweep (the file without ``[study]``, validated once by
    `llm.orchestrate.sweep_spec.sweep_from_dict`; its ``source`` the file) and its `StudySpec`;
    the tuning budgets are checked (`experiment.two_stage.study_budget` of
    `llm.orchestrate.sweep_spec.budgets`), and so is ``confirm_train``, before any run.

    Raises:
        ValueError: naming the file and key: no ``[study]`` table, a bad sweep or ``[study]``
            key, confirmation seeds that are also exploratory seeds, confirmation problems
            overlapping the exploratory ones or past the held-out stream (`MAX_EVAL_STREAM`),
            or a method tuned otherwise than the reference without ``unequal_budget = true``.
    """
    path = Path(path)
    doc, spec = two_stage.read_study(path, StudySpec)
    try:
        sweep = sweep_from_dict(doc, root=path.parent)
    except (TypeError, ValueError) as err:
        raise config_error(path, err) from None
    sweep.source = str(path)
    reused = sorted(set(spec.confirm_seeds) & set(sweep.seeds))
    if reused:
        raise ValueError(f"{path}: study.confirm_seeds: {reused} are exploratory seeds")
    two_stage.study_budget(budgets(sweep), sweep.reference, spec, path)
    explored = sweep.eval.get("offset", 0) + sweep.eval["problems"]
    if spec.confirm_offset and spec.confirm_offset < explored:
        raise ValueError(f"{path}: study.confirm_offset: {spec.confirm_offset} overlaps the "
                         f"exploratory problems (the first {explored})")  # fmt: skip
    # The confirmation's eval.offset, checked here rather than after the exploration has trained.
    offset = spec.confirm_offset or explored
    if offset + spec.confirm_problems > MAX_EVAL_STREAM:
        key = "confirm_offset" if spec.confirm_offset else "confirm_problems"
        raise ValueError(
            f"{path}: study.{key}: expected confirm_offset (0: the {explored} exploratory "
            f"problems) + confirm_problems <= {MAX_EVAL_STREAM}, got {offset} + "
            f"{spec.confirm_problems}"
        )
    if spec.confirm_train:
        try:
            confirmation(sweep, spec, {})
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: study.confirm_train: {err}") from None
    return sweep, spec


def _picked(entry: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """A pick's confirmation entry: its one setting, tuning values included."""
    return {"method": entry["method"], "label": entry.get("label", entry["method"]),
            "points": [dict(params)]}  # fmt: skip


def confirmation_doc(
    sweep: SweepSpec, spec: StudySpec, picks: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The confirmation's sweep document: `sweep`'s reference entries and one entry per picked
    label (`experiment.spec.confirmation_methods`), the fresh seeds and problems
    (``confirm_offset``, or right after the exploratory problems), and ``confirm_train`` set over
    the ``[train]`` table."""
    out = untune(sweep.doc)
    out["base"] = str(Path(sweep.base).resolve())  # absolute: parsed from any root
    explored = sweep.eval.get("offset", 0) + sweep.eval["problems"]
    out["eval"] = {**out.get("eval", {}), "problems": spec.confirm_problems,
                   "offset": spec.confirm_offset or explored}  # fmt: skip
    out["seeds"] = list(spec.confirm_seeds)
    if spec.confirm_train:
        out["train"] = merge_tables(dict(out.get("train", {})), spec.confirm_train)
    out["methods"] = confirmation_methods(out, sweep.reference, picks, _picked)
    return out


def confirmation(
    sweep: SweepSpec, spec: StudySpec, picks: Mapping[str, Mapping[str, Any]]
) -> SweepSpec:
    """The confirmation's sweep (`confirmation_doc`), validated; its ``source`` names `sweep`'s.

    Raises:
        ValueError: a bad ``confirm_train`` key or value.
    """
    out = sweep_from_dict(confirmation_doc(sweep, spec, picks), root=Path(sweep.base).parent)
    out.source = f"{sweep.source} (confirmation)"
    return out
