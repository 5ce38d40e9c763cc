"""`python -m toymdp study`: both stages on a tiny study, the confirmation's design, the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiment import reread, two_stage
from experiment import study as S
from toymdp import study as TS
from toymdp import study_spec as TSS
from toymdp import sweep as SW
from toymdp import sweep_spec
from toymdp.__main__ import main

CONFIG = Path(__file__).parents[2] / "configs" / "toy" / "quick.toml"
STUDY = """
[study]
name = "quick toy"
confirm_draws = [10, 11, 12]
confirm_seeds = [0, 1]
confirm_key = 1
unequal_budget = true
"""


@pytest.fixture(scope="module")
def study_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("study") / "quick_study.toml"
    path.write_text(CONFIG.read_text() + STUDY)
    return path


@pytest.mark.slow
def test_the_study_confirms_the_picks_on_fresh_draws_and_keys(
    study_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    assert main(["study", "--config", str(study_file), "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "study.json").read_text())
    confirm = json.loads((tmp_path / "confirm" / "results.json").read_text())
    explore = json.loads((tmp_path / "explore" / "results.json").read_text())
    assert confirm["config"]["env"]["draws"] == [10, 11, 12] and confirm["seeds"] == [0, 1]
    assert (
        confirm["config"]["train"]["seed"] == 1 and explore["config"]["train"].get("seed", 0) == 0
    )
    # The confirmation trains the reference as written and exactly the pick of each method.
    pick = doc["picks"]["pass_at_k"]["ds_grpo"]
    rows = [r for r in confirm["runs"] if r["label"] == "ds_grpo"]
    assert len(rows) == 1 and rows[0]["values"] == {}
    assert confirm["config"]["methods"][1]["fixed"] == {"gamma_n": 0.0, **pick["params"]}
    assert [r["label"] for r in confirm["runs"]].count("grpo") == 2  # kl_coef 0 and 0.1
    assert {r["claim"] for r in doc["claims"]} == {"grpo_sharpens", "ds_grpo", "grpo_spread"}
    words = {"grpo_sharpens": S.SHARPENING_VERDICTS, "grpo_spread": ("",)}
    assert all(r["verdict"] in words.get(r["claim"], S.VERDICTS) for r in doc["claims"])
    assert set(doc["provenance"]) == {
        "config",
        "config_sha256",
        "git_commit",
        "cpu",
        "cpu_id",
        "numerics",
    }
    text = (tmp_path / "verdicts.md").read_text()
    assert "## Claims" in text and "| ds_grpo |" in text
    # quick.toml tunes GRPO's kl_coef alone: allowed by unequal_budget, and said so.
    assert doc["design"]["budget"] == "unequal (explicit)" and "**unequal** (explicit" in text
    # Every row is read at every checkpoint; the pick is confirmed at its own.
    steps = {m["step"] for m in explore["frontier"]["pass_at_k"]["models"] if not m["reference"]}
    assert steps == {4, 8, 12} and doc["design"]["checkpoints"] == [4, 8, 12]
    assert pick["step"] in steps
    # The power calculation over seeds × draws, from the confirmation's variance components.
    assert doc["costs"] == TS.COSTS and "## Designs for the MDE goal" in text
    for label, d in doc["designs_for_goal"]["pass_at_k"].items():
        assert d is None or (d["mde"] <= 0.015 and d["cost"] == d["seeds"] * d["problems"]), label
    # Published, the study re-reads to the same study.json, verdicts and tables (nothing
    # re-trained: experiment.reread from the lift inputs), and a re-read is recorded as such.
    pub = tmp_path / "published"
    reread.publish(tmp_path, pub)
    again = reread.reread(pub, tmp_path / "reread")
    were = [{"claim": r["claim"], "verdict": r["verdict"]} for r in doc["claims"] if r["verdict"]]
    assert again.pop("reread") == {"from": doc["procedure"], "procedure": doc["procedure"],
                                   "git_commit": doc["provenance"]["git_commit"],
                                   "claims_were": were}  # fmt: skip
    assert json.loads(json.dumps(again)) == doc
    for name in ("verdicts.md", "explore_lifts.md", "confirm_lifts.md"):
        assert (tmp_path / "reread" / name).read_text() == (pub / name).read_text(), name
    # A procedure that picks a setting the confirmation did not train leaves it pending.
    other = next(m for m in json.loads((tmp_path / "explore" / "results.json").read_text())[
        "frontier"]["pass_at_k"]["models"] if m["label"] == "ds_grpo" and m["setting"] != pick[
        "setting"])  # fmt: skip
    picked = S.pick

    def moved(explore):
        picks = picked(explore)
        picks["pass_at_k"]["ds_grpo"] = other
        return picks

    monkeypatch.setattr(S, "pick", moved)
    later = reread.reread(pub, tmp_path / "later")
    assert later["pending"]["ds_grpo"]["setting"] == other["setting"]
    assert {r["claim"] for r in later["claims"]} == {"grpo_sharpens", "grpo_spread"}
    assert "## Picks not confirmed" in (tmp_path / "later" / "verdicts.md").read_text()


def test_bad_study_tables_are_named(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.read_text() + STUDY.replace("[10, 11, 12]", "[0, 11]"))
    with pytest.raises(ValueError, match=r"study.confirm_draws: \[0\] are exploratory draws"):
        TSS.load_study(bad)
    bad.write_text(CONFIG.read_text() + STUDY.replace("confirm_key = 1", "confirm_key = 0"))
    with pytest.raises(ValueError, match=r"study\.confirm_key: 0 equals train\.seed"):
        TSS.load_study(bad)
    bad.write_text(CONFIG.read_text() + STUDY + "alpha_typo = 1\n")
    with pytest.raises(ValueError, match="alpha_typo"):
        TSS.load_study(bad)


def test_unequal_budgets_are_refused_and_tune_gives_every_method_grpos(tmp_path: Path):
    """Parse only: quick.toml's GRPO has kl_coef 0 and 0.1, its DS-GRPO 0 alone: refused without
    ``unequal_budget``, naming the method, the axis and both values. A ``tune`` table gives both
    entries the same learning rates and kl_coef values, and the confirmation keeps them."""
    study = STUDY.replace("unequal_budget = true\n", "")
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.read_text() + study)
    with pytest.raises(ValueError) as err:
        TSS.load_study(bad)
    assert str(err.value).startswith(f"{bad}: study: unequal tuning budgets: methods[ds_grpo] "
                                     "(gamma_p=0.1) is tuned over kl_coef [0], the reference "
                                     "(grpo) over [0, 0.1]; ")  # fmt: skip
    text = CONFIG.read_text().replace("grid = { kl_coef = [0.0, 0.1] }\n", "")
    text = text.replace("\n[env]", "tune = { lr = [0.1, 0.3], kl_coef = [0.0, 0.1] }\n\n[env]", 1)
    good = tmp_path / "good.toml"
    good.write_text(text + study)
    cfg, spec = TSS.load_study(good)
    assert two_stage.study_budget(SW.budgets(cfg), cfg.reference, spec) == ("equal", None)
    rows = SW.budgets(cfg)
    assert len(rows) == 4 + 3 * 4 and {r.axes["checkpoints"] for r in rows} == {(4, 8, 12)}
    assert SW.all_rows(cfg)[7].setting() == "gamma_p=0.1, lr=0.3, kl_coef=0.1"
    pick = {"ds_grpo": {"params": {"gamma_p": 0.3, "lr": 0.3, "kl_coef": 0.1}}}
    conf = TSS.confirmation_doc(cfg, spec, pick)
    assert "tune" not in conf
    ccfg = sweep_spec.parse_config(conf)
    assert [r.values for r in SW.all_rows(ccfg)] == [
        {"lr": lr, "kl_coef": k} for lr in (0.1, 0.3) for k in (0.0, 0.1)
    ] + [{"lr": 0.3}]
    assert ccfg.methods[1].fixed == {"gamma_n": 0.0, "gamma_p": 0.3, "kl_coef": 0.1}


@pytest.mark.parametrize("name", ["study_fig6.toml", "study_sharpening.toml"])
def test_the_committed_study_configs_parse(name: str):
    cfg, spec = TSS.load_study(CONFIG.parent / name)
    assert len(spec.confirm_draws) >= 8 and spec.claim_size == 1.5
    # Equal budgets: every method at GRPO's learning rates and kl_coef values, every checkpoint.
    assert two_stage.study_budget(SW.budgets(cfg), cfg.reference, spec) == ("equal", None)
