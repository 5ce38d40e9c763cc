"""Shared fixtures of the llm tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors on a shared 2-core machine: extra intra-op threads only add synchronization."""
    try:
        import torch
    except ImportError:  # the torch-free task tests still run
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
