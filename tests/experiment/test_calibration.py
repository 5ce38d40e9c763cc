"""The calibration harness (`experiment.calibration`): its truth is what it says it is."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiment import calibration as C
from experiment import frontier as F

SMALL = C.Design(problems=24, samples=8, k=8, seeds=2)


def test_no_training_is_the_base_point():
    assert C.true_point(SMALL, 0.3, 0.2, 0.0) == pytest.approx((0.0, 0.0), abs=1e-12)


def test_the_reference_path_sharpens_and_a_chosen_lift_is_reached():
    d = C.Design()
    x, y = C.true_point(d, *d.ref_settings[0], max(d.checkpoints))
    assert x > 0.04 and y < -0.04  # GRPO's path: pass@1 up about 5 points, pass@16 down
    ref = C._true_reference(d)
    for lift in (0.0, 0.03):
        a, b = C.method_path(d, lift)
        assert C._true_lift(d, ref, a, b, C._lift_checkpoint(d)) == pytest.approx(lift, abs=1e-8)


def test_a_study_has_the_frontier_layout_and_the_truth_of_each_model():
    study = C.simulate(SMALL, [("m", 0.05, 0.0)], np.random.default_rng(0))
    m = 1 + (len(SMALL.ref_settings) + 1) * len(SMALL.checkpoints)
    assert study.x.shape == study.y.shape == (m, SMALL.seeds, SMALL.problems)
    assert np.all(study.x[0] == 0) and np.all(study.y[0] == 0)  # the base model is the origin
    is_ref = np.array(study.models.method) == "grpo"
    assert np.isnan(study.true_lift[is_ref]).all() and np.isfinite(study.true_lift[~is_ref]).all()
    assert np.all(np.abs(study.x) <= 1) and np.all(np.abs(study.y) <= 1)


def test_calibrate_reports_every_lift_and_the_familywise_rate():
    out = C.calibrate(SMALL, C.bootstrap_procedure(20), lifts=(0.0, 0.01), per_lift=2,
                      replicates=3)  # fmt: skip
    assert set(out["by_lift"]) == {"0", "1"} and out["replicates"] == 3
    for row in out["by_lift"].values():
        assert row["n"] + row["outside_range"] == 2 * 3
        assert 0.0 <= row["coverage"] <= 1.0
    assert set(out["familywise_null"]) == {"above", "below"}


@pytest.mark.parametrize("design", [*sorted(C.DESIGNS), "strong_one_path"])
def test_the_curve_procedure_is_calibrated_in_the_committed_designs(design):
    """`experiment.frontier.curve_lift` in the LLM designs (`make reproduce`'s sweep and the study's
    confirmation stage): |bias| ≤ 0.3 points, coverage in [0.93, 0.97] and family-wise false
    verdicts over a study's null models ≤ 0.05 with Holm, each allowing three Monte Carlo standard
    errors (300 null and 300 positive comparisons)."""
    d = (C.DESIGNS | C.STRESS_DESIGNS)[design]  # strong_one_path: the strong study, one path
    out = C.calibrate(d, C.curve_procedure(), lifts=(0.0, 0.03), per_lift=3, replicates=100,
                      seed=7)  # fmt: skip
    for row in out["by_lift"].values():
        assert abs(row["bias"]) <= 0.3 + 3 * row["bias_se"]
        assert 0.93 - 3 * row["coverage_se"] <= row["coverage"] <= 0.97 + 3 * row["coverage_se"]
    fw_se = np.sqrt(0.05 * 0.95 / 100)
    assert max(out["familywise_holm"].values()) <= 0.05 + 3 * fw_se


def test_two_reference_paths_with_different_trade_offs_bias_only_the_pooled_curve():
    """A dominated GRPO setting drags one pooled quadratic below GRPO's best (null lifts come out
    > +1 point); the tables' maximum of per-setting curves stays calibrated there (|bias| ≤ 0.3,
    coverage in [0.93, 0.97], three Monte Carlo errors allowed)."""
    d = C.STRESS_DESIGNS["strong_two_paths"]
    pooled = C.calibrate(d, C.curve_procedure(per_setting=False), lifts=(0.0,), per_lift=3,
                         replicates=40, seed=7)  # fmt: skip
    assert pooled["by_lift"]["0"]["bias"] > 1.0
    out = C.calibrate(d, C.curve_procedure(), lifts=(0.0, 0.03), per_lift=3, replicates=100,
                      seed=7)  # fmt: skip
    for row in out["by_lift"].values():
        assert abs(row["bias"]) <= 0.3 + 3 * row["bias_se"]
        assert 0.93 - 3 * row["coverage_se"] <= row["coverage"] <= 0.97 + 3 * row["coverage_se"]


def test_the_study_design_sees_three_points():
    """The study's confirmation design has a minimum detectable lift ≤ 3 points at 80% power."""
    out = C.calibrate(C.DESIGNS["study"], C.curve_procedure(), lifts=(0.0,), per_lift=3,
                      replicates=60, seed=3)  # fmt: skip
    assert C.minimum_detectable_lift(out) <= 3.0


