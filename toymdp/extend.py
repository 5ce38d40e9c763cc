"""`python -m toymdp study --extend DIR --methods FILE [--import MODULE] [--out OUT]`: a new method's
verdict against a committed toy study, GRPO not re-trained (`experiment.extend`).

`ToyExtension` is the toy's `experiment.extend.ExtensionLeg`: the committed study's file (its
provenance, content checked) gives the sweep, its tuning budget and its confirmation design; the
methods file's ``[[methods]]`` entries replace the study's methods beside GRPO's reference entries
(so every check of a study file applies: the methods' bounds, the equal budget). Each stage trains
the new entries alone, one compiled program per entry as in the full study, so a method's bytes
are those it would have in the full study (tests/toymdp/test_extend.py re-derives a committed
method). The trust check re-trains GRPO's exploratory entry and compares its gains' fingerprint
(`experiment.extend.gains_fingerprint`, every tuning setting, checkpoint, seed and draw) with the
committed lift inputs'.

Outputs in OUT (default ``runs/toy_extend/<study folder name>``): ``explore/`` and ``confirm/``
(the new runs' caches), and `experiment.extend.run`'s files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiment import extend as E
from experiment import report, two_stage
from experiment.lock import RunLock
from toymdp import sweep as SW
from toymdp.study_spec import StudySpec, confirmation_doc, load_study
from toymdp.sweep_spec import SweepConfig, parse_config

__all__ = ["ToyExtension", "complete_study", "extend_study"]


def _only(cfg: SweepConfig, labels: Sequence[str]) -> SweepConfig:
    """`cfg` with the entries of `labels` alone (its reference kept as the reading's): the
    document too, so that its cache key is its own."""
    keep = set(labels)
    doc = dict(cfg.doc)
    doc["methods"] = [m for m in doc["methods"] if m.get("label", m["method"]) in keep]
    methods = tuple(m for m in cfg.methods if m.label in keep)
    return dataclasses.replace(cfg, methods=methods, doc=doc)


@dataclass
class ToyExtension:
    """The toy's `experiment.extend.ExtensionLeg` (module docstring)."""

    committed: E.Committed
    methods: list[dict[str, Any]]
    claims: dict[str, str]
    out: Path
    methods_path: Path
    use_cache: bool = True
    progress: bool = True
    unit: str = "Dataset draws"

    def __post_init__(self) -> None:
        self.cfg, self.spec = load_study(self.committed.config)
        ref = list(self.cfg.reference)
        doc = E.extension_doc(self.cfg.doc, ref, self.methods, self.methods_path)
        try:
            self.ext: SweepConfig = parse_config(doc)
        except ValueError as err:
            raise ValueError(f"{self.methods_path}: {err}") from None
        self.labels = [m.label for m in self.ext.methods if m.label not in ref]
        self.budget = two_stage.study_budget(SW.budgets(self.ext), self.ext.reference, self.spec,
                                             self.methods_path)  # fmt: skip
        self.prints: dict[str, dict[str, str]] = {}

    def _inputs(self, cfg: SweepConfig, stage: str) -> dict[str, dict[str, Any]]:
        res, _ = SW.run_cached(cfg, self.out / stage, use_cache=self.use_cache,
                               progress=self.progress)  # fmt: skip
        out = {}
        for metric in report.MEASURES:
            data = SW.frontier_data(cfg, res, metric)
            k = max(cfg.train.pass_k) if metric == "pass_at_k" else None
            out[metric] = {**{key: data[key] for key in ("x", "y", "models", "rows")},
                           "reference": list(cfg.reference), "k": k}  # fmt: skip
        a = out["pass_at_k"]
        self.prints[stage] = {}
        for label in dict.fromkeys(a["models"].method):
            i = a["models"].select(label)
            self.prints[stage][label] = E.gains_fingerprint(a["x"][i], a["y"][i])
        return out

    def trust(self) -> list[dict[str, Any]]:
        ref = list(self.cfg.reference)
        got = self._inputs(_only(self.ext, ref[:1]), "trust")["pass_at_k"]
        have = self.committed.stages["explore"]["measures"]["pass_at_k"]
        i, j = have["models"].select(ref[0]), got["models"].select(ref[0])
        return [{"run": f"{ref[0]} (exploration: every tuning setting, seed and draw)",
                 "committed": E.gains_fingerprint(have["x"][i], have["y"][i]),
                 "here": E.gains_fingerprint(got["x"][j], got["y"][j])}]  # fmt: skip

    def explore(self, retrain: bool) -> dict[str, dict[str, Any]]:
        labels = [*self.ext.reference, *self.labels] if retrain else self.labels
        return self._inputs(_only(self.ext, labels), "explore")

    def confirm(
        self,
        picks: Mapping[str, Mapping[str, Any]],
        retrain: bool,
        every_checkpoint: bool = False,
    ) -> dict[str, dict[str, Any]]:
        del every_checkpoint  # a toy run is read at every checkpoint: one compiled program
        cfg = parse_config(confirmation_doc(self.ext, self.spec, picks))
        labels = [*cfg.reference, *picks] if retrain else list(picks)
        return self._inputs(_only(cfg, labels), "confirm")

    def stages(self) -> tuple[str, str]:
        s: StudySpec = self.spec
        return (f"the new methods on the study's draws {list(self.cfg.env.draws)}, seeds "
                f"{list(self.cfg.seeds)}, checkpoints {list(self.cfg.eval_steps[1:])}",
                f"those picks re-trained on the study's confirmation keys (root {s.confirm_key}, "
                f"seeds {list(s.confirm_seeds)}) and evaluated on its confirmation draws "
                f"({len(s.confirm_draws)} draws: the problem units of the lift)")  # fmt: skip

    def extras(self) -> dict[str, Any]:
        return {"fingerprints": {stage: dict(p) for stage, p in self.prints.items()
                                 if stage != "trust"}}  # fmt: skip


def extend_study(
    study_dir: str | Path,
    methods_path: str | Path,
    out: str | Path | None = None,
    *,
    retrain: bool = False,
    use_cache: bool = True,
    progress: bool = True,
    imports: Sequence[str] = (),
) -> dict[str, Any]:
    """Extend the committed toy study in `study_dir` by the ``[[methods]]`` of `methods_path`
    (`experiment.extend.run` of a `ToyExtension`); returns the extension's study.json dict.

    Raises:
        ValueError: naming the file and key of a bad methods file, a committed study whose
            config changed, a re-trained reference whose fingerprint differs (without
            `retrain`), or an `out` in the committed folder.
        experiment.lock.RunFolderError: another live study or extension holds `out`.
    """
    committed = E.load_committed(study_dir, unit=ToyExtension.unit)
    methods, claims = E.read_methods(methods_path)
    out = Path(out) if out is not None else Path("runs/toy_extend") / Path(study_dir).name
    leg = ToyExtension(committed, methods, claims, out, Path(methods_path), use_cache, progress)
    E.check_out(out, committed)  # before the lock writes into it
    with RunLock(out):  # one study or extension per folder
        return E.run(leg, committed, out, methods_path=methods_path,
                     retrain=retrain, imports=imports)  # fmt: skip


def complete_study(
    study_dir: str | Path,
    out: str | Path | None = None,
    *,
    use_cache: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Train the confirmation of the committed toy study's pending picks and read the whole study
    again (`experiment.extend.complete` of a `ToyExtension` over the study's own entries of the
    pending labels); returns the new study.json dict. Output in `out` (default
    ``runs/toy_complete/<study folder name>``).

    Raises:
        ValueError: nothing pending, a stale pending pick, a committed study whose config changed,
            a re-trained reference whose fingerprint differs, or an `out` in the committed folder.
        experiment.lock.RunFolderError: another live study or extension holds `out`.
    """
    committed = E.load_committed(study_dir, unit=ToyExtension.unit)
    pending = E.pending_labels(committed)
    out = Path(out) if out is not None else Path("runs/toy_complete") / Path(study_dir).name
    leg = ToyExtension(committed, E.study_entries(committed, pending), {}, out,
                       committed.config, use_cache, progress)  # fmt: skip
    E.check_out(out, committed)  # before the lock writes into it
    with RunLock(out):
        return E.complete(leg, committed, out)
