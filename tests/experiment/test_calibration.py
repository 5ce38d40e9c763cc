"""The calibration harness (`experiment.calibration`): its truth is what it says it is, and the
whole pipeline holds the goals of issue 37 in the designs a test can afford."""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from experiment import calibration as C
from experiment import covariance, estimand, frontier, inference
from experiment import study as S
from experiment.inference import PROCEDURE


def test_no_training_is_the_base_point():
    x, y = C.true_points(C.DESIGNS["smooth"], 0.3, 0.2, [0.0])
    assert x[0] == pytest.approx(0.0, abs=1e-12) and y[0] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(C.DESIGNS))
def test_every_design_has_its_methods_and_grpo_sharpens(name):
    """In every design GRPO's last checkpoint gains pass@1 and loses pass@k, and every simulated
    method's settings reach their chosen largest true lift with every checkpoint inside GRPO's
    range; an escaping method's best model lies above it (none below)."""
    d = C.DESIGNS[name]
    for a, b in d.ref_settings:
        x, y = C.true_points(d, a, b, d.checkpoints)
        assert x[-1] > 0.005 and y[-1] < -0.03
    _, paths, truth = C.study_paths(d)
    x_max = C.true_hull(d).x_max
    for method, setting, a, b, amounts, noise in paths:
        lift = C.methods_of(d)[method][int(setting[1:])]
        t = np.array([truth[(method, setting, round(100 * s))] for s in amounts])
        assert np.isfinite(t).all() and t.max() == pytest.approx(lift, abs=1e-7)
        x, _ = C.true_points(d, a, b, amounts, noise)
        above = method in C.ESCAPE or method in C.ABOVE or method == C.GRPO_MORE
        assert method == C.GRPO_MORE or (x[int(np.argmax(t))] > x_max) == above
        assert above or (x <= x_max).all()  # as under lift v3
    methods = C.methods_of(d)
    nulls = [n for n in C.NULLS if n in methods and max(methods[n]) <= C.NULL_TOL]
    assert len(nulls) >= 4  # the family-wise checks (issue 56)
    with pytest.raises(ValueError, match="where"):
        C.method_path(d, 0.0, "sideways")


def test_a_stage_has_the_frontier_layout():
    d = C.DESIGNS["smooth"]
    x, y, models = C.simulate(d, [("m", "s", 0.05, 0.0, (1.0, 3.0), 1.0)],
                              np.random.default_rng(0), seeds=2, problems=24)  # fmt: skip
    assert x.shape == y.shape == (3, 2, 24) and models.step == (0, 100, 300)
    assert np.all(x[0] == 0) and np.all(y[0] == 0)  # the base model is the origin
    assert np.all(np.abs(x) <= 1) and np.all(np.abs(y) <= 1)


def test_the_population_point_is_the_runs_mean_with_a_seed_shift():
    """With a run-level seed shift (and a noisier setting) the population point `true_points` is
    the mean of many simulated runs on many problems (within 4 standard errors of the crossed
    design's mean)."""
    d = C.DESIGNS["narrow_seed"]
    a, b = d.ref_settings[0]
    x, y, _ = C.simulate(d, [("m", "s", a, b, (3.0,), 2.0)], np.random.default_rng(5),
                         seeds=300, problems=600)  # fmt: skip
    tx, ty = C.true_points(d, a, b, [3.0], 2.0)
    for v, t in ((x[1], tx[0]), (y[1], ty[0])):
        var, _ = covariance.crossed_variance(v)
        assert abs(v.mean() - t) <= 4 * np.sqrt(var), (v.mean(), t)


def _within(value: float, lo: float, hi: float, se: float) -> bool:
    return lo - 3 * se <= value <= hi + 3 * se


# What each design holds (docs/statistics.md, `docs/calibration.json`): `calibration.TARGETS`,
# checked on a few studies with their Monte Carlo error (the committed file: 200 studies per design).
TARGETS = C.TARGETS


