"""The policy's forward pass on a rollout: prompt + response rows, log-probs, entropy, candidates.

A rollout batch ``(B, G, T)`` is flattened into R = B * G rows of prompt + response (`Rows`,
`build_rows`); `policy_forward` reads, under logits / temperature (the sampling distribution),
the per-token quantities every shaping method consumes (`PolicyOutputs`): the log-prob of each
response token, the token entropy, the top-N candidates of the distribution with their
log-probs (CaSP, Lambda^(n)) and the prompt log-probs (ProGRPO). `forward_all` runs it over
micro-batches without grad (the behaviour and reference passes).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

import shaping

__all__ = [
    "LOGIT_CHUNK",
    "PolicyOutputs",
    "Rows",
    "build_rows",
    "chunks",
    "forward_all",
    "policy_forward",
    "precision_autocast",
    "sampled_rank",
    "slice_outputs",
    "token_outputs",
]

Tensor = torch.Tensor

#: Response positions per block of the output head in `policy_forward` (0: the full logits).
#: About ten float32 copies of a block are alive at the peak of a forward + backward that uses
#: the entropy and top-N candidates (tests/llm/test_chunked_logits.py): 256 positions x a 152k
#: vocabulary is 1.6 GB per row, against 49 GB for the full logits of an 8k-token response.
LOGIT_CHUNK = 256


@dataclass
class Rows:
    """A rollout batch flattened to R = B * G rows of prompt + response.

    Attributes:
        input_ids: (R, P + T) prompt (left-padded) then response (right-padded).
        attention_mask: (R, P + T) 1 on real tokens.
        position_ids: (R, P + T) positions counted over real tokens (as `generate` does for
            left-padded prompts).
        response_ids: (R, T); response_mask: (R, T) float.
        prompt_len: P.
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    response_ids: Tensor
    response_mask: Tensor
    prompt_len: int

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, start: int, stop: int) -> Rows:
        return Rows(
            self.input_ids[start:stop],
            self.attention_mask[start:stop],
            self.position_ids[start:stop],
            self.response_ids[start:stop],
            self.response_mask[start:stop],
            self.prompt_len,
        )


def build_rows(
    prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor
) -> Rows:
    """Flatten ``prompt_ids (B, P)`` and ``response_ids (B, G, T)`` into `Rows` (R = B * G)."""
    b, g, t = response_ids.shape
    p_ids = prompt_ids.repeat_interleave(g, dim=0)
    p_mask = prompt_mask.to(torch.long).repeat_interleave(g, dim=0)
    r_ids = response_ids.reshape(b * g, t)
    r_mask = response_mask.reshape(b * g, t).to(torch.float32)
    attn = torch.cat([p_mask, r_mask.to(torch.long)], dim=1)
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return Rows(torch.cat([p_ids, r_ids], dim=1), attn, pos, r_ids, r_mask, prompt_ids.shape[1])


@dataclass
class PolicyOutputs:
    """Per-row quantities of one forward pass (R rows, T response tokens, N candidates).

    Attributes:
        logp: (R, T) log-prob of each response token.
        entropy: (R, T) token entropy, or None.
        cand_ids: (R, T, N) the top-N token ids of this distribution, rank 1 first, or None.
        cand_logp: (R, T, N) log-probs at the candidate ids, or None.
        prompt_logp: (R, P - 1) log-prob of prompt tokens 2..P, or None.
    """

    logp: Tensor
    entropy: Tensor | None = None
    cand_ids: Tensor | None = None
    cand_logp: Tensor | None = None
    prompt_logp: Tensor | None = None


