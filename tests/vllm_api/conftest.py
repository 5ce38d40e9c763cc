"""Tests against the real vLLM (the pinned `gpu` extra) on a machine without a GPU: `make test-vllm`.

They run in their own venv (`.venv-vllm`, ~9.5 GB: vLLM brings a CUDA build of torch) and are not
collected by `make test` (`tests/conftest.py` ignores this folder when vLLM is not installed). The
engine itself needs a GPU, so `vllm.LLM` is replaced by `RecordingLLM` (`engine_stub.py`); every
other vLLM object is the real one: `EngineArgs`, `SamplingParams`, `TokensPrompt`, the method
signatures of `LLM`, the executor's sleep bookkeeping, and the output objects with their log-probs
built by vLLM's own `LogprobsProcessor`. `test_train_e2e.py` runs `python -m llm train` through the
real engine where one can be built (a CUDA GPU) and is skipped otherwise, naming why.
"""

import os

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from llm.model.tiny import build_tokenizer


@pytest.fixture(scope="session")
def tok():
    return build_tokenizer(100)
