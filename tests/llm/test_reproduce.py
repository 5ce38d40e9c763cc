"""`python -m llm reproduce --quick`: the make-reproduce LLM stage (a budgeted
`llm.orchestrate.sweep`) end to end on a smoke budget (1-layer base model, 2 training steps per run
evaluated at steps 1 and 2, 4 held-out problems x 4 samples), and its resume safety (a second call
reuses the finished runs and their evaluations)."""

from __future__ import annotations

import json
import tomllib

import pytest

from llm.__main__ import main
from llm.orchestrate.jobs import RUN_MARKER
from llm.orchestrate.reproduce import DEFAULT_SWEEP, ReproduceSettings, results_table
from llm.orchestrate.sweep_spec import load_sweep

METHODS = ("grpo", "ds_grpo")
# configs/sweep_countdown_tiny.toml: grpo {default, kl_coef=0.1}, ds_grpo x 3 coefficients
SETTINGS = [
    "grpo[default]",
    "grpo[kl_coef=0.1]",
    "ds_grpo[gamma_p=0.3,gamma_n=0.05]",
    "ds_grpo[gamma_p=1.0,gamma_n=0.2]",
    "ds_grpo[gamma_p=4.0,gamma_n=0.8]",
]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    argv = ["reproduce", "--quick", "--out-runs", str(root / "runs")]
    argv += ["--figures", str(root / "figures"), "--methods", *METHODS]
    assert main(argv) == 0
    return root, argv


@pytest.mark.slow
def test_quick_writes_figures_tables_and_json(quick_run):
    root, _ = quick_run
    fig = root / "figures"
    for name in ("llm_countdown_passk.png", "llm_countdown_frontier.png"):
        assert (fig / name).stat().st_size > 0
    table = (fig / "llm_countdown_results.md").read_text()
    assert "| base | - |" in table and "| ds_grpo | gamma_p=1.0,gamma_n=0.2 |" in table
    assert "Lift at matched pass@1" in table
    lifts = (fig / "llm_countdown_lifts.md").read_text()
    assert lifts.count("| ds_grpo | gamma_p=4.0,gamma_n=0.8 |") == 4  # 2 measures x 2 steps
    summary = json.loads((fig / "llm_countdown.json").read_text())
    assert set(summary) >= {
        "settings",
        "base",
        "methods",
        "per_seed",
        "frontier",
    }
    # Wall-clock numbers stay out of the committed files (a rerun leaves git status clean).
    assert "timings_seconds" not in summary and "reused" not in summary
    assert "train_seconds" not in json.dumps(summary)
    timings = json.loads((fig / ".cache" / "llm_countdown_timings.json").read_text())
    assert list(summary["methods"]) == ["base", *SETTINGS]
    st = summary["settings"]
    assert (st["eval_problems"], st["eval_samples"], st["steps"], st["quick"]) == (4, 4, 2, True)
    assert st["checkpoints"] == [1, 2] and st["reference"] == "grpo"
    for agg in summary["methods"].values():
        assert set(agg["pass_at_k"]) == {"1", "2", "4"}
        assert set(agg) >= {"distinct_correct", "self_bleu", "pass_at_k_minus_base"}
    assert summary["per_seed"][SETTINGS[3]][0]["hyper"] == {"gamma_p": 1.0, "gamma_n": 0.2}
    assert set(timings["timings_seconds"]) >= {"base_model", "train_and_eval", "total"}
    assert results_table(summary).count("\n") == 2 + len(SETTINGS)  # header, rule, base, rows


@pytest.mark.slow
def test_quick_runs_and_results_json(quick_run):
    root, _ = quick_run
    sweep = root / "runs" / "quick" / "sweep"  # --quick keeps its runs apart from the real ones
    results = json.loads((sweep / "results.json").read_text())
    assert len(results["models"]) == 1 + 2 * len(SETTINGS)
    for m in results["models"]:
        assert m["n"] == 4 and len(m["correct"]) == 4
    run = sweep / "runs" / "grpo_seed0"
    assert json.loads((run / RUN_MARKER).read_text())["finished"] is True
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000002"]


@pytest.mark.slow
def test_second_call_reuses_runs_and_evals(quick_run):
    root, argv = quick_run
    sweep = root / "runs" / "quick" / "sweep"
    weights = sweep / "runs" / "grpo_seed0" / "checkpoints" / "step_000002" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert main(argv) == 0
    timings = root / "figures" / ".cache" / "llm_countdown_timings.json"
    summary = json.loads(timings.read_text())
    n = len(SETTINGS)
    assert summary["reused"] == {"runs": n, "of": n, "evals": 1 + 2 * n, "evals_of": 1 + 2 * n}
    assert weights.stat().st_mtime_ns == before


def test_quick_settings_never_touch_the_real_folders():
    s = ReproduceSettings(quick=True).resolved()
    assert s.out_runs.endswith("quick") and s.figures.startswith(s.out_runs)
    assert (s.steps, s.eval_problems, s.eval_samples, s.jobs, s.seeds) == (2, 4, 4, 1, (0,))
    assert ReproduceSettings().resolved().figures == "figures"


def test_the_make_reproduce_sweep_meets_issue_11_item_5():
    """GRPO's path and a kl_coef setting; >= 4 methods x >= 3 coefficients x >= 3 seeds; every
    run evaluated at >= 3 checkpoints."""
    spec = load_sweep(DEFAULT_SWEEP)
    grpo = [st.params for st in spec.settings if spec.reference == ["grpo"] == [st.label]]
    assert {} in grpo and any(p.get("kl_coef", 0) > 0 for p in grpo)
    others = [lb for lb in spec.labels if lb != "grpo"]
    assert set(others) >= {"ds_grpo", "entropy_bonus", "casp", "unlikeliness"}
    for lb in others:
        assert sum(st.label == lb for st in spec.settings) >= 3
    assert len(spec.seeds) >= 3 and len(spec.checkpoints) >= 3
    with DEFAULT_SWEEP.open("rb") as f:
        assert tomllib.load(f)["base"] == "countdown_tiny.toml"
