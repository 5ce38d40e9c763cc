"""Figure 6 (`toymdp.experiments.passk`): the toy dataset, a quick run, its plot and summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from theory import trees
from toymdp.experiments import passk


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


def test_shapes_and_values(results: dict[str, np.ndarray]) -> None:
    num_prompts = 2 * 2 * len(passk.MULTIPLICITIES)
    num_k = len(passk.PASS_K)
    assert list(results["methods"]) == list(passk.FIG6_METHODS)
    assert results["pass_at_k"].shape == (len(passk.FIG6_METHODS), 2, num_prompts, num_k)
    assert results["base_pass_at_k"].shape == (num_prompts, num_k)
    for key in ("pass_at_k", "base_pass_at_k"):
        assert np.isfinite(results[key]).all()
        assert (results[key] >= -1e-6).all() and (results[key] <= 1 + 1e-6).all()
    # pass@k is nondecreasing in k for every run and prompt.
    assert (np.diff(results["pass_at_k"], axis=-1) >= -1e-6).all()


def test_base_pass_at_k_matches_closed_form(results: dict[str, np.ndarray]) -> None:
    ks = np.asarray(passk.PASS_K, dtype=np.float64)
    expected = 1.0 - (1.0 - passk.BASE_CORRECTNESS) ** ks
    np.testing.assert_allclose(
        results["base_pass_at_k"], np.broadcast_to(expected, results["base_pass_at_k"].shape),
        atol=2e-5,
    )  # fmt: skip


def test_grpo_learns_transfers_and_gains_least_at_large_k(results: dict[str, np.ndarray]) -> None:
    train = results["train_prompts"]
    grpo = list(results["methods"]).index("grpo")
    train_gain = passk.gain_over_base(results, train)[grpo].mean(axis=0)  # (k,)
    heldout_gain = passk.gain_over_base(results, ~train)[grpo].mean(axis=0)
    assert train_gain[0] > 0.5  # the training prompts are learned
    assert heldout_gain[0] > 0.05  # the shared component transfers to unseen prompts
    # Sharpening: the held-out gain shrinks from k = 1 to the largest k.
    assert heldout_gain[-1] < heldout_gain[0] - 0.05


def test_plot_and_summary(results: dict[str, np.ndarray], tmp_path: Path) -> None:
    paths = passk.plot(results, tmp_path)
    assert sorted(p.name for p in paths) == ["fig6_passk.pdf", "fig6_passk.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    summary = passk.summary(results)
    json.dumps(summary)
    assert len(summary["heldout_gain/grpo"]["mean"]) == len(passk.PASS_K)
