"""Figure 6 (`toymdp.experiments.passk`): the toy dataset, the frontier sweep's configuration,
a quick run, its lifts, plot and summary."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import shaping
from experiment import estimand, inference
from theory import trees
from toymdp import sweep, sweep_spec
from toymdp.experiments import passk

# The module runs a whole figure experiment.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results() -> dict[str, np.ndarray]:
    return passk.run(True, 0)


def test_toy_dataset_fixes_multiplicity_and_base_correctness() -> None:
    env = passk.toy_dataset(np.random.default_rng(3), per_size=2)
    sizes = passk.multiplicities(2)
    np.testing.assert_array_equal(env.correct.sum(axis=1), sizes)
    assert env.train_prompts.sum() == env.num_prompts // 2
    np.testing.assert_array_equal(sizes[env.train_prompts], sizes[~env.train_prompts])
    log_pb = trees.trajectory_log_probs(env.base_logits, env.num_actions, env.depth)
    base_correctness = np.where(env.correct, np.exp(log_pb), 0.0).sum(axis=1)
    np.testing.assert_allclose(base_correctness, passk.BASE_CORRECTNESS, rtol=1e-10)


def test_full_sweep_meets_the_issue_requirements() -> None:
    """Issue 11: every method of figure 5 (issue 39: but the off-policy-only), >= 4 values each, >= 3 draws, >= 4 seeds, base
    pass@64 <= 0.8, GRPO's reference with a kl_coef sweep and another learning rate."""
    cfg = sweep_spec.parse_config(passk.sweep_doc(False, 0), check_bounds=False)
    rows = passk.method_rows(cfg, False)
    # Every method that acts here (one step per batch: the off-policy-only ones are GRPO).
    on_policy = set(shaping.METHODS) - shaping.OFF_POLICY_ONLY
    assert {r.label for r in rows} == on_policy
    for name in on_policy:
        assert len({r.setting() for r in rows if r.label == name}) >= 4, name
    assert len(cfg.env.draws) >= 3 and len(cfg.seeds) >= 4
    assert 1 - (1 - cfg.env.base_correctness) ** max(cfg.train.pass_k) <= 0.8
    ref = [r.values for r in rows if r.label == "grpo"]
    assert len({v["kl_coef"] for v in ref}) >= 4 and len({v["lr"] for v in ref}) >= 2
    assert len(cfg.eval_steps) >= 4


@pytest.mark.parametrize("row", passk.FAMILY[False], ids=lambda r: f"{r[0]}-{r[1]}")
def test_family_rows_are_their_methods(row: tuple) -> None:
    """Each `FAMILY` row, run as `ds_grpo` with `(γ_p, γ_n)`, has its method's advantages (the
    sign of a traced coefficient is not checked, as the simulator passes them)."""
    name, values, (gamma_p, gamma_n, _, _) = row
    batch = shaping.example_batch((), 3, 6, 4, 1, jnp, seed=1)
    ds = shaping.METHODS["ds_grpo"].advantages(
        batch, gamma_p=jnp.asarray(gamma_p), gamma_n=jnp.asarray(gamma_n)
    )
    own = {k: v for k, v in values.items() if k not in ("kl_coef", "lr")}
    ref = shaping.METHODS[name].advantages(batch, **own)
    np.testing.assert_allclose(np.asarray(ds), np.asarray(ref), rtol=1e-5, atol=1e-6)


def test_shapes_and_base_point(results: dict[str, np.ndarray]) -> None:
    cfg = sweep_spec.parse_config(passk.sweep_doc(True, 0), check_bounds=False)
    n, d, r, t = (
        len(sweep.all_rows(cfg)),
        len(cfg.env.draws),
        len(cfg.seeds),
        len(cfg.eval_steps),
    )
    p = results["train_prompts"].size
    assert results["correctness"].shape == (n, d, r, t, p)
    assert results["pass_at_k"].shape == (n, d, r, t, p, len(cfg.train.pass_k))
    assert sorted(results["row_order"].tolist()) == list(range(n))
    # Step 0 is the tilted base policy: pass@k = 1 - (1 - c)^k exactly, for every row and seed.
    expected = 1 - (1 - cfg.env.base_correctness) ** np.asarray(cfg.train.pass_k, float)
    np.testing.assert_allclose(
        results["pass_at_k"][:, :, :, 0], np.broadcast_to(expected, results["pass_at_k"][:, :, :, 0].shape),
        atol=2e-5,
    )  # fmt: skip


def test_lifts_match_the_reference_hull(results: dict[str, np.ndarray]) -> None:
    """Every inside point's lift is its gain minus GRPO's hull at its pass@1
    (`experiment.estimand`), less the estimated bias of the hull (a maximum of noisy points:
    `experiment.inference`), inside its interval and within ±1 (pass@k) or the measure's span."""
    _, res, _ = passk.analysis(results)
    for metric in passk.MEASURES:
        lr: inference.LiftResult = res[metric]["lift"]
        inside = np.flatnonzero((lr.status == "inside") & ~np.isin(np.arange(lr.x.size),
                                                                   lr.reference))  # fmt: skip
        assert inside.size > 0
        hull = estimand.upper_hull(lr.x[lr.reference], lr.y[lr.reference])
        raw = lr.y[inside] - hull(lr.x[inside])
        span = np.clip(raw - lr.bias[inside], lr.y[inside] - max(0.0, lr.y[lr.reference].max()),
                       lr.y[inside] - min(0.0, lr.y[lr.reference].min()))  # fmt: skip
        np.testing.assert_allclose(lr.lift[inside], span, rtol=1e-12, atol=1e-12)
        assert (lr.lo[inside] <= lr.lift[inside]).all() and (lr.lift[inside] <= lr.hi[inside]).all()
        if metric == "pass_at_k":
            assert (np.abs(lr.lift[inside]) <= 1).all()


def test_plot_and_summary(results: dict[str, np.ndarray], tmp_path: Path) -> None:
    paths = passk.plot(results, tmp_path)
    assert sorted(p.name for p in paths) == ["fig6_frontier.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    summary = passk.summary(results)
    json.dumps(summary)
    for metric in passk.MEASURES:
        rows = summary[metric]["lifts"]
        assert {r["method"] for r in rows} == {"ds_grpo", "entropy_bonus"}
        for name, best in summary[metric]["best"].items():
            same = [r["lift"] for r in rows if r["method"] == name and r["status"] == "inside"]
            assert best["lift"] == max(same)
    assert summary == passk.summary(results)  # deterministic (fixed bootstrap seed)
