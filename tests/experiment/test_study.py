"""Select, then confirm (`experiment.study`): the picking rule, Holm, the claims' rule, the power
calculation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiment import covariance as Cv
from experiment import inference as I
from experiment import reread
from experiment import study as S
from experiment import study_report as R


def _model(label, lift, lo, hi, *, p=0.5, se=0.01, df=30.0, status="inside", ref=False, step=10,
           setting="s"):  # fmt: skip
    return {"label": label, "setting": setting, "step": step, "reference": ref, "status": status,
            "lift": lift, "lift_lo": lo, "lift_hi": hi, "lift_p": p, "lift_se": se,
            "lift_df": df, "x": 0.1, "y": 0.0, "x_lo": 0.05, "x_hi": 0.15, "y_lo": -0.01,
            "y_hi": 0.01}  # fmt: skip


def test_select_takes_the_largest_estimate_with_a_lift():
    section = {"models": [
        _model("grpo", 0.0, -1, 1, ref=True),
        _model("a", 0.05, -0.01, 0.11, setting="big"),   # largest lift, wide interval: the pick
        _model("a", 0.03, 0.01, 0.05, setting="tight"),  # largest lower bound
        # b never reached GRPO's range: its model nearest it, by the bootstrap's share with a
        # lift, then by pass@1
        {**_model("b", None, None, None, status="below", setting="far"), "inside_fraction": 0.0},
        {**_model("b", None, None, None, status="below", setting="near"), "inside_fraction": 0.4},
        {**_model("b", None, None, None, status="below", setting="tie"), "inside_fraction": 0.4,
         "x": 0.05},
        # c passed GRPO's largest pass@1: above the range it has a lift (lift v4), and competes
        _model("c", 0.02, -0.01, 0.05, setting="inside"),
        {**_model("c", 0.09, 0.05, 0.13, status="above", setting="high"), "x": 0.3},
    ]}  # fmt: skip
    picks = S.select(section)
    assert list(picks) == ["a", "b", "c"] and picks["a"]["setting"] == "big"
    assert picks["b"]["setting"] == "near" and picks["c"]["setting"] == "high"
    assert list(S.select(section, ["b"])) == ["b"]


def test_confirm_applies_holm_over_the_picks_and_names_missing_labels():
    section = {"models": [
        _model("grpo", 0.0, -1, 1, ref=True),
        _model("a", 0.04, 0.02, 0.06, p=0.01),
        _model("b", 0.03, 0.01, 0.05, p=0.03),
        _model("c", -0.02, -0.04, 0.0, p=0.04),
    ]}  # fmt: skip
    out = S.confirm(section, ["a", "b", "c"], alpha=0.05)
    np.testing.assert_allclose([out[k]["p_holm"] for k in "abc"], I.holm([0.01, 0.03, 0.04]))
    assert out["a"]["verdict"] == "above"  # 0.03 <= 0.05
    assert out["b"]["verdict"] == "none" and out["c"]["verdict"] == "none"  # 0.06, 0.06 > 0.05
    assert out["a"]["mde"] == pytest.approx(
        float(Cv.minimum_detectable(0.01, 30.0, alpha=0.05 / 3))
    )
    with pytest.raises(ValueError, match="label 'z' has 0 models"):
        S.confirm(section, ["z"])


@given(p=st.floats(0.0, 1.0), picks=st.integers(1, 6))
@settings(max_examples=100, deadline=None)
def test_a_pick_outside_the_range_is_below_grpo_only_when_a_grpo_model_beats_it(p, picks):
    """Outside GRPO's range (no lift): below GRPO iff the curve-free check's p ≤ alpha / picks;
    an older record (no level, or no check) stays not resolved. (The words' rule:
    tests/experiment/test_claim_words.py.)"""
    dom = {"setting": "lr=1e-4", "step": 50, "dx": 0.02, "dy": 0.04, "p": p}
    labels = [f"m{i}" for i in range(picks)]
    section = {"models": [_model("grpo", 0.0, -1, 1, ref=True)] + [
        {**_model(lab, None, None, None, p=None, status="below"), "dominated_by": dom}
        for lab in labels]}  # fmt: skip
    out = S.confirm(section, labels, alpha=0.05)
    r = out["m0"]
    assert r["lift"] is None and r["dominance_level"] == pytest.approx(0.05 / picks)
    assert S.dominated(r) == (p <= 0.05 / picks)
    assert S.claim_verdict(r, 0.03) == ("below GRPO" if p <= 0.05 / picks else "not resolved")
    assert S.claim_verdict({k: v for k, v in r.items() if k != "dominance_level"}, 0.03) == (
        "not resolved"
    )
    assert S.claim_verdict({**r, "dominated_by": None}, 0.03) == "not resolved"
    rows = S.claim_rows("s", {"pass_at_k": {"unlikeliness": r}}, {"verdict": "supported", "y": 0,
                        "y_lo": 0, "y_hi": 0}, size=3.0, size_distinct=0.1)  # fmt: skip
    cell = R.claims_table(rows)
    if p <= 0.05 / picks:
        assert (
            f"**below GRPO** (below GRPO's range; GRPO lr=1e-4, step 50 beats it on both axes, "
            f"p {p:.3f})" in cell
        )
    else:
        assert "**not resolved** (below GRPO's range) |" in cell


def test_problems_for_scales_with_the_square_of_the_mde_ratio():
    assert S.problems_for(3.0, 128, 1.5) == 512
    assert S.problems_for(1.0, 128, 2.0) == 32
    with pytest.raises(ValueError, match="positive"):
        S.problems_for(0.0, 128, 1.5)


def test_minimum_detectable_is_the_power_formula():
    """At the MDE the t test's power (noncentral t) is 80% within the normal-approximation's
    error, and NaN stays NaN."""
    from scipy import stats

    se, df = 0.01, 40.0
    mde = float(Cv.minimum_detectable(se, df))
    crit = stats.t.ppf(0.975, df)
    power = stats.nct.sf(crit, df, mde / se) + stats.nct.cdf(-crit, df, mde / se)
    assert power == pytest.approx(0.8, abs=0.01)
    assert np.isnan(Cv.minimum_detectable(np.nan, 3.0))


def test_a_comparison_without_error_is_not_tested():
    """A model that never left the base has standard error 0: no p-value, out of Holm's family,
    not resolved (not "refuted" by an MDE of 0)."""
    section = {"models": [_model("grpo", 0.0, -1, 1, ref=True),
                          _model("a", 0.0, 0.0, 0.0, p=None, se=0.0),
                          _model("b", 0.03, 0.01, 0.05, p=0.01)]}  # fmt: skip
    out = S.confirm(section, ["a", "b"])
    assert out["a"]["lift"] is None and out["a"]["status"] == "se 0" and out["a"]["mde"] is None
    assert out["b"]["p_holm"] == 0.01  # a family of one
    assert S.claim_verdict(out["a"], 0.015) == "not resolved"
    assert S.select(section) == {"b": section["models"][2]}


def test_publish_copies_an_unfinished_studys_exploration(tmp_path):
    src = tmp_path / "study"
    (src / "explore").mkdir(parents=True)
    (src / "explore" / "lifts.md").write_text("table")
    written = reread.publish(src, tmp_path / "pub")
    assert [p.rsplit("/", 1)[1] for p in written] == ["explore_lifts.md"]
    assert (tmp_path / "pub" / "explore_lifts.md").read_text() == "table"
    with pytest.raises(ValueError, match=r"no study\.json and no explore"):
        reread.publish(tmp_path / "missing", tmp_path / "pub")


def test_sharpening_is_read_from_the_first_trained_setting_not_the_base():
    base = {**_model("grpo", 0.0, 0, 0, ref=True, step=0, setting="base"),
            "x_lo": 0.0, "x_hi": 0.0, "y_lo": 0.0, "y_hi": 0.0}  # fmt: skip
    last = {**_model("grpo", 0.0, 0, 0, ref=True, step=120, setting="default"),
            "x": 0.05, "x_lo": 0.03, "x_hi": 0.07, "y": -0.06, "y_lo": -0.09, "y_hi": -0.03}  # fmt: skip
    early = {**last, "step": 40, "x_lo": -0.01}
    out = S.sharpening_verdict({"models": [base, early, last]}, "grpo")
    assert out["step"] == 120 and out["setting"] == "default" and out["verdict"] == "supported"


@settings(max_examples=30, deadline=None)
@given(st.tuples(*[st.floats(1e-6, 1e-2)] * 3), st.floats(0.005, 0.05), st.floats(0, 100),
       st.floats(0.01, 1))  # fmt: skip
def test_design_for_is_the_cheapest_feasible_design(comp, target, run, problem):
    """Against a brute-force search over a small grid: the design reaches the target, and no
    cheaper one in the grid does."""
    seeds, problems = range(2, 12), (2, 8, 32, 128, 512)
    d = S.design_for(comp, target, level=0.05, cost_run=run, cost_problem=problem,
                     seeds=seeds, problems=problems)  # fmt: skip
    feasible = [(s * (run + p * problem), s, p) for s in seeds for p in problems
                if Cv.design_mde(comp, s, p) <= target]  # fmt: skip
    if not feasible:
        assert d is None
        return
    cost, s, p = min(feasible)
    assert d["mde"] <= target and d["cost"] == pytest.approx(cost)
    assert (d["seeds"], d["problems"]) == (s, p) or d["cost"] == pytest.approx(cost)


def test_design_for_names_bad_input_and_skips_one_seed():
    with pytest.raises(ValueError, match="target"):
        S.design_for([1, 1, 1], 0.0, level=0.05, cost_run=1, cost_problem=1)
    with pytest.raises(ValueError, match="cost_run"):
        S.design_for([1, 1, 1], 1.0, level=0.05, cost_run=0, cost_problem=0)
    assert S.design_for([np.nan, 1, 0], 1.0, level=0.05, cost_run=1, cost_problem=1) is None


def test_reference_spread_takes_each_settings_best_checkpoint_and_feeds_one_row():
    section = {"models": [
        _model("grpo", 0.0, 0.0, 0.0, ref=True, step=0, setting="base"),
        _model("grpo", 0.02, 0.01, 0.03, ref=True, step=10, setting="kl=0"),
        _model("grpo", -0.01, -0.02, 0.0, ref=True, step=20, setting="kl=0"),
        _model("grpo", 0.05, 0.03, 0.07, ref=True, step=20, setting="kl=1"),
        _model("grpo", None, None, None, ref=True, step=30, setting="kl=1", status="above"),
        _model("a", 0.09, 0.05, 0.1),
    ]}  # fmt: skip
    spread = S.reference_spread(section)
    assert set(spread) == {"grpo kl=0", "grpo kl=1"}
    assert spread["grpo kl=0"]["step"] == 10 and spread["grpo kl=1"]["lift"] == 0.05
    row = S.spread_row("st", spread)
    assert row["lift"] == pytest.approx(5.0) and row["where"] == "kl=1, step 20"
    assert "+5.0 [+3.0, +7.0] (kl=1, step 20)" in R.claims_table([row])
    assert S.spread_row("st", {}) is None


def test_the_curve_free_check_is_carried_to_the_confirmation_table():
    dom = {"setting": "kl_coef=0.1", "step": 50, "dx": 0.012, "dy": 0.034, "p": 0.004}
    section = {"models": [
        _model("grpo", 0.0, -1, 1, ref=True),
        {**_model("a", -0.04, -0.06, -0.02, p=0.001), "dominated_by": dom},
        _model("b", 0.03, 0.01, 0.05, p=0.03),  # an older results.json: no record
    ]}  # fmt: skip
    out = S.confirm(section, ["a", "b"])
    assert out["a"]["dominated_by"] == dom and out["b"]["dominated_by"] is None
    picks = {"pass_at_k": {k: {"setting": "s", "step": 10, "lift": 0.0} for k in "ab"}}
    md = R.verdicts_markdown({"pass_at_k": out, "distinct_correct": out}, picks, "intro")
    assert md.count("| a | kl_coef=0.1, 50 | +1.20 | +3.40 | 0.004 |") == 1  # pass@k: points
    assert md.count("| a | kl_coef=0.1, 50 | +1.20 | +0.03 | 0.004 |") == 1  # distinct: as is
    assert md.count("intersection-union") == 1 and md.count("Curve-free check (as above)") == 1
    assert "| b |" not in md.split("Curve-free")[1].split("###")[0]


def test_sharpening_is_read_at_the_configured_setting_not_the_first_tuning():
    """With a tune table GRPO's first setting is the first tuning combination (the smallest
    learning rate); "GRPO sharpens" is read at the configured one (`defaults`), a key a setting
    does not name taking its default."""

    def at(setting, params, step, x_lo, y_hi):
        return {**_model("grpo", 0.0, 0, 0, ref=True, step=step, setting=setting),
                "params": params, "x": 0.05, "x_lo": x_lo, "x_hi": 0.07, "y": -0.06,
                "y_lo": -0.09, "y_hi": y_hi}  # fmt: skip

    section = {"models": [at("lr=0.03", {"lr": 0.03}, 100, -0.01, 0.02),
                          at("lr=0.3", {"lr": 0.3}, 100, 0.03, -0.03)]}  # fmt: skip
    assert S.sharpening_verdict(section, "grpo")["setting"] == "lr=0.03"
    out = S.sharpening_verdict(section, "grpo", defaults={"lr": 0.3, "kl_coef": 0.0})
    assert out["setting"] == "lr=0.3" and out["verdict"] == "supported"
    # no setting agrees: the first
    assert S.sharpening_verdict(section, "grpo", defaults={"lr": 1.0})["setting"] == "lr=0.03"


def test_provenance_names_the_commit_it_is_told(tmp_path, monkeypatch):
    """A GPU lease's tree copy carries a stale .git: the caller names the commit."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("a = 1\n")
    monkeypatch.setenv(R.GIT_COMMIT_ENV, "0123abc")
    assert R.provenance(cfg, "pinned")["git_commit"] == "0123abc"
    monkeypatch.delenv(R.GIT_COMMIT_ENV)
    assert R.provenance(cfg, "pinned")["git_commit"] != "0123abc"


