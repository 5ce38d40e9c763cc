"""Smoke test of `python -m toymdp figures`: files, summary.json contract, caching, determinism."""

from __future__ import annotations

import json

import pytest

from toymdp.__main__ import main
from toymdp.experiments import EXPERIMENTS

from .test_sweep import TINY

FAST = ["theorem_3_4", "convergence"]


def test_all_seven_figures_are_registered_in_order():
    assert [e.order for e in sorted(EXPERIMENTS.values(), key=lambda e: e.order)] == list(
        range(1, 8)
    )


@pytest.mark.slow
def test_quick_figures_are_written_and_bit_identical_on_recompute(tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["figures", "--quick", "--out", str(out), "--only", *FAST]) == 0
    first = (out / "summary.json").read_bytes()
    doc = json.loads(first)
    assert set(doc["experiments"]) == set(FAST) and doc["quick"] is True
    for name in FAST:
        for fig in doc["experiments"][name]["figures"]:
            assert (out / fig).stat().st_size > 0
    timings = json.loads((out / "timings.json").read_text())
    assert not any(t["cached"] for t in timings.values())

    # A second run reads the cache; a third recomputes: both give the same bytes.
    assert main(["figures", "--quick", "--out", str(out), "--only", *FAST]) == 0
    assert all(t["cached"] for t in json.loads((out / "timings.json").read_text()).values())
    assert (out / "summary.json").read_bytes() == first
    assert main(["figures", "--quick", "--out", str(out), "--only", *FAST, "--no-cache"]) == 0
    assert (out / "summary.json").read_bytes() == first
    assert "wrote 2 experiments" in capsys.readouterr().out


def test_unknown_experiment_is_a_one_line_error(tmp_path, capsys):
    assert main(["figures", "--out", str(tmp_path), "--only", "no_such_figure"]) == 2
    err = capsys.readouterr().err
    assert "casp_tree" in err and err.count("\n") == 1 and "usage" not in err


@pytest.mark.slow
@pytest.mark.usefixtures("registry_snapshot")
def test_a_toy_sweep_takes_a_users_own_method_with_import(tmp_path, capsys):
    """`python -m toymdp sweep --import FILE.py` trains a method the package does not have."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = tmp_path / "mine.toml"
    config.write_text(TINY.replace('"entropy_bonus"\ngrid = { eta = [0.3] }',
                                   '"centred_ds"\ngrid = { beta = [0.3] }'))  # fmt: skip
    argv = ["sweep", "--config", str(config), "--out", str(tmp_path / "out"),
            "--import", str(root / "examples" / "my_methods.py")]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["label"] for r in doc["runs"]} == {"grpo", "centred_ds"}


@pytest.mark.parametrize("command", ["sweep", "study"])
def test_a_missing_config_file_is_named_by_its_flag(tmp_path, capsys, command):
    missing = str(tmp_path / "nope.toml")
    assert main([command, "--config", missing]) == 2
    assert f"error: --config: no such file {missing!r}" in capsys.readouterr().err


def test_a_negative_seed_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["figures", "--seed", "-1"])
    assert "argument --seed: expected an integer >= 0, got -1" in capsys.readouterr().err
