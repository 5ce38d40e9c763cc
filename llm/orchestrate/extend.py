"""`python -m llm study --extend DIR --methods FILE [--import MODULE] [--out OUT]`: a new method's
verdict against a committed LLM study, GRPO not re-trained (`experiment.extend`).

`LLMExtension` is the LLM's `experiment.extend.ExtensionLeg`: the committed study's file (its
provenance, content checked) gives the sweep, its tuning budget and its confirmation design; the
methods file's ``[[methods]]`` entries replace the study's methods beside GRPO's reference
entries (so every check of a study file applies). Both stages run on the study's engine
(study.json's ``design.engine``): the exploration trains the new settings on the study's seeds
and evaluates every checkpoint on its problems; the confirmation trains each pick on the
confirmation seeds and evaluates its picked checkpoint alone on the confirmation problems (the
full study evaluates every checkpoint there: the same run, two thirds of its evaluations saved).
The base model's evaluation is part of each stage and of the trust check, which re-trains the
cheapest committed reference run of the exploration (`llm.orchestrate.sweep.rerun_runs`) and
compares its fingerprint (checkpoint weights and per-problem counts,
`llm.orchestrate.sweep.run_fingerprint`) and the base model's with study.json's ``fingerprints``.

Outputs in OUT (default ``runs/llm_extend/<study folder name>``): ``explore/`` (with the trust
check's runs) and ``confirm/`` (sweep folders; a rerun resumes run by run and reuses every finished run and
evaluation), and `experiment.extend.run`'s files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment import extend as E
from experiment import two_stage
from llm.eval.frontier import confirmed_measures, frontier_inputs
from llm.orchestrate.executor import check_executor
from llm.orchestrate.study_spec import UNIT, confirmation, load_study
from llm.orchestrate.sweep import check_engine, rerun_runs, run_sweep, sweep_jobs
from llm.orchestrate.sweep_spec import SweepSpec, budgets, sweep_from_dict
from llm.run.folder import RunLock

__all__ = ["LLMExtension", "complete_study", "extend_study"]


@dataclass
class LLMExtension:
    """The LLM's `experiment.extend.ExtensionLeg` (module docstring)."""

    committed: E.Committed
    methods: list[dict[str, Any]]
    claims: dict[str, str]
    out: Path
    methods_path: Path
    run_options: dict[str, Any] = field(default_factory=dict)
    unit: str = UNIT

    def __post_init__(self) -> None:
        self.sweep, self.spec = load_study(self.committed.config)
        ref = list(self.sweep.reference)
        doc = E.extension_doc(self.sweep.doc, ref, self.methods, self.methods_path)
        try:
            self.ext: SweepSpec = sweep_from_dict(doc, root=self.committed.config.parent)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{self.methods_path}: {err}") from None
        self.ext.source = f"{self.committed.config} extended by {self.methods_path}"
        self.labels = [label for label in self.ext.labels if label not in ref]
        self.budget = two_stage.study_budget(budgets(self.ext), self.ext.reference, self.spec,
                                             self.methods_path)  # fmt: skip
        self.engine = str(self.committed.doc["design"].get("engine", "process"))
        check_engine(self.ext, self.engine)
        self.prints: dict[str, dict[str, str]] = {}
        self.measured: list[dict[str, Any]] | None = None

    def _options(self) -> dict[str, Any]:
        return {k: v for k, v in self.run_options.items() if k in ("workers", "progress", "log")}

    def trust(self) -> list[dict[str, Any]]:
        committed = self.committed.doc.get("fingerprints", {}).get("explore")
        if not committed:
            raise ValueError(f"{self.committed.dir}: study.json has no exploration fingerprints "
                             "to check a re-trained reference run against; pass "
                             "--retrain-reference")  # fmt: skip
        # In the exploration's folder: its stage then reuses the base model's evaluation.
        folder = self.out / "explore"
        jobs, *_ = sweep_jobs(self.sweep, folder, engine=self.engine, workers=1, progress=False,
                              run_bars=False, labels=self.sweep.reference[:1])  # fmt: skip
        runs = [j for j in jobs[1:] if j.name in committed]
        if not runs:
            raise ValueError(f"{self.committed.dir}: no reference run of the exploration has a "
                             "committed fingerprint; pass --retrain-reference")  # fmt: skip
        cheapest = min(runs, key=lambda j: (j.cfg.steps, j.name))
        got = rerun_runs(self.sweep, folder, ["base", cheapest.name],
                         engine=self.engine, **self._options())  # fmt: skip
        return [{"run": name, "committed": committed.get(name), "here": got[name]}
                for name in ("base", cheapest.name)]  # fmt: skip

    def _stage(
        self, spec: SweepSpec, stage: str, labels: Sequence[str], steps: Mapping[str, Any] | None
    ) -> dict[str, dict[str, Any]]:
        results = run_sweep(spec, self.out / stage, engine=self.engine, labels=list(labels),
                            steps=steps, **self.run_options)  # fmt: skip
        self.prints[stage] = dict(results["fingerprints"])
        if stage == "confirm":
            self.measured = confirmed_measures(results)
        return frontier_inputs(results)

    def explore(self, retrain: bool) -> dict[str, dict[str, Any]]:
        labels = [*self.ext.reference, *self.labels] if retrain else self.labels
        return self._stage(self.ext, "explore", labels, None)

    def confirm(
        self,
        picks: Mapping[str, Mapping[str, Any]],
        retrain: bool,
        every_checkpoint: bool = False,
    ) -> dict[str, dict[str, Any]]:
        spec = confirmation(self.ext, self.spec, picks)
        labels = [*spec.reference, *picks] if retrain else list(picks)
        steps = None if every_checkpoint else {k: [p["step"]] for k, p in picks.items()}
        return self._stage(spec, "confirm", labels, steps)

    def stages(self) -> tuple[str, str]:
        sw, s = self.sweep, self.spec
        explored = sw.eval.get("offset", 0) + sw.eval["problems"]
        return (f"the new methods on the study's seeds {sw.seeds}, its first "
                f"{sw.eval['problems']} held-out problems × {sw.eval['samples']} samples, "
                f"checkpoints {sw.checkpoints}",
                f"those picks re-trained on the study's confirmation seeds {list(s.confirm_seeds)} "
                f"and evaluated at their picked checkpoint on its {s.confirm_problems} "
                f"confirmation problems (from {s.confirm_offset or explored} on)")  # fmt: skip

    def extras(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"fingerprints": self.prints}
        if self.measured is not None:  # the confirmed models' means (`confirmed_measures`)
            extra["measures"] = self.measured
        return extra


