"""The rollout contract: G sampled responses per prompt with the behaviour log-probs (see
CONTRACT.md). `RolloutBatch` is what every backend returns, `RolloutBackend` the protocol, `Sampling` its
sampling parameters,
`stop_token_ids` the stop ids both backends use, `response_mask_from_eos` the response mask,
`check_sampling` the sampling arguments every backend checks, `sampler_entropy` the sampler's
token entropy (the stacked sampler, `llm.rollout.stacked`, shares them).

Backends: `llm.rollout.hf.HFGenerateBackend` (transformers' `model.generate`) and
`llm.rollout.vllm_engine.VLLMBackend`; `llm.rollout.backend.make_backend` picks one from a config.
Shapes: B prompts, G responses per prompt (a group), P prompt tokens, T response tokens, V
vocabulary entries, N top candidates.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from transformers import GenerationConfig


@dataclass
class RolloutBatch:
    """B prompts with G sampled responses each; every tensor on CPU.

    Positions `t >= T_bg` of a response (after its first EOS, or all of them past the longest
    response) hold `pad_token_id`, mask 0, log-prob 0, entropy 0, candidate ids `pad_token_id` and
    candidate log-probs 0. T is the longest response of the batch (at most `max_new_tokens`).
    """

    prompts: list[str]  # B prompt texts
    prompt_ids: torch.LongTensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P) 1.0 on prompt tokens
    response_ids: torch.LongTensor  # (B, G, T) right-padded with pad_token_id
    response_mask: torch.Tensor  # (B, G, T) 1.0 on generated tokens up to and including EOS
    logp: torch.Tensor  # (B, G, T) log-prob of each sampled token under the sampler (behaviour)
    texts: list[list[str]]  # (B, G) decoded responses (special tokens skipped)
    cand_ids: torch.LongTensor | None = None  # (B, G, T, N) the sampler's top-N ids, rank 1 first
    cand_logp: torch.Tensor | None = None  # (B, G, T, N) their log-probs under the sampler
    entropy: torch.Tensor | None = None  # (B, G, T) the sampler's token entropy

    @property
    def group_size(self) -> int:
        """G."""
        return self.response_ids.shape[1]


@dataclass(frozen=True, slots=True)
class Sampling:
    """How a backend samples: every argument of `RolloutBackend.generate` but the prompts, the
    group size and the generator (one definition for the backends, the stacked sampler, the
    trainer and the evaluation).

    Attributes:
        max_new_tokens: the longest response, in tokens.
        temperature: logits are divided by it (> 0).
        top_p: nucleus threshold in (0, 1] (1 = off).
        top_k: keep the k most likely tokens, before top-p (0 = off).
        top_n: the sampler's top-N candidate ids and log-probs per token (0 = none).
        want_entropy: also report the sampler's token entropy.
        want_logprobs: report log-probs (False: texts only, for evaluation; `logp` NaN on the
            mask).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    top_n: int = 0
    want_entropy: bool = False
    want_logprobs: bool = True

    @classmethod
    def of(cls, sampling: Sampling | None, **fields: Any) -> Sampling:
        """`sampling` with `fields` replaced, or ``Sampling(**fields)`` when None (the keyword
        spelling ``generate(prompts, g, max_new_tokens=8)`` of ``generate(prompts, g,
        Sampling(8))``).

        Raises:
            TypeError: a field `Sampling` does not have, or no ``max_new_tokens``.
        """
        return cls(**fields) if sampling is None else replace(sampling, **fields)


@runtime_checkable
class RolloutBackend(Protocol):
    """Samples G responses per prompt and reports the sampler's (behaviour policy's) log-probs."""

    def generate(
        self,
        prompts: list[str],
        group_size: int,
        sampling: Sampling | None = None,
        *,
        generator: torch.Generator | None = None,
        **fields: Any,
    ) -> RolloutBatch: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...


def stop_token_ids(tokenizer: Any, model_path: str | os.PathLike[str] | None = None) -> list[int]:
    """The ids that end a response, the same for both backends: the tokenizer's EOS id first,
    then the `eos_token_id`s of the model folder's ``generation_config.json`` (an int or a list;
    Qwen2.5-Instruct names 151645 and 151643), without repeats.

    vLLM stops on both by itself (vllm/sampling_params.py, `SamplingParams.
    update_from_generation_config` adds the generation config's EOS ids to `stop_token_ids`), while
    transformers' `generate` stops on the `eos_token_id` it is given; both backends pass this list.

    Args:
        tokenizer: anything with `eos_token_id`.
        model_path: the model folder (None, or a folder without ``generation_config.json``: the
            tokenizer's EOS only).

    Raises:
        ValueError: the tokenizer has no EOS id.
        OSError: ``generation_config.json`` exists but cannot be read (transformers'
            `GenerationConfig.from_pretrained`).
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer: expected eos_token_id to be set")
    ids = [int(tokenizer.eos_token_id)]
    if model_path and (Path(model_path) / "generation_config.json").is_file():
        eos = GenerationConfig.from_pretrained(str(model_path)).eos_token_id
        for i in [] if eos is None else [eos] if isinstance(eos, int) else eos:
            if int(i) not in ids:
                ids.append(int(i))
    return ids


def response_mask_from_eos(
    response_ids: torch.Tensor, eos_token_id: int | Sequence[int]
) -> torch.Tensor:
    """`(..., T)` bool: True up to and including the first stop id (`eos_token_id`, one id or
    several) of each row (all True when there is none, a truncated response). Works when the pad
    id is a stop id."""
    stops = torch.as_tensor(
        [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id),
        dtype=response_ids.dtype,
        device=response_ids.device,
    )
    is_eos = torch.isin(response_ids, stops).long()
    eos_before = torch.cumsum(is_eos, dim=-1) - is_eos  # EOS strictly before t
    return eos_before == 0


def check_sampling(group_size: int, sampling: Sampling, *, max_top_n: int) -> None:
    """The sampling arguments every backend takes (`RolloutBackend.generate`), checked.

    Raises:
        ValueError: `group_size < 1`, `max_new_tokens < 1`, `temperature <= 0`, `top_p` not in
            (0, 1], or `top_n` not in [0, `max_top_n`] (the field named).
    """
    s = sampling
    if group_size < 1:
        raise ValueError(f"group_size: expected >= 1, got {group_size}")
    if s.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected >= 1, got {s.max_new_tokens}")
    if not s.temperature > 0:
        raise ValueError(f"temperature: expected > 0, got {s.temperature}")
    if not 0 < s.top_p <= 1:
        raise ValueError(f"top_p: expected in (0, 1], got {s.top_p}")
    if not 0 <= s.top_n <= max_top_n:
        raise ValueError(f"top_n: expected in [0, {max_top_n}], got {s.top_n}")


def sampler_entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy `(...)` of the sampler's distribution from its log-probs `(..., V)`; entries that
    top-k / top-p removed are -inf and contribute 0 (p log p -> 0), not NaN."""
    p = logprobs.exp()
    return -torch.where(p > 0, p * logprobs, torch.zeros_like(p)).sum(-1)
