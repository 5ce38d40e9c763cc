"""Extend a committed study with new methods, read against its committed reference.

A run is a function of its inputs alone (`numerics`), so the reference runs of a committed study
(GRPO's settings, seeds and problems) are what a re-run would produce: their per-problem gains,
kept beside study.json as the two stages' lift inputs (`experiment.reread`), stand for them. An
extension (``python -m toymdp study --extend DIR --methods FILE``, ``python -m llm study --extend
DIR --methods FILE``; `run`) therefore trains only the new methods:

1. **trust**: before anything else, the leg re-trains one committed reference run and compares its
   fingerprint with the committed one (`check_trust`); a mismatch (another numerics pin, another
   package version, edited code) refuses the extension naming the run and both fingerprints,
   unless the reference is re-trained in full (``retrain``: then nothing committed is reused and
   study.json says so);
2. **explore**: the new ``[[methods]]`` entries (`read_methods`) under the study's own tuning
   budget (its ``tune`` axes and checkpoints, checked by the study's equal-budget rule), on the
   study's exploration seeds and problems; merged with the committed reference models (`merge`);
   per new label the pick by the study's registered rule (`experiment.study.pick`);
3. **confirm**: only the picks, on the study's confirmation seeds and problems, merged with the
   committed confirmation's reference models; concluded by the procedure in force
   (`experiment.study.conclude`), each new method's claim from `claims_for`.

The extension's family is its own: Holm runs over the new methods only, not over the committed
study's methods as well. A reader comparing many extensions of one study holds a family per
extension, so across extensions the family-wise error adds up (k extensions at level α: up to
k·α that some null method of some extension is read "supported"); docs/statistics.md.

Outputs in a new folder (never the committed one): study.json (with ``extends``: the committed
study's folder, name, provenance and the SHA-256 of its study.json and lift inputs), verdicts.md,
each stage's lift table, frontier figure and merged lift inputs (so ``python -m experiment reread``
re-reads an extension as a study), ``trust.json``.

The same machinery completes a committed study (``study --complete DIR``, `complete`): a re-read by
a later procedure may pick settings the confirmation did not train (``pending``); after the trust
check, those picks alone are trained on the confirmation's seeds and problems, their models take
the place of the settings no longer picked, and the whole study is read again, its own claims and
family.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

import numerics
from experiment import frontier, inference, report, schema, spec, store
from experiment import study as S
from experiment import study_report as R
from experiment.reread import (
    INPUTS,
    STAGES,
    check_inputs,
    check_study,
    conclude_again,
    frontier_notes,
    input_files,
    load_inputs,
    save_inputs,
    sections,
    write_reading,
    write_study,
)
from experiment.two_stage import how

__all__ = [
    "Committed",
    "ExtensionLeg",
    "check_config",
    "check_out",
    "check_trust",
    "claims_for",
    "complete",
    "describe",
    "extension_doc",
    "gains_fingerprint",
    "load_committed",
    "merge",
    "pending_labels",
    "pending_picks",
    "read_methods",
    "run",
    "study_entries",
]

CLAIM_MEASURES = ("pass_at_k", "distinct_correct")
"""The measures a new method's claim may name (``claim`` in its ``[[methods]]`` entry)."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Committed:
    """A committed study, as `load_committed` read it.

    Attributes:
        dir: its folder (published, or a study's output folder).
        doc: its study.json.
        stages: ``{"explore", "confirm"}``: each stage's lift inputs (`experiment.reread.load_inputs`).
        config: the study file its provenance names, its content checked (`check_config`).
        hashes: SHA-256 of study.json and of each stage's lift inputs (the extension records them).
    """

    dir: Path
    doc: dict[str, Any]
    stages: dict[str, dict[str, Any]]
    config: Path
    hashes: dict[str, str]

    @property
    def reference(self) -> list[str]:
        """The reference labels of the study (GRPO's)."""
        return list(next(iter(self.stages["explore"]["measures"].values()))["reference"])

    @property
    def numerics(self) -> str | None:
        """The numeric settings the study recorded (its provenance's `numerics.tag()`)."""
        return self.doc.get("provenance", {}).get("numerics")


