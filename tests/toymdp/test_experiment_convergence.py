"""Figure 4 (convergence of exact-gradient training), quick mode: shapes, files, and the property
the figure is about: training ends near `theory/`'s closed-form optimum."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toymdp.experiments import convergence as C

# The module runs a whole figure experiment.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results() -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in C.run(quick=True, seed=0).items()}


def test_shapes_and_finite(results: dict) -> None:
    steps = results["steps"]
    assert steps[0] == 0 and steps[-1] == C.QUICK["num_updates"]
    for objective, anchor in C.RUNS:
        tv = results[f"tv/{objective}/{anchor}"]
        assert tv.shape == (3, C.QUICK["num_trees"], steps.size)
        assert np.isfinite(tv).all()
        assert (tv >= 0).all() and (tv <= 1).all()


def test_training_converges_to_closed_form(results: dict) -> None:
    for objective, anchor in C.RUNS:
        tv = results[f"tv/{objective}/{anchor}"]
        # The base policy is far from every optimum; after 300 Adam steps all runs are close.
        assert tv[..., 0].min() > 5e-2, (objective, anchor)
        assert tv[..., -1].max() < 5e-3, (objective, anchor)
        # The smoother settings (β = 0.3, 1) are at the float32 floor's order.
        assert tv[1:, :, -1].max() < 1e-3, (objective, anchor)


def test_plot_and_summary(results: dict, tmp_path: Path) -> None:
    paths = C.plot(results, tmp_path)
    assert sorted(p.name for p in paths) == ["fig4_convergence.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    summary = C.summary(results)
    json.dumps(summary)
    assert summary["kl"]["final_tv_max"] < 5e-3
    assert set(summary) >= {"kl", "entropy/policy", "entropy/base", "ds/policy", "ds/base"}
