"""`experiment.fit`: a calibration design fitted to per-problem counts recovers the design that
simulated them, and a sweep's results.json reads into its layout."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy import special

from experiment import calibration as C
from experiment import fit


def _counts(d: C.Design, seeds: int, problems: int, seed: int):
    """Counts simulated by `calibration`'s model (as `calibration.simulate`, kept as counts)."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(d.mu, d.tau, problems)
    base = rng.binomial(d.samples, special.expit(theta))
    runs = {}
    for i, (a, b) in enumerate(d.ref_settings):
        z = rng.standard_normal(seeds)[:, None]
        u = rng.standard_normal((seeds, problems))
        runs[f"r{i}"] = {
            round(100 * s): rng.binomial(d.samples, special.expit(
                theta + s * np.exp(d.sigma_along * z) * (a + b * (theta - d.mu))
                + d.sigma_off * s * u))
            for s in d.checkpoints
        }  # fmt: skip
    return base, runs


def test_fit_base_recovers_mu_and_tau():
    rng = np.random.default_rng(3)
    theta = rng.normal(-1.5, 1.2, 4000)
    mu, tau = fit.fit_base(rng.binomial(16, special.expit(theta)), 16)
    # Standard errors at P = 4,000 and n = 16: ~0.02 for mu, ~0.02 for tau; 5 of them.
    assert abs(mu + 1.5) < 0.1 and abs(tau - 1.2) < 0.1


def test_fit_design_recovers_the_simulating_design():
    true = replace(C.DESIGNS["mild"], sigma_along=0.2, sigma_off=0.3)
    base, runs = _counts(true, seeds=6, problems=2000, seed=0)
    d = fit.fit_design(base, true.samples, runs)
    assert d.checkpoints == true.checkpoints and d.problems == 2000 and d.k == 16
    assert abs(d.mu - true.mu) < 0.15 and abs(d.tau - true.tau) < 0.15
    # The paths' points, not their parameters (a path's push and sharpening trade off): within
    # 1.5 points of pass@1 and pass@16 at every checkpoint.
    for (a, b), (ta, tb) in zip(d.ref_settings, true.ref_settings, strict=True):
        got = np.array(C.true_points(d, a, b, d.checkpoints))
        want = np.array(C.true_points(true, ta, tb, true.checkpoints))
        assert np.abs(got - want).max() < 0.015
    assert abs(d.sigma_along - 0.2) < 0.1 and abs(d.sigma_off - 0.3) < 0.1