def check_config(provenance: Mapping[str, Any], where: str | Path) -> Path:
    """The study file a study's `provenance` names, checked: it exists and its parsed content has
    the recorded SHA-256 (`experiment.study_report.provenance`).

    A relative path is relative to the folder the study ran in, the root of the tree it is
    committed to: it is read from the current folder, else from the nearest folder above `where`
    (the study.json) that holds it, so a committed study extends from a folder of one's own.

    Raises:
        ValueError: no config in the provenance, or a config whose content changed since (both
            SHA-256 named, and the study's commit to check out), naming `where`.
        FileNotFoundError: the config file is missing, naming it, `where` and the folders read.
    """
    if not isinstance(provenance, Mapping) or "config" not in provenance:
        raise ValueError(f"{where}: its provenance names no config file")
    path = Path(provenance["config"])
    if not path.is_absolute() and not path.is_file():
        above = (folder / path for folder in Path(where).resolve().parents)
        path = next((p for p in above if p.is_file()), path)
    if not path.is_file():
        raise FileNotFoundError(f"{where}: its config {str(path)!r} does not exist (read from the "
                                "current folder and the folders above the study)")  # fmt: skip
    here = R.provenance(path, "")["config_sha256"]
    if here != provenance.get("config_sha256"):
        raise ValueError(f"{path}: its content changed since the study (sha256 {here[:12]}, the "
                         f"study's {str(provenance.get('config_sha256'))[:12]}); check out the "
                         f"study's commit {str(provenance.get('git_commit', '?'))[:12]}")  # fmt: skip
    return path


def load_committed(study_dir: str | Path, unit: str | None = None) -> Committed:
    """Read a committed study folder: study.json with its ``reading``, ``picks`` and
    ``provenance``, both stages' lift inputs (published ``<stage>_lift_inputs.npz`` or the
    stage folder's ``lift_inputs.npz``) and its config (`check_config`); with `unit` (the leg's
    `ExtensionLeg.unit`), a study of another leg is refused before its config is parsed.

    Raises:
        ValueError: study.json missing, unreadable or without a key (`experiment.reread.
            check_study`), a study of another leg, lift inputs that are corrupt or not the ones
            study.json records (`experiment.reread.check_inputs`), stages that disagree on the
            reference, or a changed config; each naming the file.
        FileNotFoundError: a stage's lift inputs or the config are missing.
    """
    src = Path(study_dir)
    path = src / "study.json"
    doc = check_study(store.read_json(path), path)
    theirs = doc["reading"].get("unit")
    if unit is not None and theirs != unit:
        raise ValueError(
            f"--extend: {src} is a study of the other leg (its problem unit {theirs!r}, this "
            f"command's {unit!r}): a toy study extends with `python -m toymdp study --extend`, "
            "an LLM study with `python -m llm study --extend`"
        )
    files = input_files(src)
    stages = {stage: load_inputs(file) for stage, file in files.items()}
    check_inputs(doc, files, path)  # the lift inputs are this study's
    hashes = {"study.json": _sha256(path)}
    hashes.update({f"{stage}_{INPUTS}": _sha256(file) for stage, file in files.items()})
    refs = {stage: [a["reference"] for a in data["measures"].values()]
            for stage, data in stages.items()}  # fmt: skip
    if refs["explore"][0] != refs["confirm"][0]:
        raise ValueError(f"{src}: the stages' reference labels differ: {refs}")
    return Committed(src, doc, stages, check_config(doc["provenance"], path), hashes)


METHOD_FILE_KEYS = ("methods",)


