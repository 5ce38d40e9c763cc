"""`python -m llm study`: both stages end to end on a random one-layer model (seconds): the
confirmation trains only the reference and the picks, on fresh seeds and fresh problems; errors
name the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiment import study as S
from llm.__main__ import main
from llm.study import load_study
from tests.llm.test_sweep import BASE, SWEEP

STUDY = """
[study]
name = "tiny study"
confirm_seeds = [5]
confirm_problems = 4
"""


def _write(folder: Path, model: str, study: str = STUDY) -> Path:
    (folder / "base.toml").write_text(BASE.format(model=model))
    path = folder / "study.toml"
    path.write_text(SWEEP.format(eta="0.1, 0.3") + study)
    return path


def test_the_study_confirms_the_pick_on_fresh_seeds_and_problems(
    tmp_path, tiny_model_path, monkeypatch
):
    config = _write(tmp_path, tiny_model_path)
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path.parent)  # a relative --config, as users type it
    config = config.relative_to(tmp_path.parent)
    assert main(["study", "--config", str(config), "--out", str(out), "--workers", "1"]) == 0
    doc = json.loads((out / "study.json").read_text())
    explore = json.loads((out / "explore" / "results.json").read_text())
    confirm = json.loads((out / "confirm" / "results.json").read_text())
    assert confirm["settings"]["seeds"] == [5] and explore["settings"]["seeds"] == [0]
    ev = confirm["settings"]["eval"]
    assert ev["offset"] == 3 and ev["problems"] == 4  # right after the 3 exploratory problems
    explored = {json.dumps(p, sort_keys=True) for p in explore["problems"]}
    assert not explored & {json.dumps(p, sort_keys=True) for p in confirm["problems"]}
    labels = [s["label"] for s in confirm["settings"]["settings"]]
    assert labels == ["grpo", *doc["picks"]["pass_at_k"]]  # the reference, one setting per pick
    if "entropy_bonus" in doc["picks"]["pass_at_k"]:
        pick = doc["picks"]["pass_at_k"]["entropy_bonus"]
        assert confirm["settings"]["settings"][1]["params"] == pick["params"]
    assert {r["claim"] for r in doc["claims"]} >= {"grpo_sharpens"}
    assert all(r["verdict"] in S.VERDICTS for r in doc["claims"] if r["claim"] != "grpo_spread")
    assert "## Claims" in (out / "verdicts.md").read_text()
    # The cost model of the power calculation, measured in the confirmation's runs.
    assert doc["costs"]["unit"] == "core-s" and doc["costs"]["run"] > 0
    assert doc["costs"]["problem"] > 0 and "designs_for_goal" in doc


def test_study_errors_name_the_key(tmp_path, tiny_model_path):
    config = _write(tmp_path, tiny_model_path, STUDY.replace("[5]", "[0, 5]"))
    with pytest.raises(ValueError, match=r"study\.confirm_seeds: \[0\] are exploratory seeds"):
        load_study(config)
    config = _write(tmp_path, tiny_model_path, STUDY + "confirm_offset = 1\n")
    with pytest.raises(ValueError, match=r"study\.confirm_offset: 1 overlaps"):
        load_study(config)
    config = _write(tmp_path, tiny_model_path, STUDY + "typo = 1\n")
    with pytest.raises(ValueError, match="typo"):
        load_study(config)
