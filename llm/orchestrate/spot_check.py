"""`python -m llm spot-check STUDY.json`: re-train a few of a committed LLM study's confirmation
runs on this machine and compare their fingerprints with the study's (`spot_check`).

Equal fingerprints (checkpoint weights and per-problem counts) on another CPU say that this
machine would reproduce the study's bytes, and so its verdicts, at the cost of a few runs. An
extension's study.json (``python -m llm study --extend``) is checked the same way: its new
methods' confirmation runs, from the study it extends and its methods file (the methods' module
imported first, ``--import``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import numerics
import shaping
from experiment import cli, store
from experiment import extend as E
from experiment import study_report as R
from llm.orchestrate.extend import LLMExtension
from llm.orchestrate.study_spec import UNIT, confirmation, load_study
from llm.orchestrate.sweep import rerun_runs
from llm.orchestrate.sweep_spec import SweepSpec
from llm.rollout.stacked import VERSION as SAMPLER_VERSION
from numerics.emulate import emulated

__all__ = ["spot_check"]


def spot_check(
    study_path: str | Path,
    *,
    runs: int = 1,
    seed: int = 0,
    out: str | Path | None = None,
    workers: int | None = None,
    progress: bool = True,
    log: bool = False,
) -> dict[str, Any]:
    """Re-train a few of a committed study's confirmation runs on this machine and compare their
    `llm.orchestrate.sweep.run_fingerprint` (checkpoint weights and per-problem counts) with the
    ones the study recorded: the base model's evaluation and `runs` runs drawn with `seed`, each
    alone (a run of the ``batched`` engine as a batch of one: its bytes do not depend on its batch,
    `llm.orchestrate.sweep.pack_jobs`). Equal fingerprints on another CPU say that this machine
    would reproduce the study's bytes, and so its verdicts, at the cost of a few runs. The study's
    config is read at the path its provenance records (`experiment.extend.check_config`).
    Writes ``OUT/spot_check.json`` (default OUT: ``runs/llm_spot_check/<config stem>``; runs found
    there from an earlier check are reused).

    Returns:
        ``{"study", "config", "engine", "numerics": {"study", "here"}, "cpu_id": {"study",
        "here"}, "emulated" (the emulator when ``python -m llm spot-check --emulate`` ran it,
        `numerics.emulate.emulated`, else None), "runs": [{"run", "study", "here", "same"}] (the
        base first), "same", "of"}``.

    Raises:
        ValueError: a study.json without fingerprints (written before they were recorded: read
            the study again with ``python -m llm study``), a config whose content changed since
            (the two SHA-256 named), a batched study sampled by another version of the stacked
            sampler (`llm.rollout.stacked.VERSION`; the study's commit named), a study pinned to
            another version of `numerics.PINS` than this process where the pins differ, or where
            ``SHARPENING_NUMERICS`` chose another (the value that pins it named; otherwise the
            check computes under the study's version, `numerics.following`), or `runs` < 1.
        FileNotFoundError: the study or its config is missing.
    """
    if runs < 1:
        raise ValueError(f"runs: expected >= 1, got {runs}")
    study_path = Path(study_path)
    doc = store.read_json(cli.require_file(study_path, "study"))
    if not isinstance(doc, dict):
        raise ValueError(f"{study_path}: not a study.json (a JSON object)")
    reading = doc.get("reading")
    unit = reading.get("unit") if isinstance(reading, dict) else None
    if unit is not None and unit != UNIT:
        raise ValueError(f"{study_path}: a study of the toy leg (its problem unit {unit!r}, an LLM "
                         f"study's {UNIT!r}): python -m llm spot-check re-trains LLM studies' "
                         "runs")  # fmt: skip
    prints = doc.get("fingerprints", {}).get("confirm")
    if not prints and "extends" in doc:
        raise ValueError(f"{study_path}: an extension none of whose methods was picked "
                         f"({', '.join(doc.get('unpicked', [])) or 'none'}): it trained no "
                         "confirmation run to check")  # fmt: skip
    if not prints:
        raise ValueError(f"{study_path}: no fingerprints (a study.json written before they were "
                         "recorded); read the study again with python -m llm study")  # fmt: skip
    pinned = str(doc["provenance"].get("numerics", ""))
    with numerics.following(pinned):  # the study's arithmetic, where its pins are this process's
        return _check(doc, prints, study_path, pinned, runs, seed, out, workers, progress, log)


def _check(
    doc: dict[str, Any],
    prints: dict[str, str],
    study_path: Path,
    pinned: str,
    runs: int,
    seed: int,
    out: str | Path | None,
    workers: int | None,
    progress: bool,
    log: bool,
) -> dict[str, Any]:
    prov = doc["provenance"]
    config_path = E.check_config(prov, study_path)
    here = R.provenance(config_path, numerics.tag())
    if pinned.startswith("pinned") and pinned != here["numerics"]:
        setting = numerics.setting_for(pinned)
        how = (
            f"run the check with {numerics.OPT_OUT_ENV}={setting} set before Python starts"
            if setting
            else f"check out the study's commit {prov.get('git_commit', '?')[:12]}"
        )
        raise ValueError(f"{study_path}: the study ran pinned to {pinned!r}, this process to "
                         f"{here['numerics']!r}: their bytes differ; {how}")  # fmt: skip
    engine = doc["design"]["engine"]
    made = doc["design"].get("sampler_version", 1)
    if engine == "batched" and made != SAMPLER_VERSION:
        raise ValueError(f"{study_path}: its batched evaluations were sampled by version {made} of "
                         f"the stacked sampler, this code's is {SAMPLER_VERSION} "
                         "(llm.rollout.stacked.VERSION); check out the study's commit "
                         f"{prov.get('git_commit', '?')[:12]}")  # fmt: skip
    picks = doc["picks"]["pass_at_k"]
    if "extends" in doc:
        csweep = _extension_sweep(doc, config_path, study_path, picks)
        steps = {label: [pick["step"]] for label, pick in picks.items()}
    else:
        sweep, spec = load_study(config_path)
        csweep, steps = confirmation(sweep, spec, picks), None
    trained = [n for n in prints if n != "base"]
    rng = np.random.default_rng(seed)
    take = min(runs, len(trained))
    drawn = {trained[i] for i in rng.choice(len(trained), size=take, replace=False).tolist()}
    out = Path(out) if out is not None else Path("runs/llm_spot_check") / config_path.stem
    got = rerun_runs(csweep, out, ["base", *sorted(drawn)], engine=engine, workers=workers,
                     progress=progress, log=log, steps=steps)  # fmt: skip
    names = ["base", *(n for n in prints if n in drawn)]  # the study's order
    rows = [{"run": n, "study": prints[n], "here": got[n], "same": prints[n] == got[n]}
            for n in names]  # fmt: skip
    emulator = emulated()  # /proc/cpuinfo is the host's under QEMU: name the emulated CPU
    here_cpu = f"{emulator} on {here['cpu_id']}" if emulator else here["cpu_id"]
    report = {
        "study": str(study_path), "config": str(config_path), "engine": engine,
        "numerics": {"study": prov.get("numerics"), "here": here["numerics"]},
        "cpu_id": {"study": prov.get("cpu_id", "not recorded"), "here": here_cpu},
        "emulated": emulator,
        "runs": rows, "same": sum(r["same"] for r in rows), "of": len(rows),
    }  # fmt: skip
    store.write_json(out / "spot_check.json", report, indent=1)
    return report


def _extension_sweep(
    doc: dict[str, Any], methods_path: Path, study_path: Path, picks: dict[str, Any]
) -> SweepSpec:
    """The confirmation sweep of an extension's picks: the study it extends (its folder as the
    extension recorded it, checked to be the same bytes) with the extension's methods file, as
    `llm.orchestrate.extend.LLMExtension` built it.

    Raises:
        ValueError: the extended study changed since the extension (its files' SHA-256 differ),
            a method of the methods file that is not registered (``--import`` its module), or a
            method registered under other code than the extension ran (`shaping.method_code`).
    """
    extends = doc["extends"]
    committed = E.load_committed(extends["dir"], unit=LLMExtension.unit)
    if committed.hashes != extends.get("sha256"):
        changed = sorted(k for k in committed.hashes
                         if committed.hashes[k] != extends.get("sha256", {}).get(k))  # fmt: skip
        raise ValueError(f"{study_path}: the study it extends, {extends['dir']}, changed since "
                         f"the extension ({', '.join(changed)})")  # fmt: skip
    methods, claims = E.read_methods(methods_path)
    imported = doc["provenance"].get("imports") or []
    recorded = doc["provenance"].get("method_code") or {}
    changed = sorted(name for name, code in recorded.items()
                     if name in shaping.METHODS and shaping.method_code([name]).get(name) != code)  # fmt: skip
    if changed:
        raise ValueError(f"{study_path}: the code of {', '.join(changed)} differs from the code "
                         "the extension ran (study.json's provenance.method_code; "
                         "shaping.method_code): --import the file it ran")  # fmt: skip
    try:
        leg = LLMExtension(committed, methods, claims, study_path.parent, methods_path)
    except ValueError as err:
        if not imported:
            raise
        raise ValueError(f"{err} (the extension imported {', '.join(imported)})") from None
    return confirmation(leg.ext, leg.spec, picks)
