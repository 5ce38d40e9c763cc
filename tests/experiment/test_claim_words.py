"""The five claim words (`experiment.study.claim_verdicts`): each word's condition holds for every
word given, no word contradicts its interval, refutations are Holm-controlled over a study's claims,
old study.json words translate, every committed study's claims table renders in the five words, and
models above GRPO's pass@1 range are labelled in every table (issue 56)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from experiment import estimand, report
from experiment import inference as I
from experiment import study as S
from experiment import study_report as R
from experiment.__main__ import main

ALPHA = 0.05
ROOT = Path(__file__).parents[2]


def _model(label, lift, se, df, *, status="inside", ref=False, level=0.95):
    """A section's model whose interval and p are the t's of (lift, se, df), as
    `experiment.inference.lift_inference` writes them."""
    half = stats.t.ppf(0.5 + level / 2, df) * se
    return {"label": label, "setting": "s", "step": 10, "reference": ref, "status": status,
            "lift": lift, "lift_lo": max(lift - half, -1.0), "lift_hi": min(lift + half, 1.0),
            "lift_se": se, "lift_df": df, "lift_p": float(2 * stats.t.sf(abs(lift) / se, df)),
            "x": 0.1, "y": 0.0}  # fmt: skip


@st.composite
def families(draw):
    """A study's confirmation (`confirm` over 1-6 picks, Holm included) and each claim's size."""
    n = draw(st.integers(1, 6))
    models, sizes = [_model("grpo", 0.0, 0.01, 30.0, ref=True)], {}
    for i in range(n):
        se = draw(st.floats(1e-4, 0.05))
        lift = draw(st.floats(-0.1, 0.1))
        df = draw(st.floats(2.0, 300.0))
        models.append(
            _model(f"m{i}", lift, se, df, status=draw(st.sampled_from(["inside", "above"])))
        )
        sizes[f"m{i}"] = draw(st.floats(0.001, 0.1))
    labels = list(sizes)
    return S.confirm({"models": models}, labels, alpha=ALPHA), sizes


def _conditions(r, size, q):
    """Each word's condition (docs/statistics.md), from the record's tests and interval."""
    above = r["verdict"] == "above" and r["p_holm"] <= ALPHA and r["lift"] > 0
    below = r["verdict"] == "below" and r["p_holm"] <= ALPHA and r["lift"] < 0
    excluded = q is not None and q <= ALPHA / 2 and r["hi"] < size
    return {
        "supported": above and r["lo"] > 0 and r["hi"] >= size,
        "smaller than claimed": above and r["lo"] > 0 and r["hi"] < size and excluded,
        "below GRPO": below and r["hi"] < 0,
        "not better than GRPO": not above and not (below and r["hi"] < 0) and excluded,
    }


@given(families())
@settings(max_examples=300, deadline=None)
def test_each_word_is_its_condition(family):
    """Over simulated confirmations: the word is the one whose condition holds (none: not
    resolved); the size test is Holm over the family's one-sided tests of "lift ≥ size", and at
    the interval's one-sided level it never excludes a size the interval reaches."""
    conf, sizes = family
    words = S.claim_verdicts(conf, sizes, alpha=ALPHA)
    one_sided = {k: stats.t.cdf((r["lift"] - sizes[k]) / r["se"], r["df"]) for k, r in conf.items()}
    holm = dict(zip(one_sided, I.holm(list(one_sided.values())), strict=True))
    tests = S.size_tests(conf, sizes)
    for k, r in conf.items():
        assert tests[k][0] == pytest.approx(one_sided[k], rel=1e-9, abs=1e-300)
        assert tests[k][1] == pytest.approx(holm[k], rel=1e-9, abs=1e-300)
        if holm[k] <= ALPHA / 2:
            assert r["hi"] < sizes[k]  # the test excludes only what the interval excludes
        met = [w for w, ok in _conditions(r, sizes[k], holm[k]).items() if ok]
        assert len(met) <= 1 and words[k] == (met[0] if met else "not resolved"), (k, r, met)
    # a family of one is each claim alone (calibration.py's call)
    for k, r in conf.items():
        assert S.claim_verdict(r, sizes[k]) == S.claim_verdicts({k: r}, sizes[k])[k]


@given(lift=st.floats(-0.2, 0.2), lo_gap=st.floats(0.0, 0.2), hi_gap=st.floats(0.0, 0.2),
       size=st.floats(1e-3, 0.1), verdict=st.sampled_from(["above", "below", "none"]),
       q=st.one_of(st.none(), st.floats(0.0, 1.0)), status=st.sampled_from(["inside", "above"]))  # fmt: skip
