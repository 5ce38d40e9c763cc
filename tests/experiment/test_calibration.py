"""The calibration harness (`experiment.calibration`): its truth is what it says it is, and the
whole pipeline holds the goals of issue 37 in the designs a test can afford."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiment import calibration as C
from experiment.inference import PROCEDURE


def test_no_training_is_the_base_point():
    x, y = C.true_points(C.DESIGNS["smooth"], 0.3, 0.2, [0.0])
    assert x[0] == pytest.approx(0.0, abs=1e-12) and y[0] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("name", sorted(C.DESIGNS))
def test_every_design_has_its_methods_and_grpo_sharpens(name):
    """In every design GRPO's last checkpoint gains pass@1 and loses pass@k, and every simulated
    method's settings reach their chosen largest true lift with every checkpoint inside GRPO's
    range; an escaping method's best model lies above it (none below)."""
    d = C.DESIGNS[name]
    for a, b in d.ref_settings:
        x, y = C.true_points(d, a, b, d.checkpoints)
        assert x[-1] > 0.005 and y[-1] < -0.03
    for method, lifts in C.methods_of(d).items():
        where = "above" if method in C.ESCAPE else "inside"
        for lift in lifts:
            a, b = C.method_path(d, lift, where)
            t = C.true_lifts(d, a, b)
            assert np.isfinite(t).all() and t.max() == pytest.approx(lift, abs=1e-7)
            x, _ = C.true_points(d, a, b, d.checkpoints)
            x_max = C.true_hull(d).x_max
            assert (x[int(np.argmax(t))] > x_max) == (where == "above")
            assert where == "above" or (x <= x_max).all()  # as under lift v3
    with pytest.raises(ValueError, match="where"):
        C.method_path(d, 0.0, "sideways")


def test_a_stage_has_the_frontier_layout():
    d = C.DESIGNS["smooth"]
    x, y, models = C.simulate(d, [("m", "s", 0.05, 0.0, (0, 2))], np.random.default_rng(0),
                              seeds=2, problems=24)  # fmt: skip
    assert x.shape == y.shape == (3, 2, 24) and models.step == (0, 100, 300)
    assert np.all(x[0] == 0) and np.all(y[0] == 0)  # the base model is the origin
    assert np.all(np.abs(x) <= 1) and np.all(np.abs(y) <= 1)


def _within(value: float, lo: float, hi: float, se: float) -> bool:
    return lo - 3 * se <= value <= hi + 3 * se


# What each design holds (docs/statistics.md, `docs/calibration.json`): issue 37's goals (the
# narrow design explores 3 seeds x 512 problems, as the strong study's config: picked 0.91,
# coverage 0.925-0.96; with 128 problems it picked 0.69).
GOALS = {
    # design: (least best-setting share, largest |bias| in points, coverage range)
    "smooth": (0.80, 0.30, (0.93, 0.97)),
    "narrow": (0.80, 0.30, (0.93, 0.97)),
}


@pytest.mark.parametrize(("name", "replicates"), [("smooth", 120), ("narrow", 60)])
def test_the_pipeline_is_calibrated(name, replicates):
    """Explore, pick, confirm, Holm, the claim rule, each check allowing three Monte Carlo
    standard errors: no exploratory lift beyond ±100 points; the best setting (4 points ahead)
    picked as often as `GOALS` says; the confirmed picks' bias and coverage; family-wise false
    "above" ≤ 0.05 with Holm. (The narrow design's confirmation is cut to a quarter of its
    problems: `calibration.quick`.)"""
    least, bias, (lo, hi) = GOALS[name]
    d = C.DESIGNS[name] if name == "smooth" else C.quick(C.DESIGNS[name])
    out = C.calibrate(d, replicates=replicates, seed=11, draws=400)
    assert out["explore"]["max_abs_lift"] <= 100.0
    p = out["explore"]["best_picked"]
    assert p >= least - 3 * math.sqrt(least * (1 - least) / replicates), p
    for label, r in out["confirm"].items():
        assert abs(r["bias"]) <= bias + 3 * r["bias_se"], (label, r)
        assert _within(r["coverage"], lo, hi, math.sqrt(0.95 * 0.05 / r["n"])), (label, r)
    fw = out["familywise"]["above"]
    assert fw <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / replicates), fw


def test_the_committed_calibration_is_every_design():
    """`docs/calibration.json` is `python -m experiment calibrate --json` of every design."""
    doc = json.loads((Path(__file__).parents[2] / "docs" / "calibration.json").read_text())
    assert set(doc) == set(C.DESIGNS)
    for name, out in doc.items():
        assert out["replicates"] == 300 and set(out["confirm"]) == set(
            C.methods_of(C.DESIGNS[name])
        )
        assert out["explore"]["max_abs_lift"] <= 100.0
        assert out["familywise"]["above"] <= 0.05 and out["familywise"]["below"] <= 0.05
        assert out["design"]["problems"] == C.DESIGNS[name].problems


def test_cli_smoke_prints_json_for_each_design(capsys):
    from experiment.__main__ import main

    assert main(["calibrate", "--replicates", "2", "--draws", "20", "--json",
                 "--design", "smooth"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"smooth"} and set(out["smooth"]["confirm"]) == set(C.METHODS)
    assert main(["calibrate", "--replicates", "2", "--draws", "20", "--design", "mild"]) == 0
    assert "best setting picked" in capsys.readouterr().out


def test_claims_command_writes_the_table_between_the_markers(tmp_path, capsys):
    from experiment.__main__ import main

    study = tmp_path / "study.json"
    row = {"study": "toy", "claim": "ds_grpo", "text": "DS-GRPO beats GRPO", "verdict": "refuted",
           "lift": -1.0, "lo": -2.0, "hi": 0.5, "mde": 1.2, "size": 1.5, "unit": "points"}  # fmt: skip
    study.write_text(json.dumps({"study": "toy", "procedure": PROCEDURE, "claims": [row]}))
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- claims: begin -->\nold\n<!-- claims: end -->\nbottom\n")
    assert main(["claims", str(study), "--results", str(readme)]) == 0  # the full layout
    text = readme.read_text()
    assert "old" not in text and text.startswith("top\n") and text.endswith("bottom\n")
    assert "| claim | toy |" in text
    # an old word reads in the five (experiment.study.translate)
    assert "| DS-GRPO beats GRPO | **not better than GRPO** -1.0 [-2.0, +0.5], MDE 1.2 |" in text
    # a study read by an earlier lift says which; one read before lift v3 (none recorded) is
    # marked superseded
    v3 = tmp_path / "v3.json"
    v3.write_text(
        json.dumps({"study": "toy", "procedure": "lift v3: concave hull", "claims": [row]})
    )
    assert main(["claims", str(v3)]) == 0
    assert "| claim | toy (lift v3) |" in capsys.readouterr().out
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"study": "toy", "claims": [row]}))
    assert main(["claims", str(old)]) == 0
    assert "| claim | toy (lift v2, unequal budgets: superseded, to be re-run) |" in (
        capsys.readouterr().out
    )
    assert main(["claims", str(tmp_path / "missing.json")]) == 2
    assert "not a study.json" in capsys.readouterr().err
