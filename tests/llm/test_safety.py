"""Issue 13: the trainer never loses a user's data. Each test failed on the code before the fix:
a user's model folder replaced by build_base_model, a finished run silently mixed with a new one,
non-finite training saved as success, two runs into one folder, a corrupt newest checkpoint or a
torn metrics line blocking resume, and a resume without config.toml or past --steps. The last
test kills a training process at random moments and checks that resuming gives the uninterrupted
run's result."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import shaping
from llm.__main__ import main as llm_main
from llm.config import load_config
from llm.run.checkpoint import latest_checkpoint
from llm.run.folder import NonFiniteError, RunFolderError, RunLock
from llm.train.trainer import train
from tests.llm.conftest import save_random_tiny_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "countdown_tiny.toml"


@pytest.fixture(scope="module")
def tiny100(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_random_tiny_model(tmp_path_factory.mktemp("safety_tiny"), max_number=100)


def _cfg(model: str, **over):
    base = dict(model_path=model, build_base_model=False, steps=3, data={"n_problems": 8},
                rollout={"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 4},
                run={"tensorboard": False, "save_every": 1}, optim={"lr": 1e-3})  # fmt: skip
    base.update(over)
    return load_config(TINY, **base)


def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(next(ckpt.glob("*.safetensors"))))


@pytest.mark.usefixtures("registry_snapshot")
def test_a_method_with_non_finite_advantages_is_named_not_the_learning_rate(tiny100, tmp_path):
    """A method of one's own whose advantages are NaN stops the run before the optimizer step,
    naming the method and its advantages (a lower learning rate would not mend it)."""

    @shaping.register("nan_adv")
    def nan_adv(batch, *, scale: float = 1.0):
        """NaN advantages.

        Source: this test.
        """
        return batch["rewards"] * scale * float("nan")

    with pytest.raises(NonFiniteError, match=r"step 1: method 'nan_adv' returned non-finite "
                                             r"advantages \(adv_mean nan\), so the loss is nan"):  # fmt: skip
        train(_cfg(tiny100, method="nan_adv"), tmp_path / "run", progress=False)
    assert latest_checkpoint(tmp_path / "run") is None


def test_build_base_model_never_replaces_a_users_folder(tmp_path: Path) -> None:
    mine = tmp_path / "my_model"
    mine.mkdir()
    (mine / "notes.txt").write_text("an earlier checkpoint and my notes")
    cfg = load_config(TINY, model_path=str(mine), build_base_model=True, steps=1)
    with pytest.raises(RunFolderError, match="not built by this package"):
        train(cfg, tmp_path / "run", progress=False)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_new_run_into_a_finished_run_is_refused_or_moved_aside(tiny100, tmp_path) -> None:
    out = tmp_path / "run"
    train(_cfg(tiny100, steps=2), out, progress=False)
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(RunFolderError, match="already holds a run"):
        train(_cfg(tiny100, steps=1), out, progress=False)
    assert (out / "metrics.jsonl").read_text() == before
    with pytest.warns(UserWarning, match="moved the earlier run"):
        train(_cfg(tiny100, steps=1), out, progress=False, move_aside=True)
    old = next(tmp_path.glob("run.old-*"))
    assert (old / "metrics.jsonl").read_text() == before
    assert len(_metrics(out)) == 1 and latest_checkpoint(out).name == "step_000001"


def _poison_after(monkeypatch, n_steps: int) -> None:
    """Make AdamW's step number `n_steps` + 1 fill the first parameter with inf (lr is bounded by
    the config, so a huge lr can no longer provoke it)."""
    calls = {"n": 0}
    step = torch.optim.AdamW.step

    def poisoned(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] > n_steps:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned)


def test_non_finite_training_stops_and_keeps_the_last_good_checkpoint(
    tiny100, tmp_path, monkeypatch
) -> None:
    out = tmp_path / "run"
    _poison_after(monkeypatch, 2)
    with pytest.raises(NonFiniteError, match=r"step \d+: .*--change-optimizer"):
        train(_cfg(tiny100, steps=6), out, progress=False)
    ckpt = latest_checkpoint(out)
    assert ckpt is not None and ckpt.name == "step_000002"
    assert all(torch.isfinite(t).all() for t in _weights(ckpt).values())
    # The stop's advice works: resume with a lower lr through the documented flag.
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"config differs.*lr: 0\.001 -> 0\.0001"):
        train(_cfg(tiny100, steps=4, optim={"lr": 1e-4}), out, resume=True, progress=False)
    train(
        _cfg(tiny100, steps=4, optim={"lr": 1e-4}),
        out,
        resume=True,
        change_optimizer=True,
        progress=False,
    )
    assert latest_checkpoint(out).name == "step_000004"
    changes = [json.loads(x) for x in (out / "config_changes.jsonl").read_text().splitlines()]
    assert [c["changes"] for c in changes] == [{"optim.lr": [1e-3, 1e-4]}]
    assert load_config(out / "config.toml").optim.lr == 1e-4
    with pytest.raises(ValueError, match="--change-optimizer allows"):
        train(
            _cfg(tiny100, steps=5, optim={"lr": 1e-4}, seed=3),
            out,
            resume=True,
            change_optimizer=True,
            progress=False,
        )


def test_a_second_live_run_into_the_same_folder_is_refused(tiny100, tmp_path) -> None:
    out = tmp_path / "run"
    with RunLock(out), pytest.raises(RunFolderError, match=f"in use by PID {os.getpid()}"):
        train(_cfg(tiny100), out, progress=False)
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("damage", ["empty_state", "random_state", "truncated_weights"])
def test_resume_falls_back_past_a_corrupt_newest_checkpoint(tiny100, tmp_path, damage) -> None:
    out, ref = tmp_path / "run", tmp_path / "ref"
    train(_cfg(tiny100, steps=3), ref, progress=False)
    train(_cfg(tiny100, steps=3), out, progress=False, stop_after=2)
    newest = latest_checkpoint(out)
    assert newest.name == "step_000002"
    if damage == "empty_state":
        (newest / "trainer_state.pt").write_bytes(b"")
    elif damage == "random_state":
        (newest / "trainer_state.pt").write_bytes(random.Random(0).randbytes(4096))
    else:
        w = next(newest.glob("*.safetensors"))
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.warns(UserWarning, match="skipped checkpoint .*step_000002"):
        train(_cfg(tiny100, steps=3), out, resume=True, progress=False)
    # Resumed from step 1: steps 2 and 3 are redone exactly as the uninterrupted run did them.
    strip = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in _metrics(out)]
    want = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in _metrics(ref)]
    assert strip == want


def test_torn_metrics_line_is_dropped_on_resume(tiny100, tmp_path) -> None:
    out = tmp_path / "run"
    train(_cfg(tiny100, steps=3), out, progress=False, stop_after=2)
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "charts/rew')
    with pytest.warns(UserWarning, match="torn last line"):
        train(_cfg(tiny100, steps=3), out, resume=True, progress=False)
    assert [m["step"] for m in _metrics(out)] == [1, 2, 3]


def test_resume_without_config_or_past_steps_says_so(tiny100, tmp_path) -> None:
    out = tmp_path / "run"
    train(_cfg(tiny100, steps=2), out, progress=False)
    with pytest.raises(ValueError, match="at step 2, past steps = 1"):
        train(_cfg(tiny100, steps=1), out, resume=True, progress=False)
    with pytest.warns(UserWarning, match="already at step 2"):
        assert train(_cfg(tiny100, steps=2), out, resume=True, progress=False) == []
    (out / "config.toml").unlink()
    with pytest.raises(RunFolderError, match="no config"):
        train(_cfg(tiny100, steps=3), out, resume=True, progress=False)


def _cli(model: str, out: Path, steps: int, resume: bool) -> list[str]:
    argv = [sys.executable, "-m", "llm", "train", "--config", str(TINY), "--out", str(out),
            "--set", f"model_path={model}", "build_base_model=false",
            "rollout.group_size=2", "rollout.prompts_per_step=2", "rollout.max_new_tokens=4",
            "run.tensorboard=false", "run.save_every=1", "system.num_threads=1",
            "data.n_problems=8", f"steps={steps}"]  # fmt: skip
    return [*argv, "--resume"] if resume else argv


def _train_in_child(argv: list[str], log: str = os.devnull) -> None:
    """A forked child: ``python -m llm ARGV`` in this already-imported interpreter (a fresh
    process would spend most of its life importing torch), its output written to `log`."""
    os.chdir(ROOT)
    with open(log, "w") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    os._exit(llm_main(argv))


@pytest.mark.slow
def test_kill_at_random_moments_then_resume_equals_uninterrupted(tiny100, tmp_path) -> None:
    """The last resume is a real ``python -m llm train`` process; the uninterrupted run and the
    processes killed in between are forks of this one running the same command (a SIGKILL at a
    random moment after a new checkpoint appeared). Neither run trains in this process, so no
    fork starts with state of another; the last resume, in a fresh interpreter that read the run
    from disk only, must end bit-identical to the forked uninterrupted run."""
    steps, kills = 10, 5
    ref, out = tmp_path / "ref", tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    fork = multiprocessing.get_context("fork")
    log = tmp_path / "ref.log"
    proc = fork.Process(target=_train_in_child, args=(_cli(tiny100, ref, steps, False)[3:], log))
    proc.start()
    proc.join(300)
    if proc.exitcode is None:  # past the timeout
        proc.kill()
        proc.join()
    assert proc.exitcode == 0, log.read_text()[-5000:]
    rng = random.Random(13)
    done = 0
    for i in range(kills):
        proc = fork.Process(target=_train_in_child, args=(_cli(tiny100, out, steps, i > 0)[3:],))
        proc.start()
        # Kill once training has begun (a new checkpoint appeared), at a random moment after it.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.exitcode is None:
            ckpt = latest_checkpoint(out)
            if ckpt is not None and int(ckpt.name.split("_")[1]) > done:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
        proc.kill()
        proc.join()
        ckpt = latest_checkpoint(out)
        done = int(ckpt.name.split("_")[1]) if ckpt is not None else 0

    subprocess.run(_cli(tiny100, out, steps, True), cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    strip = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in _metrics(out)]
    want = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in _metrics(ref)]
    assert strip == want
    last_ref, last_out = latest_checkpoint(ref), latest_checkpoint(out)
    assert last_out.name == last_ref.name == f"step_{steps:06d}"
    a, b = _weights(last_ref), _weights(last_out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
