"""Unit tests of llm.run.folder: run-folder claims, the lock, the base-model folder guard,
checkpoint fallback, torn metrics lines and the non-finite guard (issue 13)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiment import lock
from llm.run.folder import (
    LOCK_FILE,
    NonFiniteError,
    RunFolderError,
    RunLock,
    check_base_model_folder,
    check_finite,
    claim_run_folder,
    loadable_checkpoints,
    newest_loadable,
    read_metrics,
)


def test_fresh_run_into_a_run_folder_is_refused(tmp_path: Path) -> None:
    claim_run_folder(tmp_path / "new", resume=False)  # missing: fine
    (tmp_path / "notes.txt").write_text("mine")
    claim_run_folder(tmp_path, resume=False)  # no run artifacts: fine
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(RunFolderError, match=r"already holds a run .*metrics\.jsonl"):
        claim_run_folder(tmp_path, resume=False)
    claim_run_folder(tmp_path, resume=True)


def test_move_aside_keeps_the_old_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "checkpoints" / "step_000001").mkdir(parents=True)
    (out / "config.toml").write_text("x = 1\n")
    with pytest.warns(UserWarning, match="moved the earlier run"):
        moved = claim_run_folder(out, resume=False, move_aside=True)
    assert moved is not None and (moved / "config.toml").read_text() == "x = 1\n"
    assert not out.exists()


def test_resume_without_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    with pytest.raises(RunFolderError, match=r"no config\.toml"):
        claim_run_folder(tmp_path, resume=True)


def test_out_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(RunFolderError, match="is a file"):
        claim_run_folder(f, resume=False)


def test_lock_excludes_a_second_holder_and_releases(tmp_path: Path) -> None:
    with RunLock(tmp_path):
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        assert record["pid"] == os.getpid()
        with pytest.raises(RunFolderError, match=f"in use by PID {os.getpid()}"):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / LOCK_FILE).exists()
    with RunLock(tmp_path):  # free again
        pass


def test_the_llm_and_toy_legs_share_one_lock() -> None:
    """One definition (issue 54): the LLM's run lock is `experiment.lock`'s, which the toy's
    sweeps and studies take (tests/toymdp/test_locks.py)."""
    assert (RunLock, RunFolderError, LOCK_FILE) == (lock.RunLock, lock.RunFolderError,
                                                     lock.LOCK_FILE)  # fmt: skip


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    import socket

    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    with pytest.warns(UserWarning, match=f"stale lock of PID {pid}"), RunLock(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _contend(path: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    try:
        RunLock(path).acquire()
        queue.put("won")
    except RunFolderError:
        queue.put("lost")


def test_only_one_of_two_contenders_takes_a_stale_lock(tmp_path: Path) -> None:
    # A corrupt lock long past its grace period: both contenders see it stale.
    lock = tmp_path / LOCK_FILE
    lock.write_text("")
    os.utime(lock, (0, 0))
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_contend, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    results = sorted(queue.get(timeout=5) for _ in procs)
    # The winners' PIDs are dead now, so a later loser may also take over: at least one won,
    # and no two held it at once is checked by O_EXCL itself.
    assert "won" in results


def test_base_model_folder_guard(tmp_path: Path) -> None:
    check_base_model_folder(tmp_path / "missing", "tiny_build.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    check_base_model_folder(empty, "tiny_build.json")
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "tiny_build.json").write_text("{}")
    (ours / "model.safetensors").write_text("")
    check_base_model_folder(ours, "tiny_build.json")
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("precious")
    with pytest.raises(RunFolderError, match="not built by this package"):
        check_base_model_folder(user, "tiny_build.json")
    assert (user / "notes.txt").read_text() == "precious"


def test_checkpoint_fallback_skips_corrupt_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        d = tmp_path / "checkpoints" / f"step_{step:06d}"
        d.mkdir(parents=True)
        (d / "state").write_text("good" if step < 3 else "")
    (tmp_path / "checkpoints" / ".tmp_step_000004").mkdir()

    def load(p: Path) -> str:
        text = (p / "state").read_text()
        if not text:
            raise EOFError("empty state")
        return text

    cands = loadable_checkpoints(tmp_path, lambda p: (p / "state").exists())
    assert [p.name for p in cands] == ["step_000003", "step_000002", "step_000001"]
    with pytest.warns(UserWarning, match="skipped checkpoint .*step_000003.*EOFError"):
        found = newest_loadable(cands, load)
    assert found is not None and found[0].name == "step_000002"
    assert newest_loadable([], load) is None
    (tmp_path / "checkpoints" / "step_000001" / "state").write_text("")
    (tmp_path / "checkpoints" / "step_000002" / "state").write_text("")
    with pytest.warns(UserWarning), pytest.raises(RunFolderError, match="no checkpoint loads"):
        newest_loadable(cands, load)


def test_read_metrics_drops_only_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 0.5}\n{"step": 2, "a": 0.25}\n{"step": 3, "a"')
    with pytest.warns(UserWarning, match="torn last line 3"):
        assert [r["step"] for r in read_metrics(path)] == [1, 2]
    path.write_text('{"step": 1}\n{"ste\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_metrics(path)
    assert read_metrics(tmp_path / "none.jsonl") == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_check_finite_names_step_and_quantity(bad: float) -> None:
    check_finite(3, loss=1.0, grad_norm=2.0)
    with pytest.raises(NonFiniteError, match=r"step 7: grad_norm is (nan|inf|-inf)"):
        check_finite(7, loss=0.5, grad_norm=bad)
