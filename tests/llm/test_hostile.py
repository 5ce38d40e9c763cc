"""Issues 40 and 54: nothing mixed, nothing silently ignored. A `--change-optimizer` that records a
change and must apply it, refused commands that must write nothing, two sweeps on one folder (two
real processes), workers that must die with their driver, errors that must name their file (or
``--set``), and every study and `llm eval` input bounded and used or refused. Each test failed on
the code before the fix.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from llm.__main__ import main
from llm.config import load_config
from llm.run.checkpoint import CONFIG_CHANGES, latest_checkpoint
from tests.llm.conftest import save_random_tiny_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "countdown_tiny.toml"


@pytest.fixture(scope="module")
def tiny100(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_random_tiny_model(tmp_path_factory.mktemp("hostile_tiny"), max_number=100)


def _sets(model: str, *extra: str) -> list[str]:
    return [
        f"model_path={model}", "build_base_model=false", "rollout.group_size=2",
        "rollout.prompts_per_step=2", "rollout.max_new_tokens=4", "run.tensorboard=false",
        "run.save_every=2", "system.num_threads=1", "data.n_problems=8",
        "entropy_coef=0.01", *extra,  # a gradient even where every reward is 0
    ]  # fmt: skip


def _cli(*args: str) -> tuple[int, str]:
    """``python -m llm ARGS`` in this process: (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(list(args))
    return code, err.getvalue()


def _train(out: Path, sets: list[str], *flags: str, steps: int) -> tuple[int, str]:
    return _cli(
        "train", "--config", str(TINY), "--out", str(out), "--steps", str(steps), *flags,
        "--set", *sets,
    )  # fmt: skip


def _lrs(out: Path) -> dict[int, float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["charts/lr"] for r in map(json.loads, lines)}


def _weights(out: Path) -> dict:
    return load_file(latest_checkpoint(out) / "model.safetensors")


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


# ---------------------------------------------------------------------------------------------
# --resume --change-optimizer applies what it records; a refused command writes nothing


def test_change_optimizer_applies_every_key_it_records(tiny100, tmp_path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert _train(a, _sets(tiny100), steps=2)[0] == 0
    shutil.copytree(a, b)
    shutil.copytree(a, c)
    assert _train(a, _sets(tiny100), "--resume", steps=4)[0] == 0
    code, err = _train(
        b, _sets(tiny100, "optim.lr=5e-5"), "--resume", "--change-optimizer", steps=4
    )
    assert code == 0, err
    code, err = _train(
        c, _sets(tiny100, "optim.weight_decay=0.5", "optim.adam_betas=[0.5, 0.9]"),
        "--resume", "--change-optimizer", steps=4,
    )  # fmt: skip
    assert code == 0, err
    assert _lrs(a) == {1: 1e-4, 2: 1e-4, 3: 1e-4, 4: 1e-4}
    assert _lrs(b) == {1: 1e-4, 2: 1e-4, 3: 5e-5, 4: 5e-5}  # the new lr, in charts
    wa, wb, wc = _weights(a), _weights(b), _weights(c)
    assert any(not wa[k].equal(wb[k]) for k in wa)  # and in the weights
    assert any(not wa[k].equal(wc[k]) for k in wa)  # weight_decay and betas too
    changes = json.loads((c / CONFIG_CHANGES).read_text())["changes"]
    assert set(changes) == {"optim.weight_decay", "optim.adam_betas"}


def test_a_refused_resume_writes_nothing(tiny100, tmp_path) -> None:
    out = tmp_path / "run"
    assert _train(out, _sets(tiny100), steps=4)[0] == 0
    before = _files(out)
    code, err = _train(
        out, _sets(tiny100, "optim.lr=5e-5"), "--resume", "--change-optimizer", steps=2
    )
    assert code == 2 and "past steps = 2" in err and err.count("\n") == 1
    code, err = _train(out, _sets(tiny100), "--resume", steps=2)
    assert code == 2 and "past steps = 2" in err
    assert _files(out) == before  # no config_changes.jsonl, config.toml untouched
    assert not (out / CONFIG_CHANGES).exists()
    assert load_config(out / "config.toml").steps == 4


def test_change_optimizer_without_resume_is_refused(tiny100, tmp_path) -> None:
    out = tmp_path / "run"
    code, err = _train(out, _sets(tiny100, "optim.lr=5e-5"), "--change-optimizer", steps=2)
    assert code == 2 and "--change-optimizer: only with --resume" in err
    assert err.count("\n") == 1 and not out.exists()


# ---------------------------------------------------------------------------------------------
# One sweep per folder; workers die with their driver

BASE = """
model_path = "{model}"
build_base_model = false
method = "grpo"
steps = 2000
[rollout]
group_size = 2
prompts_per_step = 2
max_new_tokens = 4
[run]
tensorboard = false
save_every = 0
[data]
source = "generate"
n_problems = 8
max_number = 9
max_target = 30
[eval]
source = "generate"
"""

SWEEP = """
base = "base.toml"
seeds = [0]
checkpoints = [2000]
reference = "grpo"
[eval]
problems = 2
samples = 2
[[methods]]
method = "grpo"
[[methods]]
method = "entropy_bonus"
grid = { eta = [0.1] }
"""


def _sweep_config(folder: Path, model: str) -> Path:
    (folder / "base.toml").write_text(BASE.format(model=model))
    (folder / "sweep.toml").write_text(SWEEP)
    return folder / "sweep.toml"


def _children(pid: int) -> list[int]:
    """The live (not zombie) processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _run_steps(out: Path) -> dict[str, list[int]]:
    return {
        p.parent.name: [json.loads(x)["step"] for x in p.read_text().splitlines() if x.strip()]
        for p in sorted((out / "runs").glob("*/metrics.jsonl"))
    }


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_second_sweep_is_refused_and_workers_die_with_their_driver(
    tiny_model_path, tmp_path
) -> None:
    """Two real processes: a second sweep on a live sweep's --out is refused without touching
    it; `kill -9` of the first's driver leaves no worker alive 10 s later."""
    config, out = _sweep_config(tmp_path, tiny_model_path), tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "llm", "sweep", "--config", str(config), "--out", str(out)]
    first = subprocess.Popen(
        [*cmd, "--workers", "2"], cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            steps = _run_steps(out) if (out / "runs").is_dir() else {}
            if len(steps) == 2 and all(len(s) >= 3 for s in steps.values()):
                break
            assert first.poll() is None, "the first sweep ended early"
            time.sleep(0.2)
        else:
            pytest.fail("the first sweep's runs logged no steps in 120 s")
        code, err = _cli("sweep", "--config", str(config), "--out", str(out), "--workers", "1")
        assert code == 2 and f"in use by PID {first.pid}" in err, err
        assert first.poll() is None  # untouched, still running
        workers = _children(first.pid)
        assert len(workers) >= 2
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if _alive(w)], "workers outlived their driver"
    finally:
        if first.poll() is None:
            first.kill()
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)
    for name, steps in _run_steps(out).items():  # each run written by one process, in order
        assert steps == list(range(1, len(steps) + 1)), name