def _binomial_se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / max(n, 1))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "replicates"), [("smooth", 40), ("narrow", 30)])
def test_the_pipeline_is_calibrated(name, replicates):
    """Explore, pick, confirm, Holm, the claim words, each check allowing three Monte Carlo
    standard errors: no exploratory lift beyond ±100 points; the best setting (4 points ahead)
    picked in ≥ 80% of studies; the confirmed picks' bias and coverage; family-wise false "above"
    and "below" ≤ 0.05 over the design's nulls (≥ 4). (The narrow design's confirmation is cut to
    a quarter of its problems: `calibration.quick`.)"""
    d = C.DESIGNS[name] if name == "smooth" else C.quick(C.DESIGNS[name])
    out = C.calibrate(d, replicates=replicates, seed=11, draws=200)
    assert out["explore"]["max_abs_lift"] <= 100.0
    p, least = out["explore"]["best_picked"], TARGETS["best"]
    assert p >= least - 3 * _binomial_se(least, replicates), p
    lo, hi = TARGETS["coverage"]
    for label, r in out["confirm"].items():
        assert abs(r["bias"]) <= TARGETS["bias"] + 3 * r["bias_se"], (label, r)
        assert _within(r["coverage"], lo, hi, _binomial_se(0.95, r["n"])), (label, r)
        assert sum(r["words"].values()) == pytest.approx(1.0)
    fw = out["familywise"]
    assert len(fw["nulls"]) >= 4
    for side in ("above", "below"):
        assert fw[side] <= TARGETS["familywise"] + 3 * _binomial_se(0.05, replicates), fw


# The committed calibration's designs that miss a target, and which (docs/statistics.md says why
# and by how much): family-wise rates and the best-setting share as estimated, coverage and bias
# within two Monte Carlo errors; every other design holds every target.
MISSES = {
    "narrow_seed": {"best", "coverage"},  # seed shifts: 3 exploration seeds; holds all at 12 x 32
    "rule": {"best", "coverage", "bias"},  # at 48 x 32 only null_above's coverage
    "real": {"bias"},  # grpo_more -0.45 +- 0.06, past GRPO's ceiling
}


def test_the_committed_calibration_is_every_design():
    """`docs/calibration.json` is `python -m experiment calibrate --json` of every design, and holds
    issue 56's targets where `MISSES` does not say otherwise."""
    doc = json.loads((Path(__file__).parents[2] / "docs" / "calibration.json").read_text())
    assert set(doc) == set(C.DESIGNS)
    for name, out in doc.items():
        n = out["replicates"]
        assert n == 200 and set(out["confirm"]) == set(C.methods_of(C.DESIGNS[name]))
        assert out["design"]["problems"] == C.DESIGNS[name].problems
        assert out["explore"]["max_abs_lift"] <= 100.0
        assert len(out["familywise"]["nulls"]) >= 4
        assert set(out["explore"]["rules"]) == set(S.PICK_RULES)
        assert C.misses(out) == MISSES.get(name, set()), name


def test_the_committed_sizes_start_from_the_committed_calibration():
    """`bench/results/calibration_size.json` (`calibrate --size`): each search's first size is the
    design as committed, and with the committed calibration's studies it is that calibration
    (the same seed); its answer is the first size `misses` finds nothing at."""
    root = Path(__file__).parents[2]
    sizes = json.loads((root / "bench" / "results" / "calibration_size.json").read_text())["runs"]
    committed = json.loads((root / "docs" / "calibration.json").read_text())
    for name, run in sizes.items():
        d, first = C.DESIGNS[name], run["trials"][0]
        assert (first["explore_seeds"], first["confirm_seeds"]) == (
            d.explore_seeds,
            d.confirm_seeds,
        )
        if run["replicates"] == committed[name]["replicates"]:
            out = committed[name]
            assert first["best_picked"] == out["explore"]["best_picked"]
            assert first["misses"] == sorted(C.misses(out))
        clean = [t for t in run["trials"] if not t["misses"]]
        assert run["size"] == (None if not clean else {k: clean[0][k] for k in
                                                       ("explore_seeds", "confirm_seeds")})  # fmt: skip
    assert sizes["narrow_seed"]["size"] == {"explore_seeds": 12, "confirm_seeds": 32}


