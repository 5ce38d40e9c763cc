"""`python -m llm` as a user meets it: `--set` overrides, and every error as one line (exit 2) with
`--debug` showing the traceback; the same error contract for `python -m toymdp` and `theory`."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

import shaping
from llm.__main__ import main
from tests.llm.conftest import save_random_tiny_model

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "countdown_tiny.toml")


@pytest.fixture(scope="module")
def tiny100(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random tiny model whose vocabulary covers countdown_tiny's numbers (up to 100)."""
    return save_random_tiny_model(tmp_path_factory.mktemp("cli_tiny"), max_number=100)


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_train_with_set_overrides_runs_and_records_them(tiny100, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--config", TINY, "--out", str(out),
            "--set", "optim.lr=3e-4", "steps=5", f"model_path={tiny100}", "build_base_model=false",
            "rollout.group_size=2", "rollout.prompts_per_step=2", "run.tensorboard=false",
            "rollout.max_new_tokens=4", "data.n_problems=8", "--steps", "1"]  # fmt: skip
    assert main(argv) == 0
    # stderr is a file here, as in a log: a line per step, not a bar's carriage returns.
    err = capsys.readouterr().err
    assert "\r" not in err and err.startswith("train grpo: 1/1 (reward=")
    with (out / "config.toml").open("rb") as f:
        cfg = tomllib.load(f)
    assert cfg["optim"]["lr"] == 3e-4 and cfg["rollout"]["group_size"] == 2
    assert cfg["rollout"]["max_new_tokens"] == 4 and cfg["data"]["n_problems"] == 8
    assert cfg["steps"] == 1  # --steps still works, and wins over --set steps=...
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.usefixtures("registry_snapshot")
def test_train_and_sweep_take_a_users_own_method_with_import(tiny100, tmp_path, capsys):
    """`--import` (a `.py` path) registers the user's method before the config is read, so
    `train --set method=centred_ds` trains it; without it the method is unknown (one line)."""
    mine = str(ROOT / "examples" / "my_methods.py")
    argv = ["train", "--config", TINY, "--out", str(tmp_path / "run"),
            "--set", "method=centred_ds", "hyper.beta=0.3", f"model_path={tiny100}",
            "build_base_model=false", "rollout.group_size=2", "rollout.prompts_per_step=2",
            "run.tensorboard=false", "rollout.max_new_tokens=4", "data.n_problems=8",
            "--steps", "1"]  # fmt: skip
    assert main(argv) == 2
    assert "or a method of one's own (--import the module that registers it), got 'centred_ds'" in (
        _one_error_line(capsys)
    )
    # One file by two spellings of its path is imported once (a second would register twice).
    assert main([*argv, "--import", mine, "--import", os.path.relpath(mine)]) == 0
    assert "centred_ds" in shaping.METHODS
    with (tmp_path / "run" / "config.toml").open("rb") as f:
        cfg = tomllib.load(f)
    assert cfg["method"] == "centred_ds" and cfg["hyper"]["beta"] == 0.3
    assert main(["sweep", "--describe", "--import", mine]) == 0
    capsys.readouterr()
    # --describe lists an imported method's hyper-parameters with the package's
    assert main(["train", "--describe", "--import", mine]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("  centred_ds: "))
    assert "beta = 0.1" in line


@pytest.mark.usefixtures("registry_snapshot")
def test_train_takes_a_users_own_task_with_import(tiny100, tmp_path):
    """A task module of the user's own (`llm.tasks.register_task`) is one `--import` away: here
    the parity task of tests/llm/parity_task.py registered again under another name."""
    from llm.tasks import TASKS

    module = tmp_path / "my_task.py"
    module.write_text("import dataclasses\n\nfrom llm.tasks import TASKS, register_task\n"
                      "from tests.llm import parity_task  # noqa: F401  (registers parity)\n\n"
                      "register_task(dataclasses.replace(TASKS['parity'], name='my_parity'))\n")  # fmt: skip
    argv = ["train", "--config", TINY, "--out", str(tmp_path / "run"), "--import", str(module),
            "--set", "task=my_parity", "template=bits", "data.source=generate",
            "eval.source=generate", f"model_path={tiny100}", "build_base_model=false",
            "rollout.group_size=2", "rollout.prompts_per_step=2", "run.tensorboard=false",
            "rollout.max_new_tokens=4", "data.n_problems=8", "--steps", "1"]  # fmt: skip
    try:
        assert main(argv) == 0
        with (tmp_path / "run" / "config.toml").open("rb") as f:
            assert tomllib.load(f)["task"] == "my_parity"
    finally:
        TASKS._tasks.pop("my_parity", None)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (["rollout.group_size=1"], "rollout.group_size: expected an integer >= 2, got 1"),
        (["hyper.gamma_p=0.1", "method=ds_grpo", 'hyper.gamma_p="0.1"'], "got '0.1'"),
        (["seed=9223372036854775807"], "seed: expected an integer in"),
        (["colour=red"], "--set colour=red: unknown key 'colour'"),
        (["optim.lr=fast"], "optim.lr: expected a finite number in (0, 1], got 'fast'"),
    ],
)
def test_config_errors_are_one_line_and_exit_2(sets, match, tmp_path, capsys):
    assert main(["train", "--config", TINY, "--out", str(tmp_path), "--set", *sets]) == 2
    assert match in _one_error_line(capsys)
    assert not any(tmp_path.iterdir())  # refused before the run folder is touched


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="group_size"):
        main(
            [
                "train",
                "--debug",
                "--config",
                TINY,
                "--out",
                str(tmp_path),
                "--set",
                "rollout.group_size=1",
            ]
        )