def read_methods(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The ``[[methods]]`` tables of a methods file (the sweep grammar's entries,
    `experiment.spec`) and each label's claimed measure: an entry's optional ``claim`` key,
    ``"pass_at_k"`` (default) or ``"distinct_correct"``, is removed from the entry.

    Raises:
        ValueError: naming the file: an unreadable file, a key other than ``methods``, no
            entries, an entry that is not a table, an unknown ``claim``, or what the sweep
            grammar refuses of an entry by itself (`experiment.spec.parse_methods`: an unknown
            key or method, a bad or repeated label, ...), named by its place in this file
            (``methods[0]`` its first entry).
    """
    path = Path(path)
    doc = schema.read_toml(path)
    unknown = sorted(set(doc) - set(METHOD_FILE_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}: a methods file holds [[methods]] "
                         "tables only (the study's tune, seeds and checkpoints are its own)")  # fmt: skip
    entries = doc.get("methods")
    if entries is None or entries == []:
        raise ValueError(f"{path}: no [[methods]] table")
    if not isinstance(entries, list):
        raise ValueError(f"{path}: methods: expected [[methods]] tables, got {entries!r}")
    out, claims = [], {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: methods[{i}]: expected a table, got {entry!r}")
        entry = dict(entry)
        measure = entry.pop("claim", "pass_at_k")
        if measure not in CLAIM_MEASURES:
            raise ValueError(f"{path}: methods[{i}].claim: expected one of {CLAIM_MEASURES}, "
                             f"got {measure!r}")  # fmt: skip
        claims[str(entry.get("label", entry.get("method")))] = measure
        out.append(entry)
    try:  # the entries alone, so that an error names its place in this file, not in the study's
        spec.parse_methods(out)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return out, claims


def extension_doc(
    study: Mapping[str, Any],
    reference: Sequence[str],
    methods: Sequence[Mapping[str, Any]],
    methods_path: str | Path,
) -> dict[str, Any]:
    """The extension's sweep document: the committed study's sweep document `study` with its
    ``[[methods]]`` cut to the `reference` entries, then `methods` (the leg parses it as it
    parses a study file, so every check of one applies).

    Raises:
        ValueError: an entry labelled as the reference, naming `methods_path`.
    """
    clash = sorted({str(m.get("label", m.get("method"))) for m in methods} & set(reference))
    if clash:
        raise ValueError(f"{methods_path}: methods: {clash} is the study's reference label; give "
                         "the entry another label")  # fmt: skip
    doc = dict(study)
    kept = [m for m in doc["methods"] if m.get("label", m["method"]) in reference]
    doc["methods"] = [*kept, *methods]
    return doc


def claims_for(labels: Mapping[str, str]) -> tuple[tuple[str, str, str, str], ...]:
    """The claims an extension judges: GRPO's sharpening, then per new label (`labels`: label →
    claimed measure) the committed claim of that label where `experiment.study.CLAIMS` has one,
    else "LABEL beats GRPO's trade-off" in its measure."""
    known = {c[1]: c for c in S.CLAIMS}
    out = [next(c for c in S.CLAIMS if c[0] == "grpo_sharpens")]
    for label, measure in labels.items():
        if label in known and known[label][2] == measure:
            out.append(known[label])
            continue
        what = "pass@k" if measure == "pass_at_k" else "distinct correct"
        out.append((label, label, measure,
                    f"{label} beats GRPO's trade-off ({what} at matched pass@1)"))  # fmt: skip
    return tuple(out)


def gains_fingerprint(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of a model set's per-problem gains `x`, `y` `(M, S, P)` as float64 bytes (C order):
    equal fingerprints, equal verdict inputs."""
    h = hashlib.sha256()
    for a in (x, y):
        a = np.ascontiguousarray(a, dtype=np.float64)
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def merge(
    committed: Mapping[str, Any],
    new: Mapping[str, Mapping[str, Any]],
    reference: Sequence[str],
    *,
    reuse: bool = True,
    where: str = "stage",
    keep: Sequence[str] = (),
) -> dict[str, Any]:
    """One stage's lift inputs: the committed stage's reference models (`reuse`; else the new
    inputs' own) and its models of the labels `keep` (`complete`), then the new inputs' other
    models, in `experiment.reread.load_inputs`' layout with the committed stage's draws, seed,
    level, paragraph and title (so that the reading is the committed study's).

    Args:
        committed: a loaded stage (`experiment.reread.load_inputs`).
        new: ``{measure: {"x", "y", "models", "rows", "reference", "k"}}`` of the new runs
            (`x`, `y` `(M', S, P)`), the base model filed under the reference at step 0; empty:
            the committed reference alone (no pick to confirm).

    Raises:
        ValueError: naming `where`: a measure missing, or seeds × problems or k that differ
            from the committed stage's.
    """
    ref = set(reference)
    out = {k: v for k, v in committed.items() if k != "measures"}
    out["measures"] = {}
    for measure, a in committed["measures"].items():
        if not new:  # the committed stage's reference alone
            i = [j for j, m in enumerate(a["models"].method) if m in ref]
            out["measures"][measure] = {
                **a, "x": np.asarray(a["x"])[i], "y": np.asarray(a["y"])[i], "rows": [a["rows"][j] for j in i],
                "models": frontier.Models(*([getattr(a["models"], f)[j] for j in i]
                                            for f in ("method", "setting", "step"))),
            }  # fmt: skip
            continue
        if measure not in new:
            raise ValueError(f"{where}: the new runs have no {measure!r} gains")
        b = new[measure]
        if np.shape(b["x"])[1:] != np.shape(a["x"])[1:]:
            raise ValueError(f"{where}: {measure}: the new runs' (seeds, problems) "
                             f"{np.shape(b['x'])[1:]} differ from the committed "
                             f"{np.shape(a['x'])[1:]}")  # fmt: skip
        if b["k"] != a["k"]:
            raise ValueError(f"{where}: {measure}: k {b['k']} differs from the committed {a['k']}")
        kept = (ref if reuse else set()) | set(keep)
        keep_a = [i for i, m in enumerate(a["models"].method) if m in kept]
        keep_b = [i for i, m in enumerate(b["models"].method) if reuse is False or m not in ref]
        parts = [(a, keep_a), (b, keep_b)]
        x = np.concatenate([np.asarray(s["x"], dtype=np.float64)[i] for s, i in parts])
        y = np.concatenate([np.asarray(s["y"], dtype=np.float64)[i] for s, i in parts])
        models = frontier.Models(*(
            [getattr(s["models"], f)[j] for s, i in parts for j in i]
            for f in ("method", "setting", "step")
        ))  # fmt: skip
        rows = [dict(s["rows"][j]) for s, i in parts for j in i]
        out["measures"][measure] = {"x": x, "y": y, "models": models, "rows": rows,
                                    "reference": list(reference), "k": a["k"]}  # fmt: skip
    return out


