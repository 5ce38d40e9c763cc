"""Figure 1 (the CaSP tree), quick mode: shapes, the initial policy against `theory/`, the
directions the figure reports, and the figure and summary files.

The experiment runs once (module-scoped fixture, ~3 s, one compiled program).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from theory import measures
from toymdp.env import casp_env
from toymdp.experiments import casp_tree as C
from toymdp.experiments._registry import EXPERIMENTS

# The module runs a whole figure experiment.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results() -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in C.run(quick=True, seed=0).items()}


def _main(results: dict, method: str) -> int:
    (i,) = np.flatnonzero(
        (results["variant/method"] == method) & (results["variant/group"] == "main")
    )
    return int(i)


def test_registered() -> None:
    exp = EXPERIMENTS["casp_tree"]
    assert exp.order == 1 and exp.run is C.run


def test_shapes_and_values(results: dict) -> None:
    s, r, u = len(C.variants(quick=True)), int(results["num_seeds"]), int(results["num_updates"])
    assert results["variant/method"].shape == (s,)
    assert results["accuracy"].shape == results["modes"].shape == (s, r)
    assert results["final_prob"].shape == (s, r, 64)
    assert results["curve/modes"].shape == results["curve/accuracy"].shape == (s, u + 1)
    for key in ("accuracy", "modes", "final_prob", "curve/accuracy", "curve/modes"):
        assert np.isfinite(results[key]).all(), key
    np.testing.assert_allclose(results["final_prob"].sum(-1), 1.0, atol=1e-5)
    assert (results["modes"] >= 0).all() and (results["modes"] <= 6 + 1e-5).all()
    # Accuracy of the final policy is the mass of the correct set, by two routes.
    mass = results["final_prob"][..., results["correct"]].sum(-1)
    np.testing.assert_allclose(results["accuracy"], mass, atol=1e-5)


@pytest.mark.parametrize("skew", sorted(C.SKEWS.values()))
def test_initial_policy_matches_theory(results: dict, skew: float) -> None:
    """Update 0 is the run's base policy (skewed or uniform): accuracy and modes from
    `theory.measures`."""
    env = casp_env(C.base_logits(skew))
    log_pb, correct = env.base_log_probs()[0], env.correct[0]
    assert correct.sum() == 6
    acc0 = measures.correctness(log_pb, correct)
    modes0 = measures.expected_distinct(log_pb, C.DISTINCT_K, correct)
    sel = np.isclose(results["variant/skew"], skew)
    assert sel.any()
    np.testing.assert_allclose(results["curve/accuracy"][sel, 0], acc0, rtol=1e-5)
    np.testing.assert_allclose(results["curve/modes"][sel, 0], modes0, rtol=1e-5)
    if skew == C.SKEW:
        _check_skewed_base(results, log_pb, acc0)


def _check_skewed_base(results: dict, log_pb: np.ndarray, acc0: float) -> None:
    # The numbers the module docstring states for the base policy.
    labels = list(results["labels"])
    assert abs(np.exp(log_pb[labels.index("BDC")]) - 0.36) < 0.005
    assert abs(acc0 - 0.43) < 0.005


def test_directions_reported_in_the_figure(results: dict) -> None:
    """GRPO concentrates on BDC; the entropy bonus buys modes with accuracy; DS-GRPO and CaSP keep
    more modes than GRPO at a small accuracy cost."""
    acc, modes = results["accuracy"], results["modes"]
    grpo, ent = _main(results, "grpo"), _main(results, "entropy_bonus")
    correct_labels = results["labels"][results["correct"]]
    prob = results["final_prob"][grpo][:, results["correct"]]
    assert (correct_labels[prob.argmax(-1)] == "BDC").all()
    assert prob.max(-1).mean() > 0.9
    assert modes[ent].mean() > modes[grpo].mean() + 1.0
    assert acc[ent].mean() < acc[grpo].mean() - 0.3
    for method in ("ds_grpo", "casp"):
        i = _main(results, method)
        assert modes[i].mean() > modes[grpo].mean(), method
        assert acc[i].mean() > 0.9, method


def test_plot_and_summary(results: dict, tmp_path: Path) -> None:
    paths = C.plot(results, tmp_path)
    assert sorted(p.name for p in paths) == ["fig1_casp_tree.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    summary = C.summary(results)
    json.dumps(summary)
    assert set(summary["main"]) == set(C.FOCAL)
    assert set(summary["most_modes_at_accuracy_0.99"]) == set(C.SERIES.values())
    assert 0.0 <= summary["main"]["grpo"]["top_mode_is_BDC"] <= 1.0


def test_best_modes_against_a_plain_loop() -> None:
    """`best_modes` on hand-made results: the most modes among settings with mean accuracy >= 0.99,
    None where no setting reaches it."""
    rows = [
        ("grpo", "grid", 0.0, "adam", 0.1, np.nan, 0.8, 0.995, 3.0),
        ("ds_grpo", "grid", 0.0, "adam", 0.1, 0.3, 0.8, 0.999, 4.0),
        ("ds_grpo", "grid", 0.0, "adam", 0.1, 1.0, 0.8, 0.98, 5.5),  # too inaccurate
        ("ds_grpo", "grid", 0.0, "adam", 0.1, 3.0, 0.8, 0.992, 4.5),
        ("casp", "grid", 0.0, "adam", 0.1, 1.0, 0.8, 0.5, 6.0),
        ("casp", "grid", 0.0, "adam", 0.1, 1.0, 0.0, 0.99, 5.0),
    ]
    names = ("method", "group", "skew", "optimizer", "lr", "coef", "quantile")
    res = {f"variant/{n}": np.array([r[j] for r in rows]) for j, n in enumerate(names)}
    res["accuracy"] = np.array([[r[7], r[7]] for r in rows])
    res["modes"] = np.array([[r[8] - 0.5, r[8] + 0.5] for r in rows])
    best = C.best_modes(res)
    cell = ("uniform", "adam", 0.1)
    assert best["GRPO"][cell] == {"modes": 3.0, "accuracy": 0.995, "coef": None}
    assert best["DS-GRPO"][cell]["modes"] == 4.5 and best["DS-GRPO"][cell]["coef"] == 3.0
    assert best["CaSP (q 0.8)"][cell] is None
    assert best["CaSP (q 0, no entropy mask)"][cell]["modes"] == 5.0
    assert best["GRPO + entropy"] == {}
    assert ("skewed", "adam", 0.1) not in best["GRPO"]
