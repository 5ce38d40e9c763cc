"""Token-level measures of the sampling policy at evaluation: its entropy per generated token and,
given a reference (base) model, its exact KL to the reference per generated token.

Both come from one teacher-forced forward over the sampled responses (the sampler's texts are not
touched: sampling runs as without them, ``want_logprobs=False``). At response position t, with
``l_t`` the evaluated model's logits and ``r_t`` the reference's, both at the evaluation
temperature tau:

- token entropy ``H_t = -sum_v pi(v) ln pi(v)`` (nats) of the sampler's distribution
  ``pi = softmax(filter(l_t / tau))``, top-k then top-p as the samplers apply them
  (`llm.rollout.stacked.filter_logits`); the entropy the rollouts report
  (`llm.rollout.base.sampler_entropy`), here from a full forward instead of the KV-cached decode
  (equal to float rounding);
- ``KL_t = sum_v p(v) (ln p(v) - ln q(v))`` (nats), exact over the vocabulary, with
  ``p = softmax(l_t / tau)``, ``q = softmax(r_t / tau)``: the full distributions, not top-k/top-p
  filtered (a truncated reference would make the KL infinite where the supports differ). The
  expectation over the policy's own samples of the summed ``KL_t`` is the sequence KL
  ``KL(pi(.|x) || pi_ref(.|x))``; the k1 estimator ``ln p(y_t) - ln q(y_t)`` has the same mean but
  a higher variance.

`token_entropy_kl` is the batched forward, `token_entropy_kl_reference` one forward per prefix
(slow; the tests' reference). Shapes: B prompts, G responses per prompt, P prompt tokens, T
response tokens, V vocabulary entries.
"""

from __future__ import annotations

import torch

from llm.rollout.base import sampler_entropy
from llm.rollout.stacked import filter_logits

__all__ = ["token_entropy_kl", "token_entropy_kl_reference"]

Tensor = torch.Tensor


def _response_logits(
    model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor
) -> Tensor:
    """Logits ``(rows, T, V)`` predicting each response token: prompts ``(rows, P)`` left-padded,
    responses ``(rows, T)``; positions ``cumsum(mask) - 1`` as in `generate`
    (`llm.rollout.hf.sequence_logp`)."""
    device = next(model.parameters()).device
    p_ids, p_mask = prompt_ids.to(device), prompt_mask.to(device).long()
    r_ids = response_ids.to(device)
    ids = torch.cat([p_ids, r_ids], dim=1)  # (rows, P + T)
    # Causal attention: tokens after EOS never influence earlier ones, so attend to all of them.
    attn = torch.cat([p_mask, torch.ones_like(r_ids)], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    return logits[:, p_ids.shape[1] - 1 : -1].float()


@torch.no_grad()
def token_entropy_kl(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    reference: torch.nn.Module | None = None,
    rows_per_forward: int = 64,
) -> tuple[Tensor, Tensor | None]:
    """Per-token entropy of the sampler and exact KL of `model` to `reference` (module docstring).

    Args:
        model: the evaluated (sampling) policy, a causal LM returning ``.logits``.
        prompt_ids, prompt_mask: ``(B, P)``, left-padded (a `RolloutBatch`'s).
        response_ids, response_mask: ``(B, G, T)``; the mask is 1 on generated tokens.
        temperature, top_k, top_p: the sampling settings (top-k 0: off).
        reference: the base model (the same vocabulary), or None (no KL).
        rows_per_forward: responses per forward, at most (bounds the ``(rows, T, V)`` logits).

    Returns:
        ``(entropy, kl)``, each ``(B, G, T)`` float32 on CPU in nats, 0 where the mask is 0; kl is
        None without `reference`.

    Raises:
        ValueError: `rows_per_forward < 1`, or a reference whose vocabulary size differs.
    """
    if rows_per_forward < 1:
        raise ValueError(f"rows_per_forward: expected >= 1, got {rows_per_forward}")
    B, G, T = response_ids.shape
    p_ids = prompt_ids.repeat_interleave(G, dim=0)  # (B*G, P)
    p_mask = prompt_mask.repeat_interleave(G, dim=0)
    r_ids = response_ids.reshape(B * G, T)
    entropy = torch.zeros(B * G, T)
    kl = torch.zeros(B * G, T) if reference is not None else None
    for s in range(0, B * G, rows_per_forward):
        rows = slice(s, s + rows_per_forward)
        logits = _response_logits(model, p_ids[rows], p_mask[rows], r_ids[rows]) / temperature
        sampler = torch.log_softmax(filter_logits(logits, top_k=top_k, top_p=top_p), dim=-1)
        entropy[rows] = sampler_entropy(sampler).cpu()
        if kl is not None:
            assert reference is not None
            ref = _response_logits(reference, p_ids[rows], p_mask[rows], r_ids[rows])
            if ref.shape[-1] != logits.shape[-1]:
                raise ValueError(
                    f"reference: expected the model's vocabulary of {logits.shape[-1]} entries, "
                    f"got {ref.shape[-1]}"
                )
            logp = torch.log_softmax(logits, dim=-1)
            logq = torch.log_softmax(ref / temperature, dim=-1)
            kl[rows] = (logp.exp() * (logp - logq)).sum(-1).cpu()
    mask = response_mask.reshape(B * G, T) > 0
    entropy = entropy.masked_fill(~mask, 0.0).reshape(B, G, T)
    if kl is not None:
        kl = kl.masked_fill(~mask, 0.0).reshape(B, G, T)
    return entropy, kl


@torch.no_grad()
def token_entropy_kl_reference(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    reference: torch.nn.Module | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`token_entropy_kl` computed plainly (slow; the tests' reference): for every generated token,
    one unpadded forward of its prefix through each model, the sums over the vocabulary in float64
    as written in the module docstring."""
    B, G, T = response_ids.shape
    entropy = torch.zeros(B, G, T, dtype=torch.float64)
    kl = torch.zeros(B, G, T, dtype=torch.float64) if reference is not None else None

    def next_logits(m: torch.nn.Module, ids: Tensor) -> Tensor:
        device = next(m.parameters()).device
        return m(input_ids=ids[None].to(device)).logits[0, -1].double().cpu() / temperature

    for b in range(B):
        prompt = prompt_ids[b][prompt_mask[b] > 0]
        for g in range(G):
            for t in range(T):
                if response_mask[b, g, t] <= 0:
                    continue
                prefix = torch.cat([prompt, response_ids[b, g, :t]])
                logits = next_logits(model, prefix)
                kept = filter_logits(logits[None], top_k=top_k, top_p=top_p)[0]
                pi = torch.softmax(kept, dim=-1)
                entropy[b, g, t] = -sum(float(q) * float(torch.log(q)) for q in pi if float(q) > 0)
                if kl is not None:
                    assert reference is not None
                    p = torch.softmax(logits, dim=-1)
                    q = torch.softmax(next_logits(reference, prefix), dim=-1)
                    kl[b, g, t] = float((p * (p.log() - q.log())).sum())
    return entropy.float(), kl.float() if kl is not None else None