def check_trust(
    rows: Sequence[Mapping[str, Any]], study: str | Path, recorded: str | None = None
) -> None:
    """Refuse an extension whose re-trained reference run differs from the committed one.

    Args:
        rows: per re-trained run ``{"run", "committed", "here"}`` (fingerprints).
        recorded: the committed study's numeric settings (its provenance's ``numerics``, a
            `numerics.tag()`); where they are not this process's and name a version, the message
            says which ``SHARPENING_NUMERICS`` reproduces them.

    Raises:
        ValueError: one line naming the first differing run, both fingerprints, and the ways out
            (``SHARPENING_NUMERICS=pinned-vN`` where the pins differ, ``--retrain-reference``).
    """
    setting = numerics.setting_for(recorded) if recorded and recorded != numerics.tag() else None
    pin = (f"; the study ran under {recorded!r}, this process under {numerics.tag()!r}: run "
           f"with {numerics.OPT_OUT_ENV}={setting} set before Python starts, or") if setting else (
           "; its committed reference cannot stand for a re-run:")  # fmt: skip
    for r in rows:
        if r["committed"] != r["here"]:
            raise ValueError(f"{study}: reference run {r['run']!r} re-trained here has fingerprint "
                             f"{str(r['here'])[:16]}, the committed study's {str(r['committed'])[:16]}"
                             f" (another numerics pin, package version or code){pin} pass "
                             "--retrain-reference to re-train the reference in full")  # fmt: skip