def test_the_measures_table_shows_the_base_grpo_and_each_pick():
    row = {"pass1": 0.2, "pass_at_k": 0.6, "maj_at_k": 0.3, "answer_entropy": 1.2,
           "distinct_correct": 1.5}  # fmt: skip
    result = {
        "grpo_sharpens": {"setting": "lr=0.1", "step": 20},
        "picks": {"pass_at_k": {"ds": {"setting": "g=1", "step": 10}}},
        "measures": [
            {"label": "grpo", "setting": "base", "step": 0, **row},
            {"label": "grpo", "setting": "lr=0.1", "step": 20, **row, "pass1": 0.4},
            {"label": "grpo", "setting": "lr=0.1", "step": 10, **row, "pass1": 0.9},
            {"label": "ds", "setting": "g=1", "step": 10, **row, "maj_at_k": None},
            {"label": "ds", "setting": "g=1", "step": 20, **row, "pass1": 0.9},
        ],
    }
    text = R.measures_markdown(result)
    lines = [x for x in text.splitlines() if x.startswith("| ") and "model" not in x]
    assert lines == [
        "| base | base | 0 | 20.0 | 60.0 | 30.0 | 1.20 | 1.50 |",
        "| GRPO (configured) | lr=0.1 | 20 | 40.0 | 60.0 | 30.0 | 1.20 | 1.50 |",
        "| ds | g=1 | 10 | 20.0 | 60.0 | — | 1.20 | 1.50 |",
    ]
