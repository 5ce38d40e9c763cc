"""The rollout backend a config names: `make_backend` (transformers' `model.generate`, or the
colocated vLLM engine), and `RolloutBackendLike`, the part of the contract the trainer uses."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from llm.config import TrainConfig
from llm.rollout.hf import HFGenerateBackend
from llm.rollout.vllm_engine import VLLMBackend

__all__ = ["RolloutBackendLike", "make_backend"]


class RolloutBackendLike(Protocol):
    """The part of `llm.rollout.base.RolloutBackend` the trainer uses (see llm/CONTRACT.md)."""

    def generate(self, prompts: list[str], group_size: int, **kwargs: Any) -> Any: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...


def make_backend(cfg: TrainConfig, model: Any, tokenizer: Any) -> RolloutBackendLike:
    """The rollout backend named by ``cfg.rollout.backend`` (vllm: `llm.rollout.vllm_engine.VLLMBackend` on the
    model folder ``cfg.model_path`` with the ``[vllm]`` settings; it needs CUDA and the `gpu`
    extra).

    Raises:
        ValueError: an unknown ``cfg.rollout.backend``.
    """
    if cfg.rollout.backend == "transformers":
        return HFGenerateBackend(model, tokenizer)
    if cfg.rollout.backend == "vllm":
        v = cfg.vllm
        return VLLMBackend(
            cfg.model_path,
            tokenizer,
            gpu_memory_utilization=v.gpu_memory_utilization,
            sleep_mode=v.sleep_mode,
            tensor_parallel_size=v.tensor_parallel_size,
            max_model_len=v.max_model_len,
            enforce_eager=v.enforce_eager,
            dtype=v.dtype,
            seed=cfg.seed,
        )
    raise ValueError(f"backend: unknown backend {cfg.rollout.backend!r}")
