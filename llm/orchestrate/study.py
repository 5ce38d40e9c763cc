"""`python -m llm study --config FILE [--workers N] [--out DIR]`: a two-stage LLM study with verdicts.

A study file is an LLM sweep file (`llm.orchestrate.sweep_spec`) plus a ``[study]`` table
(`StudySpec`): the confirmation's fresh training seeds and held-out problems (how many, and how
many of the stream to skip: the exploratory ones), a claim's size and the family-wise level. The
stages are `experiment.two_stage`'s: the exploration is the sweep as written, every run
evaluated at every checkpoint, its tuning budgets `llm.orchestrate.sweep_spec.budgets`; the
confirmation (`confirmation_doc`) re-trains the reference entries and one entry per pick on the
fresh seeds and evaluates them on the fresh problems at the same checkpoints.

Outputs in OUT (default ``runs/llm_study/<config stem>``): ``explore/`` and ``confirm/`` (sweep
folders: results.json, lifts.md, frontier.png, runs/), ``study.json`` (provenance, picks, confirmed
lifts, verdicts, the problems each comparison would need for the claimed size) and
``verdicts.md``. Both stages are resumable run by run (`llm.orchestrate.jobs`): a rerun after a kill
continues where it stopped and reuses every finished run and evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment import two_stage
from experiment.schema import meta, option
from experiment.spec import untune
from llm.eval.frontier import confirmed_measures
from llm.orchestrate.executor import check_executor
from llm.orchestrate.sweep import check_engine, measured_costs, run_sweep
from llm.orchestrate.sweep_spec import SweepSpec, budgets, merge_tables, sweep_from_dict
from llm.rollout.stacked import VERSION as SAMPLER_VERSION
from llm.run.folder import RunLock

__all__ = ["LLMLeg", "StudySpec", "confirmation_doc", "load_study", "run_study"]


@dataclass(frozen=True)
class StudySpec(two_stage.StudyClaims):
    """``[study]``: the confirmation stage and the claims' rule (module docstring)."""

    name: str = option("LLM study", "the study's name in the tables")
    confirm_seeds: list[int] = field(default_factory=lambda: [10, 11, 12], metadata=meta(
        "training seeds of the confirmation (fresh: not among the sweep's seeds)", ge=0,
        length=(1, None)))  # fmt: skip
    confirm_problems: int = option(512, "held-out problems of the confirmation", ge=2)
    confirm_offset: int = option(
        0, "problems of the held-out stream to skip (0: the exploratory ones)", ge=0
    )
    confirm_train: dict[str, Any] = field(default_factory=dict, metadata=meta(
        "train-config overrides of the confirmation alone, set over [train] (e.g. eval = { dtype = "
        "'bfloat16' } to sample faster on a GPU): every confirmation run shares them, GRPO's "
        "reference included, so its comparisons stay like for like"))  # fmt: skip


def _configured(sweep: SweepSpec) -> dict[str, float]:
    """The tuned keys' values of a run with no setting of its own (the base config and
    ``[train]``): the GRPO setting "GRPO sharpens" is read from (`experiment.study.conclude`)."""
    cfg = sweep.base_config
    return {"optim.lr": float(cfg.optim.lr), "kl_coef": float(cfg.kl_coef)}


def load_study(path: str | Path) -> tuple[dict[str, Any], StudySpec]:
    """The exploratory sweep document (the file without ``[study]``) and its `StudySpec`; the
    sweep is validated (`llm.orchestrate.sweep_spec.sweep_from_dict`), and so are its tuning budgets
    (`experiment.two_stage.study_budget` of `llm.orchestrate.sweep_spec.budgets`).

    Raises:
        ValueError: naming the file and key: a bad ``[study]`` key, confirmation seeds that are
            also exploratory seeds, confirmation problems overlapping the exploratory ones, or a
            method tuned otherwise than the reference without ``unequal_budget = true``.
    """
    path = Path(path)
    doc, spec = two_stage.read_study(path, StudySpec)
    try:
        sweep = sweep_from_dict(doc, root=path.parent)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from None
    if spec.confirm_train:  # checked before any run, not after the exploration
        try:
            sweep_from_dict(confirmation_doc(doc, spec, {}, path.parent), root=path.parent)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: study.confirm_train: {err}") from None
    reused = sorted(set(spec.confirm_seeds) & set(sweep.seeds))
    if reused:
        raise ValueError(f"{path}: study.confirm_seeds: {reused} are exploratory seeds")
    two_stage.study_budget(budgets(sweep), sweep.reference, spec, path)
    explored = sweep.eval.get("offset", 0) + sweep.eval["problems"]
    if spec.confirm_offset and spec.confirm_offset < explored:
        raise ValueError(f"{path}: study.confirm_offset: {spec.confirm_offset} overlaps the "
                         f"exploratory problems (the first {explored})")  # fmt: skip
    return doc, spec


