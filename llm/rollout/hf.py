"""The transformers rollout backend: G sampled responses per prompt with the behaviour log-probs
(see CONTRACT.md and `llm.rollout.base`).

`HFGenerateBackend` samples with transformers' `model.generate` (CPU or GPU); the vLLM backend
(`llm.rollout.vllm_engine.VLLMBackend`) implements the same `RolloutBackend` protocol. Shapes:
B prompts, G responses per prompt (a group), P prompt tokens, T response tokens, V vocabulary
entries, N top candidates.

Sources read (transformers 5.23, the installed version; the API is the same since 4.38):
- `GenerationMixin._sample` (transformers/generation/utils.py): at every step
  `next_token_scores = logits_processor(input_ids, next_token_logits)` is what
  `output_scores=True` stores (one `(B*G, V)` tensor per step; `output_logits=True` stores the raw
  logits instead), and the token is `torch.multinomial(softmax(next_token_scores))` drawn from the
  *global* torch RNG; finished rows are filled with `pad_token_id`.
- `GenerationMixin._get_logits_processor`: temperature, then top-k (generation default 50, so we
  pass `top_k=0` to disable it), then top-p (filtered entries set to -inf).
- `GenerationMixin._expand_inputs_for_generation`: `num_return_sequences` repeats each prompt with
  `repeat_interleave`, so rows are prompt-major: row `b * G + g`.
- `GenerationMixin._prepare_position_ids_for_generation`: with left padding, positions are
  `attention_mask.cumsum(-1) - 1`; `sequence_logp` reproduces that.
- Docs: https://huggingface.co/docs/transformers/internal/generation_utils (GenerateDecoderOnlyOutput:
  `sequences`, `scores`, `logits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from llm.model.tokens import check_prompts
from llm.rollout.base import (
    RolloutBatch,
    Sampling,
    check_sampling,
    response_mask_from_eos,
    sampler_entropy,
    stop_token_ids,
)


class HFGenerateBackend:
    """`RolloutBackend` on transformers' `model.generate` (multinomial sampling, KV cache).

    Samples from the same `model` object the trainer updates, so `sync_weights` has nothing to do.
    The sampler's distribution at each step is softmax(top-p(logits / temperature)), with top-k
    disabled; `logp`, `cand_logp` and `entropy` are taken from exactly the scores `generate`
    sampled from (`output_scores`), so they are the behaviour policy's, including -inf for
    candidates that top-p removed.

    Memory: `generate` keeps one `(B*G, V)` float32 score tensor per step (not with
    `want_logprobs=False`); fine for the tiny model, but for a 150k vocabulary and long responses
    use the vLLM backend.

    Stops: a response ends at the first of `stop_token_ids` (default `stop_token_ids(tokenizer,
    model.name_or_path)`: the tokenizer's EOS and the model folder's generation-config EOS ids, as
    the vLLM backend stops), included in the mask.
    """

    #: The sampler IS the training policy (same module, same logits): its log-probs, entropies and
    #: top-N candidates are pi_old's (`llm.train.behaviour.sampler_is_behaviour`). A wrapper that passes
    #: the rollout through unchanged may forward this flag; one that edits it must not.
    samples_from_policy = True

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        stop_token_ids: Sequence[int] | None = None,
    ) -> None:
        """Raises: ValueError: a tokenizer without pad or EOS id; OSError: an unreadable
        ``generation_config.json`` in the model's folder."""
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("tokenizer: expected pad_token_id and eos_token_id to be set")
        self.model = model
        self.tokenizer = tokenizer
        if stop_token_ids is None:
            stop_token_ids = _stop_ids_of(model, tokenizer)
        self.stop_token_ids = [int(i) for i in stop_token_ids]

    def sync_weights(self, model: torch.nn.Module) -> None:
        """No-op: this backend samples from the trained model object itself."""

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        group_size: int,
        sampling: Sampling | None = None,
        *,
        generator: torch.Generator | None = None,
        **fields: Any,
    ) -> RolloutBatch:
        """Sample `group_size` responses per prompt with `sampling` (or its `fields` as keywords,
        `Sampling.of`).

        Randomness: transformers' `generate` draws from the global torch RNG and takes no
        generator. With `generator`, one seed is drawn from it and sampling runs under
        `torch.random.fork_rng` seeded with it, so the result depends only on `generator`'s state
        and the global RNG is left untouched. Without it, the global RNG is used (and advanced).
        `top_k` (0 = off) truncates before top-p, as transformers orders its logits processors.
        `want_logprobs=False` (texts only, for evaluation) keeps no scores: `logp` is NaN on the
        mask (0 outside), and `top_n` must be 0 and `want_entropy` False.

        Returns:
            A `RolloutBatch`; response tensors are `(B, G, T)`, candidates `(B, G, T, top_n)`.

        Raises:
            ValueError: empty `prompts`, `group_size < 1`, `max_new_tokens < 1`,
                `temperature <= 0`, `top_p` not in (0, 1], `top_n` not in [0, V], or `top_n > 0`
                or `want_entropy` without `want_logprobs`.
            UnrepresentableNumberError, PromptTooLongError (`llm.model.tokens.check_prompts`): a prompt
                states a number a word-level tokenizer cannot represent, or its tokens plus
                `max_new_tokens` exceed the model's `max_position_embeddings`.
        """
        sampling = Sampling.of(sampling, **fields)
        max_new_tokens, temperature, top_p, top_k = (
            sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k,
        )  # fmt: skip
        top_n, want_entropy, want_logprobs = (
            sampling.top_n, sampling.want_entropy, sampling.want_logprobs,
        )  # fmt: skip
        vocab = self.model.get_output_embeddings().weight.shape[0]
        if not prompts:
            raise ValueError("prompts: expected at least one prompt")
        check_sampling(group_size, sampling, max_top_n=vocab)
        if not want_logprobs and (top_n or want_entropy):
            raise ValueError("want_logprobs=False: expected top_n = 0 and want_entropy = False")

        tok = self.tokenizer
        device = self.model.device
        enc = tok(list(prompts), return_tensors="pt", padding=True, padding_side="left")
        prompt_ids = enc.input_ids.to(device)  # (B, P)
        prompt_mask = enc.attention_mask.to(device)  # (B, P)
        check_prompts(
            tok, prompts, lengths=enc.attention_mask.sum(-1).tolist(),
            max_positions=getattr(self.model.config, "max_position_embeddings", None),
            max_new_tokens=max_new_tokens,
        )  # fmt: skip
        B, P, G = prompt_ids.shape[0], prompt_ids.shape[1], group_size

        was_training = self.model.training
        self.model.eval()
        try:
            if generator is None:
                out = self._sample(
                    prompt_ids, prompt_mask, G, max_new_tokens, temperature, top_p, top_k,
                    scores=want_logprobs,
                )  # fmt: skip
            else:
                seed = int(torch.randint(0, 2**62, (1,), generator=generator))
                devices = [device] if device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices, device_type=device.type):
                    torch.manual_seed(seed)
                    out = self._sample(
                        prompt_ids, prompt_mask, G, max_new_tokens, temperature, top_p, top_k,
                        scores=want_logprobs,
                    )  # fmt: skip
        finally:
            self.model.train(was_training)

        response = out.sequences[:, P:]  # (B*G, T)
        T = response.shape[1]
        mask = response_mask_from_eos(response, self.stop_token_ids)  # (B*G, T)
        logp = torch.empty(B * G, T, device=device)
        if not want_logprobs:
            logp.fill_(float("nan"))
        entropy = torch.empty(B * G, T, device=device) if want_entropy else None
        cand_ids = torch.empty(B * G, T, top_n, dtype=torch.long, device=device)
        cand_logp = torch.empty(B * G, T, top_n, device=device)
        # Step by step: a (B*G, T, V) stack would double the memory `generate` already holds.
        for t, scores in enumerate(out.scores if want_logprobs else ()):
            logprobs = torch.log_softmax(scores.float(), dim=-1)  # (B*G, V) the sampler's
            logp[:, t] = logprobs.gather(-1, response[:, t, None]).squeeze(-1)
            if entropy is not None:
                entropy[:, t] = sampler_entropy(logprobs)
            if top_n:
                cand_logp[:, t], cand_ids[:, t] = torch.topk(logprobs, top_n, dim=-1)

        # Past the first EOS the rows hold padding whose log-probs mean nothing (maybe -inf).
        response = response.masked_fill(~mask, tok.pad_token_id)
        logp = logp.masked_fill(~mask, 0.0)
        if entropy is not None:
            entropy = entropy.masked_fill(~mask, 0.0)
        texts = tok.batch_decode(response, skip_special_tokens=True)

        def grouped(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(B, G, *x.shape[1:]).cpu()

        return RolloutBatch(
            prompts=list(prompts),
            prompt_ids=prompt_ids.cpu(),
            prompt_mask=prompt_mask.float().cpu(),
            response_ids=grouped(response),
            response_mask=grouped(mask.float()),
            logp=grouped(logp),
            texts=[texts[b * G : (b + 1) * G] for b in range(B)],
            cand_ids=grouped(cand_ids.masked_fill(~mask[..., None], tok.pad_token_id))
            if top_n
            else None,
            cand_logp=grouped(cand_logp.masked_fill(~mask[..., None], 0.0)) if top_n else None,
            entropy=grouped(entropy) if entropy is not None else None,
        )

    def _sample(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int = 0,
        *,
        scores: bool = True,
    ):
        return self.model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,  # 0 = off: the generation default of 50 would truncate the distribution
            max_new_tokens=max_new_tokens,
            num_return_sequences=group_size,
            return_dict_in_generate=True,
            output_scores=scores,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.stop_token_ids,  # a list: stops on any of them
        )


