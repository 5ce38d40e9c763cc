"""Figure 3 (Theorem 3.4 / B.10), quick mode: shapes, files, the pinned counterexample and the
proven facts every point of the figure must obey."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toymdp.experiments import theorem_3_4 as E

# The module runs a whole figure experiment.
pytestmark = pytest.mark.slow

PREFIXES = ("tree", "pin")


@pytest.fixture(scope="module")
def results() -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in E.run(quick=True, seed=0).items()}


def test_shapes_and_finite(results: dict) -> None:
    for prefix in PREFIXES:
        n = results[f"{prefix}/eta"].size
        for key in ("ent_p", "ent_v", "ent_kl", "margin", "bound", "ds_kl", "ds_p", "ds_v"):
            arr = results[f"{prefix}/{key}"]
            assert arr.shape == (n,), key
            assert np.isfinite(arr).all(), key
        assert results[f"{prefix}/ds_params"].shape == (n, 3)
    assert np.isclose(results["pin/eta"], E.PIN_ETA).any()
    found = results["counts/found"]
    assert found.shape == (E.QUICK["count_trees"], len(E.COUNT_BETAS), E.QUICK["count_etas"])


def test_minimal_counterexample_matches_theory_doc(results: dict) -> None:
    """docs/theorem_3_4.md: P(π_ent) = 0.71680, and for every divergence the least DS value
    exceeds ε (KL: 0.069841 < 0.074428), certified by the proven bound."""
    i = int(np.argmin(np.abs(results["pin/eta"] - E.PIN_ETA)))
    assert results["pin/ent_p"][i] == pytest.approx(0.71680, abs=1e-5)
    assert not results["pin/ds_found"][i]
    assert not results["pin4/found"].any()
    assert (results["pin4/bound"] > results["pin4/epsilon"]).all()
    kl = list(results["pin4/kind"]).index("kl")
    assert results["pin4/epsilon"][kl] == pytest.approx(0.069841, abs=1e-6)
    assert results["pin4/min_divergence"][kl] == pytest.approx(0.074428, abs=1e-6)
    assert float(results["pin4/p_min"]) == pytest.approx(0.72447, abs=1e-5)


def test_proven_conditions_hold(results: dict) -> None:
    """margin > 0 ⇒ witness (sufficient); no witness ⇒ bound > ε (the search agrees with the
    necessary condition); each DS point keeps P ≥ P(π_ent), V ≤ V(π_ent); witnesses fit in ε."""
    for prefix in PREFIXES:
        g = lambda k, p=prefix: results[f"{p}/{k}"]  # noqa: E731
        found = g("ds_found").astype(bool)
        assert found[g("margin") > 0].all(), prefix
        assert (g("bound")[~found] > g("ent_kl")[~found]).all(), prefix
        assert (g("ds_p") >= g("ent_p") - 1e-9).all(), prefix
        assert (g("ds_v") <= g("ent_v") * (1 + 1e-9) + 1e-12).all(), prefix
        assert (g("ds_kl")[found] <= g("ent_kl")[found] * (1 + 1e-9) + 1e-12).all(), prefix
        # Some η on each instance have no witness: the figure's point.
        assert (~found).any(), prefix
    assert results["counts/found"][results["counts/margin_pos"]].all()
    assert not results["counts/found"][results["counts/certified_none"]].any()


def test_no_policy_beats_the_kl_tilt(results: dict) -> None:
    """The KL-regularized optimum (η = 0) is the most correct policy within its KL (Lemma B.1):
    every entropy-bonus and DS point lies on or below that frontier."""
    for prefix in PREFIXES:
        tilt_kl, tilt_p = results[f"{prefix}/tilt_kl"], results[f"{prefix}/tilt_p"]
        order = np.argsort(tilt_kl)
        tilt_kl, tilt_p = tilt_kl[order], tilt_p[order]
        for kind in ("ent", "ds"):
            kl, p = results[f"{prefix}/{kind}_kl"], results[f"{prefix}/{kind}_p"]
            idx = np.searchsorted(tilt_kl, kl)  # first frontier point with at least this budget
            inside = idx < tilt_kl.size
            assert (p[inside] <= tilt_p[idx[inside]] + 1e-9).all(), (prefix, kind)


def test_plot_and_summary(results: dict, tmp_path: Path) -> None:
    paths = E.plot(results, tmp_path)
    assert sorted(p.name for p in paths) == ["fig3_theorem_3_4.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    summary = E.summary(results)
    json.dumps(summary)
    assert summary["minimal_counterexample"]["kl"]["witness"] is False
    assert summary["tree"]["margin_positive_without_witness"] == 0