@settings(max_examples=500, deadline=None)
def test_no_word_contradicts_its_interval(lift, lo_gap, hi_gap, size, verdict, q, status):
    """Whatever the record (a Holm decision at another level than its interval's, a Holm p from
    another family): supported's interval lies above 0 and reaches the size; smaller than
    claimed's lies above 0 and below the size; not better than GRPO's below the size; below
    GRPO's below 0."""
    r = {"lift": lift, "lo": lift - lo_gap, "hi": lift + hi_gap, "se": 0.01, "df": 30.0,
         "verdict": verdict, "status": status}  # fmt: skip
    word = S.claim_verdict(r, size, alpha=ALPHA, size_p_holm=q)
    assert word in S.VERDICTS
    if word == "supported":
        assert r["lo"] > 0 and r["hi"] >= size and verdict == "above"
    elif word == "smaller than claimed":
        assert 0 < r["lo"] and r["hi"] < size and verdict == "above"
    elif word == "not better than GRPO":
        assert r["hi"] < size and verdict != "above"
    elif word == "below GRPO":
        assert r["hi"] < 0 and verdict == "below"


def test_a_size_the_interval_reaches_exactly_is_tested_at_its_one_sided_level():
    """`size_p` at the interval's upper end is the interval's one-sided level, 0.025."""
    m = _model("a", 0.01, 0.004, 12.0)
    r = {"lift": m["lift"], "se": m["lift_se"], "df": m["lift_df"]}
    assert S.size_p(r, m["lift_hi"]) == pytest.approx(0.025, rel=1e-9)
    assert S.size_p({**r, "se": 0.0}, 0.03) is None and S.size_p({**r, "lift": None}, 0.03) is None
    with pytest.raises(ValueError, match="size: the claimed lift must be > 0, got 0"):
        S.claim_verdict({**r, "lo": 0, "hi": 0.02, "verdict": "none"}, 0)


def test_refutations_are_controlled_across_the_claims():
    """The same half-point lift: alone its size is excluded; among 12 claims whose other tests
    are weak, Holm keeps it (not resolved), as Holm keeps a support."""
    weak = _model("w", 0.0, 0.02, 30.0)
    lone = _model("a", 0.005, 0.0042, 30.0)  # +0.5 [-0.35, +1.36] points against 1.5
    section = {"models": [_model("grpo", 0.0, 0.01, 30.0, ref=True), lone]}
    conf = S.confirm(section, ["a"])
    assert S.claim_verdicts(conf, 0.015) == {"a": "not better than GRPO"}
    labels = ["a"] + [f"w{i}" for i in range(11)]
    section["models"] += [{**weak, "label": lb} for lb in labels[1:]]
    conf = S.confirm(section, labels)
    words = S.claim_verdicts(conf, 0.015)
    assert S.size_p(conf["a"], 0.015) * 12 > ALPHA / 2 and words["a"] == "not resolved"


def test_a_pick_below_the_range_is_below_grpo_only_when_a_grpo_model_beats_it():
    dom = {"setting": "lr=1e-4", "step": 50, "dx": 0.02, "dy": 0.04, "p": 0.001}
    below = {**_model("b", 0.0, 0.01, 30.0, status="below"), "lift": None, "lift_p": None,
             "dominated_by": dom}  # fmt: skip
    section = {"models": [_model("grpo", 0.0, 0.01, 30.0, ref=True), below]}
    r = S.confirm(section, ["b"])["b"]
    assert S.claim_verdict(r, 0.03) == "below GRPO"
    assert S.claim_verdict({**r, "dominated_by": {**dom, "p": 0.2}}, 0.03) == "not resolved"
    rows = S.claim_rows("s", {"pass_at_k": {"unlikeliness": r}}, {"verdict": "supported", "y": 0,
                        "y_lo": 0, "y_hi": 0}, size=3.0, size_distinct=0.1)  # fmt: skip
    assert ("**below GRPO** (below GRPO's range; GRPO lr=1e-4, step 50 beats it on both axes, "
            "p 0.001)") in R.claims_table(rows)  # fmt: skip


