"""`python -m toymdp study --config FILE [--out DIR]`: a two-stage toy study with verdicts.

`ToyLeg` runs `experiment.two_stage`'s stages of a study file (`toymdp.study_spec`) as toy sweeps:
the exploration as written, every row read at every checkpoint; the confirmation
(`toymdp.study_spec.confirmation_doc`) on fresh dataset draws (new prompts and correct sets) and
training keys. Outputs in OUT (default ``runs/toy_study/<config stem>``):
``explore/`` and ``confirm/`` (sweep folders, each cached like a sweep, so a rerun costs only the
analysis), ``study.json`` and ``verdicts.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiment import two_stage
from experiment.lock import RunLock
from toymdp import sweep as SW
from toymdp.study_spec import StudySpec, confirmation_doc, load_study
from toymdp.sweep_spec import SweepConfig, parse_config

__all__ = ["COSTS", "ToyLeg", "run_study"]


COSTS = {"run": 0.0, "problem": 1.0, "unit": "draw × seed trainings"}
"""The toy's cost model for `experiment.study.design_for`: every (draw, seed) cell is one training
(vectorized together), so a design costs seeds × draws."""


@dataclass
class ToyLeg:
    """The toy's `experiment.two_stage.Leg`: each stage a toy sweep
    (`toymdp.sweep.sweep_config`)."""

    cfg: SweepConfig
    spec: StudySpec
    out: Path
    use_cache: bool = True
    progress: bool = True
    unit: str = "Dataset draws"

    def __post_init__(self) -> None:
        self.budget = two_stage.study_budget(SW.budgets(self.cfg), self.cfg.reference, self.spec)
        self.reading = {"reference": self.cfg.reference[0],
                        "problems": len(self.spec.confirm_draws),
                        "defaults": {"lr": self.cfg.train.lr, "kl_coef": self.cfg.train.kl_coef},
                        "by_step": True}  # fmt: skip

    def _sweep(self, cfg: SweepConfig, stage: str) -> dict[str, Any]:
        return SW.sweep_config(cfg, self.out / stage, use_cache=self.use_cache,
                               progress=self.progress)["doc"]  # fmt: skip

    def explore(self) -> dict[str, Any]:
        return self._sweep(self.cfg, "explore")

    def confirm(self, picks: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        return self._sweep(parse_config(confirmation_doc(self.cfg, self.spec, picks)), "confirm")

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
    """Both stages of the study in `config_path` (`experiment.two_stage.run` of a `ToyLeg`);
    returns study.json's dict.

    Raises:
        ValueError: naming the file and key of a bad configuration.
        experiment.lock.RunFolderError: another live study holds `out` (its PID named).
    """
    config_path = Path(config_path)
    cfg, spec = load_study(config_path)
    out = Path(out) if out is not None else Path("runs/toy_study") / config_path.stem
    with RunLock(out):  # one study per folder; each stage's sweep locks its own
        return two_stage.run(ToyLeg(cfg, spec, out, use_cache, progress), out, config_path)
