"""Models the trainer holds: the policy and tokenizer from a local folder, the frozen reference,
and activation checkpointing."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from llm.config import TrainConfig

__all__ = [
    "enable_gradient_checkpointing",
    "load_model",
    "load_model_and_tokenizer",
    "load_policy_and_reference",
    "load_tokenizer",
    "reference_precision",
]


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer of a local model folder, exactly as its ``tokenizer.json`` defines it.

    `AutoTokenizer` in transformers 5 picks the class from ``config.json``'s model type, and
    `Qwen2Tokenizer` then replaces the saved pre-tokenizer and decoder with Qwen's byte-level
    ones, which breaks the tiny model's word-level tokenizer (words glued, `<answer>` split).
    `PreTrainedTokenizerFast` loads ``tokenizer.json`` as saved, for real models too.
    """
    if (Path(path) / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def load_model_and_tokenizer(
    path: str | os.PathLike[str], device: str, precision: str = "fp32"
) -> tuple[Any, Any]:
    """`AutoModelForCausalLM` (eval mode) and `load_tokenizer` from a local directory; weights in
    bfloat16 for ``precision = "bf16"``, float32 otherwise (``bf16-mixed`` keeps float32 master
    weights and computes under autocast, or under FSDP2 through its mixed-precision policy:
    `llm.run.distributed.wrap_policy`).

    Raises:
        FileNotFoundError: `path` is not a local folder (models are never downloaded).
    """
    return load_model(path, device, precision), load_tokenizer(path)


def load_model(path: str | os.PathLike[str], device: str, precision: str = "fp32") -> Any:
    """The model of `load_model_and_tokenizer` alone (a folder without a tokenizer will do).

    Raises:
        FileNotFoundError: `path` is not a local folder (models are never downloaded).
    """
    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"model folder {str(path)!r} does not exist (models load from local folders; "
            "nothing is downloaded)"
        )
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


def load_policy_and_reference(
    cfg: TrainConfig,
    path: str | os.PathLike[str],
    device: str,
    *,
    ref_path: str | os.PathLike[str] | None = None,
) -> tuple[Any, Any, Any | None]:
    """``(model, tokenizer, ref_model)``: the policy from `path` (a checkpoint or
    ``cfg.model_path``) with activation checkpointing when ``cfg.system.gradient_checkpointing``, and the
    frozen KL reference when the run uses one (``cfg.uses_reference``: ``kl_coef > 0`` or
    ``control.kl_in_reward``; else None), whole on this device (under FSDP2 the trainer then
    shards it: `llm.run.distributed.wrap_reference`). The reference is the base model
    ``cfg.model_path``, or `ref_path` (a reset reference saved in a checkpoint,
    ``control.reference_reset_every``).

    Raises:
        FileNotFoundError: a model folder does not exist.
    """
    model, tokenizer = load_model_and_tokenizer(path, device, cfg.system.precision)
    if cfg.system.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    ref_model = None
    if cfg.uses_reference:
        ref_model = load_model(ref_path or cfg.model_path, device, reference_precision(cfg))
        ref_model.requires_grad_(False)
    return model, tokenizer, ref_model


def reference_precision(cfg: TrainConfig) -> str:
    """The precision the frozen KL reference loads in: ``"fp32"`` when the run is float32
    throughout, else ``"bf16"`` (frozen: no float32 master copy is needed)."""
    return "fp32" if cfg.system.precision == "fp32" else "bf16"


def enable_gradient_checkpointing(model: Any) -> None:
    """Transformers' activation checkpointing (non-reentrant). Transformers only checkpoints in
    training mode (``GradientCheckpointingLayer`` checks ``self.training``), so the model is put in
    train mode; that is harmless for the Qwen/Llama families (no dropout by default) and a warning
    names any active dropout."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # its new name; the old one warns that v6 removes it
        enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers before the rename
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False
    model.train()
    active = sorted(
        {type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0}
    )
    rates = {
        k: getattr(model.config, k, 0.0)
        for k in ("attention_dropout", "hidden_dropout", "dropout")
        if getattr(model.config, k, 0.0)
    }
    if active or rates:
        warnings.warn(
            f"gradient_checkpointing puts the model in train mode; dropout is active ({rates or active})",
            stacklevel=2,
        )
