"""`shaping.backend.sqrt`: the correctly rounded square root on every backend, torch's CPU
tensors included (torch's own CPU ``sqrt`` is not, and which inputs it misses changes with the
CPU: `python -m numerics.emulate`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from shaping.backend import sqrt

_VALUES = st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=50, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 5), st.integers(1, 40)), elements=_VALUES))
def test_torch_cpu_sqrt_is_numpys_to_the_bit(x):
    for dtype in (np.float32, np.float64):
        got = sqrt(torch.from_numpy(x.astype(dtype)))
        assert got.dtype == torch.from_numpy(x.astype(dtype)).dtype and got.shape == x.shape
        np.testing.assert_array_equal(got.numpy(), np.sqrt(x.astype(dtype)))
    np.testing.assert_array_equal(sqrt(x), np.sqrt(x))  # NumPy in, NumPy out


def test_torch_cpu_sqrt_is_not_correctly_rounded_here_without_it():
    """Why the helper exists: on this torch, some float32 inputs miss (if none did, torch.sqrt
    would do)."""
    x = torch.rand(4096, generator=torch.Generator().manual_seed(0)) * 10
    missed = int((torch.sqrt(x).numpy() != np.sqrt(x.numpy())).sum())
    if missed == 0:
        pytest.skip("this torch's CPU sqrt is correctly rounded on these inputs")
    assert (sqrt(x).numpy() == np.sqrt(x.numpy())).all()


def test_the_gradient_is_torchs_and_bfloat16_rounds_once_more():
    x = torch.tensor([0.5, 2.0, 9.0], requires_grad=True)
    y = sqrt(x)
    y.sum().backward()
    np.testing.assert_array_equal(y.detach().numpy(), np.sqrt(x.detach().numpy()))
    torch.testing.assert_close(x.grad, 0.5 / torch.sqrt(x.detach()))
    big = sqrt(torch.tensor([float("inf"), 4.0], requires_grad=True))
    assert big[0] == float("inf") and big[1] == 2.0  # inf - inf would make the correction NaN
    b = torch.tensor([2.0, 3.0], dtype=torch.bfloat16)
    assert sqrt(b).dtype == torch.bfloat16
    assert torch.equal(sqrt(b), torch.from_numpy(np.sqrt(b.float().numpy())).to(torch.bfloat16))
