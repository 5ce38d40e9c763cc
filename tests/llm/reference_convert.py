"""The per-token Python conversion of vLLM outputs that `llm.rollout.vllm_engine.rollout_batch_from_outputs`
replaced (issue 12 item 6), kept verbatim as the slow, obviously-correct reference: the tests check
the vectorized version equals it, and `bench/bench_vllm_convert.py` times both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import torch

from llm.rollout.base import RolloutBatch
from llm.rollout.vllm_convert import LogprobLike, RequestOutputLike


def reference_rollout_batch_from_outputs(
    prompts: Sequence[str],
    prompt_token_ids: Sequence[Sequence[int]],
    outputs: Sequence[RequestOutputLike],
    group_size: int,
    top_n: int,
    pad_token_id: int,
    eos_token_id: int,
    tokenizer: Any,
) -> RolloutBatch:
    """The `RolloutBatch` of vLLM's `RequestOutput`s, one per prompt, each with G completions.

    Rows are prompt-major (row `b * G + g` is completion g of prompt b, ordered by
    `CompletionOutput.index`). A completion is cut after its first `eos_token_id` (vLLM stops
    there already; this keeps the contract if a different stop token let it run on). Per position,
    `logprobs[t]` is vLLM's dict `token_id -> Logprob`: the sampled token's log-prob is read at its
    id, and the candidates are the `top_n` entries of smallest rank (rank 1 first), which drops
    the sampled token when it was added outside the top N.

    Args:
        prompts: B prompt texts.
        prompt_token_ids: B unpadded prompt token-id lists (what was sent to the engine).
        outputs: B objects with `.outputs`, each G objects with `.index`, `.token_ids` and
            `.logprobs` (a list of per-position dicts, as long as `token_ids`).
        group_size: G.
        top_n: N, candidates per position (0: none; vLLM was asked for `logprobs=top_n`).
        pad_token_id: fills prompt padding (left) and response padding (right).
        eos_token_id: the EOS id; the response mask includes it.
        tokenizer: anything with `batch_decode(list[list[int]], skip_special_tokens=True)`.

    Returns:
        A `RolloutBatch` on CPU: `prompt_ids`/`prompt_mask` (B, P), `response_ids`,
        `response_mask`, `logp` (B, G, T) with T the longest response, `cand_ids`/`cand_logp`
        (B, G, T, N) or None when `top_n == 0`, `entropy` None (vLLM does not report it), `texts`
        (B, G). Outside the mask: ids pad, log-probs 0, candidate ids pad, candidate log-probs 0.

    Raises:
        ValueError: lengths of `prompts`, `prompt_token_ids` and `outputs` differ, a request has
            not G completions, `logprobs` is missing or shorter than `token_ids`, the sampled
            token is missing from its position's dict, or a position has fewer than `top_n`
            candidates.
    """
    B, G, N = len(prompts), group_size, top_n
    if len(prompt_token_ids) != B or len(outputs) != B:
        raise ValueError(
            f"expected one prompt_token_ids list and one output per prompt ({B}), got "
            f"{len(prompt_token_ids)} and {len(outputs)}"
        )

    responses: list[list[int]] = []  # B*G token-id lists, cut after the first EOS
    position_logprobs: list[Sequence[dict[int, LogprobLike]]] = []
    for b, request in enumerate(outputs):
        completions = sorted(request.outputs, key=lambda c: c.index)
        if len(completions) != G:
            raise ValueError(f"prompt {b}: expected {G} completions, got {len(completions)}")
        for completion in completions:
            ids = [int(i) for i in completion.token_ids]
            if eos_token_id in ids:
                ids = ids[: ids.index(eos_token_id) + 1]
            lps = completion.logprobs
            if lps is None or len(lps) < len(ids):
                raise ValueError(
                    f"prompt {b}, completion {completion.index}: expected a logprobs dict per "
                    f"token ({len(ids)}), got {None if lps is None else len(lps)}"
                )
            responses.append(ids)
            position_logprobs.append(lps)

    T = max((len(ids) for ids in responses), default=0)
    response_ids = torch.full((B * G, T), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros(B * G, T)
    logp = torch.zeros(B * G, T)
    cand_ids = torch.full((B * G, T, N), pad_token_id, dtype=torch.long)
    cand_logp = torch.zeros(B * G, T, N)
    for row, (ids, lps) in enumerate(zip(responses, position_logprobs, strict=True)):
        for t, token in enumerate(ids):
            entries = lps[t]
            if token not in entries:
                raise ValueError(f"row {row}, position {t}: sampled token {token} has no log-prob")
            response_ids[row, t] = token
            response_mask[row, t] = 1.0
            logp[row, t] = entries[token].logprob
            if N:
                # A missing rank (never the case for sampled-token log-probs) sorts last.
                ranked = sorted(
                    entries.items(),
                    key=lambda kv: float("inf") if kv[1].rank is None else kv[1].rank,
                )
                if len(ranked) < N:
                    raise ValueError(
                        f"row {row}, position {t}: expected {N} candidates, got {len(ranked)}"
                    )
                for n, (cand, lp) in enumerate(ranked[:N]):
                    cand_ids[row, t, n] = cand
                    cand_logp[row, t, n] = lp.logprob

    P = max((len(ids) for ids in prompt_token_ids), default=0)
    prompt_ids = torch.full((B, P), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros(B, P)
    for b, ids in enumerate(prompt_token_ids):
        if ids:
            prompt_ids[b, P - len(ids) :] = torch.as_tensor(list(ids), dtype=torch.long)
            prompt_mask[b, P - len(ids) :] = 1.0

    texts = tokenizer.batch_decode(responses, skip_special_tokens=True) if responses else []

    def grouped(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(B, G, *x.shape[1:])

    return RolloutBatch(
        prompts=list(prompts),
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=grouped(response_ids),
        response_mask=grouped(response_mask),
        logp=grouped(logp),
        texts=[list(texts[b * G : (b + 1) * G]) for b in range(B)],
        cand_ids=grouped(cand_ids) if N else None,
        cand_logp=grouped(cand_logp) if N else None,
        entropy=None,
    )
