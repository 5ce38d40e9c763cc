"""`python -m llm reproduce --quick`: the make-reproduce LLM stage end to end on a smoke budget
(1-layer base model, 2 training steps per method, 4 held-out problems x 4 samples), and its
resume safety (a second call reuses the finished runs and their evaluations)."""

from __future__ import annotations

import json

import pytest

from llm.__main__ import main
from llm.reproduce import ReproduceSettings, results_table, run_dir_name

METHODS = ("grpo", "ds_grpo")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    argv = ["reproduce", "--quick", "--out-runs", str(root / "runs")]
    argv += ["--figures", str(root / "figures"), "--methods", *METHODS]
    assert main(argv) == 0
    return root, argv


def test_quick_writes_figure_table_and_json(quick_run):
    root, _ = quick_run
    fig = root / "figures"
    assert (fig / "llm_countdown_passk.png").stat().st_size > 0
    table = (fig / "llm_countdown_results.md").read_text()
    for method in ("base", *METHODS):
        assert f"| {method} |" in table
    summary = json.loads((fig / "llm_countdown.json").read_text())
    assert set(summary) >= {"settings", "base", "methods", "per_seed", "timings_seconds"}
    assert list(summary["methods"]) == ["base", *METHODS]
    assert summary["settings"]["eval_problems"] == 4 and summary["settings"]["eval_samples"] == 4
    assert summary["settings"]["steps"] == 2 and summary["settings"]["quick"] is True
    for agg in summary["methods"].values():
        assert set(agg["pass_at_k"]) == {"1", "2", "4"}
        assert set(agg) >= {"distinct_correct", "self_bleu", "pass_at_k_minus_base"}
    assert summary["per_seed"]["ds_grpo"][0]["hyper"] == {"gamma_p": 0.3, "gamma_n": 0.05}
    assert set(summary["timings_seconds"]) >= {"base_model", "train_and_eval", "total"}
    assert results_table(summary).count("\n") == 2 + len(METHODS)  # header, rule, base, methods


def test_quick_runs_and_eval_json(quick_run):
    root, _ = quick_run
    runs = root / "runs" / "quick"  # --quick keeps its runs apart from the real ones
    data = json.loads((runs / "eval" / "eval.json").read_text())
    assert list(data) == ["base", *METHODS]
    for label in data:
        assert data[label]["n"] == 4 and data[label]["n_problems"] == 4
        assert len(data[label]["weights_sha256"]) == 64
    for method in METHODS:
        run = runs / run_dir_name(method, 0)
        marker = json.loads((run / "reproduce_run.json").read_text())
        assert marker["finished"] is True
        assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000002"]


def test_second_call_reuses_runs_and_evals(quick_run):
    root, argv = quick_run
    run = root / "runs" / "quick" / run_dir_name("grpo", 0)
    weights = run / "checkpoints" / "step_000002" / "model.safetensors"
    before = (
        weights.stat().st_mtime_ns,
        (root / "runs" / "quick" / "eval" / "eval.json").read_text(),
    )
    assert main(argv) == 0
    summary = json.loads((root / "figures" / "llm_countdown.json").read_text())
    assert summary["reused"] == {
        "runs": len(METHODS),
        "evals": 1 + len(METHODS),
        "of": len(METHODS),
    }
    after = (
        weights.stat().st_mtime_ns,
        (root / "runs" / "quick" / "eval" / "eval.json").read_text(),
    )
    assert before == after


def test_quick_settings_never_touch_the_real_folders():
    s = ReproduceSettings(quick=True).resolved()
    assert s.out_runs.endswith("quick") and s.figures.startswith(s.out_runs)
    assert (s.steps, s.eval_problems, s.eval_samples, s.jobs, s.seeds) == (2, 4, 4, 1, (0,))
    assert ReproduceSettings().resolved().figures == "figures"