def policy_forward(
    model: torch.nn.Module,
    rows: Rows,
    *,
    temperature: float,
    want_entropy: bool = False,
    n_top: int = 0,
    cand_ids: Tensor | None = None,
    want_prompt: bool = False,
    precision: str = "fp32",
    logit_chunk: int = LOGIT_CHUNK,
) -> PolicyOutputs:
    """Log-probs of `rows` under `model` with logits / `temperature` (the sampling distribution,
    as TRL's `GRPOTrainer` scales them; top-p truncation is not applied, as there).

    Memory: with ``logit_chunk > 0`` (the default) the output head runs on `logit_chunk` response
    positions at a time (`_ChunkedHead`): no (R, T, V) logits tensor exists, only (R, chunk, V)
    float32 blocks, and under grad each block is recomputed in the backward pass rather than
    kept. ``logit_chunk = 0`` is the plain path (the model's full logits; always taken with
    `want_prompt`), kept as the reference the chunked path is tested equal to.

    Args:
        n_top: return the top-`n_top` candidates of this distribution (ignored if `cand_ids`).
        cand_ids: (R, T, N) candidate ids at which to read log-probs (the behaviour policy's).
        precision: ``bf16-mixed`` runs the model under bf16 autocast; log-softmax is always
            computed in float32.
        logit_chunk: response positions per block of the output head (0: no chunking).

    Raises:
        ValueError: ``logit_chunk < 0``.
    """
    if logit_chunk < 0:
        raise ValueError(f"logit_chunk: must be >= 0 (0 = no chunking), got {logit_chunk}")
    p = rows.prompt_len
    t = rows.response_ids.shape[1]
    if logit_chunk > 0 and not want_prompt:
        return _chunked_forward(
            model,
            rows,
            temperature=temperature,
            want_entropy=want_entropy,
            n_top=n_top,
            cand_ids=cand_ids,
            precision=precision,
            chunk=logit_chunk,
        )
    # Only the positions that predict response tokens need logits (a (P, V) float block per row
    # is gigabytes at a 150k vocabulary); ProGRPO's prompt log-probs need them all.
    keep = {} if want_prompt else {"logits_to_keep": t + 1}
    with precision_autocast(rows.input_ids.device, precision):
        out = model(
            input_ids=rows.input_ids,
            attention_mask=rows.attention_mask,
            position_ids=rows.position_ids,
            use_cache=False,
            **keep,
        )
    logits = out.logits.float() / temperature  # (R, P + T, V), or (R, T + 1, V)
    # Position i predicts token i + 1: response token t comes from position P - 1 + t.
    res = token_outputs(
        logits[:, -t - 1 : -1], rows.response_ids, want_entropy=want_entropy, n_top=n_top,
        cand_ids=cand_ids,
    )  # fmt: skip
    if want_prompt and p > 1:
        prompt_lp = torch.log_softmax(logits[:, : p - 1], dim=-1)
        res.prompt_logp = prompt_lp.gather(-1, rows.input_ids[:, 1:p].unsqueeze(-1)).squeeze(-1)
    return res


def token_outputs(
    logits: Tensor,
    targets: Tensor,
    *,
    want_entropy: bool,
    n_top: int = 0,
    cand_ids: Tensor | None = None,
) -> PolicyOutputs:
    """The per-token quantities of `PolicyOutputs` from response logits: the one computation of
    `policy_forward` (its plain path) and `llm.model.stacked.stacked_policy_forward`.

    Args:
        logits: (R, T, V) float32 logits of the sampling distribution (already / temperature),
            position t predicting response token t.
        targets: (R, T) response token ids.
        n_top: read the top-`n_top` candidates of these logits (ignored if `cand_ids`).
        cand_ids: (R, T, N) candidate ids at which to read log-probs, or None.

    Returns:
        ``logp (R, T)``; ``entropy (R, T)`` with `want_entropy`; ``cand_ids``, ``cand_logp``
        ``(R, T, N)`` with candidates.
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    res = PolicyOutputs(logp=logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
    if want_entropy:
        res.entropy = shaping.token_entropy(logits)
    if cand_ids is None and n_top > 0:
        cand_ids = logits.detach().topk(n_top, dim=-1).indices
    if cand_ids is not None:
        res.cand_ids = cand_ids
        res.cand_logp = logprobs.gather(-1, cand_ids)
    return res


class _ChunkedHead:
    """Stands in for the output head's ``forward`` during one model call: maps the last hidden
    states ``(R, T + 1, d)`` to the per-token quantities ``(R, T, 2 + 2N)`` (log-prob of the
    response token, entropy, N candidate log-probs, N candidate ids as floats; ids < 2^24 are
    exact) block by block over positions, so that only ``(R, chunk, V)`` logits exist at a time.

    It runs inside the model's own forward (so DDP and FSDP2 see an ordinary call and the head's
    weight is the gathered one under FSDP2) and under the caller's autocast, so the head's matmul
    is the same bf16 / fp32 product the plain path computes. Under grad each block is wrapped in
    non-reentrant `torch.utils.checkpoint`: the backward pass recomputes its logits.
    """

    def __init__(
        self,
        head: torch.nn.Module,
        targets: Tensor,
        *,
        temperature: float,
        want_entropy: bool,
        n_top: int,
        cand_ids: Tensor | None,
        chunk: int,
    ) -> None:
        self.head, self.targets, self.temperature = head, targets, temperature
        self.want_entropy = want_entropy
        self.n_top = cand_ids.shape[-1] if cand_ids is not None else n_top
        self.cand_ids, self.chunk = cand_ids, chunk

    def _block(self, hidden: Tensor, targets: Tensor, cand: Tensor | None) -> Tensor:
        logits = torch.nn.functional.linear(hidden, self.head.weight, self.head.bias)
        logits = logits.float() / self.temperature  # (R, c, V)
        logprobs = torch.log_softmax(logits, dim=-1)
        logp = logprobs.gather(-1, targets.unsqueeze(-1))
        entropy = (
            shaping.token_entropy(logits).unsqueeze(-1)
            if self.want_entropy
            else torch.zeros_like(logp)
        )
        cols = [logp, entropy]
        if self.n_top > 0:
            if cand is None:
                cand = logits.detach().topk(self.n_top, dim=-1).indices
            cols += [logprobs.gather(-1, cand), cand.to(torch.float32)]
        return torch.cat(cols, dim=-1)  # (R, c, 2 + 2N)

    def __call__(self, hidden: Tensor) -> Tensor:
        hidden = hidden[:, :-1]  # position i predicts response token i
        t = hidden.shape[1]
        width = 2 + 2 * self.n_top
        blocks = []
        for s, e in chunks(t, self.chunk):
            cand = None if self.cand_ids is None else self.cand_ids[:, s:e]
            args = (hidden[:, s:e], self.targets[:, s:e], cand)
            if torch.is_grad_enabled():
                blocks.append(checkpoint(self._block, *args, use_reentrant=False))
            else:
                blocks.append(self._block(*args))
        if not blocks:
            return hidden.new_zeros(hidden.shape[0], 0, width, dtype=torch.float32)
        return torch.cat(blocks, dim=1)


def _output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The output embedding (``lm_head``) of a transformers model, under DDP's ``.module``."""
    inner = getattr(model, "module", model)
    head = inner.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(
            f"logit_chunk: the model's output head is {type(head).__name__}, not nn.Linear; "
            "use logit_chunk = 0"
        )
    return head


