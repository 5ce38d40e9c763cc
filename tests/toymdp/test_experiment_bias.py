"""Figure 2 (`toymdp.experiments.bias`): a quick run, theory agreement, plot and summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toymdp.experiments import bias

# The module runs a whole figure experiment.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results() -> dict[str, np.ndarray]:
    return bias.run(True, 0)


def test_shapes_and_finite(results: dict[str, np.ndarray]) -> None:
    t, m = results["log_pb"].shape
    n = len(bias.SAMPLE_SIZES)
    size = bias.SIZES[True]
    assert results["a/freq_trained"].shape == (t, n, m)
    s, r = 2, size["seeds"]
    assert results["b/correctness"].shape == (s, r, size["rl_updates"] + 1, t)
    assert results["b/log_pi_final"].shape == (s, r, t, m)
    for key, value in results.items():
        if value.dtype.kind == "f":
            assert np.isfinite(value).all(), key


def test_selection_events_match_closed_form(results: dict[str, np.ndarray]) -> None:
    """Exact-mode training on r̂ increases exactly the responses Lemma B.1's optimum increases
    (those sampled and correct: Prop. B.2's mechanism), and converges to that optimum."""
    np.testing.assert_array_equal(results["a/freq_trained"], results["a/freq_closed_form"])
    assert float(results["a/tv_to_closed_form_max"]) < 0.02
    # Nothing incorrect is ever rewarded, so no incorrect response increases.
    assert (results["a/freq_trained"][~np.broadcast_to(
        results["correct"][:, None], results["a/freq_trained"].shape)] == 0).all()  # fmt: skip


def test_kl_keeps_variance_and_no_kl_sharpens(results: dict[str, np.ndarray]) -> None:
    """Prop. B.3's consequence: with the KL term `V` stays near `V(π_b)`; without it GRPO
    sharpens (`V` grows), and it reaches a higher correctness."""
    ratio = bias.variance_ratio(results)[:, :, -1]  # (S, R): no KL, KL
    assert (ratio[0] > 1.5).all()
    assert (ratio[0] > ratio[1]).all()
    corr = results["b/correctness"][:, :, -1].mean(axis=-1)
    assert (corr[0] > corr[1]).all()
    assert (corr[1] > bias.base_correctness(results).mean()).all()


def test_selection_theory_is_increasing_in_pb_and_n() -> None:
    lp = np.log(np.array([1e-3, 0.01, 0.1, 0.5]))
    th = bias.selection_theory(lp, np.array([1, 4, 16]))
    assert (np.diff(th, axis=1) > 0).all() and (np.diff(th, axis=0) > 0).all()
    np.testing.assert_allclose(th[0], np.exp(lp))


def test_plot_and_summary(results: dict[str, np.ndarray], tmp_path: Path) -> None:
    paths = bias.plot(results, tmp_path)
    assert sorted(p.name for p in paths) == ["fig2_bias.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    summary = bias.summary(results)
    json.dumps(summary)
    assert summary["selection_bias_trained_equals_closed_form"] is True