def extend_study(
    study_dir: str | Path,
    methods_path: str | Path,
    out: str | Path | None = None,
    *,
    retrain: bool = False,
    workers: int | None = None,
    progress: bool = True,
    num_resamples: int = 200,
    executor: str = "local",
    address: str | None = None,
    log: bool = False,
    imports: Sequence[str] = (),
) -> dict[str, Any]:
    """Extend the committed LLM study in `study_dir` by the ``[[methods]]`` of `methods_path`
    (`experiment.extend.run` of an `LLMExtension`); returns the extension's study.json dict.
    `workers`, `executor`, `address` and `log` go to `llm.orchestrate.sweep.run_sweep`.

    Raises:
        ValueError: naming the file and key of a bad methods file, a committed study whose
            config changed, a re-trained reference whose fingerprint differs (without
            `retrain`), an `out` that is the committed folder, or a bad executor.
        llm.run.folder.RunFolderError: another live study or extension holds `out`.
    """
    check_executor(executor, address)
    committed = E.load_committed(study_dir, unit=LLMExtension.unit)
    methods, claims = E.read_methods(methods_path)
    out = Path(out) if out is not None else Path("runs/llm_extend") / Path(study_dir).name
    options = {"workers": workers, "progress": progress, "num_resamples": num_resamples,
               "executor": executor, "address": address, "log": log}  # fmt: skip
    leg = LLMExtension(committed, methods, claims, out, Path(methods_path), options)
    E.check_out(out, committed)  # before the lock writes into it
    with RunLock(out):
        return E.run(
            leg, committed, out, methods_path=methods_path, retrain=retrain, imports=imports
        )


def complete_study(
    study_dir: str | Path,
    out: str | Path | None = None,
    *,
    workers: int | None = None,
    progress: bool = True,
    num_resamples: int = 200,
    executor: str = "local",
    address: str | None = None,
    log: bool = False,
) -> dict[str, Any]:
    """Train the confirmation of the committed LLM study's pending picks and read the whole study
    again (`experiment.extend.complete` of an `LLMExtension` over the study's own entries of the
    pending labels); returns the new study.json dict. Output in `out` (default
    ``runs/llm_complete/<study folder name>``), resumable run by run; `workers`, `executor`,
    `address` and `log` go to `llm.orchestrate.sweep.run_sweep`.

    Raises:
        ValueError: nothing pending, a stale pending pick, a committed study whose config changed,
            a re-trained reference run whose fingerprint differs, an `out` that is the committed
            folder, or a bad executor (each named).
        llm.run.folder.RunFolderError: another live study or extension holds `out`.
    """
    check_executor(executor, address)
    committed = E.load_committed(study_dir, unit=LLMExtension.unit)
    pending = E.pending_labels(committed)
    out = Path(out) if out is not None else Path("runs/llm_complete") / Path(study_dir).name
    options = {"workers": workers, "progress": progress, "num_resamples": num_resamples,
               "executor": executor, "address": address, "log": log}  # fmt: skip
    leg = LLMExtension(committed, E.study_entries(committed, pending), {}, out,
                       committed.config, options)  # fmt: skip
    E.check_out(out, committed)  # before the lock writes into it
    with RunLock(out):
        return E.complete(leg, committed, out)
