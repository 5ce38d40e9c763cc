"""Re-reading a committed study with the procedure in force, without training anything again.

A study's verdicts are a function of its per-problem gains: every sweep stage writes the inputs of
its lift analysis (`experiment.report.lift_analysis`: per measure the `(M, S, P)` gains over the
base in pass@1 and in the measure, the models, their rows, the reference labels and k) beside its
results.json as ``lift_inputs.npz`` (`save_inputs`), and study.json records under ``reading`` what
`experiment.study.conclude` and the verdict page need beyond its design. `experiment.study_report.
publish` copies both stages' inputs next to study.json, so a committed study can be re-read by a
later procedure (``python -m experiment reread STUDY_DIR``, `reread`): both stages' lift sections
are recomputed, the picks made again and the confirmation concluded again.

A published folder is one study. study.json records under ``inputs_sha256`` a digest of each
stage's lift inputs (`inputs_sha256`: their entries' names, dtypes, shapes and values), so lift
inputs that sit beside another study's study.json are refused by name (`check_inputs`); a re-read
or a publication into a folder that holds another study (identified by its name, config file and
config SHA-256: `identity`) is refused (`claim_folder`); a study.json written before the digest
existed is given it once (`upgrade`, ``python -m experiment upgrade STUDY_DIR``).

A pick whose setting the confirmation did not train cannot be confirmed by a re-read (its
confirmation models do not exist): it is listed under ``pending`` with its exploratory lift and
gets no verdict until its confirmation is trained: ``python -m llm study --complete STUDY_DIR``
(``python -m toymdp study --complete`` for a toy study; `experiment.extend.complete`) trains just
those runs, at every checkpoint, and reads the whole study again. A pick that moves to another
checkpoint of a trained setting is read there: the confirmation evaluated every checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiment import frontier, inference, report, store
from experiment import study as S
from experiment import study_report as R
from experiment.lock import check_folder

__all__ = [
    "HASH_KEY",
    "INPUTS",
    "PUBLISHED",
    "STAGES",
    "check_inputs",
    "check_study",
    "claim_folder",
    "conclude_again",
    "identity",
    "input_files",
    "inputs_sha256",
    "load_inputs",
    "publish",
    "reread",
    "save_inputs",
    "sections",
    "upgrade",
    "write_reading",
    "write_study",
]

INPUTS = "lift_inputs.npz"
STAGES = ("explore", "confirm")
HASH_KEY = "inputs_sha256"
"""study.json's key of its stages' lift-input digests: ``{"explore": hex, "confirm": hex}``."""
STUDY_KEYS = {
    "study": (),
    "design": ("alpha", "claim_size", "claim_size_distinct"),
    "provenance": ("config", "config_sha256"),
    "picks": ("pass_at_k",),
    "reading": ("reference", "problems", "defaults", "by_step", "how", "unit"),
}
"""What a re-read reads of study.json: each key and the keys it needs inside."""
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


_UNREADABLE = (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile, zlib.error)
"""What numpy and zipfile raise on a truncated, corrupt or foreign npz file."""
_META_KEYS = ("num_resamples", "seed", "level", "labels", "title", "intro", "measures")


def _entries(path: Path) -> dict[str, np.ndarray]:
    """Every entry of the npz file `path`, read whole (a corrupt entry fails here, named)."""
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError(f"a single {type(data).__name__}, not an npz archive")
        with data:
            return {name: data[name] for name in data.files}
    except _UNREADABLE as e:
        why = str(e).splitlines()[0] if str(e) else ""
        if "allow_pickle" in why:
            why = "it holds pickled objects, which are never loaded"
        raise ValueError(f"lift inputs: {path} is corrupt or not an npz file written by "
                         f"save_inputs ({type(e).__name__}: {why})") from None  # fmt: skip


def _check_values(meta: Mapping[str, Any], path: Path) -> None:
    """Each measure's gains: 3-D, one shape across measures, one row per model, finite; pass@1
    gains (``x``) and a pass@k measure's (``y``, its ``k`` set) within [-1, 1]."""
    shapes = {}
    for measure, a in meta["measures"].items():
        m = a["models"]
        for axis in ("x", "y"):
            v = a[axis]
            name = f"{axis}_{measure}"
            if v.ndim != 3 or not np.issubdtype(v.dtype, np.floating):
                raise ValueError(f"lift inputs: {path}: {name} must be a float array (models, "
                                 f"seeds, problems), got {v.dtype} of shape {v.shape}")  # fmt: skip
            rate = axis == "x" or a["k"] is not None
            bad = ~np.isfinite(v) | (rate & (np.abs(v) > 1.0))
            if bad.any():
                i, j, k = (int(n) for n in np.argwhere(bad)[0])
                bound = "finite and within [-1, 1] (a pass-rate gain)" if rate else "finite"
                raise ValueError(
                    f"lift inputs: {path}: {name} must be {bound}; {int(bad.sum())} value(s) are "
                    f"not, e.g. {float(v[i, j, k])!r} at model {i} ({m.method[i]} {m.setting[i]} "
                    f"step {m.step[i]}), seed {j}, problem {k}"
                )
            shapes[name] = v.shape
        sizes = {"models.method": len(m.method), "models.setting": len(m.setting),
                 "models.step": len(m.step), "rows": len(a["rows"])}  # fmt: skip
        if set(sizes.values()) != {a["x"].shape[0]}:
            raise ValueError(f"lift inputs: {path}: measure {measure!r} has {a['x'].shape[0]} "
                             f"models in its gains but {sizes}")  # fmt: skip
    if len(set(shapes.values())) > 1:
        raise ValueError(f"lift inputs: {path}: the gains' shapes differ: {shapes}")


