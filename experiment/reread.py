"""Re-reading a committed study with the procedure in force, without training anything again.

A study's verdicts are a function of its per-problem gains: every sweep stage writes the inputs of
its lift analysis (`experiment.report.lift_analysis`: per measure the `(M, S, P)` gains over the
base in pass@1 and in the measure, the models, their rows, the reference labels and k) beside its
results.json as ``lift_inputs.npz`` (`save_inputs`), and study.json records under ``reading`` what
`experiment.study.conclude` and the verdict page need beyond its design. `experiment.study_report.
publish` copies both stages' inputs next to study.json, so a committed study can be re-read by a
later procedure (``python -m experiment reread STUDY_DIR``, `reread`): both stages' lift sections
are recomputed, the picks made again and the confirmation concluded again.

A pick whose setting the confirmation did not train cannot be confirmed by a re-read (its
confirmation models do not exist): it is listed under ``pending`` with its exploratory lift and
gets no verdict until the confirmation is re-run (`python -m llm study` / `python -m toymdp study`
on the same config trains just those runs). A pick that moves to another checkpoint of a trained
setting is read there: the confirmation evaluated every checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiment import frontier, inference, report, store
from experiment import study as S
from experiment import study_report as R

__all__ = ["INPUTS", "load_inputs", "reread", "save_inputs", "sections", "write_study"]

INPUTS = "lift_inputs.npz"
_METHOD, _STATUS = "<lift method>", "<lift status>"  # the procedure's texts, filled in when read


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"lift inputs: {type(v).__name__} is not JSON-serializable")


def save_inputs(
    path: str | Path,
    inputs: Mapping[str, Mapping[str, Any]],
    *,
    num_resamples: int,
    seed: int,
    intro: str,
    labels: Sequence[str],
    title: str,
    level: float = 0.95,
) -> Path:
    """Write a stage's lift-analysis inputs to `path` (npz, compressed, atomically).

    Args:
        inputs: ``{measure: {"x", "y", "models", "rows", "reference", "k"}}``: the arguments of
            `experiment.report.lift_analysis` (`x`, `y` `(M models, S seeds, P problems)` gains,
            `models` a `experiment.frontier.Models`, `rows` one JSON-serializable mapping per
            model, `reference` the reference labels, `k` the k of pass@k or None).
        num_resamples, seed, level: the analysis' draws, their seed and the interval level.
        intro, labels, title: the lift table's paragraph and the frontier figure's legend order
            and title (`experiment.report.lift_markdown`, `plot_frontier`); the procedure's texts
            (`report.LIFT_METHOD`, `report.LIFT_STATUS`) in `intro` are stored as placeholders.
    """
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"num_resamples": int(num_resamples), "seed": int(seed),
                            "level": float(level), "labels": list(labels), "title": title,
                            "intro": intro.replace(report.LIFT_METHOD, _METHOD)
                            .replace(report.LIFT_STATUS, _STATUS), "measures": {}}  # fmt: skip
    for measure, a in inputs.items():
        arrays[f"x_{measure}"] = np.asarray(a["x"], dtype=np.float64)
        arrays[f"y_{measure}"] = np.asarray(a["y"], dtype=np.float64)
        m = a["models"]
        ref = a["reference"]
        meta["measures"][measure] = {
            "models": {"method": list(m.method), "setting": list(m.setting), "step": list(m.step)},
            "rows": [dict(r) for r in a["rows"]], "k": a["k"],
            "reference": [ref] if isinstance(ref, str) else list(ref),
        }  # fmt: skip
    arrays["meta"] = np.array(json.dumps(meta, default=_plain))
    return store.save_npz(path, arrays, compressed=True)


def load_inputs(path: str | Path) -> dict[str, Any]:
    """The stage `save_inputs` wrote: its ``meta`` with each measure's ``x``, ``y`` and
    ``models`` (`experiment.frontier.Models`) filled in.

    Raises:
        FileNotFoundError: naming `path`.
        ValueError: `path` is not a lift-inputs file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lift inputs: {path} does not exist")
    with np.load(path, allow_pickle=False) as data:
        if "meta" not in data.files:
            raise ValueError(
                f"lift inputs: {path} has no 'meta' entry (not written by save_inputs)"
            )
        meta = json.loads(str(data["meta"]))
        for measure, a in meta["measures"].items():
            a["x"], a["y"] = data[f"x_{measure}"], data[f"y_{measure}"]
            a["models"] = frontier.Models(**a["models"])
    return meta


