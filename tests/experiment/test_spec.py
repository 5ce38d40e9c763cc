"""The shared sweep grammar's checkpoints (`experiment.spec`): the sweep's own and a setting's
that trains another number of steps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiment.spec import extend_checkpoints, parse_checkpoints


def test_parse_checkpoints_counts_and_lists():
    assert parse_checkpoints(3, 120) == (40, 80, 120)
    assert parse_checkpoints([0, 50, 100], 150) == (50, 100, 150)
    with pytest.raises(ValueError, match="checkpoints"):
        parse_checkpoints([200], 150)


def test_extend_checkpoints_examples():
    assert extend_checkpoints((40, 80, 120), 240) == (40, 80, 120, 160, 200, 240)
    assert extend_checkpoints((40, 80, 120), 100) == (40, 80, 100)
    assert extend_checkpoints((40, 80, 120), 130) == (40, 80, 120, 130)
    assert extend_checkpoints((50,), 120) == (50, 100, 120)
    with pytest.raises(ValueError, match="steps"):
        extend_checkpoints((40,), 0)


@given(count=st.integers(1, 6), steps=st.integers(6, 300), other=st.integers(1, 600))
@settings(max_examples=200, deadline=None)
def test_extend_checkpoints_keeps_the_sweeps_steps_and_spacing(count, steps, other):
    """The sweep's steps up to `other` are kept, the last is `other`, the steps ascend, and past
    the sweep's last checkpoint they are spaced as its last two (or its first from 0)."""
    base = parse_checkpoints(count, steps)
    out = extend_checkpoints(base, other)
    assert list(out) == sorted(set(out)) and out[-1] == other
    assert {c for c in base if c <= other} <= set(out)
    assert extend_checkpoints(base, steps) == base
    gap = base[-1] - (base[-2] if len(base) > 1 else 0)
    beyond = [c for c in out if c > base[-1]]
    assert all(b - a == gap for a, b in zip([base[-1], *beyond], beyond[:-1], strict=False))