def _fake_output(best: float, coverage: float, bias: float, above: float = 0.0) -> dict:
    """A `calibrate` output of two methods read in 200 studies each."""
    row = {"n": 200, "coverage": coverage, "coverage_se": 0.005, "bias": bias, "bias_se": 0.01}
    return {
        "explore": {"best_picked": best},
        "familywise": {"above": above, "below": 0.0},
        "confirm": {"null": dict(row), "plus5": {**row, "coverage": 0.95, "bias": 0.0}},
    }


def test_misses_names_each_target_a_design_misses():
    assert C.misses(_fake_output(0.9, 0.95, 0.1)) == set()
    assert C.misses(_fake_output(0.7, 0.95, 0.1)) == {"best"}
    assert C.misses(_fake_output(0.9, 0.90, 0.1)) == {"coverage"}
    assert C.misses(_fake_output(0.9, 0.99, 0.1)) == {"coverage"}  # over-covering misses too
    assert C.misses(_fake_output(0.9, 0.925, 0.1)) == set()  # within two Monte Carlo errors
    assert C.misses(_fake_output(0.9, 0.95, -0.5)) == {"bias"}
    assert C.misses(_fake_output(0.9, 0.95, 0.1, above=0.06)) == {"familywise"}
    assert C.misses(_fake_output(0.5, 0.8, 1.0, above=0.1)) == set(C.TARGETS)


def test_size_for_grows_exploration_then_confirmation_seeds(monkeypatch):
    """The search: exploration seeds until the best setting is picked often enough, then
    confirmation seeds at that exploration until nothing is missed; each size one calibration."""
    runs = []

    def fake(d, **kw):  # best needs 12 exploration seeds, coverage 32 confirmation seeds
        runs.append((d.explore_seeds, d.confirm_seeds))
        assert kw["replicates"] == 50 and d.problems == C.DESIGNS["narrow_seed"].problems
        return _fake_output(
            0.9 if d.explore_seeds >= 12 else 0.6, 0.95 if d.confirm_seeds >= 32 else 0.88, 0.1
        )

    monkeypatch.setattr(C, "calibrate", fake)
    out = C.size_for(C.DESIGNS["narrow_seed"], replicates=50)
    assert runs == [(3, 16), (6, 16), (12, 16), (12, 32)]
    assert out["size"] == {"explore_seeds": 12, "confirm_seeds": 32}
    assert [t["misses"] for t in out["trials"]] == [
        ["best", "coverage"],
        ["best", "coverage"],
        ["coverage"],
        [],
    ]
    assert out["trials"][0]["coverage"] == [0.88, 0.95] and out["trials"][0]["best_picked"] == 0.6
    # A miss more seeds do not remove: every exploration size, then every confirmation multiple.
    runs.clear()
    monkeypatch.setattr(
        C,
        "calibrate",
        lambda d, **kw: (
            runs.append((d.explore_seeds, d.confirm_seeds)) or _fake_output(0.6, 0.95, 1.0)
        ),
    )
    out = C.size_for(C.DESIGNS["rule"], replicates=50, explore=(3, 12), factors=(1, 2))
    assert runs == [(3, 8), (12, 8), (12, 16)] and out["size"] is None
    assert out["trials"][-1]["misses"] == ["best", "bias"]