def sections(stage: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{measure: section}`` of `experiment.report.lift_analysis` for a loaded stage
    (`load_inputs`), with the stage's draws, seed and level: results.json's ``frontier``."""
    out = {}
    for measure, a in stage["measures"].items():
        out[measure], _ = report.lift_analysis(
            a["x"], a["y"], a["models"], a["rows"], a["reference"], k=a["k"],
            num_resamples=stage["num_resamples"], level=stage["level"], seed=stage["seed"],
        )  # fmt: skip
    return out


def write_study(
    out: str | Path, result: dict[str, Any], *, reading: Mapping[str, Any], how: str, unit: str
) -> None:
    """Write study.json (`result` with ``reading``: `reading` (``reference``, ``defaults``,
    ``problems``, ``by_step``: `experiment.study.conclude`'s arguments beyond the design), `how`
    (the design paragraph of verdicts.md) and `unit` (its problem unit)) and verdicts.md
    (`experiment.study_report.study_markdown`), atomically."""
    out = Path(out)
    result["reading"] = {**reading, "how": how, "unit": unit}
    text = R.study_markdown(result, how, unit)
    if result.get("pending"):
        text += "\n## Picks not confirmed\n\n" + "\n".join(
            f"- `{label}`: {p['setting']} at step {p['step']} (exploratory lift "
            f"{100 * p['lift']:+.1f} points): the confirmation did not train this setting; "
            "re-run the study's confirmation to judge it."
            for label, p in result["pending"].items()
        ) + "\n"  # fmt: skip
    store.write_json(out / "study.json", result, indent=1)
    store.write_text(out / "verdicts.md", text)


def reread(study_dir: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """Re-read a study (published with `experiment.study_report.publish`, or a study's output
    folder) with the procedure in force (module docstring); writes study.json, verdicts.md and
    each stage's lift table and frontier figure into `out` (default: `study_dir`) and returns
    the new study.json's dict. Its ``reread`` records the procedure read before and the commit.

    Raises:
        ValueError: study.json is missing or has no ``reading`` (written before 2026-11-27: the
            study must be re-run), naming the file.
        FileNotFoundError: a stage's lift inputs are missing.
    """
    src = Path(study_dir)
    out = Path(out) if out is not None else src
    doc = store.read_json(src / "study.json")
    if doc is None:
        raise ValueError(f"study_dir: {src / 'study.json'} is missing or unreadable")
    if "reading" not in doc:
        raise ValueError(f"study_dir: {src / 'study.json'} has no 'reading' (written before "
                         "studies kept their lift inputs): re-run the study to re-read it")  # fmt: skip
    reading = doc["reading"]
    stages = {}
    for stage in ("explore", "confirm"):
        published = src / f"{stage}_{INPUTS}"
        stages[stage] = load_inputs(published if published.is_file() else src / stage / INPUTS)
    found = {stage: sections(data) for stage, data in stages.items()}
    picks = S.pick(found["explore"])
    trained = doc["picks"]["pass_at_k"]  # the settings the confirmation trained, every checkpoint
    pending = {label: p for label, p in picks["pass_at_k"].items()
               if label not in trained or p["setting"] != trained[label]["setting"]}  # fmt: skip
    kept = {measure: {label: p for label, p in ps.items() if label not in pending}
            for measure, ps in picks.items()}  # fmt: skip
    design = {k: v for k, v in doc["design"].items()
              if k not in ("alpha", "claim_size", "claim_size_distinct")}  # fmt: skip
    result = S.conclude(
        doc["study"], kept, found["confirm"], reference=reading["reference"],
        alpha=doc["design"]["alpha"], size=doc["design"]["claim_size"],
        size_distinct=doc["design"]["claim_size_distinct"], problems=reading["problems"],
        design=design, provenance=doc["provenance"], by_step=reading["by_step"],
        costs=doc.get("costs"), defaults=reading["defaults"],
        claims=[tuple(c) for c in reading.get("claims", S.CLAIMS)],
    )  # fmt: skip
    if pending:
        result["pending"] = {label: {k: p.get(k) for k in S.PICK_KEYS}
                             for label, p in pending.items()}  # fmt: skip
    for key in ("measures", "fingerprints", "extends"):  # of the trained models: unchanged
        if key in doc:
            result[key] = doc[key]
    result["reread"] = {"from": doc.get("procedure"), "procedure": inference.PROCEDURE,
                        "git_commit": R.git_commit()}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    for stage, data in stages.items():
        intro = (
            data["intro"].replace(_METHOD, report.LIFT_METHOD).replace(_STATUS, report.LIFT_STATUS)
        )
        store.write_text(out / f"{stage}_lifts.md", report.lift_markdown(found[stage], intro))
        report.plot_frontier(found[stage], out / f"{stage}_frontier.png", labels=data["labels"],
                             reference=next(iter(data["measures"].values()))["reference"],
                             title=data["title"])  # fmt: skip
    write_study(out, result, reading=reading, how=reading["how"], unit=reading["unit"])
    return result
