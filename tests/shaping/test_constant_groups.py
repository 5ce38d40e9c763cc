"""A group of equal rewards and GRPO's advantage: a known float32 flaw, held as expected failures.

`shaping.grpo_advantages` computes ``(r - mean) / (std + eps)`` as written. For a constant group
``r - mean`` should be 0; its last-place residual divided by ``std + eps`` (1e-6) is not
(docs/numerics.md, "A constant group's advantages are not exactly 0 in float32", measured there).
Centring constant groups exactly changes the bytes of every committed study, so it waits for a
versioned shaping arithmetic; each case below is a strict expected failure, and passes (failing
the suite) the day the flaw is fixed, so its mark must be removed with the fix.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import shaping
from toymdp.engine import COMPILE_OPTIONS

FLAW = "docs/numerics.md: a constant group's float32 GRPO advantages are not exactly 0"


def _numpy(rewards: np.ndarray) -> np.ndarray:
    return np.asarray(shaping.grpo_advantages(rewards))


def _torch(rewards: np.ndarray) -> np.ndarray:
    torch = pytest.importorskip("torch")
    return shaping.grpo_advantages(torch.from_numpy(rewards)).numpy()


def _toy_engine(rewards: np.ndarray) -> np.ndarray:
    return np.asarray(jax.jit(shaping.grpo_advantages, compiler_options=COMPILE_OPTIONS)(rewards))


@pytest.mark.parametrize(
    ("where", "value", "group"),
    [
        (_numpy, 0.3, 7),  # a non-binary reward, G not a power of 2
        (_torch, 0.1, 8),  # Countdown's all-well-formed-but-wrong group (format_score 0.1)
        (_toy_engine, 1.0, 7),  # an all-correct group of 7 under the toy engine's options
    ],
    ids=["numpy-0.3x7", "torch-0.1x8", "toy-engine-1x7"],
)
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=FLAW)
def test_a_constant_group_gets_exactly_zero_advantage(where, value, group):
    rewards = np.full((2, group), value, dtype=np.float32)
    assert np.all(where(rewards) == 0)


@pytest.mark.parametrize("where", [_numpy, _torch, _toy_engine], ids=["numpy", "torch", "toy"])
def test_binary_constant_groups_of_a_power_of_two_get_exactly_zero(where):
    """Where the flaw does not reach (binary rewards, 1 / G exact), a constant group gets 0."""
    for value in (0.0, 1.0):
        assert np.all(where(np.full((2, 8), value, dtype=np.float32)) == 0), value