def confirmation_doc(
    doc: Mapping[str, Any], spec: StudySpec, picks: Mapping[str, Mapping[str, Any]], root: Path
) -> dict[str, Any]:
    """The confirmation sweep: `doc`'s reference entries (with ``tune`` crossed in,
    `experiment.spec.untune`), one entry per picked label with its picked setting's parameters
    (its tuning values included), the fresh seeds and problems (``confirm_offset``, or right after
    the exploratory problems), and ``confirm_train`` set over the ``[train]`` table."""
    sweep = sweep_from_dict(doc, root=root)
    out = untune(doc)
    out["base"] = str(Path(sweep.base).resolve())  # absolute: parsed from any root
    explored = sweep.eval.get("offset", 0) + sweep.eval["problems"]
    out["eval"] = {**out.get("eval", {}), "problems": spec.confirm_problems,
                   "offset": spec.confirm_offset or explored}  # fmt: skip
    out["seeds"] = list(spec.confirm_seeds)
    if spec.confirm_train:
        out["train"] = merge_tables(dict(out.get("train", {})), spec.confirm_train)
    methods = []
    for entry in out["methods"]:
        label = entry.get("label", entry["method"])
        if label in sweep.reference:
            methods.append(entry)
        elif label in picks:
            methods.append({"method": entry["method"], "label": label,
                            "points": [dict(picks[label]["params"])]})  # fmt: skip
    out["methods"] = methods
    return out


@dataclass
class LLMLeg:
    """The LLM's `experiment.two_stage.Leg`: each stage an LLM sweep (`llm.orchestrate.sweep.
    run_sweep`, resumable run by run), the confirmation on fresh seeds and problems
    (`confirmation_doc`); `run_options` go to `run_sweep`."""

    doc: dict[str, Any]
    spec: StudySpec
    config_path: Path
    out: Path
    engine: str
    run_options: dict[str, Any]
    unit: str = "Problems"

    def __post_init__(self) -> None:
        self.sweep = sweep_from_dict(self.doc, root=self.config_path.parent)
        self.sweep.source = str(self.config_path)
        self.budget = two_stage.study_budget(budgets(self.sweep), self.sweep.reference, self.spec)
        self.reading = {"reference": self.sweep.reference[0], "defaults": _configured(self.sweep),
                        "problems": self.spec.confirm_problems, "by_step": True}  # fmt: skip

    def explore(self) -> dict[str, Any]:
        return run_sweep(self.sweep, self.out / "explore", engine=self.engine, **self.run_options)

    def confirm(self, picks: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        cdoc = confirmation_doc(self.doc, self.spec, picks, self.config_path.parent)
        csweep = sweep_from_dict(cdoc, root=self.config_path.parent)
        csweep.source = f"{self.config_path} (confirmation)"
        return run_sweep(csweep, self.out / "confirm", engine=self.engine, **self.run_options)

    def design(self, confirm: Mapping[str, Any]) -> dict[str, Any]:
        sw, c = self.sweep, confirm["settings"]["eval"]  # the confirmation's, as it ran
        return {"explore_seeds": sw.seeds, "explore_problems": sw.eval["problems"],
                "confirm_seeds": list(self.spec.confirm_seeds),
                "confirm_problems": self.spec.confirm_problems,
                "confirm_offset": c["offset"], "samples": c["samples"],
                "checkpoints": sw.checkpoints, "engine": self.engine,
                **({"sampler_version": SAMPLER_VERSION} if self.engine == "batched" else {})}  # fmt: skip

    def stages(self, confirm: Mapping[str, Any]) -> tuple[str, str]:
        sw, c = self.sweep, confirm["settings"]["eval"]
        return (f"seeds {sw.seeds}, the first {sw.eval['problems']} held-out problems × "
                f"{sw.eval['samples']} samples, checkpoints {sw.checkpoints}",
                "those settings and GRPO's reference entries re-trained on fresh seeds "
                f"{self.spec.confirm_seeds} and evaluated on {self.spec.confirm_problems} fresh "
                f"problems (from {c['offset']} on) × {c['samples']} samples")  # fmt: skip

    def costs(self) -> dict[str, Any] | None:
        return measured_costs(self.out / "confirm" / "runs")

    def extras(self, explore: Mapping[str, Any], confirm: Mapping[str, Any]) -> dict[str, Any]:
        return {"measures": confirmed_measures(confirm),
                "fingerprints": {"explore": explore["fingerprints"],
                                 "confirm": confirm["fingerprints"]}}  # fmt: skip


def run_study(
    config_path: str | Path,
    out: str | Path | None = None,
    *,
    workers: int | None = None,
    progress: bool = True,
    num_resamples: int = 200,
    executor: str = "local",
    address: str | None = None,
    engine: str = "process",
    log: bool = False,
) -> dict[str, Any]:
    """Both stages of the study in `config_path` (module docstring; `experiment.two_stage.run`
    of an `LLMLeg`); returns study.json's dict. `workers`, `executor`, `address`, `engine` and
    `log` (both stages) go to `llm.orchestrate.sweep.run_sweep`.

    Raises:
        ValueError: naming the file and key of a bad configuration, or a bad executor.
        ImportError: executor ``ray`` without Ray installed.
        llm.run.folder.RunFolderError: another live study holds `out` (its PID named).
    """
    check_executor(executor, address)
    config_path = Path(config_path)
    doc, spec = load_study(config_path)
    out = Path(out) if out is not None else Path("runs/llm_study") / config_path.stem
    options = {"workers": workers, "progress": progress, "num_resamples": num_resamples,
               "executor": executor, "address": address, "log": log}  # fmt: skip
    leg = LLMLeg(doc, spec, config_path, out, engine, options)
    check_engine(leg.sweep, engine)  # both stages, before any run
    if spec.confirm_train:  # else the confirmation trains and samples as the exploration does
        check_engine(sweep_from_dict(confirmation_doc(doc, spec, {}, config_path.parent),
                                     root=config_path.parent), engine)  # fmt: skip
    with RunLock(out):  # one study per folder; each stage's sweep locks its own
        return two_stage.run(leg, out, config_path)
