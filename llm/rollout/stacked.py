"""Group sampling for R runs at once: the prompts of every run go through one
`llm.model.stacked.StackedLM` pass, the G responses of each prompt continue its shared keys and
values, and every decoding step is one stacked forward of all runs' rows with a KV cache.

Randomness: run r draws its tokens with its own `torch.Generator` (``torch.multinomial`` on its
rows only, and only while one of them decodes), so its responses, and the state its generator is
left in, depend on its generator and its weights alone, not on the other runs of the batch: a
stacked evaluation that goes on to the next prompts with the same generators samples each model
as alone (`VERSION`; tests/llm/test_batched.py compares batched and alone). The
distribution is the transformers sampler's (`llm.rollout.hf.HFGenerateBackend`): softmax of the
logits / temperature after top-k (0: off) and top-p, the order of transformers' logits
processors (`GenerationMixin._get_logits_processor`, read in transformers 5.x); the top-p rule is
`TopPLogitsWarper`'s (drop the tokens whose ascending cumulative probability is at most
``1 - top_p``, keep at least one). A finished row continues with the pad token, as `generate`
does. The random stream differs from `generate`'s (which draws from the global RNG), so a
batched run does not repeat the samples of a run trained by `llm.train.trainer.train`.

Device: the runs' (``lm.device``); each generator must be on it (a CUDA generator for models on a
GPU). The loop keeps its tensors there; the returned batches are on the CPU.

Shapes: R runs, B prompts per run, G responses per prompt, P prompt tokens, T response tokens,
V vocabulary entries, N top candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from llm.model.stacked import StackedLM
from llm.model.tokens import check_prompts
from llm.rollout.base import (
    RolloutBatch,
    Sampling,
    check_sampling,
    response_mask_from_eos,
    sampler_entropy,
)

__all__ = ["VERSION", "filter_logits", "left_pad", "sample_groups"]

VERSION = 2
"""The stacked sampler's random stream, recorded in the evaluation keys of batched sweeps so that
evaluations of another version are sampled again: 2 draws a run's tokens only while one of its
rows decodes (a generator's state after a call no longer depends on the batch-mates); 1 drew at
every step of the stack. Training is the same under both (each step seeds its generators)."""

Tensor = torch.Tensor


def left_pad(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], width: int = 0
) -> tuple[Tensor, Tensor]:
    """``(ids, mask)`` of `prompts`, each ``(len(prompts), P)`` left-padded with the pad id to
    ``P = max(width, longest prompt)``."""
    encoded = tokenizer(list(prompts), add_special_tokens=True)["input_ids"]
    p = max([width, *map(len, encoded)])
    ids = torch.full((len(encoded), p), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), p), dtype=torch.long)
    for i, row in enumerate(encoded):
        if row:
            ids[i, p - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, p - len(row) :] = 1
    return ids, mask


def filter_logits(scores: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """``(rows, V)`` scores with the tokens outside top-k (0: off), then outside top-p, set to
    -inf (transformers' `TopKLogitsWarper` then `TopPLogitsWarper`)."""
    if top_k > 0 and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p)
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores


@torch.no_grad()
def sample_groups(
    lm: StackedLM,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Sequence[str]],
    group_size: int,
    sampling: Sampling | None = None,
    *,
    generators: Sequence[torch.Generator],
    stop_token_ids: Sequence[int],
    prompt_width: int = 0,
    **fields: Any,
) -> list[RolloutBatch]:
    """`group_size` responses to each prompt of each run, one `RolloutBatch` per run.

    Args:
        lm: the R runs.
        prompts: R lists of B prompt texts (the same B for every run).
        generators: R generators on ``lm.device``, run r's tokens are drawn from
            ``generators[r]`` alone.
        stop_token_ids: a response ends at the first of them (included in its mask).
        prompt_width: left-pad the prompts to at least this many tokens.
        sampling, fields: as `HFGenerateBackend.generate` (`Sampling.of`).

    Returns:
        R `RolloutBatch`es; run r's responses are ``(B, G, T_r)`` with ``T_r`` its longest
        response (at most `max_new_tokens`), the tensors on CPU.

    Raises:
        ValueError: a run count other than ``lm.runs``, runs with different prompt counts,
            `group_size < 1`, `max_new_tokens < 1`, `temperature <= 0`, `top_p` not in (0, 1],
            `top_n` not in [0, V], or `top_n` / `want_entropy` without `want_logprobs`.
        UnrepresentableNumberError, PromptTooLongError (`llm.model.tokens.check_prompts`).
    """
    sampling = Sampling.of(sampling, **fields)
    max_new_tokens, temperature, top_p, top_k = (
        sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k,
    )  # fmt: skip
    top_n, want_entropy, want_logprobs = (
        sampling.top_n, sampling.want_entropy, sampling.want_logprobs,
    )  # fmt: skip
    r = lm.runs
    vocab = lm.config.vocab_size
    if len(prompts) != r or len(generators) != r:
        raise ValueError(
            f"prompts, generators: expected {r} of each (one per run), got {len(prompts)} and "
            f"{len(generators)}"
        )
    b = len(prompts[0])
    if b < 1 or any(len(x) != b for x in prompts):
        raise ValueError(f"prompts: expected the same number (>= 1) per run, got "
                         f"{[len(x) for x in prompts]}")  # fmt: skip
    check_sampling(group_size, sampling, max_top_n=vocab)
    if not want_logprobs and (top_n or want_entropy):
        raise ValueError("want_logprobs=False: expected top_n = 0 and want_entropy = False")

    g, t_max = group_size, max_new_tokens
    flat = [x for run in prompts for x in run]
    prompt_ids, prompt_mask = left_pad(tokenizer, flat, prompt_width)  # (R*B, P)
    check_prompts(
        tokenizer, flat, lengths=prompt_mask.sum(-1).tolist(),
        max_positions=getattr(lm.config, "max_position_embeddings", None),
        max_new_tokens=max_new_tokens,
    )  # fmt: skip
    dev = lm.device
    params = lm.stack()
    ids_d, mask_d = prompt_ids.to(dev), prompt_mask.to(dev)
    prompt_pos = (mask_d.cumsum(-1) - 1).clamp(min=0)
    prefix = lm.encode_prefix(ids_d, mask_d, prompt_pos, params=params)
    rows = r * b * g
    n_run = b * g  # rows per run
    cache = lm.cache_from_prefix(prefix, g, t_max)
    prompt_keys = prefix.mask.long().repeat_interleave(g, dim=0)  # (rows, P)
    next_pos = mask_d.sum(-1).repeat_interleave(g)[:, None]  # (rows, 1)
    logits = prefix.last_logits.repeat_interleave(g, dim=0)  # (rows, V)
    stops = torch.tensor(list(stop_token_ids), dtype=torch.long, device=dev)
    pad = tokenizer.pad_token_id

    tokens = torch.full((rows, t_max), pad, dtype=torch.long, device=dev)
    logp = torch.zeros(rows, t_max, device=dev)
    entropy = torch.zeros(rows, t_max, device=dev) if want_entropy else None
    cand_ids = torch.full((rows, t_max, top_n), pad, dtype=torch.long, device=dev)
    cand_logp = torch.zeros(rows, t_max, top_n, device=dev)
    running = torch.ones(rows, dtype=torch.bool, device=dev)
    steps = 0
    for t in range(t_max):
        scores = filter_logits(logits.float() / temperature, top_k=top_k, top_p=top_p)
        probs = scores.softmax(dim=-1)
        # A run draws only while one of its rows decodes, as it would alone (whose loop stops
        # there), so its generator leaves this call in the same state with any batch-mates.
        decoding = running.view(r, n_run).any(-1).tolist()
        drawn = torch.full((rows,), pad, dtype=torch.long, device=dev)
        for i in range(r):
            if decoding[i]:
                drawn[i * n_run : (i + 1) * n_run] = torch.multinomial(
                    probs[i * n_run : (i + 1) * n_run], 1, generator=generators[i]
                ).squeeze(-1)
        token = torch.where(running, drawn, torch.full_like(drawn, pad))
        tokens[:, t] = token
        if want_logprobs:
            logprobs = torch.log_softmax(scores, dim=-1)
            logp[:, t] = logprobs.gather(-1, token[:, None]).squeeze(-1)
            if entropy is not None:
                entropy[:, t] = sampler_entropy(logprobs)
            if top_n:
                cand_logp[:, t], cand_ids[:, t] = torch.topk(logprobs, top_n, dim=-1)
        running = running & ~torch.isin(token, stops)
        steps = t + 1
        if not bool(running.any()) or t + 1 == t_max:
            break
        key_mask = torch.cat([prompt_keys, torch.ones(rows, t + 1, dtype=torch.long, device=dev)],
                             dim=1)  # fmt: skip
        logits = lm.decode(token[:, None], key_mask, next_pos + t, cache, params=params)[:, -1]

    tokens, logp = tokens.cpu(), logp.cpu()  # the batches are returned on the CPU
    entropy = entropy.cpu() if entropy is not None else None
    cand_ids, cand_logp = cand_ids.cpu(), cand_logp.cpu()
    mask = response_mask_from_eos(tokens[:, :steps], stop_token_ids)  # (rows, steps)
    out = []
    for i in range(r):
        sl = slice(i * n_run, (i + 1) * n_run)
        m = mask[sl]
        length = int(m.any(0).nonzero().max()) + 1 if bool(m.any()) else 1
        m = m[:, :length]
        resp = tokens[sl, :length].masked_fill(~m, pad)
        texts = tokenizer.batch_decode(resp, skip_special_tokens=True)

        def grouped(x: Tensor, sl: slice = sl, length: int = length) -> Tensor:
            y = x[sl, :length]
            return y.reshape(b, g, *y.shape[1:])

        run_logp = grouped(logp).masked_fill(~m.reshape(b, g, length), 0.0)
        if not want_logprobs:
            run_logp = run_logp.masked_fill(m.reshape(b, g, length), float("nan"))
        mask3 = m.reshape(b, g, length)
        out.append(
            RolloutBatch(
                prompts=list(prompts[i]),
                prompt_ids=prompt_ids[i * b : (i + 1) * b],
                prompt_mask=prompt_mask[i * b : (i + 1) * b].float(),
                response_ids=resp.reshape(b, g, length),
                response_mask=mask3.float(),
                logp=run_logp,
                texts=[texts[j * g : (j + 1) * g] for j in range(b)],
                cand_ids=grouped(cand_ids).masked_fill(~mask3[..., None], pad) if top_n else None,
                cand_logp=grouped(cand_logp).masked_fill(~mask3[..., None], 0.0) if top_n else None,
                entropy=grouped(entropy).masked_fill(~mask3, 0.0) if entropy is not None else None,
            )
        )
    return out