# ---------------------------------------------------------------------------------------------
# Errors name their file (and line); bounded inputs; a refused command leaves nothing


def test_a_non_utf8_sweep_or_study_file_is_named(tmp_path) -> None:
    bad = tmp_path / "B.toml"
    bad.write_bytes(b"# \xff\n" + (ROOT / "configs" / "sweep_countdown_quick.toml").read_bytes())
    for command in ("sweep", "study"):
        code, err = _cli(command, "--config", str(bad), "--out", str(tmp_path / "X"))
        assert code == 2 and f"{bad}, line 1: not UTF-8 text" in err and err.count("\n") == 1
    assert not (tmp_path / "X").exists()


def test_a_config_value_error_names_the_file_and_line(tmp_path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(TINY.read_text().replace("weight_decay = 0.0", "weight_decay = 1e38"))
    code, err = _cli("train", "--config", str(config), "--out", str(tmp_path / "O"))
    line = 1 + config.read_text().splitlines().index("weight_decay = 1e38")
    assert code == 2 and f"{config}, line {line}: optim.weight_decay: expected" in err
    code, err = _cli("train", "--config", str(TINY), "--out", str(tmp_path / "O"),
                     "--set", "optim.weight_decay=1e38")  # fmt: skip
    assert code == 2 and "--set optim.weight_decay: expected a finite number in [0, 1]" in err
    assert str(TINY) not in err  # the value came from --set, not from the file
    assert not (tmp_path / "O").exists()


def test_sweep_eval_offset_is_bounded(tmp_path) -> None:
    config = ROOT / "configs" / "sweep_countdown_quick.toml"
    code, err = _cli("sweep", "--config", str(config), "--out", str(tmp_path / "X"),
                     "--set", "eval.offset=100000000")  # fmt: skip
    assert code == 2 and "eval.offset: expected offset + problems <= 8000" in err
    assert not (tmp_path / "X").exists()


def test_a_sweep_refused_at_its_start_leaves_no_folder(tiny_model_path, tmp_path) -> None:
    config, out = _sweep_config(tmp_path, tiny_model_path), tmp_path / "X"
    code, err = _cli("sweep", "--config", str(config), "--out", str(out), "--set", "eval.set=nope")
    assert code == 2 and "eval.set: expected one of" in err
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_the_cuda_error_names_system_device(tiny100, tmp_path) -> None:
    code, err = _train(tmp_path / "O", _sets(tiny100, "system.device=cuda"), steps=2)
    assert code == 2 and 'set system.device = "cpu"' in err


# ---------------------------------------------------------------------------------------------
# Issue 54: study and eval inputs bounded, used or refused


def test_a_study_without_a_study_table_is_refused(tiny_model_path, tmp_path) -> None:
    config, out = _sweep_config(tmp_path, tiny_model_path), tmp_path / "X"
    code, err = _cli("study", "--config", str(config), "--out", str(out))
    assert code == 2 and f"{config}: no [study] table" in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("how", ["file", "set"])
def test_a_sweeps_eval_n_samples_is_a_removed_key(tiny_model_path, tmp_path, how) -> None:
    config, out = _sweep_config(tmp_path, tiny_model_path), tmp_path / "X"
    sets: list[str] = []
    if how == "file":
        config.write_text(SWEEP.replace("samples = 2", "n_samples = 2"))
    else:
        sets = ["--set", "eval.n_samples=2"]
    code, err = _cli("sweep", "--config", str(config), "--out", str(out), *sets)
    assert code == 2 and "eval.n_samples: removed; write eval.samples" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("study", "named"),
    [("confirm_offset = 100000000", "study.confirm_offset: expected confirm_offset"),
     ("confirm_problems = 7999", "study.confirm_problems: expected confirm_offset (0: the 2 ")],
)  # fmt: skip
def test_the_confirmation_offset_is_checked_before_any_training(
    tiny_model_path, tmp_path, study, named
) -> None:
    config, out = _sweep_config(tmp_path, tiny_model_path), tmp_path / "X"
    config.write_text(SWEEP + f"[study]\nconfirm_seeds = [5]\n{study}\n")
    code, err = _cli("study", "--config", str(config), "--out", str(out))
    assert code == 2 and f"{config}: {named}" in err and "<= 8000" in err
    assert not out.exists()  # nothing explored


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--samples", "0"], "--samples: expected an integer in [1, 4096], got 0"),
     (["--samples", "1000000000"], "--samples: expected an integer in [1, 4096], got 1000000000"),
     (["--heldout", "0"], "--heldout: expected an integer in [1, 8000], got 0"),
     (["--heldout", "100000000"], "--heldout: expected an integer in [1, 8000], got 100000000"),
     (["--generate", "0"], "--generate: expected an integer in [1, 8000], got 0"),
     (["--set", "eval.samples=0"], "--set eval.samples: expected an integer in [1, 4096], got 0"),
     (["--set", "eval.samples=5000"], "--set eval.samples: expected an integer in [1, 4096]"),
     (["--set", "eval.dtype=bfloat16", "rollout.backend=vllm", "system.device=cuda"],
      "eval.dtype: 'bfloat16' applies to the transformers backend")],
)  # fmt: skip
def test_eval_counts_are_bounded(tiny100, tmp_path, flags, named) -> None:
    """``--samples 0`` evaluated 16 samples, ``--heldout 0`` 64 problems and ``--samples 1e9``
    never ended; each is refused by name before the model loads."""
    out = tmp_path / "E"
    code, err = _cli("eval", "--model", tiny100, "--out", str(out), *flags)
    assert code == 2 and named in err and err.count("\n") == 1
    assert not out.exists()