def check_out(out: Path, committed: Committed) -> None:
    """Refuse an output folder that is the committed study's folder or inside it.

    Raises:
        ValueError: naming `out` and the committed folder.
    """
    here, there = Path(out).resolve(), committed.dir.resolve()
    if here == there or there in here.parents:
        raise ValueError(f"out: {out} is in the committed study's folder {committed.dir}; an "
                         "extension writes a new one")  # fmt: skip


class ExtensionLeg(Protocol):
    """What a leg gives `run`: the new methods' runs of both stages, on the committed design."""

    unit: str
    """the problem unit of the lift, capitalized ("Problems", "Dataset draws")"""
    labels: list[str]
    """the new method labels, in file order"""
    claims: Mapping[str, str]
    """each new label's claimed measure (`read_methods`; a label not named claims pass@k)"""
    budget: tuple[str, str | None]
    """`experiment.spec.check_budget`'s (budget, how it is unequal or None) over the new
    methods and the reference"""

    def trust(self) -> list[dict[str, Any]]:
        """Re-train one committed reference run (the cheapest) and the base model's evaluation
        where there is one; per run ``{"run", "committed", "here"}`` fingerprints."""
        ...

    def explore(self, retrain: bool) -> Mapping[str, Mapping[str, Any]]:
        """Train and evaluate the new methods' exploratory runs (and, with `retrain`, the
        reference's); their lift inputs per measure (`merge`'s `new`)."""
        ...

    def confirm(
        self,
        picks: Mapping[str, Mapping[str, Any]],
        retrain: bool,
        every_checkpoint: bool = False,
    ) -> Mapping[str, Mapping[str, Any]]:
        """Train and evaluate the pass@k `picks` (per new label) on the confirmation's seeds and
        problems (and, with `retrain`, the reference's confirmation runs); their lift inputs. A
        leg may evaluate a pick at its picked checkpoint alone, unless `every_checkpoint`
        (`complete`: as the full study's confirmation, so that a later re-read may move the pick
        to another checkpoint of its setting)."""
        ...

    def stages(self) -> tuple[str, str]:
        """The design paragraph's two clauses (`experiment.two_stage.how`)."""
        ...

    def extras(self) -> dict[str, Any]:
        """study.json's entries of this leg alone (e.g. the new runs' ``fingerprints``)."""
        ...


def _family(labels: Sequence[str], committed: str, reused: bool) -> str:
    src = ("its reference models are the committed study's (not re-trained)" if reused else
           "its reference was re-trained in full (--retrain-reference)")  # fmt: skip
    return (f"Extension of the committed study {committed!r} by {', '.join(labels)}: {src}. "
            f"Holm's family is the extension's own new methods ({len(labels)}), not the committed "
            "study's: a reader comparing several extensions of one study holds one family per "
            "extension.")  # fmt: skip


@contextmanager
def study_numerics(committed: Committed) -> Iterator[str]:
    """The committed study's numeric settings for the block, where they need no new process
    (`numerics.following`: its reference runs' arithmetic, e.g. a study recorded under
    ``pinned avx2 v2`` extended by a version-3 process); says so on stderr when it switches.
    Yields the `numerics.tag()` in force."""
    here = numerics.tag()
    with numerics.following(committed.numerics) as tag:
        if tag != here:
            print(f"{committed.dir}: the study ran under {committed.numerics!r}; computing under it "
                  f"({numerics.OPT_OUT_ENV}={numerics.setting_for(tag)}), not {here!r}",
                  file=sys.stderr)  # fmt: skip
        yield tag


def run(
    leg: ExtensionLeg,
    committed: Committed,
    out: str | Path,
    *,
    methods_path: str | Path,
    retrain: bool = False,
    imports: Sequence[str] = (),
) -> dict[str, Any]:
    """Extend `committed` by `leg`'s new methods (module docstring) into `out`; returns the
    extension's study.json dict. Runs under the committed study's numeric settings where they need
    no new process (`study_numerics`), and records the settings it ran under.

    Raises:
        ValueError: `out` is (or is inside) the committed folder; the trust check failed (`check_trust`); as
            `merge`.
    """
    with study_numerics(committed) as numerics_tag:
        return _run(leg, committed, Path(out), methods_path, numerics_tag, retrain, imports)


