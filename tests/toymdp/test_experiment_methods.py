"""Figure 5 (`toymdp.experiments.methods`): the environment-as-data program against
`make_train`, a quick run, a direction of the results, plot and summary."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from toymdp import train as T
from toymdp.experiments import methods


@pytest.fixture(scope="module")
def results() -> dict[str, np.ndarray]:
    return methods.run(True, 0)


def test_train_over_envs_equals_make_train() -> None:
    """Tracing `make_train` with the environment as data gives the run of `make_train` on that
    environment (same draws, same metrics up to float32 rounding)."""
    envs = methods.environments(np.random.default_rng(1))
    config = T.TrainConfig(envs[1], method="grpo", num_updates=5, group_size=4, pass_k=(1,))
    settings, key = T.default_settings(config), jax.random.key(3)
    ref = jax.jit(lambda s, k: T.make_train(config)(s, k)["exact"])(settings, key)
    train = methods.train_over_envs(
        T.TrainConfig(envs[0], method="grpo", num_updates=5, group_size=4, pass_k=(1,))
    )
    got = jax.jit(lambda b, c, s, k: train(b, c, s, k)["exact"])(
        envs[1].base_logits.astype(np.float32), envs[1].correct, settings, key
    )
    for name in ("correctness", "normalized_variance", "entropy"):
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(ref[name]), atol=2e-5)


def test_shapes_and_finite(results: dict[str, np.ndarray]) -> None:
    size = methods.SIZES[True]
    assert list(results["methods"]) == list(methods.QUICK_METHODS)
    shape = (len(methods.QUICK_METHODS), 2, size["num_seeds"], size["num_updates"] + 1, 2)
    for key in methods.METRICS:
        assert results[key].shape == shape
        assert np.isfinite(results[key]).all()
    # The first entry is the base policy, the same for every method.
    first = results["correctness"][:, :, :, 0]  # (methods, E, R, 2)
    np.testing.assert_allclose(first, np.broadcast_to(first[:1, :, :1], first.shape))


def test_diversity_methods_beat_grpo_on_variance(results: dict[str, np.ndarray]) -> None:
    """DS-GRPO and the entropy bonus keep the correct set more even than GRPO (lower normalized
    variance, more distinct correct responses), on both environments, averaged over seeds."""
    names = list(results["methods"])
    final = {k: results[k][:, :, :, -1, 0].mean(axis=2) for k in methods.METRICS}  # (methods, E)
    g = names.index("grpo")
    for other in ("ds_grpo", "entropy_bonus"):
        i = names.index(other)
        assert (final["normalized_variance"][i] < final["normalized_variance"][g]).all()
        assert (final["distinct_correct"][i] > final["distinct_correct"][g]).all()


def test_plot_and_summary(results: dict[str, np.ndarray], tmp_path: Path) -> None:
    paths = methods.plot(results, tmp_path)
    assert sorted(p.name for p in paths) == ["fig5_methods.png"]
    summary = methods.summary(results)
    json.dumps(summary)
    assert set(summary) == set(methods.SHARED_SIZES)
    assert "heldout_correctness" in summary["multi-prompt toy"]["grpo"]
