"""Issue 24: no run is ever mixed or stranded. `--move-aside` against a live run (two real
processes), failed starts that used to block the corrected command, errors that did not name
their cause, and a checkpoint skipped without a word. Each test failed on the code before the fix.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from llm.__main__ import main
from llm.config import load_config
from llm.run.checkpoint import latest_checkpoint
from llm.run.folder import RunFolderError
from llm.train.trainer import train
from tests.llm.conftest import save_random_tiny_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "countdown_tiny.toml"


@pytest.fixture(scope="module")
def tiny100(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_random_tiny_model(tmp_path_factory.mktemp("holes_tiny"), max_number=100)


def _sets(model: str, *extra: str) -> list[str]:
    return [
        f"model_path={model}", "build_base_model=false", "rollout.group_size=2",
        "rollout.prompts_per_step=2", "rollout.max_new_tokens=4", "run.tensorboard=false",
        "run.save_every=5", "system.num_threads=1", "data.n_problems=8", *extra,
    ]  # fmt: skip


class _Result:
    def __init__(self, returncode: int, stderr: str) -> None:
        self.returncode, self.stderr = returncode, stderr


def _cli(*args: str) -> _Result:
    """``python -m llm ARGS`` in this process (`llm.__main__.main`): exit status and stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: print(
            f"{c.__name__}: {m}", file=sys.stderr
        )
        code = main(list(args))
    return _Result(code, err.getvalue())


def _train_cli(out: Path, sets: list[str], *flags: str, steps: int = 2):
    return _cli(
        "train", "--config", str(TINY), "--out", str(out), "--steps", str(steps), *flags,
        "--set", *sets,
    )  # fmt: skip


def _steps(out: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_move_aside_never_touches_a_live_run(tiny100, tmp_path) -> None:
    """Two real processes: the second, with --move-aside, is refused while the first runs."""
    live = tmp_path / "live"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "llm", "train", "--config", str(TINY), "--out", str(live)]
    cmd += ["--steps", "100000", "--set", *_sets(tiny100)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            metrics = live / "metrics.jsonl"
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 6:
                break
            assert proc.poll() is None, "the live run ended early"
            time.sleep(0.2)
        else:
            pytest.fail("the live run logged no steps in 120 s")
        res = _train_cli(live, _sets(tiny100), "--move-aside", steps=10)
        assert res.returncode == 2, res.stderr
        assert "in use by PID" in res.stderr and str(proc.pid) in res.stderr
        assert not list(tmp_path.glob("live.old-*")), "the live run's folder was moved"
        n = len(_steps(live))
        time.sleep(1.0)
        assert proc.poll() is None and len(_steps(live)) >= n  # still running, in place
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    steps = _steps(live)
    assert steps == list(range(1, len(steps) + 1)), "metrics.jsonl was written by two runs"


def test_move_aside_of_a_finished_run_still_moves_it(tiny100, tmp_path) -> None:
    out = tmp_path / "run"
    assert _train_cli(out, _sets(tiny100)).returncode == 0
    res = _train_cli(out, _sets(tiny100), "--move-aside", steps=1)
    assert res.returncode == 0, res.stderr
    (old,) = tmp_path.glob("run.old-*")
    assert not (old / ".run.lock").exists() and not (out / ".run.lock").exists()
    assert _steps(old) == [1, 2] and _steps(out) == [1]


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (["system.device=cuda"], "device: 'cuda' cannot run here"),
        (["data.source='file'", "data.path='nowhere/train.jsonl'"], "nowhere/train.jsonl"),
        (["data.source='generate'", "data.max_target=1000"], "not in the model's vocabulary"),
    ],
    ids=["cuda_without_gpu", "missing_data_file", "number_outside_vocabulary"],
)
def test_a_failed_start_leaves_nothing_and_the_fix_just_works(tiny100, tmp_path, bad, named):
    out = tmp_path / "r"
    res = _train_cli(out, _sets(tiny100, *bad))
    assert res.returncode == 2 and named in res.stderr, res.stderr
    assert res.stderr.count("error:") == 1 and res.stderr.endswith(")\n"), res.stderr
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.iterdir())
    res = _train_cli(out, _sets(tiny100))
    assert res.returncode == 0, res.stderr
    assert _steps(out) == [1, 2]


def test_a_refused_base_model_build_leaves_nothing(tmp_path) -> None:
    mine = tmp_path / "my_model"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    out = tmp_path / "run"
    out.mkdir()
    (out / "README").write_text("a folder the user made")
    cfg = load_config(TINY, model_path=str(mine), build_base_model=True, steps=1)
    with pytest.raises(RunFolderError, match="not built by this package"):
        train(cfg, out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["README"]  # kept, nothing added


def test_errors_name_their_cause(tiny100, tmp_path) -> None:
    res = _train_cli(tmp_path / "a", _sets(tiny100, "optim.lr=1e38"))
    named = "error: --set optim.lr: expected a finite number in (0, 1]"  # the flag, not the file
    assert res.returncode == 2 and named in res.stderr
    garbage = tmp_path / "garbage.toml"
    garbage.write_bytes(bytes(range(256)))
    res = _cli("train", "--config", str(garbage), "--out", str(tmp_path / "b"))
    assert res.returncode == 2 and str(garbage) in res.stderr and "UTF-8" in res.stderr
    folder = tmp_path / "data_dir"
    folder.mkdir()
    res = _train_cli(tmp_path / "c", _sets(tiny100, "data.source='file'", f"data.path='{folder}'"))
    assert res.returncode == 2 and f"data.path: '{folder}' is a folder" in res.stderr
    res = _cli("eval", "--model", tiny100, "--problems", str(folder), "--out", str(tmp_path / "e"))
    assert res.returncode == 2 and f"--problems: '{folder}' is a folder" in res.stderr
    res = _train_cli(tmp_path / "d", _sets(tiny100, "system.device=cuda:0"))
    assert res.returncode == 2 and "device: 'cuda:0' cannot run here" in res.stderr


def test_each_skipped_checkpoint_is_named(tiny100, tmp_path) -> None:
    out = tmp_path / "run"
    assert _train_cli(out, _sets(tiny100, "run.save_every=1"), steps=3).returncode == 0
    newest = latest_checkpoint(out)
    (newest / "trainer_state.pt").unlink()
    res = _train_cli(out, _sets(tiny100, "run.save_every=1"), "--resume", steps=3)
    assert res.returncode == 0, res.stderr
    assert f"skipped checkpoint {newest}" in res.stderr
    assert latest_checkpoint(out).name == "step_000003"
