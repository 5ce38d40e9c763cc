"""Figure 7 (`toymdp.experiments.multiplicity`): entropy control as `ds_grpo` settings, a quick
run grouped by `|C|`, its plot and summary."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import shaping
from toymdp.experiments import multiplicity, passk

# The module runs a whole figure experiment.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results() -> dict[str, np.ndarray]:
    return multiplicity.run(True, 0)


@pytest.mark.parametrize("name", ["entropy_bonus", "entropy_penalty"])
def test_entropy_methods_are_ds_grpo_settings(name: str) -> None:
    """The figure runs the global entropy bonus/penalty as `ds_grpo` with `(γ_p, γ_n) = (±η, ∓η)`:
    the advantages must be the registry's trajectory-form ones."""
    batch = shaping.example_batch((), 3, 6, 4, 1, jnp, seed=0)
    gamma_p, gamma_n = passk.METHODS[name]
    # Traced-like 0-d arrays, as the simulator passes its swept settings (unchecked sign).
    ds = shaping.METHODS["ds_grpo"].advantages(
        batch, gamma_p=jnp.asarray(gamma_p), gamma_n=jnp.asarray(gamma_n)
    )
    ref = shaping.METHODS[name].advantages(batch, eta=passk.ETA, form="trajectory")
    np.testing.assert_allclose(np.asarray(ds), np.asarray(ref), rtol=1e-5, atol=1e-6)


def test_shapes(results: dict[str, np.ndarray]) -> None:
    assert list(results["methods"]) == list(multiplicity.FIG7_METHODS)
    train = results["train_prompts"]
    effect = multiplicity.effect_vs_grpo(results, ~train)
    assert effect.shape == (4, 2, len(passk.MULTIPLICITIES), len(passk.PASS_K))
    assert np.isfinite(effect).all()
    np.testing.assert_array_equal(effect[0], 0.0)


def test_penalty_beats_bonus_on_heldout_pass_at_1(results: dict[str, np.ndarray]) -> None:
    """The global entropy penalty sharpens the shared policy, the bonus flattens it: on unseen
    prompts the penalty's pass@1 is the higher one (averaged over multiplicities)."""
    effect = multiplicity.effect_vs_grpo(results, ~results["train_prompts"])
    names = list(results["methods"])
    pass1 = effect[..., 0].mean(axis=(1, 2))  # (S,)
    assert pass1[names.index("entropy_penalty")] > pass1[names.index("entropy_bonus")]


def test_plot_and_summary(results: dict[str, np.ndarray], tmp_path: Path) -> None:
    paths = multiplicity.plot(results, tmp_path)
    assert sorted(p.name for p in paths) == ["fig7_multiplicity.png"]
    summary = multiplicity.summary(results)
    json.dumps(summary)
    assert len(summary["heldout/entropy_bonus_minus_grpo_pass@8"]["mean"]) == len(
        passk.MULTIPLICITIES
    )
