"""`python -m llm study --config FILE [--workers N] [--out DIR]`: a two-stage LLM study with verdicts.

`LLMLeg` runs `experiment.two_stage`'s stages of a study file (`llm.orchestrate.study_spec`) as
LLM sweeps (`llm.orchestrate.sweep.run_sweep`): the exploration as written, every run evaluated
at every checkpoint; the confirmation (`llm.orchestrate.study_spec.confirmation`) on fresh seeds
and held-out problems. Outputs in OUT (default ``runs/llm_study/<config stem>``): ``explore/``
and ``confirm/`` (sweep folders: results.json, lifts.md, frontier.png, runs/), ``study.json`` and
``verdicts.md``. Both stages resume run by run (`llm.orchestrate.jobs`): a rerun after a kill
continues where it stopped and reuses every finished run and evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiment import two_stage
from llm.eval.frontier import confirmed_measures
from llm.orchestrate.executor import check_executor
from llm.orchestrate.study_spec import UNIT, StudySpec, confirmation, load_study
from llm.orchestrate.sweep import check_engine, measured_costs, run_sweep
from llm.orchestrate.sweep_spec import SweepSpec, budgets
from llm.rollout.stacked import VERSION as SAMPLER_VERSION
from llm.run.folder import RunLock

__all__ = ["LLMLeg", "run_study"]


@dataclass
class LLMLeg:
    """The LLM's `experiment.two_stage.Leg`: each stage an LLM sweep (`run_sweep`, resumable run
    by run; `run_options` go to it), the `engine` checked for both stages before any run."""

    sweep: SweepSpec
    spec: StudySpec
    out: Path
    engine: str
    run_options: dict[str, Any]
    unit: str = UNIT

    def __post_init__(self) -> None:
        check_engine(self.sweep, self.engine)
        if self.spec.confirm_train:  # else the confirmation trains and samples as the exploration
            check_engine(confirmation(self.sweep, self.spec, {}), self.engine)
        self.budget = two_stage.study_budget(budgets(self.sweep), self.sweep.reference, self.spec)
        cfg = self.sweep.base_config  # "defaults": the tuned keys of a run without a setting
        defaults = {"optim.lr": float(cfg.optim.lr), "kl_coef": float(cfg.kl_coef)}
        self.reading = {"reference": self.sweep.reference[0], "defaults": defaults,
                        "problems": self.spec.confirm_problems, "by_step": True}  # fmt: skip

    def explore(self) -> dict[str, Any]:
        return run_sweep(self.sweep, self.out / "explore", engine=self.engine, **self.run_options)

    def confirm(self, picks: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        csweep = confirmation(self.sweep, self.spec, picks)
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
    sweep, spec = load_study(config_path)
    out = Path(out) if out is not None else Path("runs/llm_study") / config_path.stem
    options = {"workers": workers, "progress": progress, "num_resamples": num_resamples,
               "executor": executor, "address": address, "log": log}  # fmt: skip
    leg = LLMLeg(sweep, spec, out, engine, options)
    with RunLock(out):  # one study per folder; each stage's sweep locks its own
        return two_stage.run(leg, out, config_path)