def load_inputs(path: str | Path) -> dict[str, Any]:
    """The stage `save_inputs` wrote: its ``meta`` with each measure's ``x``, ``y`` and
    ``models`` (`experiment.frontier.Models`) filled in, its values checked.

    Raises:
        FileNotFoundError: naming `path`.
        ValueError: naming `path`: not a lift-inputs file (corrupt, truncated, pickled, without
            ``meta`` or one of its keys), or gains that are not `(M models, S seeds, P problems)`
            arrays of one shape with a row per model, not finite, or pass-rate gains outside
            [-1, 1].
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lift inputs: {path} does not exist")
    data = _entries(path)
    if "meta" not in data:
        raise ValueError(f"lift inputs: {path} has no 'meta' entry (not written by save_inputs)")
    try:
        meta = json.loads(str(data["meta"]))
        missing = [k for k in _META_KEYS if k not in meta]
        for measure, a in meta.get("measures", {}).items():
            missing += [f"measures.{measure}.{k}" for k in ("models", "rows", "k", "reference")
                        if k not in a]  # fmt: skip
            missing += [k for k in (f"x_{measure}", f"y_{measure}") if k not in data]
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"lift inputs: {path}: its 'meta' entry is not save_inputs' "
                         f"({type(e).__name__}: {e})") from None  # fmt: skip
    if missing:
        raise ValueError(f"lift inputs: {path}: no {', '.join(map(repr, missing))} (not written "
                         "by save_inputs)")  # fmt: skip
    for measure, a in meta["measures"].items():
        a["x"], a["y"] = data[f"x_{measure}"], data[f"y_{measure}"]
        try:
            a["models"] = frontier.Models(**a["models"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"lift inputs: {path}: measures.{measure}.models: {e}") from None
    _check_values(meta, path)
    return meta


def inputs_sha256(path: str | Path) -> str:
    """The SHA-256 of a lift-inputs file's content: each entry's name, dtype, shape and values in
    name order (not the zip's bytes, which carry write times: the same inputs, the same digest).

    Raises:
        FileNotFoundError, ValueError: as `load_inputs`, naming `path`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lift inputs: {path} does not exist")
    h = hashlib.sha256()
    for name, a in sorted(_entries(path).items()):
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def input_files(study_dir: str | Path) -> dict[str, Path]:
    """``{stage: path}`` of a study folder's lift inputs: the published ``<stage>_lift_inputs.npz``,
    else the stage folder's ``<stage>/lift_inputs.npz`` (a study's output folder)."""
    src = Path(study_dir)
    out = {}
    for stage in STAGES:
        published = src / f"{stage}_{INPUTS}"
        out[stage] = published if published.is_file() else src / stage / INPUTS
    return out


def check_study(doc: Any, path: str | Path) -> dict[str, Any]:
    """`doc`, the study.json at `path`, checked for what a re-read reads (`STUDY_KEYS`).

    Raises:
        ValueError: `doc` is missing (None) or not an object, has no ``reading`` (written before
            studies kept their lift inputs: re-run it), or lacks a key, naming `path` and the key.
    """
    if doc is None:
        raise ValueError(f"{path} is missing or unreadable: not a study's folder (a published "
                         "study, figures/..., or a study's output folder)")  # fmt: skip
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a study.json (a JSON object)")
    if "reading" not in doc:
        raise ValueError(f"{path} has no 'reading' (written before studies kept their lift "
                         "inputs): re-run the study to re-read it")  # fmt: skip
    for key, inner in STUDY_KEYS.items():
        if key not in doc:
            raise ValueError(f"{path}: no key {key!r} (not a study.json written by a study)")
        for sub in inner:
            if not isinstance(doc[key], dict) or sub not in doc[key]:
                raise ValueError(f"{path}: no key '{key}.{sub}' (not a study.json written by a "
                                 "study)")  # fmt: skip
    return doc


def identity(doc: Mapping[str, Any]) -> tuple[str, str, str]:
    """A study's identity: its name, config file and the SHA-256 of the config's content
    (`experiment.study_report.provenance`)."""
    prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
    return (str(doc.get("study")), str(prov.get("config")), str(prov.get("config_sha256")))


def _describe(doc: Mapping[str, Any]) -> str:
    name, config, sha = identity(doc)
    return f"{name!r} ({config}, config sha256 {sha[:12]})"


def claim_folder(dest: str | Path, doc: Mapping[str, Any] | None, *, src: str | Path) -> None:
    """Check that `dest` may receive the study `doc` (the study.json of `src`; None: an unfinished
    study): `dest` holds no study.json, or one of the same study (`identity`).

    Raises:
        ValueError: `dest` holds another study (both named), a study.json that cannot be read, or
            any study when `doc` is None (an unfinished study goes to a folder of its own).
        experiment.lock.RunFolderError: `dest` is a file (`experiment.lock.check_folder`).
    """
    path = check_folder(dest) / "study.json"
    if not path.exists():
        return
    there = store.read_json(path)
    if not isinstance(there, dict):
        raise ValueError(f"{dest}: holds a study.json that cannot be read ({path}); choose "
                         "another folder")  # fmt: skip
    if doc is None:
        raise ValueError(f"{dest}: holds the study {_describe(there)}; {src} is an unfinished "
                         "study (no study.json): publish it into a folder of its own")  # fmt: skip
    if identity(there) != identity(doc):
        raise ValueError(f"{dest}: holds the study {_describe(there)}, not {_describe(doc)} of "
                         f"{src}: one folder holds one study; choose another folder")  # fmt: skip


def check_inputs(doc: Mapping[str, Any], files: Mapping[str, Path], path: str | Path) -> None:
    """Check that the lift inputs `files` (``{stage: path}``) are the ones the study.json `doc`
    (at `path`) records under `HASH_KEY` (`inputs_sha256`).

    Raises:
        ValueError: `doc` records no digest (a study written before digests: record it once with
            ``python -m experiment upgrade``), or a file whose digest differs (it belongs to
            another study), naming the file and study.json.
        FileNotFoundError: a stage's lift inputs are missing.
    """
    recorded = doc.get(HASH_KEY)
    if not isinstance(recorded, dict):
        raise ValueError(f"{path}: no {HASH_KEY!r} (written before studies recorded their lift "
                         "inputs' digest): record it once with python -m experiment upgrade "
                         f"{Path(path).parent}")  # fmt: skip
    for stage, file in files.items():
        found = inputs_sha256(file)
        if found != recorded.get(stage):
            raise ValueError(f"{file}: not the {stage} lift inputs of {path} (sha256 "
                             f"{found[:12]}, study.json records {str(recorded.get(stage))[:12]}): "
                             "the folder mixes studies")  # fmt: skip


def upgrade(study_dir: str | Path) -> bool:
    """Record `HASH_KEY` in the study.json of `study_dir` from the lift inputs beside it (checked
    by `load_inputs`), once: a study.json that records it is checked instead (`check_inputs`).
    Only that key is added; verdicts.md is untouched. Returns whether study.json was written.

    Raises:
        ValueError, FileNotFoundError: as `check_study`, `load_inputs` and `check_inputs`.
    """
    path = Path(study_dir) / "study.json"
    doc = check_study(store.read_json(path), path)
    files = input_files(study_dir)
    for file in files.values():
        load_inputs(file)
    if HASH_KEY in doc:
        check_inputs(doc, files, path)
        return False
    doc = with_digest(doc, {stage: inputs_sha256(file) for stage, file in files.items()})
    store.write_json(path, doc, indent=1)
    return True


def with_digest(doc: Mapping[str, Any], digests: Mapping[str, str]) -> dict[str, Any]:
    """`doc` with `HASH_KEY` = `digests` where `write_study` puts it (just before ``reading``, or
    last), so that an upgraded study.json has the bytes a re-read writes."""
    out = {k: v for k, v in doc.items() if k not in (HASH_KEY, "reading")}
    out[HASH_KEY] = dict(digests)
    if "reading" in doc:
        out["reading"] = doc["reading"]
    return out


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


def frontier_notes(
    result: Mapping[str, Any],
    picks: Mapping[str, Mapping[str, Mapping[str, Any]]],
    claims: Sequence[Sequence[str]],
) -> dict[str, dict[str, dict[str, str]]]:
    """Each stage's panel titles for `experiment.report.plot_frontier`, ``{stage: {measure:
    {label: text}}}``: the exploration's pick of each label on each measure (``"setting, step
    N"``) and the confirmation's verdict word of each claim with one, on the claim's measure for
    its method label.

    Args:
        result: a study's record (`experiment.study.conclude`): its ``claims``, each with
            ``claim`` (the claim's id) and ``verdict``.
        picks: `experiment.study.pick` of the exploration.
        claims: the study's claims, ``(id, method label, measure, text)`` (`experiment.study.CLAIMS`).
    """
    explore = {measure: {label: f"{p['setting']}, step {p['step']}" for label, p in ps.items()}
               for measure, ps in picks.items()}  # fmt: skip
    words = {r["claim"]: r["verdict"] for r in result.get("claims", []) if r.get("verdict")}
    confirm: dict[str, dict[str, str]] = {}
    for cid, label, measure, _ in claims:
        if cid in words:
            confirm.setdefault(measure, {})[label] = words[cid]
    return {"explore": explore, "confirm": confirm}


def write_study(
    out: str | Path, result: dict[str, Any], *, reading: Mapping[str, Any], how: str, unit: str
) -> None:
    """Write study.json (`result` with ``reading``: `reading` (``reference``, ``defaults``,
    ``problems``, ``by_step``: `experiment.study.conclude`'s arguments beyond the design), `how`
    (the design paragraph of verdicts.md) and `unit` (its problem unit); and `HASH_KEY`, the
    digests of the lift inputs in `out` (`input_files`) when both stages' are there) and
    verdicts.md (`experiment.study_report.study_markdown`), atomically."""
    out = Path(out)
    files = input_files(out)
    if all(f.is_file() for f in files.values()):
        result[HASH_KEY] = {stage: inputs_sha256(f) for stage, f in files.items()}
    result["reading"] = {**reading, "how": how, "unit": unit}
    text = R.study_markdown(result, how, unit)
    if result.get("pending"):
        text += "\n## Picks not confirmed\n\n" + "\n".join(
            f"- `{label}`: {p['setting']} at step {p['step']} (exploratory lift "
            f"{100 * p['lift']:+.1f} points): the confirmation did not train this setting; "
            "`study --complete STUDY_DIR` (`python -m llm` or `python -m toymdp`) trains it and "
            "reads the study again."
            for label, p in result["pending"].items()
        ) + "\n"  # fmt: skip
    store.write_json(out / "study.json", result, indent=1)
    store.write_text(out / "verdicts.md", text)


def reread(study_dir: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """Re-read a study (published with `publish`, or a study's output
    folder) with the procedure in force (module docstring); writes study.json, verdicts.md,
    each stage's lift table and frontier figure, and (into another folder) both stages' lift
    inputs into `out` (default: `study_dir`), so that `out` re-reads again; returns the new
    study.json's dict. Its ``reread`` records the procedure read before, the commit and the claims'
    words before (``claims_were``: ``[{claim, verdict}]`` as the study.json had them); re-reading a
    re-read study keeps the records before (``earlier``, oldest first), so a re-read in place
    loses no verdict's history. Nothing is written before every check has passed.

    Raises:
        ValueError: naming the file: study.json missing, without ``reading`` (written before
            studies kept their lift inputs: the study must be re-run) or a key (`check_study`);
            lift inputs that are corrupt or hold bad values (`load_inputs`), or that are not the
            ones study.json records (`check_inputs`); `out` holding another study
            (`claim_folder`).
        FileNotFoundError: a stage's lift inputs are missing.
    """
    src = Path(study_dir)
    out = Path(out) if out is not None else src
    path = src / "study.json"
    doc = check_study(store.read_json(path), path)
    files = input_files(src)
    stages = {stage: load_inputs(file) for stage, file in files.items()}
    check_inputs(doc, files, path)
    elsewhere = out.resolve() != src.resolve()
    if elsewhere:
        claim_folder(out, doc, src=src)
    found = {stage: sections(data) for stage, data in stages.items()}
    result, picks = conclude_again(doc, found, doc["picks"]["pass_at_k"])
    result["reread"] = {"from": doc.get("procedure"), "procedure": inference.PROCEDURE,
                        "git_commit": R.git_commit(),
                        "claims_were": [{"claim": r.get("claim"), "verdict": r.get("verdict")}
                                        for r in doc.get("claims", []) if r.get("verdict")]}  # fmt: skip
    if "reread" in doc:  # a re-read of a re-read keeps the records before it, oldest first
        before = dict(doc["reread"])
        result["reread"]["earlier"] = [*before.pop("earlier", []), before]
    out.mkdir(parents=True, exist_ok=True)
    if elsewhere:  # the inputs travel with the reading: `out` re-reads on its own
        for stage, file in files.items():
            store.write_bytes(out / f"{stage}_{INPUTS}", file.read_bytes())
    write_reading(out, doc, result, stages, found, picks)
    return result


def conclude_again(
    doc: Mapping[str, Any],
    found: Mapping[str, Mapping[str, Any]],
    trained: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A committed study concluded again from its stages' lift sections `found` (`sections`) by
    the procedure in force: the exploration's picks made again (`experiment.study.pick`), each
    pick whose setting is not among `trained` (``{label: {"setting": ...}}``, the settings the
    confirmation trained at every checkpoint) listed under ``pending`` with no verdict, the others
    read on the confirmation (`experiment.study.conclude`, `doc`'s design, claims and reading);
    `doc`'s ``measures``, ``fingerprints``, ``extends`` and ``completed`` kept. Returns (study.json's new dict,
    the picks)."""
    reading = doc["reading"]
    picks = S.pick(found["explore"])
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
    for key in ("measures", "fingerprints", "extends", "completed"):  # trained: unchanged
        if key in doc:
            result[key] = doc[key]
    return result, picks


def write_reading(
    out: Path,
    doc: Mapping[str, Any],
    result: dict[str, Any],
    stages: Mapping[str, Mapping[str, Any]],
    found: Mapping[str, Mapping[str, Any]],
    picks: Mapping[str, Any],
) -> None:
    """Write a study read again (`conclude_again`'s `result` and `picks`) into `out`, whose lift
    inputs are already there: each stage's lift table and frontier figure (`stages` loaded by
    `load_inputs`, `found` their sections), then study.json and verdicts.md (`write_study`, with
    `doc`'s reading)."""
    reading = doc["reading"]
    notes = frontier_notes(result, picks, reading.get("claims", S.CLAIMS))
    for stage, data in stages.items():
        intro = (
            data["intro"].replace(_METHOD, report.LIFT_METHOD).replace(_STATUS, report.LIFT_STATUS)
        )
        store.write_text(out / f"{stage}_lifts.md", report.lift_markdown(found[stage], intro))
        report.plot_frontier(found[stage], out / f"{stage}_frontier.png", labels=data["labels"],
                             reference=next(iter(data["measures"].values()))["reference"],
                             title=data["title"], notes=notes[stage])  # fmt: skip
    write_study(out, result, reading=reading, how=reading["how"], unit=reading["unit"])


PUBLISHED = {
    "study.json": "study.json",
    "verdicts.md": "verdicts.md",
    "explore/lifts.md": "explore_lifts.md",
    "explore/frontier.png": "explore_frontier.png",
    "confirm/lifts.md": "confirm_lifts.md",
    "confirm/frontier.png": "confirm_frontier.png",
    "explore/lift_inputs.npz": "explore_lift_inputs.npz",
    "confirm/lift_inputs.npz": "confirm_lift_inputs.npz",
}
"""A study's small outputs (source under the study folder → name in the published folder): what a
later procedure's re-read needs (`reread`) and what it rewrites."""


def publish(study_dir: str | Path, dest: str | Path) -> list[str]:
    """Copy `PUBLISHED` from a study's output folder (or a published folder: the names on the
    right) into `dest`, each file atomically, study.json last; returns the written paths.

    A finished study (study.json) publishes every file of `PUBLISHED`, its study.json and lift
    inputs checked (`check_study`, `load_inputs`, `check_inputs`; a study.json without the
    inputs' digest gets it: `upgrade`), into a folder that holds no study or the same one
    (`claim_folder`). An unfinished study (no study.json yet) publishes its exploratory stage
    alone, into a folder that holds no study and no file of `PUBLISHED` it does not write.

    Raises:
        ValueError: `study_dir` has neither study.json nor an exploratory lift table; a bad
            study.json or lift inputs (named); `dest` holds another study, or files of one that
            this publication would leave beside it (named).
        FileNotFoundError: a finished study lacks a file of `PUBLISHED` (named).
    """
    src, dest = Path(study_dir), Path(dest)
    sources = {target: next((p for p in (src / name, src / target) if p.is_file()), None)
               for name, target in PUBLISHED.items()}  # fmt: skip
    study = sources["study.json"]
    if study is None and sources["explore_lifts.md"] is None:
        raise ValueError(f"study_dir: {src} has no study.json and no explore/lifts.md")
    doc = None
    if study is not None:
        doc = check_study(store.read_json(study), study)
        for name, target in PUBLISHED.items():
            if sources[target] is None:
                raise FileNotFoundError(f"study_dir: {src} has no {name} (nor {target}): a "
                                        "published study holds what a re-read needs")  # fmt: skip
        files = {stage: sources[f"{stage}_{INPUTS}"] for stage in STAGES}
        for file in files.values():
            load_inputs(file)
        recorded = HASH_KEY in doc
        if recorded:
            check_inputs(doc, files, study)
        else:  # a study written before the digest: recorded now
            doc = with_digest(doc, {stage: inputs_sha256(f) for stage, f in files.items()})
    claim_folder(dest, doc, src=src)
    if doc is None:
        for file in (f"{stage}_{INPUTS}" for stage in STAGES):
            if sources[file] is not None:
                load_inputs(sources[file])
        left = sorted(t for t, p in sources.items() if p is None and (dest / t).exists())
        if left:
            raise ValueError(f"{dest}: holds {', '.join(left)} of an earlier publication, which "
                             f"{src} (unfinished) would leave beside its own files: publish into "
                             "a folder of its own")  # fmt: skip
    written = {}
    for target, path in sources.items():
        if path is not None and target != "study.json":
            written[target] = store.write_bytes(dest / target, path.read_bytes())
    if study is not None and recorded:
        written["study.json"] = store.write_bytes(dest / "study.json", study.read_bytes())
    elif doc is not None:
        written["study.json"] = store.write_json(dest / "study.json", doc, indent=1)
    return [str(written[t]) for t in PUBLISHED.values() if t in written]