def test_eval_dtype_is_applied_and_recorded_with_the_sampler(tiny100, tmp_path) -> None:
    """``eval.dtype = "bfloat16"`` was accepted and never used (results equal float32's): the
    policy now samples in bfloat16 (its token entropy, a forward of the same weights, differs
    from float32's) and eval.json records the dtype and the sampler of every label."""
    out = tmp_path / "E"
    common = ["eval", "--model", tiny100, "--out", str(out), "--heldout", "2", "--samples", "2",
              "--no-bleu", "--no-semantic", "--token-entropy"]  # fmt: skip
    runs = {("float32", "generate"), ("bfloat16", "generate"), ("float32", "stacked")}
    for dtype, sampler in sorted(runs):
        label = f"{dtype}-{sampler}"
        sets = ["--set", f"eval.dtype={dtype}", f"eval.sampler={sampler}"]
        code, err = _cli(*common, "--label", label, *sets)
        assert code == 0, err
    doc = json.loads((out / "eval.json").read_text())
    assert {(r["dtype"], r["sampler"]) for r in doc.values()} == runs
    assert all(doc[f"{d}-{s}"]["dtype"] == d for d, s in runs)
    assert doc["bfloat16-generate"]["token_entropy"] != doc["float32-generate"]["token_entropy"]


