"""`python -m llm study --config FILE [--workers N] [--out DIR]`: a two-stage LLM study with verdicts.

A study file is an LLM sweep file (`llm.orchestrate.sweep`: the exploratory stage, every method's
coefficients against GRPO's own curve, every run evaluated at every checkpoint) plus a ``[study]``
table (`StudySpec`): the fresh training seeds, the fresh held-out problems (how many, and how many
of the stream to skip: the exploratory ones) of the confirmation stage, the claimed size of a lift
and the family-wise level. The stages (`experiment.study`):

1. **explore**: the sweep as written; per method label, the (setting, checkpoint) with the
   largest (bias-corrected) estimate of its pass@k lift. Every method must get the tuning of GRPO's reference
   (its learning rates, ``kl_coef`` values and checkpoints: `budgets`, checked by
   `experiment.spec.check_budget`; a top-level ``tune`` table gives it to all), unless
   ``unequal_budget = true`` says otherwise, which study.json's ``design.budget`` then records;
2. **confirm**: the reference entries as written plus one entry per pick (its setting), trained on
   the fresh seeds and evaluated on the fresh problems at the same checkpoints; each pick is read
   at its picked checkpoint, Holm over the picks, the MDE, every claim's verdict.

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

import numpy as np

from experiment import schema, store, two_stage
from experiment.schema import meta, option
from experiment.spec import Budget, check_budget, untune
from llm.config import MOVED_KEYS
from llm.eval.frontier import setting_name
from llm.orchestrate.executor import check_executor
from llm.orchestrate.sweep import check_engine, run_sweep
from llm.orchestrate.sweep_spec import SweepSpec, merge_tables, run_config, sweep_from_dict
from llm.rollout.stacked import VERSION as SAMPLER_VERSION
from llm.run.folder import RunLock

__all__ = [
    "TUNING_KEYS",
    "LLMLeg",
    "StudySpec",
    "budgets",
    "confirmation_doc",
    "confirmed_measures",
    "load_study",
    "measured_costs",
    "run_study",
    "study_budget",
]


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


TUNING_KEYS = ("optim.lr", "kl_coef", "steps")
"""A setting's keys that tune it rather than shape it (`budgets`; ``steps`` moves its
checkpoints)."""


def budgets(sweep: SweepSpec) -> list[Budget]:
    """Each setting's tuning (`experiment.spec.Budget`): its learning rate and ``kl_coef`` as its
    runs train (`llm.orchestrate.sweep_spec.run_config`: base config, ``[train]``, the setting) and the
    checkpoints its models are read at (`llm.orchestrate.sweep_spec.SweepSpec.checkpoints_of`: every
    one)."""
    out = []
    for s in sweep.settings:
        cfg = run_config(sweep, s)
        own = {k: v for k, v in s.params.items() if MOVED_KEYS.get(k, k) not in TUNING_KEYS}
        axes = {"optim.lr": float(cfg.optim.lr), "kl_coef": float(cfg.kl_coef),
                "checkpoints": tuple(sweep.checkpoints_of(s))}  # fmt: skip
        out.append(Budget(s.label, setting_name(own), axes))
    return out


def _configured(sweep: SweepSpec) -> dict[str, float]:
    """The tuned keys' values of a run with no setting of its own (the base config and
    ``[train]``): the GRPO setting "GRPO sharpens" is read from (`experiment.study.conclude`)."""
    cfg = sweep.base_config
    return {"optim.lr": float(cfg.optim.lr), "kl_coef": float(cfg.kl_coef)}


def study_budget(sweep: SweepSpec, spec: StudySpec) -> tuple[str, str | None]:
    """The study's tuning budget (`experiment.spec.check_budget` of `budgets`) and, when it is
    unequal, how (`experiment.spec.budget_difference`).

    Raises:
        ValueError: a method tuned otherwise than the reference without ``unequal_budget``.
    """
    return check_budget(budgets(sweep), sweep.reference, unequal=spec.unequal_budget)


def load_study(path: str | Path) -> tuple[dict[str, Any], StudySpec]:
    """The exploratory sweep document (the file without ``[study]``) and its `StudySpec`; the
    sweep is validated (`llm.orchestrate.sweep_spec.sweep_from_dict`), and so are its tuning budgets
    (`experiment.spec.check_budget` of `budgets`).

    Raises:
        ValueError: naming the file and key: a bad ``[study]`` key, confirmation seeds that are
            also exploratory seeds, confirmation problems overlapping the exploratory ones, or a
            method tuned otherwise than the reference without ``unequal_budget = true``.
    """
    path = Path(path)
    doc = dict(store.read_toml(path))
    table = doc.pop("study", {})
    try:
        spec = schema.from_dict(StudySpec, table if isinstance(table, Mapping) else {"": table})
        schema.check_fields(spec)
        sweep = sweep_from_dict(doc, root=path.parent)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: study: {err}") from None
    if spec.confirm_train:  # checked before any run, not after the exploration
        try:
            sweep_from_dict(confirmation_doc(doc, spec, {}, path.parent), root=path.parent)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: study.confirm_train: {err}") from None
    reused = sorted(set(spec.confirm_seeds) & set(sweep.seeds))
    if reused:
        raise ValueError(f"{path}: study.confirm_seeds: {reused} are exploratory seeds")
    try:
        study_budget(sweep, spec)
    except ValueError as err:
        raise ValueError(f"{path}: study: {err}") from None
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


def confirmed_measures(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per model of a sweep's results (label, setting, step; the base filed under the first
    reference label at step 0) the means over its seeds of pass@1, pass@k at the largest k, maj@k
    at that k, the answer entropy (nats) and distinct correct: study.json's ``measures``
    (`experiment.study_report.measures_markdown`). A measure some seed's evaluation did not
    record (an evaluation older than maj@k) is None."""
    s = results["settings"]
    k = str(s["eval"]["ks"][-1])
    groups: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for m in results["models"]:
        base = m["label"] == "base"
        key = (s["reference"][0] if base else m["label"],
               "base" if base else setting_name(m["params"]), int(m["step"]))  # fmt: skip
        groups.setdefault(key, []).append(m)

    def mean(values: list[Any]) -> float | None:
        return None if any(v is None for v in values) else float(np.mean(values))

    return [{"label": label, "setting": setting, "step": step,
             "pass1": mean([m["pass1"] for m in ms]),
             "pass_at_k": mean([m["pass_at_k"][k] for m in ms]),
             "maj_at_k": mean([(m.get("maj_at_k") or {}).get(k) for m in ms]),
             "answer_entropy": mean([m.get("answer_entropy") for m in ms]),
             "distinct_correct": mean([m["distinct_correct"] for m in ms])}
            for (label, setting, step), ms in groups.items()]  # fmt: skip


def measured_costs(runs_dir: Path) -> dict[str, Any] | None:
    """The cost model of `experiment.study.design_for` from a sweep's finished runs
    (``RUNS/*/sweep_run.json``): the median training time of a run and the median, over runs, of
    the evaluation time per problem summed over the run's checkpoints, in seconds of one worker
    (one core; process start-up not counted). None when no run has both."""
    train, per_problem = [], []
    for marker in sorted(Path(runs_dir).glob("*/sweep_run.json")):
        doc = store.read_json(marker)
        evals = [e["result"] for e in doc.get("evals", {}).values()
                 if "eval_seconds" in e.get("result", {})]  # fmt: skip
        if doc.get("train_seconds") is not None and doc.get("finished") and evals:
            train.append(float(doc["train_seconds"]))
            per_problem.append(sum(r["eval_seconds"] / len(r["correct"]) for r in evals))
    if not train:
        return None
    return {"run": float(np.median(train)), "problem": float(np.median(per_problem)),
            "unit": "core-s"}  # fmt: skip


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
        self.budget = study_budget(self.sweep, self.spec)
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