def _chunked_forward(
    model: torch.nn.Module,
    rows: Rows,
    *,
    temperature: float,
    want_entropy: bool,
    n_top: int,
    cand_ids: Tensor | None,
    precision: str,
    chunk: int,
) -> PolicyOutputs:
    """`policy_forward` with the output head evaluated by `_ChunkedHead`."""
    t = rows.response_ids.shape[1]
    head = _output_head(model)
    chunked = _ChunkedHead(
        head,
        rows.response_ids,
        temperature=temperature,
        want_entropy=want_entropy,
        n_top=n_top,
        cand_ids=cand_ids,
        chunk=chunk,
    )
    head.forward = chunked  # an instance attribute shadows nn.Linear.forward for this call
    try:
        with precision_autocast(rows.input_ids.device, precision):
            out = model(
                input_ids=rows.input_ids,
                attention_mask=rows.attention_mask,
                position_ids=rows.position_ids,
                use_cache=False,
                logits_to_keep=t + 1,
            )
    finally:
        del head.forward
    packed = out.logits  # (R, T, 2 + 2N)
    n = chunked.n_top
    res = PolicyOutputs(logp=packed[..., 0])
    if want_entropy:
        res.entropy = packed[..., 1]
    if n > 0:
        res.cand_logp = packed[..., 2 : 2 + n]
        res.cand_ids = cand_ids if cand_ids is not None else packed[..., 2 + n :].detach().long()
    return res


def precision_autocast(device: torch.device, precision: str) -> Any:
    """The context a forward pass of ``system.precision`` `precision` runs in: bfloat16 autocast
    on `device` for ``"bf16-mixed"`` (float32 weights, bfloat16 compute), none otherwise."""
    if precision != "bf16-mixed":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive pieces of at most `size` of ``range(n)``."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def forward_all(
    model: torch.nn.Module, rows: Rows, micro_batch_size: int, **kw: Any
) -> PolicyOutputs:
    """`policy_forward` over micro-batches without grad, concatenated."""
    parts = []
    with torch.no_grad():
        for s, e in chunks(len(rows), micro_batch_size):
            sub_kw = dict(kw)
            if kw.get("cand_ids") is not None:
                sub_kw["cand_ids"] = kw["cand_ids"][s:e]
            parts.append(policy_forward(model, rows.slice(s, e), **sub_kw))

    def cat(name: str) -> Tensor | None:
        vals = [getattr(x, name) for x in parts]
        return None if vals[0] is None else torch.cat(vals, dim=0)

    return PolicyOutputs(**{k: cat(k) for k in PolicyOutputs.__dataclass_fields__})


def slice_outputs(out: PolicyOutputs, start: int, stop: int) -> PolicyOutputs:
    """Rows ``start:stop`` of every per-row field (the prompt log-probs included)."""
    return PolicyOutputs(
        **{
            k: None if getattr(out, k) is None else getattr(out, k)[start:stop]
            for k in PolicyOutputs.__dataclass_fields__
        }
    )


def sampled_rank(cand_ids: Tensor, response_ids: Tensor) -> Tensor:
    """0-based rank of each sampled token among the candidates (R, T, N) -> (R, T); N if absent."""
    match = cand_ids == response_ids.unsqueeze(-1)
    first = match.to(torch.int64).argmax(dim=-1)
    return torch.where(match.any(dim=-1), first, torch.full_like(first, cand_ids.shape[-1]))
