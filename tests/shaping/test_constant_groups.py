"""A group of equal rewards carries no signal: its centred rewards, and so GRPO's, Dr. GRPO's and
Lite PPO's advantages, are exactly 0 on every backend (`numerics` version 3,
`numerics.EXACT_CENTRING`).

In float32 ``r - mean(r)`` of a constant group need not be 0 (0.1 × 8 in torch, 0.3 × 7 in NumPy,
or XLA fusing ``sum · (1/G)`` into one multiply-add under the toy engine's options), and GRPO's
division by ``std + eps`` (1e-6) turned that residual into advantages up to 0.06 (docs/numerics.md).
Versions 1-2 keep that arithmetic, so their committed outputs are reproduced under
``SHARPENING_NUMERICS=pinned-v2``; the last test holds it.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import numerics
import shaping
from shaping import methods
from toymdp.engine import COMPILE_OPTIONS

ADVANTAGES = {
    "grpo": shaping.grpo_advantages,
    "dr_grpo": shaping.dr_grpo_advantages,
    "lite_ppo": lambda r: methods.lite_ppo({"rewards": r}),
}


def _numpy(fn, rewards: np.ndarray) -> np.ndarray:
    return np.asarray(fn(rewards))


def _torch(fn, rewards: np.ndarray) -> np.ndarray:
    return fn(torch.from_numpy(rewards)).numpy()


def _toy_engine(fn, rewards: np.ndarray) -> np.ndarray:
    # A new wrapper per call: JAX caches a trace by function, and the tests below change the
    # version the trace reads.
    return np.asarray(jax.jit(lambda r: fn(r), compiler_options=COMPILE_OPTIONS)(rewards))


@settings(max_examples=60, deadline=None)
@given(
    value=st.floats(-10, 10, width=32),
    group=st.integers(1, 40),
    prompts=st.integers(1, 3),
    where=st.sampled_from([_numpy, _torch]),
    name=st.sampled_from(sorted(ADVANTAGES)),
)
def test_a_constant_group_gets_exactly_zero(value, group, prompts, where, name):
    rewards = np.full((prompts, group), value, dtype=np.float32)
    assert np.all(where(ADVANTAGES[name], rewards) == 0)


@pytest.mark.parametrize("group", [5, 6, 7])
def test_a_constant_group_gets_exactly_zero_under_the_toy_engine(group):
    """All-correct groups of 5-7 were the toy engine's case (−0.015 / −0.030 / −0.045 each)."""
    rewards = np.ones((2, group), dtype=np.float32)
    assert np.all(_toy_engine(shaping.grpo_advantages, rewards) == 0)


def _groups(group: int) -> st.SearchStrategy:
    """1-4 groups of `group` float32 rewards."""
    reward = st.floats(-4, 4, width=32)
    return st.lists(st.lists(reward, min_size=group, max_size=group), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(2, 16).flatmap(_groups),
    where=st.sampled_from([_numpy, _torch]),
)
def test_every_other_group_keeps_its_bytes(rows, where):
    """Only constant groups change: version 3's advantages equal version 2's bit for bit on
    every group whose rewards are not all equal (`numpy.where` selects, it does not round)."""
    rewards = np.asarray(rows, dtype=np.float32)
    new = where(shaping.grpo_advantages, rewards)
    with pytest.MonkeyPatch.context() as m:
        m.setitem(numerics._state, "version", 2)
        old = where(shaping.grpo_advantages, rewards)
    mixed = rewards.max(axis=1) > rewards.min(axis=1)
    np.testing.assert_array_equal(new[mixed], old[mixed])
    assert np.all(new[~mixed] == 0)


@pytest.mark.parametrize(
    ("where", "value", "group", "residual"),
    [
        (_numpy, 0.3, 7, True),
        (_torch, 0.1, 8, True),  # Countdown's all-well-formed-but-wrong group (format_score 0.1)
        (_toy_engine, 1.0, 7, True),
        (_toy_engine, 1.0, 8, False),  # binary rewards, 1 / G exact: 0 under every version
    ],
    ids=["numpy-0.3x7", "torch-0.1x8", "toy-engine-1x7", "toy-engine-1x8"],
)
def test_version_2_keeps_its_arithmetic(monkeypatch, where, value, group, residual):
    """``SHARPENING_NUMERICS=pinned-v2`` reproduces the outputs recorded under version 2,
    residual included (the values of docs/numerics.md)."""
    monkeypatch.setitem(numerics._state, "version", 2)
    rewards = np.full((2, group), value, dtype=np.float32)
    assert bool(np.any(where(shaping.grpo_advantages, rewards) != 0)) is residual