def test_counts_from_results_groups_settings_steps_and_seeds():
    rec = {"label": "grpo", "n": 4}
    results = {"models": [
        {"label": "base", "params": {}, "seed": None, "step": 0, "n": 4, "correct": [1, 2, 0]},
        *({**rec, "params": {"lr": lr}, "seed": s, "step": st, "correct": [s, st // 10, 1]}
          for lr in (1e-4, 3e-4) for st in (10, 20) for s in (0, 1)),
    ]}  # fmt: skip
    base, n, runs = fit.counts_from_results(results)
    assert n == 4 and base.tolist() == [1, 2, 0] and len(runs) == 2
    by_step = runs['{"lr": 0.0001}']
    assert sorted(by_step) == [10, 20] and by_step[20].tolist() == [[0, 2, 1], [1, 2, 1]]
    with pytest.raises(ValueError, match="label 'kl'"):
        fit.counts_from_results(results, label="kl")
    with pytest.raises(ValueError, match="no base"):
        fit.counts_from_results({"models": results["models"][1:]})


def test_fit_base_rejects_counts_outside_their_range():
    with pytest.raises(ValueError, match="correct"):
        fit.fit_base([0, 17], 16)


def test_fit_design_command_prints_a_design_and_names_bad_steps(tmp_path, capsys):
    import json

    from experiment.__main__ import main

    d = replace(C.DESIGNS["mild"], sigma_along=0.2, sigma_off=0.3)
    base, runs = _counts(d, seeds=3, problems=300, seed=1)
    models = [{"label": "base", "params": {}, "seed": None, "step": 0, "n": 16,
               "correct": base.tolist()}]  # fmt: skip
    for i, by_step in enumerate(runs.values()):
        for step, counts in by_step.items():
            models += [{"label": "grpo", "params": {"lr": i}, "seed": s, "step": step, "n": 16,
                        "correct": c.tolist()} for s, c in enumerate(counts)]  # fmt: skip
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"models": models}))
    assert main(["fit-design", str(path), "--steps", "100,300"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["checkpoints"] == [1.0, 3.0] and len(out["ref_settings"]) == 2
    assert main(["fit-design", str(path), "--steps", "100,250"]) == 2
    assert "--steps: [250]" in capsys.readouterr().err


def test_the_rule_design_is_the_fit_of_its_committed_counts():
    """`calibration.DESIGNS["rule"]` is `python -m experiment fit-design` of the rule study's
    exploration counts committed in docs/data (to the digits written there; the optimizers stop
    within 1e-6 of their optimum)."""
    import json
    from pathlib import Path

    path = Path(__file__).parents[2] / "docs" / "data" / "rule_study_grpo_counts.json"
    base, n, runs = fit.counts_from_results(json.loads(path.read_text()))
    got, want = fit.fit_design(base, n, runs), C.DESIGNS["rule"]
    assert (got.problems, got.samples, got.k, got.checkpoints) == (256, 16, 16, (1.0, 2.0, 3.0))
    np.testing.assert_allclose([got.mu, got.tau, got.sigma_along, got.sigma_off],
                               [want.mu, want.tau, want.sigma_along, want.sigma_off], atol=5e-4)  # fmt: skip
    np.testing.assert_allclose(got.ref_settings, want.ref_settings, atol=5e-4)


def test_seed_moments_recover_a_known_seed_component():
    """Gains `a_s + b_p + e_sp` with a seed component of known size and correlation between
    pass@1 and pass@k: the method of moments recovers both (16 seeds x 8 models: the seed sd
    within 15%, the correlation within 0.15) and the seed share of a mean's variance."""
    rng = np.random.default_rng(0)
    m, s, p = 8, 16, 800
    cov = np.array([[1.0, -0.6], [-0.6, 1.0]]) * 0.02**2  # sd 2 points, correlation -0.6
    a = rng.multivariate_normal([0, 0], cov, (m, s))  # (M, S, 2)
    b = rng.normal(0, 0.05, (m, 1, p, 2))
    e = rng.normal(0, 0.1, (m, s, p, 2))
    v = a[:, :, None, :] + b + e
    got = fit.seed_moments(v[..., 0], v[..., 1])
    assert got["models"] == m
    assert got["sd_x"] == pytest.approx(2.0, rel=0.15) and got["sd_y"] == pytest.approx(
        2.0, rel=0.15
    )
    assert got["corr"] == pytest.approx(-0.6, abs=0.15)
    share = 0.02**2 / s / (0.02**2 / s + 0.05**2 / p + 0.1**2 / (s * p))
    assert got["share_x"] == pytest.approx(share, abs=0.1)
    with pytest.raises(ValueError, match="x, y"):
        fit.seed_moments(v[..., 0], v[:, :1, :, 1])


def test_a_seed_shift_moves_pass_at_1_and_pass_at_k_together():
    """Along a sharpening path a seed moves pass@1 and pass@k in opposite directions; a run-level
    shift of every problem's logit moves them together (the strong study's GRPO: +0.08): the
    correlation `fit_seed_shift` fits on."""
    d = C.DESIGNS["narrow"]
    ref = C.study_paths(d, methods=False)[0]
    along = C.simulate(d, ref, np.random.default_rng(1), seeds=16, problems=1280)
    shift = C.simulate(replace(d, sigma_along=0.0, sigma_seed=0.1), ref,
                       np.random.default_rng(1), seeds=16, problems=1280)  # fmt: skip
    assert fit.seed_moments(along[0][1:], along[1][1:])["corr"] < -0.5
    assert fit.seed_moments(shift[0][1:], shift[1][1:])["corr"] > 0.5


def test_the_fit_command_names_a_bad_file_in_one_line(tmp_path, capsys):
    """``python -m experiment.fit`` follows every command's error convention (`experiment.cli`)."""
    bad = tmp_path / "x.npz"
    bad.write_text("not an npz")
    assert fit.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: lift inputs: ") and str(bad) in err and len(err.splitlines()) == 1


def test_a_design_file_is_design_fields_checked_as_set_checks_them():
    """`fit-design`'s output is a design (`design_from_fields`): its fields as fitted, the others
    at `Design`'s defaults; a bad field is named with the file."""
    fitted = fit.describe_fit(replace(C.DESIGNS["mild"], problems=64), ["lr=1e-4", "lr=3e-4"])
    assert C.design_from_fields(fitted, "f") == replace(C.DESIGNS["mild"], problems=64)
    assert C.design_from_fields({"noisy": True}, "f") == C.Design(noisy=True)
    for bad, message in (({"sigma_off": -1}, r"f: sigma_off='-1' must be >= 0"),
                         ({"seeds": 3}, r"f: 'seeds' is not a field of Design"),
                         ({"checkpoints": ["a"]}, r"f: checkpoints='\"a\"': expected"),
                         ([1, 2], r"f: expected a JSON object")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            C.design_from_fields(bad, "f")


@pytest.mark.slow
def test_a_fitted_design_is_calibrated_from_its_file(tmp_path, capsys):
    """`fit-design`'s output, saved, is a design `calibrate --design-file` simulates with no edit
    of `DESIGNS`, named by the file; `--set` changes it as any design."""
    import json

    from experiment.__main__ import main

    fitted = fit.describe_fit(replace(C.DESIGNS["mild"], problems=64), ["lr=1e-4", "lr=3e-4"])
    path = tmp_path / "my_study.json"
    path.write_text(json.dumps(fitted))
    assert main(["calibrate", "--replicates", "2", "--draws", "20", "--json", "--design-file",
                 str(path), "--set", "confirm_problems=96"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"my_study"}
    design = out["my_study"]["design"]
    want = {k: v for k, v in fitted.items() if k != "settings"}
    assert {k: design[k] for k in want} == json.loads(json.dumps(want))
    assert design["confirm_problems"] == 96 and design["explore_seeds"] == C.Design().explore_seeds
    (tmp_path / "smooth.json").write_text("{}")
    with pytest.raises(SystemExit):
        main(["calibrate", "--design", "smooth", "--design-file", str(tmp_path / "smooth.json")])
    assert "its name 'smooth' is already a design" in capsys.readouterr().err
