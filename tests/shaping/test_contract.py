"""The batch contract: CONTRACT.md's key table is `BATCH_KEYS`, and `example_batch` obeys it on
every backend and runs every method."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shaping
from shaping.contract import BASE_KEYS, check_batch, contract_table

from .helpers import check_every, jit_each, requires, to_numpy

NAMES = tuple(sorted(shaping.METHODS))
CONTRACT = Path(shaping.__file__).with_name("CONTRACT.md")


def test_contract_md_key_table_is_generated_from_batch_keys():
    assert contract_table() in CONTRACT.read_text(encoding="utf-8"), (
        "shaping/CONTRACT.md's key table is stale: paste shaping.contract.contract_table()"
    )


def _namespace(backend: str):
    requires(backend)
    if backend.startswith("jax"):
        import jax.numpy as jnp

        return jnp
    if backend == "torch":
        import torch

        return torch
    return np


@pytest.mark.parametrize("backend", ["numpy", "jax", "torch"])
def test_example_batch_obeys_the_contract(backend):
    xp = _namespace(backend)
    B, G, T, N, P = 3, 5, 6, 4, 3
    batch = shaping.example_batch(set(shaping.BATCH_KEYS), B, G, T, N, xp, seed=3, P=P)
    assert set(batch) == set(shaping.BATCH_KEYS)
    sizes = {"B": B, "G": G, "T": T, "N": N, "P": P}
    for key, spec in shaping.BATCH_KEYS.items():
        assert tuple(batch[key].shape) == tuple(sizes[a] for a in spec.axes), key
        kind = str(batch[key].dtype)
        assert ("int" in kind) == (spec.dtype == "int"), (key, kind)
    check_batch("example", batch)
    b = {k: to_numpy(v) for k, v in batch.items()}
    mask = b["mask"]
    assert set(np.unique(b["rewards"])) <= {0.0, 1.0}
    assert np.all(b["rewards"].max(1) > b["rewards"].min(1)), "every group is mixed"
    # Prefix masks, at least one token, and one full-length response per group.
    lengths = mask.sum(-1)
    assert np.all(mask == (np.arange(T) < lengths[..., None])) and lengths.min() >= 1
    assert np.all(lengths.max(1) == T)
    for key in ("logp", "logp_old", "logp_ref", "cand_logp", "cand_logp_old", "prompt_logp"):
        assert np.all(b[key] <= 1e-6), key
    rank = b["sampled_rank"].astype(int)
    assert rank.min() >= 0 and rank.max() <= N
    assert np.all(np.diff(b["cand_logp_old"], axis=-1) <= 1e-6), "candidates sorted by pi_old"
    inside = rank < N
    picked = np.take_along_axis(b["cand_logp_old"], np.minimum(rank, N - 1)[..., None], -1)[..., 0]
    np.testing.assert_allclose(b["logp_old"][inside], picked[inside], rtol=1e-5)
    assert np.all(b["logp_old"][~inside] <= picked[~inside] + 1e-6)
    picked_new = np.take_along_axis(b["cand_logp"], np.minimum(rank, N - 1)[..., None], -1)[..., 0]
    np.testing.assert_allclose(b["logp"][inside], picked_new[inside], rtol=1e-5)
    assert np.all((b["entropy"] >= -1e-6) & (b["entropy"] <= np.log(N + 1) + 1e-5))
    assert np.all((b["diversity"] >= 0) & (b["diversity"] <= 1))
    assert np.all(b["prompt_mask"].sum(-1) >= 1)


def test_example_batch_is_seeded_and_backend_independent():
    a = shaping.example_batch({"entropy"}, 2, 3, 4, 2, np, seed=5)
    again = shaping.example_batch({"entropy"}, 2, 3, 4, 2, np, seed=5)
    other = shaping.example_batch({"entropy"}, 2, 3, 4, 2, np, seed=6)
    assert set(a) == {*BASE_KEYS, "entropy"}
    assert all(np.array_equal(a[k], again[k]) for k in a)
    assert not np.array_equal(a["logp"], other["logp"])


def test_example_batch_names_bad_arguments():
    with pytest.raises(ValueError, match=r"unknown batch key.*'entropie'"):
        shaping.example_batch({"entropie"}, 1, 2, 3, 1, np)
    with pytest.raises(ValueError, match="G must be"):
        shaping.example_batch((), 1, 0, 3, 1, np)


@pytest.mark.parametrize("backend", ["numpy", "jax.jit", "torch"])
def test_every_method_runs_on_its_example_batch(backend):
    """Every method's loss and metrics are finite on its example batch, with a KL penalty and an
    entropy bonus on. JAX runs the methods under one ``jax.jit`` (the toy leg's path; eager JAX is
    `test_backends`'s ``jax`` backend): a third of the time of one eager pass, whose cost is a
    compilation per primitive. When tracing them together fails, each method runs alone, so the
    failure names it."""
    hyper = {"kl_coef": 0.1, "entropy_coef": 0.01}
    xp = _namespace(backend)
    batches = {
        name: shaping.example_batch(
            shaping.get_method(name).needs_for(**hyper), 2, 4, 5, 3, xp, seed=1
        )
        for name in NAMES
    }

    def loss(name: str, batch: dict) -> tuple:
        return shaping.get_method(name).loss(batch, **hyper)

    if backend == "jax.jit":
        run = jit_each(loss, batches)
    else:
        run = lambda name: loss(name, batches[name])  # noqa: E731

    def check(name: str) -> None:
        value, metrics = run(name)
        assert np.isfinite(float(value)), name
        assert all(np.all(np.isfinite(to_numpy(v))) for v in metrics.values()), name

    check_every([(name,) for name in NAMES], check)