def test_an_unequal_budget_keeps_the_words_and_marks_the_column():
    """The words compare with GRPO as the study tuned it; a study whose methods had less tuning
    than GRPO is marked in its column's head, not by other words."""
    section = {"k": 16, "models": [
        {**_model("grpo", 0.0, 0.01, 30.0, ref=True), "step": 0, "x_lo": 0.0, "x_hi": 0.0,
         "y_lo": 0.0, "y_hi": 0.0},
        {**_model("grpo", 0.0, 0.01, 30.0, ref=True), "x_lo": 0.05, "x_hi": 0.15,
         "y_lo": -0.03, "y_hi": -0.02},
        {**_model("ds_grpo", -0.05, 0.01, 30.0), "dominated_by": None},
    ]}  # fmt: skip
    picks = {"pass_at_k": {"ds_grpo": {"setting": "s", "step": 10, "lift": 0.0}}}
    common = dict(reference="grpo", alpha=0.05, size=3.0, size_distinct=0.1, problems=100,
                  provenance={}, by_step=True)  # fmt: skip
    for budget, mark in (("equal", False), (None, True)):
        design = {} if budget is None else {"budget": budget}
        out = S.conclude("st", picks, {"pass_at_k": section}, design=design, **common)
        row = next(r for r in out["claims"] if r["claim"] == "ds_grpo")
        assert row["verdict"] == "below GRPO" and row["budget"] == ("unequal" if mark else "equal")
        assert row["p_size"] is not None and row["p_size_holm"] == row["p_size"]
        assert (f"| claim | st ({R.UNEQUAL}) |" in R.claims_table(out["claims"])) == mark


def test_old_words_translate_to_the_five():
    dom = {"setting": "s", "step": 5, "dx": 0.1, "dy": 0.1, "p": 0.0}
    doc = {"claims": [
        {"claim": "grpo_sharpens", "verdict": "refuted", "lift": 5.0, "lo": 4.0, "hi": 6.0},
        {"claim": "ds_grpo", "verdict": "refuted", "lift": 0.2, "lo": -1.0, "hi": 1.4},
        {"claim": "casp", "verdict": "refuted", "lift": -3.0, "lo": -4.0, "hi": -2.0},
        {"claim": "unlikeliness", "verdict": "not better than tuned GRPO", "lift": -3.0,
         "lo": -4.0, "hi": -2.0},
        {"claim": "w_reinforce", "verdict": "refuted", "lift": None, "dominated_by": dom},
        {"claim": "entropy_bonus", "verdict": "supported", "lift": 0.2, "lo": 0.1, "hi": 0.3},
        {"claim": "grpo_spread", "verdict": "", "lift": 1.0, "lo": 0.0, "hi": 2.0},
    ], "confirmed": {"pass_at_k": {"casp": {"verdict": "below"}, "ds_grpo": {"verdict": "none"},
                                   "unlikeliness": {"verdict": "none"}}}}  # fmt: skip
    got = {r["claim"]: (r["verdict"], r.get("verdict_was")) for r in S.translate(doc)}
    assert got == {
        "grpo_sharpens": ("pass@k rises", "refuted"),
        "ds_grpo": ("not better than GRPO", "refuted"),
        "casp": ("below GRPO", "refuted"),
        "unlikeliness": ("not better than GRPO", "not better than tuned GRPO"),
        "w_reinforce": ("below GRPO", "refuted"),
        "entropy_bonus": ("supported", None),
        "grpo_spread": ("", None),
    }
    with pytest.raises(ValueError, match="'casp' has the verdict 'disproved'"):
        S.translate({"claims": [{"claim": "casp", "verdict": "disproved"}]})


STUDIES = sorted([*(ROOT / "figures").glob("*/study.json"),
                  *(ROOT / "docs" / "superseded").glob("*/study.json")])  # fmt: skip


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.parent.name)
def test_every_committed_study_renders_in_the_five_words(path, capsys):
    """`python -m experiment claims` on each committed study.json (not re-read): only the five
    words (and GRPO sharpens' three, and *pending* for a pick the confirmation did not train),
    none contradicting its interval, and every claim above GRPO's pass@1 range labelled."""
    assert main(["claims", str(path)]) == 0
    table = capsys.readouterr().out
    assert "refuted" not in table and "tuned GRPO" not in table
    words = set(re.findall(r"\*\*([^*]+)\*\*", table))
    assert words <= {*S.VERDICTS, *S.SHARPENING_VERDICTS, S.PENDING}
    doc = json.loads(path.read_text())
    assert (S.PENDING in words) == bool(S.pending_rows(doc))
    for r in S.translate(doc):
        word, hi, lo = r["verdict"], r.get("hi"), r.get("lo")
        if r["claim"] in ("grpo_sharpens", "grpo_spread"):
            continue
        if word in ("not better than GRPO", "smaller than claimed", "supported"):
            assert hi < r["size"] if word != "supported" else hi >= r["size"]
        if word in ("smaller than claimed", "supported"):
            assert lo > 0
        if word == "below GRPO":
            assert (hi is not None and hi < 0) or r.get("dominated_by") is not None
        if r.get("status") == "above" and r.get("lift") is not None:
            assert estimand.ABOVE_RANGE in table


