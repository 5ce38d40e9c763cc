"""The frontier of an LLM sweep's evaluations (`llm.orchestrate.sweep`): per-problem gains over the
base model from the stored counts, lifts at matched pass@1 over the reference curve
(`experiment.report.lift_analysis`), the lift tables and the frontier figure (`write_reports`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from experiment import frontier, report, reread

__all__ = [
    "confirmed_measures",
    "frontier_analysis",
    "frontier_arrays",
    "frontier_inputs",
    "lift_intro",
    "save_inputs",
    "setting_name",
    "write_reports",
]


def setting_name(params: Mapping[str, Any]) -> str:
    """``"k=v,k=v"`` (``"default"`` for no parameters): a model's setting label."""
    return ",".join(f"{k}={v}" for k, v in params.items()) or "default"


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


def frontier_arrays(
    results: Mapping[str, Any], measure: str
) -> tuple[np.ndarray, np.ndarray, Any, list[dict[str, Any]]]:
    """The per-problem gains over the base model of a sweep's results in `experiment.frontier`'s
    layout (`experiment.frontier.gains_from_counts`: the base model is the first reference
    label's step 0, models are (label, setting, step), seeds as the sweep's).

    Raises:
        ValueError: an unknown `measure`, or a model missing some seed.
    """
    s = results["settings"]
    base = next(m for m in results["models"] if m["label"] == "base")
    records = [{**m, "setting": setting_name(m["params"])} for m in results["models"]
               if m["label"] != "base"]  # fmt: skip
    return frontier.gains_from_counts(
        base, records, seeds=s["seeds"], measure=measure, k=int(s["eval"]["ks"][-1]),
        reference=s["reference"][0],
    )  # fmt: skip


def frontier_inputs(results: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{measure: {"x", "y", "models", "rows", "reference", "k"}}``: the arguments of
    `experiment.report.lift_analysis` for each measure of `experiment.report.MEASURES`
    (`frontier_arrays`; k the largest evaluated k for pass@k, None for distinct correct)."""
    s = results["settings"]
    out = {}
    for measure in report.MEASURES:
        x, y, models, rows = frontier_arrays(results, measure)
        k = int(s["eval"]["ks"][-1]) if measure == "pass_at_k" else None
        out[measure] = {"x": x, "y": y, "models": models, "rows": rows,
                        "reference": list(s["reference"]), "k": k}  # fmt: skip
    return out


def frontier_analysis(
    results: Mapping[str, Any],
    *,
    num_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    inputs: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Lift at matched pass@1 of every model over the reference labels' upper envelope, for each
    measure of `experiment.report.MEASURES` (`experiment.report.lift_analysis`: the lift over the
    reference's hull, draws of every model's mean over training seeds and problems), from
    `inputs` (default: `frontier_inputs` of `results`).

    Returns:
        ``{measure: section}`` of `lift_analysis`; gains over the base model (x: pass@1, y: the
        measure), NaN written as null.
    """
    stage = {"measures": inputs if inputs is not None else frontier_inputs(results),
             "num_resamples": num_resamples, "level": level, "seed": seed}  # fmt: skip
    return reread.sections(stage)


def _title(results: Mapping[str, Any]) -> str:
    s = results["settings"]
    ev = s["eval"]
    level = next(iter(results["frontier"].values()))["level"]
    return (f"frontiers: {ev['problems']} problems × {ev['samples']} samples (paired), seeds "
            f"{s['seeds']}, checkpoints {s['checkpoints']}; bars: {round(100 * level)}% "
            "t intervals of each method's hull vertices")  # fmt: skip


def save_inputs(
    results: Mapping[str, Any],
    path: Path,
    inputs: Mapping[str, Mapping[str, Any]],
    *,
    num_resamples: int,
    seed: int = 0,
) -> Path:
    """Write a sweep's lift inputs (`frontier_inputs`) with its table paragraph and figure title
    to `path` (`experiment.reread.save_inputs`), so that a later procedure can re-read it."""
    level = next(iter(results["frontier"].values()))["level"]
    return reread.save_inputs(
        path, inputs, num_resamples=num_resamples, seed=seed, level=level,
        intro=lift_intro(results), labels=results["settings"]["labels"], title=_title(results),
    )  # fmt: skip


def lift_intro(results: Mapping[str, Any]) -> str:
    """The paragraph above the lift tables (`experiment.report.lift_markdown`): the reference,
    the paired evaluation design, the seeds and the CI."""
    s = results["settings"]
    ev = s["eval"]
    return (
        f"Lift at matched pass@1 over `{', '.join(s['reference'])}` (all its settings and "
        "checkpoints, and the base model at step 0), gains over the base model. "
        f"Paired evaluation: {ev['problems']} problems ({ev['source']}) × {ev['samples']} "
        "samples, "
        f"sampling seed {ev['seed']} for every model; training seeds {s['seeds']}; "
        f"{report.LIFT_METHOD}; {report.LIFT_STATUS}."
    )


def write_reports(results: Mapping[str, Any], frontier_png: Path, lifts_md: Path) -> str:
    """Write the frontier figure and the lift tables (`experiment.report`); returns the tables."""
    s = results["settings"]
    report.plot_frontier(results["frontier"], frontier_png, labels=s["labels"],
                         reference=s["reference"], title=_title(results))  # fmt: skip
    text = report.lift_markdown(results["frontier"], lift_intro(results))
    lifts_md.write_text(text, encoding="utf-8")
    return text
