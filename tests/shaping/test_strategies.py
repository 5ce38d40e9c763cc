"""The public batch strategies (`shaping.strategies`) draw what their docstrings promise."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

import shaping
from shaping.contract import BASE_KEYS, check_batch
from shaping.strategies import batches, masks, method_batches, reward_groups

_CANDIDATES = {"cand_logp", "cand_logp_old", "sampled_rank"}
_PROMPT = {"prompt_logp", "prompt_mask"}


def _expected_keys(needs: frozenset[str]) -> set[str]:
    keys = {*BASE_KEYS, "logp_ref", *needs}
    if needs & _CANDIDATES:
        keys |= _CANDIDATES
    if needs & _PROMPT:
        keys |= _PROMPT
    return keys


@given(
    needs=st.sets(st.sampled_from(sorted(set(shaping.BATCH_KEYS) - {"is_weight"}))),
    min_g=st.integers(1, 3),
    data=st.data(),
)
def test_batches_hold_the_needed_keys_with_contract_shapes_and_bounds(needs, min_g, data):
    batch = data.draw(batches(needs, min_g, max_b=2, max_g=4, max_t=3, max_n=2, max_p=2))
    assert set(batch) - {"is_weight"} == _expected_keys(frozenset(needs))
    check_batch("drawn", batch)
    n_b, n_g = batch["rewards"].shape
    n_t = batch["mask"].shape[-1]
    assert 1 <= n_b <= 2 and min_g <= n_g <= 4 and 1 <= n_t <= 3
    assert set(np.unique(batch["rewards"])) <= {0.0, 1.0}
    assert set(np.unique(batch["mask"])) <= {0.0, 1.0}
    assert np.all(batch["logp_old"] <= 0.0)
    assert np.all(np.abs(batch["logp"] - batch["logp_old"]) <= 0.6 + 1e-12)
    assert all(np.all(np.isfinite(v)) for v in batch.values())
    if "sampled_rank" in batch:
        n_c = batch["cand_logp"].shape[-1]
        assert 1 <= n_c <= 2 and batch["sampled_rank"].dtype == np.int64
        assert np.all((batch["sampled_rank"] >= 0) & (batch["sampled_rank"] <= n_c))
    if "prompt_logp" in batch:
        assert 1 <= batch["prompt_logp"].shape[1] <= 2
    if "entropy" in batch:
        assert np.all((batch["entropy"] >= 0) & (batch["entropy"] <= 3))
    if "diversity" in batch:
        assert np.all((batch["diversity"] >= 0) & (batch["diversity"] <= 1))
    if "is_weight" in batch:
        assert np.all((batch["is_weight"] >= 0) & (batch["is_weight"] <= 2))


def test_batches_reach_padding_fully_masked_responses_and_every_kind_of_group():
    # Reachability only: the first batch found will do (shrinking it to the smallest took 95%
    # of the test's time and proves nothing more).
    first = settings(phases=[Phase.generate])
    lengths = lambda b: b["mask"].sum(-1)  # noqa: E731
    partial = lambda b: np.any((lengths(b) > 0) & (lengths(b) < b["mask"].shape[-1]))  # noqa: E731
    find(batches(), partial, settings=first)
    find(batches(), lambda b: np.any(lengths(b) == 0), settings=first)
    for kind in (0.0, 1.0, 0.5):  # all wrong, all correct, mixed
        find(batches(min_g=2), lambda b, k=kind: np.any(b["rewards"].mean(1) == k), settings=first)


@given(data=st.data(), n_b=st.integers(0, 3), n_g=st.integers(1, 5))
def test_reward_groups_are_binary_of_the_asked_shape(data, n_b, n_g):
    r = data.draw(reward_groups(n_b, n_g))
    assert r.shape == (n_b, n_g) and set(np.unique(r)) <= {0.0, 1.0}


@given(m=masks(2, 3, 4))
def test_masks_are_float_bits_of_the_asked_shape(m):
    assert m.shape == (2, 3, 4) and m.dtype == np.float64 and set(np.unique(m)) <= {0.0, 1.0}


@pytest.mark.parametrize("name", sorted(shaping.METHODS))
@settings(max_examples=5)
@given(data=st.data())
def test_method_batches_carry_what_the_method_reads(name, data):
    method = shaping.get_method(name)
    batch = data.draw(method_batches(name))
    assert method.needs_for() <= set(batch)
    check_batch(name, batch)
    assert np.isfinite(float(method.loss(batch)[0]))


@pytest.mark.parametrize("name", sorted(shaping.METHODS))
@settings(max_examples=3)
@given(data=st.data())
def test_the_smallest_batch_a_method_is_drawn_is_one_it_takes(name, data):
    """The smallest sizes `method_batches` draws (a group of one, one candidate, unless the
    method's `sizes` ask for more: pass@k's G >= k, CaSP's N >= top_n) run through the method's
    loss, so a user's property test of any method never draws a batch the method refuses."""
    method = shaping.get_method(name)
    least = method.min_sizes()
    g, n = least.get("G", 1), least.get("N", 1)
    batch = data.draw(batches(method.needs_for(), g, max_b=1, max_g=g, max_t=2, min_n=n, max_n=n))
    assert np.isfinite(float(method.loss(batch)[0]))


def test_a_methods_sizes_follow_its_hyper_parameters_and_are_checked_at_registration():
    assert shaping.get_method("passk").min_sizes(k=6) == {"G": 6}
    assert shaping.get_method("casp").min_sizes() == {"N": 3}
    assert shaping.get_method("grpo").min_sizes() == {}
    with pytest.raises(ValueError, match=r"sizes \{'T': 'k'\}: each axis one of \('G', 'N'\)"):
        shaping.register("never_added", sizes={"T": "k"})(_own_method)
    assert "never_added" not in shaping.METHODS


@settings(max_examples=10)
@given(passk=method_batches("passk", k=7), casp=method_batches("casp"))
def test_method_batches_draw_from_the_methods_least_sizes_up(passk, casp):
    assert passk["rewards"].shape[1] >= 7  # beyond MAX_G: the largest group grows to fit
    assert casp["cand_logp"].shape[-1] >= 3


def _own_method(batch, *, k: int = 2):
    """An advantage of one's own.

    Source: this test.
    """
    return batch["rewards"] - batch["rewards"].mean(axis=1, keepdims=True)


@given(batch=method_batches("casp", entropy_coef=0.01))
def test_method_batches_follow_the_hyper_parameters(batch):
    assert {"entropy", *_CANDIDATES} <= set(batch)


@pytest.mark.parametrize(
    ("strategy", "error"),
    [
        (batches({"logits"}), r"needs: unknown batch key\(s\) \['logits'\]; known: \['rewards'"),
        (batches(max_t=0), "max_t must be an int >= 1, got 0"),
        (batches(min_g=3, max_g=2), "max_g must be an int >= 3, got 2"),
        (reward_groups(1, 0), "n_g must be an int >= 1, got 0"),
        (masks(1, -1, 2), "n_g must be an int >= 0, got -1"),
    ],
)
def test_bad_sizes_and_keys_are_refused_with_their_name(strategy, error):
    with pytest.raises(ValueError, match=error):
        find(strategy, lambda _: True)


def test_an_unknown_method_or_hyper_parameter_is_refused():
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        method_batches("nope")
    with pytest.raises(ValueError, match="bogus"):
        method_batches("grpo", bogus=1)
