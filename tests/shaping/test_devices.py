"""Every method keeps its arrays on its inputs' device.

An array made without ``device=`` (``xp.arange(n)``) lands on torch's default device, the CPU, and
a CUDA batch then fails with "Expected all tensors to be on the same device" (unlikeliness,
pass@k and ProGRPO did, on the first GPU lease of issue 23). No GPU is needed to see it: torch's
``meta`` device refuses to mix with CPU tensors the same way, and runs no arithmetic.
"""

from __future__ import annotations

import pytest
import torch

import shaping

from .helpers import convert
from .strategies import random_batch
from .test_backends import _every_setting, _setting


def test_every_method_keeps_the_inputs_device():
    """Every method at its default and at its custom setting (`test_backends.CUSTOM`): the loss
    of a batch on the meta device is on the meta device."""
    batch = {
        k: v.to("meta") if isinstance(v, torch.Tensor) else v
        for k, v in convert(random_batch(seed=7), "torch").items()
    }

    def check(name: str, which: str) -> None:
        value, _ = shaping.get_method(name).loss(batch, **_setting(name, which))
        assert value.device.type == "meta", f"{name}/{which}: {value.device}"

    _every_setting(check)


def test_a_cpu_array_among_meta_ones_is_refused():
    """The premise: mixing devices raises on meta as it does on CUDA."""
    with pytest.raises(RuntimeError, match="device"):
        _ = torch.ones(3, device="meta") < torch.arange(3)
