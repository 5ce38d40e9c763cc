"""Issue 54 item 3: a toy sweep or study takes its --out folder's lock (`experiment.lock.RunLock`,
the LLM leg's), so a second one into the same folder is refused by name and nothing is mixed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiment.lock import LOCK_FILE
from tests.toymdp.test_sweep import TINY
from toymdp.__main__ import main

ROOT = Path(__file__).parents[2]
STUDY = """
[[methods]]
method = "ds_grpo"
grid = {{ gamma_p = [0.1, 0.3] }}

[study]
name = "{name}"
confirm_draws = [10, 11]
confirm_seeds = [0, 1]
confirm_key = 1
"""


# TINY without its second method, which the lock does not depend on (one compiled program per
# method and stage).
LEAN = TINY.replace('[[methods]]\nmethod = "entropy_bonus"\ngrid = { eta = [0.3] }\n', "")
assert "entropy_bonus" not in LEAN


def _config(tmp_path: Path, command: str, name: str, seeds: str) -> Path:
    text = LEAN.replace("seeds = [0, 1]", f"seeds = {seeds}")
    if command == "study":
        text += STUDY.format(name=name)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def _wait_for_lock(out: Path, proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if json.loads((out / LOCK_FILE).read_text())["pid"] == proc.pid:
                return
        except (OSError, ValueError, KeyError):
            pass
        assert proc.poll() is None, "the first command ended before its lock was seen"
        time.sleep(0.02)
    pytest.fail("the first command took no lock in 120 s")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["sweep", "study"])
def test_a_second_toy_command_on_a_live_folder_is_refused(tmp_path, capsys, command):
    """Two real commands into one --out: the second is refused with the first's PID named,
    the first finishes, and the folder holds the first's results alone."""
    first_cfg = _config(tmp_path, command, "first", "[0, 1]")
    second_cfg = _config(tmp_path, command, "second", "[2, 3]")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(
        [sys.executable, "-m", "toymdp", command, "--config", str(first_cfg), "--out", str(out)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_lock(out, first)
        assert main([command, "--config", str(second_cfg), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"in use by PID {first.pid}" in err and str(out) in err and err.count("\n") == 1
        _, stderr = first.communicate(timeout=300)
        assert first.returncode == 0, stderr
    finally:
        if first.poll() is None:
            first.kill()
    assert not (out / LOCK_FILE).exists()
    results = out / ("explore" if command == "study" else "") / "results.json"
    assert json.loads(results.read_text())["config"]["seeds"] == [0, 1]  # the first's alone
    if command == "study":
        doc = json.loads((out / "study.json").read_text())
        assert doc["study"] == "first" and doc["provenance"]["config"] == str(first_cfg)


def test_an_output_path_that_is_a_file_is_refused_by_name(tmp_path, capsys):
    """A sweep's or the figures' --out naming a file is one line naming it (it was the OS's
    '[Errno 20] Not a directory' of the lock file, or '[Errno 17] File exists'); the file is
    left as it was."""
    taken = tmp_path / "taken"
    taken.write_text("mine")
    cfg = _config(tmp_path, "sweep", "s", "[0]")
    for argv in (["sweep", "--config", str(cfg), "--out", str(taken)],
                 ["figures", "--quick", "--only", "bias", "--out", str(taken)]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{str(taken)!r} is a file, not a folder" in err, err
    assert taken.read_text() == "mine"
