"""R models of one Llama architecture as one program: a forward pass whose weights carry a leading
run axis (batched runs: `llm.train.batched`).

Why not ``torch.func.vmap`` over the transformers model (`stack_module_state` + `functional_call`):
transformers builds its attention mask with data-dependent control flow (it asks whether a padding
mask is all ones), which vmap refuses ("data-dependent control flow"; measured with transformers
5.24). So the forward is written out here with the run axis in batched matmuls (`torch.baddbmm`,
`torch.bmm`), the network of `transformers.models.llama.modeling_llama` (the installed 5.x source
read: `LlamaRMSNorm`, `LlamaRotaryEmbedding` with the default rope, `apply_rotary_pos_emb`,
`LlamaAttention`, `LlamaMLP`, `LlamaDecoderLayer`), and tested equal to the transformers forward
of each run (tests/llm/test_batched.py).

Shapes: R runs, N rows per run, L positions, H hidden units, heads ``nh`` of ``D`` units, V
vocabulary entries. Rows of a flat batch are **run-major**: rows ``r * N .. (r + 1) * N - 1``
belong to run r.

What it supports (`check_stackable`): `LlamaForCausalLM` (the tiny model of `llm.model.tiny`, or
any Llama folder) with the default rope, SiLU MLP, as many key-value heads as heads or fewer
(grouped-query attention), tied or untied output head, float32 or bfloat16 weights (bfloat16:
norms and softmax in float32 as transformers' Llama, logits returned in float32; gradients in the
weights' dtype, as the transformers model's). Anything else is refused with a message (by a
sweep's batched engine before any run: `config_refusal` of the model folder's config, through
`llm.orchestrate.sweep.check_engine`). A decoding step reads each key-value head once (no
grouped-query copies) from a cache of fixed size, on the models' device.

Gradients flow into every run's own parameters: `stack_parameters` is `torch.stack` of the runs'
tensors, so a loss summed over runs back-propagates to each model's ``.grad`` as if it had been
computed alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, PretrainedConfig

from llm.model.forward import PolicyOutputs, precision_autocast, token_outputs

__all__ = [
    "KVCache",
    "Prefix",
    "StackedLM",
    "check_stackable",
    "config_refusal",
    "folder_refusal",
    "stack_parameters",
    "stacked_policy_forward",
]

Tensor = torch.Tensor


def check_stackable(models: Sequence[torch.nn.Module]) -> None:
    """Raise `ValueError` unless `models` can run as one `StackedLM` (module docstring).

    Raises:
        ValueError: no models, a model that is not a `LlamaForCausalLM` with the default rope and
            SiLU MLP, weights other than float32 or bfloat16, or models whose configs or dtypes
            differ.
    """
    if not models:
        raise ValueError("models: expected at least one model")
    first = models[0].config
    dtypes = (torch.float32, torch.bfloat16)
    dtype = next(models[0].parameters()).dtype
    for i, m in enumerate(models):
        cfg = m.config
        if type(m).__name__ != "LlamaForCausalLM":
            raise ValueError(f"models[{i}]: expected a LlamaForCausalLM, got {type(m).__name__}")
        reason = config_refusal(cfg)
        if reason is not None:
            raise ValueError(f"models[{i}]: {reason}")
        got = next(m.parameters()).dtype
        if got not in dtypes or got != dtype:
            names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise ValueError(f"models[{i}]: {got} weights; expected {names}, one for all models")
        for key in _ARCH_KEYS:
            if getattr(cfg, key, None) != getattr(first, key, None):
                raise ValueError(
                    f"models[{i}]: config {key} = {getattr(cfg, key, None)!r} differs from "
                    f"models[0]'s {getattr(first, key, None)!r}"
                )


def config_refusal(config: PretrainedConfig) -> str | None:
    """Why a model of `config` (a transformers config) cannot run in a `StackedLM`, or None: not
    a Llama, another rope than the default, another activation than SiLU."""
    if config.model_type != "llama":
        return f"model_type {config.model_type!r} (llama only)"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope != "default":
        return f"rope_type {rope!r} is not supported (default only)"
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r} (silu only)"
    return None


def folder_refusal(path: str | os.PathLike[str]) -> str | None:
    """`config_refusal` of the model folder `path`'s ``config.json`` (nothing loaded but the
    config); None also when the folder holds no readable config (its loader reports that)."""
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        return None
    return config_refusal(config)


_ARCH_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "attention_bias",
    "mlp_bias",
    "rms_norm_eps",
    "tie_word_embeddings",
    "rope_parameters",
)


def stack_parameters(models: Sequence[torch.nn.Module]) -> dict[str, Tensor]:
    """``{name: (R, *shape)}``: each parameter of the runs stacked along a new leading run axis
    (``torch.stack``, differentiable into each model's own tensor). Tied weights appear once,
    under the input embedding's name."""
    names = [n for n, _ in models[0].named_parameters()]
    per_model = [dict(m.named_parameters()) for m in models]
    return {n: torch.stack([p[n] for p in per_model]) for n in names}


@dataclass
class Prefix:
    """The prompts' pass, shared by the G rows of each group: per-layer keys and values
    ``(R * B, nkv, P, D)``, the prompt mask ``(R * B, P)`` and the logits at the last prompt
    position ``(R * B, V)`` (they predict every response's first token)."""

    keys: list[Tensor]
    values: list[Tensor]
    mask: Tensor
    last_logits: Tensor


@dataclass
class KVCache:
    """Keys and values of the suffix rows' earlier positions for incremental decoding:
    ``keys[l]``, ``values[l]`` are ``(R * N, nkv, L_max, D)``; `length` positions are filled.
    With a `prefix` (the decoding step's matrix products, `StackedLM.decode_matmul`), the prompt's
    keys and values stay there, once per prompt, read by the `group` rows that continue it, and
    the cache holds the responses' positions alone."""

    keys: list[Tensor]
    values: list[Tensor]
    length: int = 0
    prefix: Prefix | None = None
    group: int = 1

    @property
    def past(self) -> int:
        """Positions before the next token: the prompt's (when shared) and the filled ones."""
        return self.length + (self.prefix.mask.shape[1] if self.prefix is not None else 0)


class StackedLM:
    """The forward pass of R `LlamaForCausalLM` of one architecture, with a run axis.

    Two ways in: `forward` (whole rows, as the transformers model's forward) and, for group
    sampling and the GRPO update, `encode_prefix` + `forward_suffix`: the B prompts of each run
    are run once and their keys and values shared by the G responses of the group (``B * P``
    prompt positions instead of ``B * G * P``; the same arithmetic per position).

    Args:
        models: the R runs' models (`check_stackable`); used, not copied: a later update of a
            model's parameters is seen by the next call (stack once per call, `stack`).
        checkpointing: activation checkpointing (``system.gradient_checkpointing``): with grad
            enabled and no decoding cache, each decoder layer keeps its input alone and runs again
            in the backward pass (`torch.utils.checkpoint`, non-reentrant), as transformers'
            ``gradient_checkpointing_enable`` does per layer; the values are the same.
    """

    def __init__(
        self,
        models: Sequence[torch.nn.Module],
        *,
        checkpointing: bool = False,
    ) -> None:
        check_stackable(models)
        self.checkpointing = checkpointing
        self.models = list(models)
        first = next(self.models[0].parameters())
        self.dtype, self.device = first.dtype, first.device
        cfg = self.models[0].config
        self.config = cfg
        self.n_layers = cfg.num_hidden_layers
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        d = self.head_dim
        # LlamaRotaryEmbedding.compute_default_rope_parameters
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))
        self.tied = bool(cfg.tie_word_embeddings)
        self.padding_idx = self.models[0].get_input_embeddings().padding_idx

    @property
    def runs(self) -> int:
        return len(self.models)

    @property
    def decode_matmul(self) -> bool:
        """Whether a decoding step runs as matrix products with the prompt's keys and values
        shared (on a GPU; `_DECODE_MATMUL` on the CPU) rather than as broadcast products over a
        per-row copy of them (the CPU, whose bytes the committed CPU results are)."""
        return self.device.type != "cpu" or _DECODE_MATMUL

    def parameters(self) -> list[Tensor]:
        """Every run's parameters (each model's own tensors)."""
        return [p for m in self.models for p in m.parameters()]

    def stack(self) -> dict[str, Tensor]:
        """The runs' current parameters, stacked (`stack_parameters`)."""
        return stack_parameters(self.models)

    # -----------------------------------------------------------------------------------------
    # Entry points

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        *,
        params: dict[str, Tensor] | None = None,
        logits_to_keep: int = 0,
    ) -> Tensor:
        """Logits of run-major rows, as the transformers forward of each run.

        Args:
            input_ids: (R * N, L) token ids; rows of run r are ``r * N .. (r + 1) * N - 1``.
            attention_mask: (R * N, L) 1 on real tokens.
            position_ids: (R * N, L) positions (``cumsum(mask) - 1`` for left-padded prompts).
            params: `stack` of the runs (default: stacked now).
            logits_to_keep: only the last this many positions get logits (0: all).

        Returns:
            (R * N, L_kept, V) float32 logits.

        Raises:
            ValueError: rows not divisible by the number of runs, or a mask of another shape.
        """
        logits, _ = self._run(input_ids, attention_mask, position_ids, params, None, 1, None,
                              logits_to_keep)  # fmt: skip
        return logits

    __call__ = forward

    def encode_prefix(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        *,
        params: dict[str, Tensor] | None = None,
    ) -> Prefix:
        """Run the prompts (R * B, P), left-padded: their per-layer keys and values and the
        logits at the last position (`Prefix`)."""
        logits, kv = self._run(input_ids, attention_mask, position_ids, params, None, 1, None, 1,
                               keep_kv=True)  # fmt: skip
        assert kv is not None
        return Prefix(kv[0], kv[1], attention_mask.bool(), logits[:, -1])

    def forward_suffix(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        prefix: Prefix,
        *,
        group: int,
        params: dict[str, Tensor] | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Logits of the suffix rows (R * B * G, L) that continue `prefix`'s prompts, row
        ``i`` continuing prompt ``i // group``.

        Args:
            attention_mask: (R * B * G, past + L) 1 on real suffix tokens: with `cache`, the
                mask of the cached positions first; the prompt's mask comes from `prefix`.
            position_ids: (R * B * G, L).
            cache: the suffix's earlier keys and values (decoding); filled in place.

        Returns:
            (R * B * G, L, V) float32 logits.
        """
        logits, _ = self._run(input_ids, attention_mask, position_ids, params, prefix, group,
                              cache, 0)  # fmt: skip
        return logits

    def decode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: KVCache,
        *,
        params: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Logits of the next positions of rows whose earlier keys and values are in `cache`
        (`cache_from_prefix`), which is filled in place.

        Args:
            input_ids, position_ids: (rows, L) the new tokens and their positions.
            attention_mask: (rows, cache.length + L) 1 on real tokens, cached positions first.

        Returns:
            (rows, L, V) float32 logits.
        """
        logits, _ = self._run(input_ids, attention_mask, position_ids, params, None, 1, cache, 0)
        return logits

    def cache_from_prefix(self, prefix: Prefix, group: int, extra: int) -> KVCache:
        """A `KVCache` for the ``R * B * group`` rows that continue `prefix`'s prompts (row
        ``i`` continues prompt ``i // group``), holding the prompts' keys and values and room for
        `extra` more positions: the prompt is copied once, not at every decoding step. Under
        `decode_matmul` the prompt's keys and values are not copied at all: the cache refers to
        `prefix`, and every row of a group reads its prompt's."""
        rows = prefix.mask.shape[0] * group
        p = prefix.mask.shape[1]
        if self.decode_matmul:
            cache = self.new_cache(rows, extra, prefix.keys[0].device)
            cache.prefix, cache.group = prefix, group
            return cache
        cache = self.new_cache(rows, p + extra, prefix.keys[0].device)
        for layer in range(self.n_layers):
            cache.keys[layer][:, :, :p] = prefix.keys[layer].repeat_interleave(group, dim=0)
            cache.values[layer][:, :, :p] = prefix.values[layer].repeat_interleave(group, dim=0)
        cache.length = p
        return cache

    def new_cache(self, rows: int, max_len: int, device: torch.device | str = "cpu") -> KVCache:
        """An empty `KVCache` for `rows` (all runs') suffix rows and `max_len` positions, in the
        weights' dtype."""
        shape = (rows, self.n_kv, max_len, self.head_dim)
        # Uninitialized: positions past `length` are never read.
        return KVCache(
            [torch.empty(shape, device=device, dtype=self.dtype) for _ in range(self.n_layers)],
            [torch.empty(shape, device=device, dtype=self.dtype) for _ in range(self.n_layers)],
        )

    # -----------------------------------------------------------------------------------------
    # The network

    def _run(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        params: dict[str, Tensor] | None,
        prefix: Prefix | None,
        group: int,
        cache: KVCache | None,
        logits_to_keep: int,
        *,
        keep_kv: bool = False,
    ) -> tuple[Tensor, tuple[list[Tensor], list[Tensor]] | None]:
        p = self.stack() if params is None else params
        rn, length = input_ids.shape
        r = self.runs
        if rn % r:
            raise ValueError(f"input_ids: {rn} rows are not divisible by the {r} runs")
        n = rn // r
        past = cache.past if cache is not None else 0
        if attention_mask.shape != (rn, past + length):
            raise ValueError(
                f"attention_mask: expected shape {(rn, past + length)}, got "
                f"{tuple(attention_mask.shape)}"
            )
        if prefix is not None and prefix.mask.shape[0] * group != rn:
            raise ValueError(
                f"input_ids: {rn} rows, expected {prefix.mask.shape[0]} prompts x group {group}"
            )
        embed = p["model.embed_tokens.weight"]  # (R, V, H)
        run_idx = torch.arange(r, device=input_ids.device)[:, None]
        flat_ids = input_ids.reshape(r, n * length)
        h = embed[run_idx, flat_ids]  # (R, N*L, H)
        if self.padding_idx is not None:
            # nn.Embedding(padding_idx=...) never updates that row through the lookup.
            h = torch.where((flat_ids == self.padding_idx)[..., None], h.detach(), h)
        cos, sin = self._rope(position_ids)  # (R*N, 1, L, D)
        mask = _suffix_mask(attention_mask.bool(), past, length)  # (R*N, 1, L, past + L)
        if prefix is not None:
            pm = prefix.mask.repeat_interleave(group, dim=0)  # (R*N, P)
            pm = pm[:, None, None, :].expand(rn, 1, length, pm.shape[1])
            mask = torch.cat([pm, mask], dim=-1)
        kept_k: list[Tensor] = []
        kept_v: list[Tensor] = []
        again = self.checkpointing and cache is None and torch.is_grad_enabled()
        for layer in range(self.n_layers):
            args = (h, layer, p, n, length, cos, sin, mask, prefix, group, cache)
            if again:
                h, k, v = checkpoint(self._layer, *args, use_reentrant=False)
            else:
                h, k, v = self._layer(*args)
            if keep_kv:
                kept_k.append(k)
                kept_v.append(v)
        if cache is not None:
            cache.length += length
        h = h.reshape(r, n, length, -1)
        if logits_to_keep:
            h = h[:, :, -logits_to_keep:]
        kept = h.shape[2]
        h = _rms_norm(h.reshape(r, n * kept, -1), p["model.norm.weight"], self.eps)
        head = embed if self.tied else p["lm_head.weight"]  # (R, V, H)
        logits = torch.bmm(h, head.transpose(1, 2)).float()  # (R, N*kept, V), as generate reads
        return logits.reshape(rn, kept, -1), ((kept_k, kept_v) if keep_kv else None)

    def _layer(
        self,
        h: Tensor,
        layer: int,
        p: dict[str, Tensor],
        n: int,
        length: int,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor,
        prefix: Prefix | None,
        group: int,
        cache: KVCache | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Decoder layer `layer` (`LlamaDecoderLayer`) on the hidden states `h` (R, N*L, H): the
        new hidden states and this call's keys and values (R*N, nkv, L, D), written into `cache`
        when given."""
        pre = f"model.layers.{layer}."
        x = _rms_norm(h, p[pre + "input_layernorm.weight"], self.eps)
        q, k, v = self._qkv(x, p, pre, n, length, cos, sin)
        new_k, new_v = k, v
        shared = None
        if cache is not None:
            at = cache.length
            cache.keys[layer][:, :, at : at + length] = k
            cache.values[layer][:, :, at : at + length] = v
            k = cache.keys[layer][:, :, : at + length]
            v = cache.values[layer][:, :, : at + length]
            if cache.prefix is not None:
                shared = (cache.prefix.keys[layer], cache.prefix.values[layer], cache.group)
        if prefix is not None:
            k = torch.cat([prefix.keys[layer].repeat_interleave(group, dim=0), k], dim=2)
            v = torch.cat([prefix.values[layer].repeat_interleave(group, dim=0), v], dim=2)
        h = h + self._attend(q, k, v, mask, p, pre, n, length, shared)
        x = _rms_norm(h, p[pre + "post_attention_layernorm.weight"], self.eps)
        gate = _linear(x, p, pre + "mlp.gate_proj")
        up = _linear(x, p, pre + "mlp.up_proj")
        return h + _linear(F.silu(gate) * up, p, pre + "mlp.down_proj"), new_k, new_v

    def _rope(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        # LlamaRotaryEmbedding.forward (attention_scaling 1 for the default rope)
        freqs = position_ids[..., None].float() * self.inv_freq.to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]

    def _qkv(
        self,
        x: Tensor,
        p: dict[str, Tensor],
        pre: str,
        n: int,
        length: int,
        cos: Tensor,
        sin: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        r, d = self.runs, self.head_dim

        def heads(y: Tensor, count: int) -> Tensor:  # (R, N*L, count*D) -> (R*N, count, L, D)
            return y.reshape(r * n, length, count, d).transpose(1, 2)

        q = heads(_linear(x, p, pre + "self_attn.q_proj"), self.n_heads)
        k = heads(_linear(x, p, pre + "self_attn.k_proj"), self.n_kv)
        v = heads(_linear(x, p, pre + "self_attn.v_proj"), self.n_kv)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # apply_rotary_pos_emb: in the weights' dtype
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor,
        p: dict[str, Tensor],
        pre: str,
        n: int,
        length: int,
        shared: tuple[Tensor, Tensor, int] | None = None,
    ) -> Tensor:
        """Attention of the queries q (rows, nh, L, D) to the keys and values k, v
        (rows, nkv, L_k, D) under mask (rows, 1, L, L_k), then the output projection; with
        `shared` = (keys, values, group) of the prompts (rows // group, nkv, P, D), a decoding
        step's keys are those P, then k's (the mask covers P + L_k)."""
        nh, nkv, d = self.n_heads, self.n_kv, self.head_dim
        rows, g = q.shape[0], nh // nkv
        if q.shape[2] == 1 and self.decode_matmul:
            out = _decode_matmul(q, k, v, mask, nkv, shared)
        elif q.shape[2] == 1:
            # One query per row (a decoding step) on the CPU: broadcast products and sums beat
            # the fused kernel and batched matmuls, whose per-(row, head) set-up dominates at one
            # query. Query head i*g + j reads key-value head i (repeat_kv's order) by
            # broadcasting, so each key-value head is read once, not copied g times.
            qg, kg, vg = q.reshape(rows, nkv, g, 1, d), k[:, :, None], v[:, :, None]
            scores = (qg * kg).sum(-1, keepdim=True).transpose(-1, -2) * (1.0 / math.sqrt(d))
            scores = scores.masked_fill(~mask[:, :, None], float("-inf"))  # (rows, nkv, g, 1, L)
            weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # float32, as eager
            out = (weights.transpose(-1, -2) * vg).sum(-2, keepdim=True).reshape(rows, nh, 1, d)
        else:
            if nkv != nh:  # grouped-query attention: repeat_kv (once per prompt or update)
                k = k.repeat_interleave(g, dim=1)
                v = v.repeat_interleave(g, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(d))
        out = out.transpose(1, 2).reshape(self.runs, n * length, nh * d)
        return _linear(out, p, pre + "self_attn.o_proj")


def stacked_policy_forward(
    lm: StackedLM,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    *,
    temperature: float,
    want_entropy: bool,
    cand_ids: Tensor | None,
    params: dict[str, Tensor] | None = None,
    precision: str = "fp32",
) -> PolicyOutputs:
    """`llm.model.forward.policy_forward`'s quantities for all runs' rows at once, each prompt
    run once for its group (`StackedLM.encode_prefix` + `forward_suffix`).

    Args:
        prompt_ids, prompt_mask: (R * B, P) left-padded prompts, run-major.
        response_ids, response_mask: (R * B, G, T) responses, right-padded.
        cand_ids: (R * B * G, T, N) candidate ids at which to read log-probs, or None.
        precision: ``system.precision``; ``"bf16-mixed"`` runs the model under bfloat16 autocast
            (`llm.model.forward.precision_autocast`); the log-softmax is in float32 always.

    Returns:
        `PolicyOutputs` over the R * B * G rows: ``logp (rows, T)``, ``entropy`` (with
        `want_entropy`), ``cand_ids``/``cand_logp (rows, T, N)`` (with `cand_ids`); differentiable
        when grad is enabled.
    """
    rb, g, t = response_ids.shape
    prompt_mask = prompt_mask.long()
    pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    with precision_autocast(lm.device, precision):
        prefix = lm.encode_prefix(prompt_ids, prompt_mask, pos, params=params)
        first = prefix.last_logits.repeat_interleave(g, dim=0)[:, None]  # (rows, 1, V)
        if t > 1:
            ids = response_ids.reshape(rb * g, t)[:, :-1]
            mask = response_mask.reshape(rb * g, t)[:, :-1].long()
            start = prompt_mask.sum(-1).repeat_interleave(g)[:, None]
            r_pos = start + torch.arange(t - 1, device=start.device)[None, :]
            rest = lm.forward_suffix(ids, mask, r_pos, prefix, group=g, params=params)
            logits = torch.cat([first, rest], dim=1)  # (rows, T, V)
        else:
            logits = first
    return token_outputs(
        logits.float() / temperature, response_ids.reshape(rb * g, t),
        want_entropy=want_entropy, cand_ids=cand_ids,
    )  # fmt: skip


def _decode_matmul(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    nkv: int,
    shared: tuple[Tensor, Tensor, int] | None,
) -> Tensor:
    """A decoding step's attention (`StackedLM.decode_matmul`, a GPU's) as matrix products: the
    g query heads of a key-value head are the rows of one product against its keys and values,
    which are read once and never materialized per query head (the CPU's broadcast products
    would write rows x heads x L x D). With `shared` (`StackedLM._attend`), the ``group`` rows of
    a prompt read its keys and values together first, as the rows of one product per (prompt,
    key-value head); one softmax over both. Returns (rows, nh, 1, D)."""
    rows, nh, _, d = q.shape
    qg = q.reshape(rows, nkv, nh // nkv, d)
    scores = torch.matmul(qg, k.transpose(-1, -2))  # (rows, nkv, g, L_k)
    if shared is not None:
        pk, pv, group = shared
        prompt = _by_row(torch.matmul(_by_prompt(qg, group), pk.transpose(-1, -2)), group)
        scores = torch.cat([prompt, scores], dim=-1)
    scores = scores * (1.0 / math.sqrt(d))
    scores = scores.masked_fill(~mask, float("-inf"))  # mask (rows, 1, 1, [P +] L_k)
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    if shared is None:
        return torch.matmul(weights, v).reshape(rows, nh, 1, d)
    p = pk.shape[2]
    out = _by_row(torch.matmul(_by_prompt(weights[..., :p], group), pv), group)
    return (out + torch.matmul(weights[..., p:], v)).reshape(rows, nh, 1, d)


def _by_prompt(x: Tensor, group: int) -> Tensor:
    """(rows, nkv, g, X) -> (rows // group, nkv, group * g, X): the rows continuing one prompt
    (row ``i`` continues prompt ``i // group``) side by side, as the rows of one product."""
    rows, nkv, g, last = x.shape
    b = rows // group
    return x.reshape(b, group, nkv, g, last).transpose(1, 2).reshape(b, nkv, group * g, last)


def _by_row(x: Tensor, group: int) -> Tensor:
    """The inverse of `_by_prompt`: (B, nkv, group * g, X) -> (B * group, nkv, g, X)."""
    b, nkv, gg, last = x.shape
    g = gg // group
    return x.reshape(b, nkv, group, g, last).transpose(1, 2).reshape(b * group, nkv, g, last)


_DECODE_MATMUL = False
"""Decode with the GPU's matrix products on the CPU too (tests compare both paths)."""


def _suffix_mask(keys_real: Tensor, past: int, length: int) -> Tensor:
    """(R*N, 1, L, past + L) bool, True where a query attends: causal, to real keys, and always
    to itself (a left-padding query would otherwise attend to nothing, and softmax over no key
    is NaN; its output is never read)."""
    total = past + length
    q_pos = torch.arange(past, total, device=keys_real.device)[:, None]
    k_pos = torch.arange(total, device=keys_real.device)[None, :]
    allowed = (k_pos <= q_pos)[None] & keys_real[:, None, :]
    allowed = allowed | (k_pos == q_pos)[None]
    return allowed[:, None]


def _rms_norm(h: Tensor, weight: Tensor, eps: float) -> Tensor:
    """LlamaRMSNorm with a run axis: h (R, M, H), weight (R, H); in float32, the result in h's
    dtype (transformers' order: normalized, cast, then scaled)."""
    x = h.float()
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight[:, None, :] * (x * torch.rsqrt(variance + eps)).to(h.dtype)


def _linear(x: Tensor, p: dict[str, Tensor], name: str) -> Tensor:
    """``x @ W^T + b`` per run: x (R, M, in), W (R, out, in), b (R, out) or absent."""
    w = p[name + ".weight"]
    b = p.get(name + ".bias")
    if b is None:
        return torch.bmm(x, w.transpose(1, 2))
    return torch.baddbmm(b[:, None, :], x, w.transpose(1, 2))


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