def test_cli_smoke_prints_json_for_each_design(capsys):
    from experiment.__main__ import main

    assert main(["calibrate", "--replicates", "2", "--draws", "20", "--json",
                 "--design", "smooth"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"smooth"}
    assert set(out["smooth"]["confirm"]) == set(C.methods_of(C.DESIGNS["smooth"]))
    assert main(["calibrate", "--replicates", "2", "--draws", "20", "--design", "smooth"]) == 0
    assert "best setting picked" in capsys.readouterr().out
    assert main(["calibrate", "--replicates", "2", "--draws", "20", "--json", "--design", "smooth",
                 "--set", "explore_seeds=4", "--set", "confirm_problems=96"]) == 0  # fmt: skip
    design = json.loads(capsys.readouterr().out)["smooth"]["design"]
    assert design["explore_seeds"] == 4 and design["confirm_problems"] == 96
    assert main(["calibrate", "--design", "smooth", "--set", "explore_seed=4"]) == 2
    assert "'explore_seed' is not a field of Design" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["calibrate", "--summary", "docs/calibration.json", "--set", "explore_seeds=4"])
    assert "--summary simulates nothing" in capsys.readouterr().err


def test_cli_size_prints_each_size_tried(capsys, monkeypatch):
    from experiment.__main__ import main

    sizes = {(3, 8): _fake_output(0.6, 0.95, 0.1), (6, 8): _fake_output(0.9, 0.95, 0.1)}
    monkeypatch.setattr(C, "calibrate",
                        lambda d, **kw: sizes[d.explore_seeds, d.confirm_seeds])  # fmt: skip
    assert main(["calibrate", "--design", "smooth", "--size", "--replicates", "7"]) == 0
    text = capsys.readouterr().out
    assert "| 3 × 8 | 0.60 |" in text and "| best |" in text and "| 6 × 8 | 0.90 |" in text
    assert "Holds every target at 6 exploration × 8 confirmation seeds." in text
    assert main(["calibrate", "--design", "smooth", "--size", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["smooth"]
    assert out["size"] == {"explore_seeds": 6, "confirm_seeds": 8} and len(out["trials"]) == 2


def test_a_design_is_changed_field_by_field_with_each_fields_type():
    d = C.DESIGNS["smooth"]
    got = C.override(d, ["explore_seeds=6", "sigma_seed=0.05", "checkpoints=1,2,4", "noisy=TRUE",
                         "ref_settings=(0.03,0.1),(0.02,0.12)", "mu=-2"])  # fmt: skip
    assert got == replace(d, explore_seeds=6, sigma_seed=0.05, checkpoints=(1.0, 2.0, 4.0),
                          noisy=True, ref_settings=((0.03, 0.1), (0.02, 0.12)), mu=-2.0)  # fmt: skip
    assert C.override(d, []) == d
    for bad, match in [("explore_seeds", "expected FIELD=VALUE"), ("seeds=3", "not a field"),
                       ("explore_seeds=2.5", "explore_seeds='2.5': expected an integer"),
                       ("noisy=yes", "noisy='yes': expected true or false"), ("explore_seeds=1", ">= 2"),
                       ("sigma_off=-0.1", ">= 0"), ("k=32", "k=32 is more than samples=16"),
                       ("checkpoints=a", "checkpoints='a': expected a comma-separated"),
                       ("mu=nan", "mu='nan' must be finite"), ("sigma_along=inf", "finite"),
                       ("tau=0", "tau='0' must be > 0"), ("checkpoints=0", "positive"),
                       ("checkpoints=3,2,1", "increasing"), ("checkpoints=1,1", "increasing"),
                       ("sharpenings=2,-2", "the smaller first"), ("sharpenings=1", "two values"),
                       ("ref_settings=(0.1,0.2,0.3)", "pairs"), ("pushes=", "comma-separated"),
                       ("checkpoints=1,1e400", "finite")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            C.override(d, [bad])


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
    assert "studies: no such file" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[1]")
    assert main(["claims", str(tmp_path / "list.json")]) == 2
    assert "not a study.json" in capsys.readouterr().err


def test_a_json_file_argument_that_is_missing_or_not_json_is_named(tmp_path, capsys):
    """Every `python -m experiment` argument that reads a file names the argument and the file
    when it is missing or not JSON text (a missing results file read as 'no models list', a
    missing --readme as the OS's [Errno 2])."""
    from experiment.__main__ import main

    text = tmp_path / "text.json"
    text.write_text("not json")
    missing = str(tmp_path / "missing.json")
    for argv, want in [
        (["fit-design", missing], "results: no such file"),
        (["fit-design", str(text)], "results: " + str(text) + " is not JSON text"),
        (["calibrate", "--summary", missing], "--summary: no such file"),
        (["calibrate", "--design-file", str(text)], "--design-file: " + str(text) + " is not"),
        (["claims", str(text)], "studies: " + str(text) + " is not JSON text"),
        (
            [
                "claims",
                str(Path(__file__).parents[2] / "figures" / "toy_study_fig6" / "study.json"),
                "--readme",
                missing,
            ],
            "--readme: no such file",
        ),
    ]:
        assert main(argv) == 2, argv
        assert want in capsys.readouterr().err, argv


def test_the_statistics_page_shows_the_committed_calibration(capsys):
    """docs/statistics.md's calibration table is `calibrate --summary docs/calibration.json`,
    line for line; a file that is not a calibration output is refused by name."""
    from experiment.__main__ import main

    root = Path(__file__).parents[2]
    assert main(["calibrate", "--summary", str(root / "docs" / "calibration.json")]) == 0
    table = capsys.readouterr().out
    assert table in (root / "docs" / "statistics.md").read_text()
    with pytest.raises(ValueError, match="design 'x': not a calibrate --json output"):
        __import__("experiment.__main__", fromlist=["summary_table"]).summary_table({"x": {}})


def _fixed_pick_bench():
    root = Path(__file__).parents[2]
    spec = importlib.util.spec_from_file_location(
        "fixed_pick", root / "bench/calibration_fixed_pick.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fixed_pick_bench_reads_where_the_draws_read_a_model():
    """bench/calibration_fixed_pick.py's `read_facet` names the side of GRPO's range end and the
    vertex or segment under the read point; `agreement` is 1 where every draw reads the model on
    the observed segment (noise far smaller than the hull's segments) and below 1 where the model
    sits at a vertex, within noise: the draws read it on either segment."""
    bench = _fixed_pick_bench()
    hull = estimand.upper_hull(np.array([0.1, 0.2]), np.array([-0.1, -0.3]))  # (0,0) and both
    assert bench.read_facet(hull, -0.1) == ("below",)
    assert bench.read_facet(hull, 0.05) == ("inside", estimand.ORIGIN, 0)
    assert bench.read_facet(hull, 0.1) == ("inside", 0)
    assert bench.read_facet(hull, 0.25) == ("above", 0, 1)  # the window's edge, 0.15
    assert bench.read_facet(hull, 0.35) == ("above", estimand.ORIGIN, 0)  # edge at 0.05
    assert bench.read_facet(hull, 0.5) == ("above", estimand.ORIGIN)  # the whole range: its peak
    rng = np.random.default_rng(0)
    means = [(0.0, 0.0), (0.1, -0.1), (0.2, -0.3), (0.15, -0.1), (0.1, -0.05)]
    x = np.stack([mx + 1e-4 * rng.standard_normal((2, 6)) for mx, _ in means])
    y = np.stack([my + 1e-4 * rng.standard_normal((2, 6)) for _, my in means])
    x[0], y[0] = 0.0, 0.0
    models = frontier.Models(["grpo"] * 3 + ["m"] * 2, ["b", "a", "a", "c", "d"], [0, 1, 2, 1, 1])
    res = inference.lift_inference(x, y, models, num_draws=40, keep_draws=True)
    assert bench.agreement(res, 3) == 1.0  # read inside the segment from 0.1 to 0.2
    assert bench.agreement(res, 4) < 1.0  # at the vertex at 0.1: the draws fall either side