def test_missing_model_path_says_so_and_downloads_nothing(tmp_path, capsys):
    missing = tmp_path / "no_such_model"
    argv = ["train", "--config", TINY, "--out", str(tmp_path / "run"),
            "--set", f"model_path={missing}", "build_base_model=false"]  # fmt: skip
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert "model_path" in line and str(missing) in line and "does not exist" in line


def test_missing_config_file_and_eval_model_are_one_line(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in _one_error_line(capsys)
    argv = ["eval", "--model", str(tmp_path / "gone"), "--out", str(tmp_path / "ev")]
    assert main(argv) == 2
    assert "--model" in _one_error_line(capsys)
    argv = ["eval", "--model", str(tmp_path), "--out", str(tmp_path / "ev"), "--set", "eval.n=4"]
    assert main(argv) == 2
    assert "unknown key 'eval.n'" in _one_error_line(capsys)


def test_eval_applies_set(tiny100, tmp_path, capsys):
    argv = ["eval", "--model", tiny100, "--heldout", "2", "--out", str(tmp_path), "--no-semantic",
            "--set", "eval.samples=2", "rollout.max_new_tokens=4"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "pass@2=" in out and "pass@4" not in out  # n from eval.samples = 2, not 16
    argv += ["eval.sampler=stacked", "--label", "stacked"]  # the sweeps' stacked sampler
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "[stacked]: pass@1=" in out and "pass@2=" in out and "pass@4" not in out


def test_describe_still_prints_every_key(capsys):
    assert main(["train", "--describe"]) == 0
    assert "vllm.gpu_memory_utilization = 0.3" in capsys.readouterr().out


def test_toymdp_and_theory_errors_are_one_line(tmp_path, capsys):
    from theory.__main__ import main as theory_main
    from toymdp.__main__ import main as toymdp_main

    (tmp_path / "a_file").write_text("")
    blocked = tmp_path / "a_file" / "out"
    argv = ["check", "--only", "dsdr_lemma_c3", "--trials", "1", "--json", "--out", str(blocked)]
    assert theory_main(argv) == 2
    assert "a_file" in _one_error_line(capsys)
    assert toymdp_main(["figures", "--quick", "--only", "convergence", "--out", str(blocked)]) == 2
    assert "a_file" in _one_error_line(capsys)
    with pytest.raises(OSError):
        toymdp_main(
            ["figures", "--quick", "--only", "convergence", "--out", str(blocked), "--debug"]
        )


@pytest.mark.parametrize(
    "argv",
    [["train"], ["sweep"], ["study"], ["eval", "--model", ".", "--out", "x"]],
    ids=["train", "sweep", "study", "eval"],
)
def test_a_missing_config_file_is_named_by_its_flag(tmp_path, capsys, argv):
    """Every LLM command names a `--config` that is not a file by its flag, as the toy's do (it
    printed the OS's '[Errno 2] No such file or directory')."""
    missing = str(tmp_path / "nope.toml")
    assert main([*argv, "--config", missing]) == 2
    assert _one_error_line(capsys) == (
        f"error: --config: no such file {missing!r} (--debug shows the traceback)"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["train", "--config", TINY, "--steps", "0"],
            "argument --steps: expected an integer >= 1, got 0",
        ),
        (
            ["eval", "--model", ".", "--out", "x", "--seed", "-1"],
            "argument --seed: expected an integer >= 0",
        ),
    ],
)
def test_a_count_or_seed_flag_out_of_range_is_refused_by_name(capsys, argv, message):
    """`--steps 0` was blamed on the config file (`FILE: steps: ...`) and a negative `--seed`
    reached NumPy ('expected non-negative integer', no flag named)."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_eval_names_a_folder_that_is_neither_a_model_nor_a_run(tmp_path, capsys):
    """`llm eval --model DIR` of a folder without config.json or checkpoints is named as such (it
    was transformers' "Unrecognized model ... should have a model_type key")."""
    (tmp_path / "notes.txt").write_text("not a model")
    assert main(["eval", "--model", str(tmp_path), "--out", str(tmp_path / "e")]) == 2
    assert "holds neither a config.json" in _one_error_line(capsys)