def test_the_range_label_and_its_tables():
    assert estimand.range_label("inside", 1) is None and estimand.range_label(None, 0) is None
    assert estimand.range_label("above", 0) == "above GRPO's pass@1 range"
    assert estimand.range_label("above", 1).endswith(": dominates GRPO near its end")
    assert estimand.range_label("above", -1, "distinct correct").endswith(
        ": less distinct correct, more pass@1 than GRPO near its end"
    )
    with pytest.raises(ValueError, match="sign: expected -1, 0 or \\+1, got 2"):
        estimand.range_label("above", 2)
    # the confirmation table, by Holm's decision
    high = {**_model("a", 0.05, 0.005, 30.0, status="above"), "x": 0.4}
    low = {**_model("b", -0.05, 0.005, 30.0, status="above"), "x": 0.4}
    section = {"models": [_model("grpo", 0.0, 0.01, 30.0, ref=True), high, low]}
    conf = S.confirm(section, ["a", "b"])
    picks = {"pass_at_k": {k: {"setting": "s", "step": 10, "lift": 0.0} for k in "ab"}}
    md = R.verdicts_markdown({"pass_at_k": conf}, picks, "intro")
    assert "(above GRPO's pass@1 range: dominates GRPO near its end) |" in md
    assert "(above GRPO's pass@1 range: less pass@k, more pass@1 than GRPO near its end) |" in md
    assert "| > 0 |" in md and "| < 0 |" in md
    # the claims table, from the rows
    rows = S.claim_rows("st", {"pass_at_k": {"casp": conf["a"], "unlikeliness": conf["b"]}},
                        {"verdict": "supported", "y": 0, "y_lo": 0, "y_hi": 0}, size=3.0,
                        size_distinct=0.1)  # fmt: skip
    table = R.claims_table(rows)
    assert "**supported** +5.0 [+4.0, +6.0], MDE" in table
    assert "(above GRPO's pass@1 range: dominates GRPO near its end) |" in table
    assert "**below GRPO** -5.0 [-6.0, -4.0]" in table
    compact = R.claims_table(rows, compact=True)  # README's: the short label
    assert f"**supported** +5.0 ({estimand.ABOVE_RANGE}) |" in compact
    assert f"**below GRPO** -5.0 ({estimand.ABOVE_RANGE}) |" in compact
    # an exploratory lift table, by the interval
    section["models"] = [{**m, "inside_fraction": 1.0} for m in section["models"]]
    md = report.lift_markdown({"pass_at_k": {**section, "level": 0.95, "k": 16}}, "intro")
    assert md.count("above GRPO's pass@1 range: dominates") == 1
    assert md.count("above GRPO's pass@1 range: less pass@k") == 1


def test_the_reread_command_prints_the_word_each_claim_replaces(tmp_path, capsys, monkeypatch):
    """A re-read prints the old word beside a changed one (``reread.claims_were``). (The frontier
    figures, most of a re-read's time, are not drawn: tests/experiment/test_reread.py checks
    they are asked for.)"""
    src = ROOT / "figures" / "toy_study_sharpening"
    if not (src / "explore_lift_inputs.npz").is_file():
        pytest.skip("no committed lift inputs")
    monkeypatch.setattr(report, "plot_frontier", lambda found, path, **kw: None)
    assert main(["reread", str(src), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "study.json").read_text())
    was = {r["claim"]: r["verdict"] for r in doc["reread"]["claims_were"]}
    committed = json.loads((src / "study.json").read_text())
    assert was == {r["claim"]: r["verdict"] for r in committed["claims"] if r["verdict"]}
    for r in doc["claims"]:
        if r["verdict"] and was.get(r["claim"]) not in (None, r["verdict"]):
            assert f"  {r['claim']}: {r['verdict']} (was {was[r['claim']]})" in out
    assert np.all([r["verdict"] in S.VERDICTS + S.SHARPENING_VERDICTS
                   for r in doc["claims"] if r["claim"] != "grpo_spread"])  # fmt: skip
