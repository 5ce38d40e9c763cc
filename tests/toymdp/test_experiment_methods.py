"""Figure 5 (`toymdp.experiments.methods`): the environment-as-data program against
`make_train`, a quick run, a direction of the results, plot and summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toymdp.experiments import methods

# The module runs a whole figure experiment.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results() -> dict[str, np.ndarray]:
    return methods.run(True, 0)


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