def test_cli_smoke_prints_json_for_each_procedure(capsys):
    from experiment.__main__ import main

    assert main(["calibrate", "--replicates", "2", "--resamples", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {f"{d}/{p}" for d in C.DESIGNS for p in ("curve", "envelope")}
    assert out["study/curve"]["mde"] > 0


def test_claims_command_writes_the_table_between_the_markers(tmp_path, capsys):
    from experiment.__main__ import main

    study = tmp_path / "study.json"
    row = {"study": "toy", "claim": "ds_grpo", "text": "DS-GRPO beats GRPO", "verdict": "refuted",
           "lift": -1.0, "lo": -2.0, "hi": 0.5, "mde": 1.2, "size": 1.5, "unit": "points"}  # fmt: skip
    study.write_text(json.dumps({"claims": [row]}))
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- claims: begin -->\nold\n<!-- claims: end -->\nbottom\n")
    assert main(["claims", str(study), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "old" not in text and text.startswith("top\n") and text.endswith("bottom\n")
    assert "| claim | toy |" in text
    assert "| DS-GRPO beats GRPO | **refuted** -1.0 [-2.0, +0.5], MDE 1.2 |" in text
    assert main(["claims", str(tmp_path / "missing.json")]) == 2
    assert "not a study.json" in capsys.readouterr().err


def test_the_bias_correction_removes_the_maximums_ride_on_noise():
    """In the reproduce design GRPO's two settings have near-identical curves, so the maximum
    of their noisy fits rides up and the uncorrected lifts come out low (−0.4 to −0.8 points in
    300 replicates); the bias-corrected maximum (`curve_lift(bias_correct=True)`, the tables')
    is within 0.3 points of the truth, allowing three Monte Carlo standard errors."""
    d = C.DESIGNS["reproduce"]
    kw = {"lifts": (0.0,), "per_lift": 3, "replicates": 100, "seed": 11}
    raw = C.calibrate(d, C.curve_procedure(bias_correct=False), **kw)["by_lift"]["0"]
    fixed = C.calibrate(d, C.curve_procedure(), **kw)["by_lift"]["0"]
    assert abs(fixed["bias"]) <= 0.3 + 3 * fixed["bias_se"]
    assert raw["bias"] < fixed["bias"] - 0.15
    assert 0.93 - 3 * fixed["coverage_se"] <= fixed["coverage"] <= 0.97 + 3 * fixed["coverage_se"]


def test_the_edge_rule_tests_both_sides_of_a_dominant_settings_drop_and_nothing_else():
    """The tables' edge rule (`curve_lift(edge_z=2, edge_drop=2)`): where a dominant setting
    stops short (`short_dominant`) models near its reach are marked "edge" and get the union of
    the intervals against the curves on both sides (never narrower than the rule-free one); with
    one reference setting there is no drop, and nothing changes (without the bias correction,
    which an edge model's estimate does not take)."""
    rng = np.random.default_rng(3)
    for name, marked in (("short_dominant", True), ("strong_one_path", False)):
        d = C.STRESS_DESIGNS[name]
        study = C.simulate(d, [("m", *C.method_path(d, 0.0))], rng, {})
        args = (study.x, study.y, study.models, study.reference)
        kw = {"per_setting": True, "bias_correct": False, "num_resamples": 10}
        plain = F.curve_lift(*args, edge_z=0.0, **kw)
        edge = F.curve_lift(*args, edge_z=F.EDGE_Z, edge_drop=F.EDGE_DROP, **kw)
        at = edge.status == "edge"
        assert at.any() == marked
        np.testing.assert_array_equal(edge.lift, plain.lift)
        np.testing.assert_array_equal(edge.lo[~at], plain.lo[~at])
        assert np.all(edge.lo[at] <= plain.lo[at]) and np.all(edge.hi[at] >= plain.hi[at])
        assert np.all(np.isfinite(edge.p[at]))
        assert np.all((edge.lo[at] <= edge.lift[at]) & (edge.lift[at] <= edge.hi[at]))


def test_the_edge_rule_covers_where_a_dominant_setting_stops_short():
    """Without the rule the interval covers 11% of the time at `short_dominant`'s cliff, and a
    study's null models give a Holm false verdict in 63-67% of studies; tested on both sides
    (the intersection-union test) it covers and the family-wise rates are controlled, and where
    settings are alike (`reproduce`) it changes nothing that matters."""
    kw = {"lifts": (0.0,), "per_lift": 3, "replicates": 60, "seed": 5}
    mc = 3 * np.sqrt(0.05 * 0.95 / 60)
    off = C.calibrate(C.STRESS_DESIGNS["short_dominant"], C.curve_procedure(edge_z=0.0), **kw)
    on = C.calibrate(C.STRESS_DESIGNS["short_dominant"], C.curve_procedure(), **kw)
    assert off["by_lift"]["0"]["coverage"] < 0.5
    assert on["by_lift"]["0"]["coverage"] >= 0.93 - 3 * on["by_lift"]["0"]["coverage_se"]
    assert max(on["familywise_holm"].values()) <= 0.05 + mc < max(off["familywise_holm"].values())
    alike = C.calibrate(C.DESIGNS["reproduce"], C.curve_procedure(), **kw)["by_lift"]["0"]
    assert alike["outside_range"] / (alike["n"] + alike["outside_range"]) <= 0.1
    assert 0.93 - 3 * alike["coverage_se"] <= alike["coverage"]