def _stop_ids_of(model: Any, tokenizer: Any) -> list[int]:
    """`stop_token_ids` of the folder `model` was loaded from (`name_or_path`; a model built in
    memory has none: the tokenizer's EOS)."""
    path = getattr(model, "name_or_path", None) or None
    return stop_token_ids(tokenizer, path if path and Path(path).is_dir() else None)


def sequence_logp(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probs of the response tokens under `model` at `temperature` (no top-p), one forward pass.

    The slow, obviously-correct reference for `RolloutBatch.logp` (equal at `top_p=1`): prompt
    `(B, P)` left-padded, responses `(B, G, T)`; positions are `cumsum(mask) - 1` as in
    `generate`. Gradients flow when enabled. Returns `(B, G, T)`, 0 where `response_mask` is 0.
    """
    B, G, T = response_ids.shape
    device = model.device
    p_ids = prompt_ids.to(device).repeat_interleave(G, dim=0)  # (B*G, P)
    p_mask = prompt_mask.to(device).long().repeat_interleave(G, dim=0)
    r_ids = response_ids.to(device).reshape(B * G, T)
    r_mask = response_mask.to(device).reshape(B * G, T)
    ids = torch.cat([p_ids, r_ids], dim=1)  # (B*G, P+T)
    # Causal attention: tokens after EOS never influence earlier ones, so attend to all of them.
    attn = torch.cat([p_mask, torch.ones_like(r_ids)], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits  # (B*G, P+T, V)
    P = p_ids.shape[1]
    logprobs = torch.log_softmax(logits[:, P - 1 : -1].float() / temperature, dim=-1)  # (B*G, T, V)
    logp = logprobs.gather(-1, r_ids[..., None]).squeeze(-1)
    return torch.where(r_mask > 0, logp, torch.zeros_like(logp)).reshape(B, G, T)