def _run(
    leg: ExtensionLeg,
    committed: Committed,
    out: Path,
    methods_path: str | Path,
    numerics_tag: str,
    retrain: bool,
    imports: Sequence[str],
) -> dict[str, Any]:
    check_out(out, committed)
    doc, reference = committed.doc, committed.reference
    trust = [] if retrain else leg.trust()
    out.mkdir(parents=True, exist_ok=True)
    store.write_json(out / "trust.json", {"retrain_reference": retrain, "runs": trust}, indent=1)
    check_trust(trust, committed.dir, committed.numerics)
    found, merged = {}, {}
    merged["explore"] = merge(committed.stages["explore"], leg.explore(retrain), reference,
                              reuse=not retrain, where="explore")  # fmt: skip
    found["explore"] = sections(merged["explore"])
    picks = S.pick(found["explore"])
    if picks["pass_at_k"] or retrain:
        new = leg.confirm(picks["pass_at_k"], retrain)
        merged["confirm"] = merge(committed.stages["confirm"], new, reference,
                                  reuse=not retrain, where="confirm")  # fmt: skip
    else:  # no new model left the base: nothing to confirm, the committed reference alone
        merged["confirm"] = merge(committed.stages["confirm"], {}, reference, where="confirm")
    found["confirm"] = sections(merged["confirm"])
    reading = dict(doc["reading"])
    d = doc["design"]
    budget, unequal = leg.budget
    design = {k: v for k, v in d.items() if k not in ("alpha", "claim_size", "claim_size_distinct")}
    claims = claims_for({label: leg.claims.get(label, "pass_at_k") for label in leg.labels})
    name = f"{doc['study']} + {', '.join(leg.labels)}"
    result = S.conclude(
        name, picks, found["confirm"], reference=reading["reference"], alpha=d["alpha"],
        size=d["claim_size"], size_distinct=d["claim_size_distinct"],
        problems=reading["problems"], design={**design, "budget": budget},
        provenance=R.provenance(Path(methods_path), numerics_tag), by_step=reading["by_step"],
        costs=doc.get("costs"), defaults=reading["defaults"], claims=claims,
    )  # fmt: skip
    result["provenance"]["imports"] = list(imports)
    result["unpicked"] = [label for label in leg.labels if label not in picks["pass_at_k"]]
    result["extends"] = {"study": doc["study"], "dir": str(committed.dir),
                         "provenance": doc["provenance"], "sha256": committed.hashes,
                         "reference": "re-trained in full" if retrain else "committed",
                         "trust": trust}  # fmt: skip
    result.update(leg.extras())
    notes = frontier_notes(result, picks, claims)
    for stage in STAGES:
        data = merged[stage]
        intro = _intro(data)
        store.write_text(out / f"{stage}_lifts.md", report.lift_markdown(found[stage], intro))
        labels = [*reference, *leg.labels]
        report.plot_frontier(found[stage], out / f"{stage}_frontier.png", labels=labels,
                             reference=reference, title=f"{data['title']} (extension)",
                             notes=notes[stage])  # fmt: skip
        save_inputs(out / f"{stage}_{INPUTS}", data["measures"], num_resamples=data["num_resamples"],
                    seed=data["seed"], level=data["level"], intro=intro, labels=labels,
                    title=data["title"])  # fmt: skip
    explored, confirmed = leg.stages()
    text = f"{how(explored, confirmed, unequal)} {_family(leg.labels, doc['study'], not retrain)}"
    reading["claims"] = [list(c) for c in claims]
    write_study(out, result, reading=reading, how=text, unit=reading.get("unit", leg.unit))
    return result