def test_resume_into_a_missing_folder_is_refused(tiny100, tmp_path) -> None:
    out = tmp_path / "nope"
    code, err = _train(out, _sets(tiny100), "--resume", steps=2)
    assert code == 2 and f"--resume: no run folder {str(out)!r}" in err
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "eval"])
def test_the_help_shows_set_examples_that_are_accepted(command, capsys) -> None:
    """``--help`` showed ``--set lr=3e-4``, which is refused: its examples now load."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    examples = text.split("override config keys: ", 1)[1].split(" (TOML", 1)[0].split()
    assert "optim.lr=3e-4" in examples and "lr=3e-4" not in examples
    cfg = load_config(TINY, sets=examples)
    assert cfg.optim.lr == 3e-4 and cfg.data.seed == 3 and cfg.eval.samples == 64


@pytest.mark.parametrize(
    "argv",
    [["sweep", "--config", "configs/sweep_countdown_quick.toml", "--workers", "0"],
     ["study", "--config", "configs/study_countdown_mild.toml", "--workers", "-2"],
     ["spot-check", "figures/gpu/study.json", "--workers", "0"],
     ["reproduce", "--quick", "--jobs", "0"], ["reproduce", "--quick", "--eval-problems", "0"],
     ["reproduce", "--quick", "--eval-samples", "-1"]],
)  # fmt: skip
def test_counts_below_one_are_refused_by_name(argv, capsys):
    """A worker, job, problem or sample count below 1 is refused before anything runs (``--workers
    0`` ran every run inline and ``--eval-problems 0`` fell back to the default)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"argument {argv[-2]}: expected an integer >= 1, got {int(argv[-1])}" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["data.source=file", "data.path={missing}"], "data.path: '{missing}' does not exist"),
        (["eval.source=file", "eval.paths=['{folder}']"], "eval.paths: '{folder}' is a folder"),
    ],
)
def test_a_missing_data_file_is_refused_at_launch(tmp_path, capsys, sets, message):
    """A run whose data file is missing (or a folder) is refused before it builds the tiny base
    model (minutes) or writes its folder: it failed only when the problems were loaded."""
    names = {"missing": str(tmp_path / "nope.jsonl"), "folder": str(tmp_path)}
    base = tmp_path / "base"
    out = tmp_path / "run"
    argv = ["train", "--config", str(TINY), "--out", str(out), "--steps", "1", "--set",
            f"model_path={base}", *(s.format(**names) for s in sets)]  # fmt: skip
    assert main(argv) == 2
    assert message.format(**names) in capsys.readouterr().err
    assert not out.exists() and not base.exists()