def pending_labels(committed: Committed) -> list[str]:
    """The labels of the committed study's pending picks (study.json ``pending``: picks of a later
    procedure whose setting its confirmation did not train, `experiment.reread`).

    Raises:
        ValueError: nothing pending, naming the folder.
    """
    pending = committed.doc.get("pending") or {}
    if not pending:
        raise ValueError(f"{committed.dir}: no pending pick (study.json has no 'pending': its "
                         "confirmation trained every pick's setting); nothing to complete")  # fmt: skip
    return list(pending)


def pending_picks(
    committed: Committed, explore: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The committed study's pending picks (`pending_labels`) as the procedure in force picks them
    from the exploration's lift sections `explore` (`experiment.reread.sections`,
    `experiment.study.pick`).

    Raises:
        ValueError: naming the folder: nothing pending, or a pending pick that is not the
            procedure in force's (the study was re-read by another procedure: re-read it first).
    """
    pending = {label: committed.doc["pending"][label] for label in pending_labels(committed)}
    picks = S.pick(explore)["pass_at_k"]
    for label, p in pending.items():
        now = picks.get(label, {})
        if (now.get("setting"), now.get("step")) != (p.get("setting"), p.get("step")):
            raise ValueError(
                f"{committed.dir}: pending pick {label!r} ({p.get('setting')}, step "
                f"{p.get('step')}) is not the procedure in force's ({now.get('setting')}, step "
                f"{now.get('step')}); re-read the study first (python -m experiment reread)"
            )
    return {label: picks[label] for label in pending}


def study_entries(committed: Committed, labels: Sequence[str]) -> list[dict[str, Any]]:
    """The ``[[methods]]`` entries of the committed study's own file (its checked config) whose
    label (``label``, else ``method``) is one of `labels`: the entries `complete`'s leg trains.

    Raises:
        ValueError: a label no entry has, naming the config.
    """
    entries = schema.read_toml(committed.config).get("methods", [])
    found = [m for m in entries if m.get("label", m.get("method")) in set(labels)]
    missing = sorted(set(labels) - {m.get("label", m.get("method")) for m in found})
    if missing:
        raise ValueError(f"{committed.config}: no [[methods]] entry for the pending {missing}")
    return found


def complete(leg: ExtensionLeg, committed: Committed, out: str | Path) -> dict[str, Any]:
    """Train the confirmation of the committed study's pending picks (`pending_picks`) and read the
    whole study again into `out`; returns its study.json dict.

    A study re-read by a later procedure (`experiment.reread`) may pick a setting its
    confirmation did not train: the pick is pending, with no verdict. A run is a function of its
    inputs alone, so the committed confirmation's models stand for a re-run: `leg` (an
    `ExtensionLeg` over the study's own entries of the pending labels, `study_entries`) re-trains
    one committed reference run (the trust check, as an extension's), then trains each pending
    pick on the confirmation's seeds and problems and evaluates it at every checkpoint, as the
    full study's confirmation would. Its models replace the pending labels' committed ones (the
    settings the procedure no longer picks); the study is then concluded as a re-read
    (`experiment.reread.conclude_again`: the study's claims, Holm over all its picks). Where the
    confirmation's models come in the full study's order (the toy's), the reading is the full
    study's to the bit; otherwise the other picks' lifts move by the draws of the bias correction
    alone, which follow the model set. study.json records ``completed`` (the picks trained, the trust check, the procedure,
    commit and numeric settings; an earlier completion's record under ``earlier``) and keeps the
    records of earlier re-reads. Runs under the study's numeric settings as `run` does.

    Raises:
        ValueError: `out` in the committed folder (`check_out`); nothing pending or a stale
            pending pick (`pending_picks`); the trust check failed (`check_trust`); as `merge`.
    """
    with study_numerics(committed) as numerics_tag:
        return _complete(leg, committed, Path(out), numerics_tag)


def _complete(
    leg: ExtensionLeg, committed: Committed, out: Path, numerics_tag: str
) -> dict[str, Any]:
    check_out(out, committed)
    doc, reference = committed.doc, committed.reference
    explore = sections(committed.stages["explore"])  # the exploration read once
    pending = pending_picks(committed, explore)
    trust = leg.trust()
    out.mkdir(parents=True, exist_ok=True)
    store.write_json(out / "trust.json", {"retrain_reference": False, "runs": trust}, indent=1)
    check_trust(trust, committed.dir, committed.numerics)
    new = leg.confirm(pending, False, every_checkpoint=True)
    labels = dict.fromkeys(next(iter(committed.stages["confirm"]["measures"].values()))
                           ["models"].method)  # fmt: skip
    stages = {"explore": committed.stages["explore"],
              "confirm": merge(committed.stages["confirm"], new, reference, where="confirm",
                               keep=[label for label in labels if label not in pending])}  # fmt: skip
    found = {"explore": explore, "confirm": sections(stages["confirm"])}
    trained = {**doc["picks"]["pass_at_k"], **pending}
    result, picks = conclude_again(doc, found, trained)
    extras = leg.extras()
    if "measures" in result and "measures" in extras:  # the pending labels' rows replaced
        result["measures"] = [r for r in result["measures"] if r["label"] not in pending] + [
            r for r in extras["measures"] if r["label"] in pending]  # fmt: skip
    if isinstance(result.get("fingerprints"), dict):
        for stage, prints in extras.get("fingerprints", {}).items():
            result["fingerprints"] = {**result["fingerprints"],
                                      stage: {**result["fingerprints"].get(stage, {}), **prints}}  # fmt: skip
    record = {
        "picks": {label: {k: p.get(k) for k in S.PICK_KEYS} for label, p in pending.items()},
        "procedure": inference.PROCEDURE, "git_commit": R.git_commit(), "numerics": numerics_tag,
        "trust": trust,
    }  # fmt: skip
    if "completed" in doc:  # a completion of a completed study keeps the one before, oldest first
        before = dict(doc["completed"])
        record["earlier"] = [*before.pop("earlier", []), before]
    result["completed"] = record
    if "reread" in doc:
        result["reread"] = doc["reread"]
    files = input_files(committed.dir)
    store.write_bytes(out / f"explore_{INPUTS}", files["explore"].read_bytes())
    data = stages["confirm"]
    save_inputs(out / f"confirm_{INPUTS}", data["measures"], num_resamples=data["num_resamples"],
                seed=data["seed"], level=data["level"], intro=data["intro"],
                labels=data["labels"], title=data["title"])  # fmt: skip
    write_reading(out, doc, result, {"explore": stages["explore"], "confirm": load_inputs(
        out / f"confirm_{INPUTS}")}, found, picks)  # fmt: skip
    return result


def _intro(stage: Mapping[str, Any]) -> str:
    """A loaded stage's lift-table paragraph with the procedure's texts filled in
    (`experiment.reread.save_inputs` stores them as placeholders)."""
    text = stage["intro"].replace("<lift method>", report.LIFT_METHOD)
    return text.replace("<lift status>", report.LIFT_STATUS)


def describe(result: Mapping[str, Any]) -> str:
    """One line per new method's claim (the command's output): its verdict, confirmed lift,
    interval and MDE, or why it has no lift."""
    lines = [
        f"{label}: no pick (none of its models has a lift or lies below GRPO's range: they "
        "never left the base model)"
        for label in result.get("unpicked", [])
    ]
    for row in result["claims"]:
        if row["claim"] in ("grpo_sharpens", "grpo_spread"):
            continue
        if row.get("lift") is None:
            lines.append(f"{row['claim']}: {row['verdict']} (no lift: {row.get('status')})")
            continue
        mde = "" if row.get("mde") is None else f", MDE {row['mde']:.2f}"
        lines.append(f"{row['claim']}: {row['verdict']}, lift {row['lift']:+.2f} "
                     f"[{row['lo']:+.2f}, {row['hi']:+.2f}] {row['unit']}{mde}")  # fmt: skip
    return "\n".join(lines)
