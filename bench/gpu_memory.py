"""The memory formulas of docs/gpu_memory.md, as functions, and the tables they give.

Every number in docs/gpu_memory.md's computed tables comes from here (``python
bench/gpu_memory.py`` prints them, and the "measured on an H100" comparison from
``bench/results/gpu_update_h100_2026-11-23.jsonl``); `tests/llm/test_gpu_memory_formulas.py` builds
tiny models and counts the tensors each formula predicts. Bytes unless a name says otherwise;
``GIB = 2**30``. Shapes are `bench.bench_gpu_update.SHAPES` (public ``config.json`` values).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_gpu_update import SHAPES  # noqa: E402

GIB = 2**30
#: fp32 copies of one (micro-batch rows, LOGIT_CHUNK, V) logits block alive at the chunked head's
#: peak, by pass and by what it computes (counted on CPU by tests/llm/test_gpu_memory_formulas.py:
#: forward 2.0-2.8 / 7.3-7.6, backward 3.6 / 9.8-10.8; the H100 behaviour pass: 7.5-7.8).
#: ``entropy`` stands for entropy and top-N candidates: the behaviour pass always computes them,
#: the update only when the loss uses the entropy (Countdown, CaSP).
LOGIT_COPIES = {
    ("forward", "logp"): 3,
    ("forward", "entropy"): 8,
    ("backward", "logp"): 4,
    ("backward", "entropy"): 11,
}
#: `llm.model.forward.LOGIT_CHUNK`.
LOGIT_CHUNK = 256
#: The H100 80GB's capacity as torch reports it (79.18 GiB).
H100_GIB = 79.18
#: CUDA context, allocator fragmentation (reserved - allocated: 2.3-4.5 GiB on the H100), a
#: sleeping vLLM engine's residue: not in ``max_memory_allocated``.
OVERHEAD_GIB = 4.0
#: vLLM's own activations and CUDA graphs inside its share.
VLLM_ACT_GIB = 2.0
BENCH_RESULTS = ROOT / "bench/results/gpu_update_h100_2026-11-23.jsonl"


def dims(shape: dict[str, Any]) -> dict[str, int]:
    """d, f, L, V, head_dim, q (= heads x head_dim) and kv (= KV heads x head_dim) of a shape."""
    d, heads = shape["hidden_size"], shape["num_attention_heads"]
    hd = shape.get("head_dim") or d // heads
    return dict(
        d=d,
        f=shape["intermediate_size"],
        L=shape["num_hidden_layers"],
        V=shape["vocab_size"],
        hd=hd,
        q=heads * hd,
        kv=shape["num_key_value_heads"] * hd,
    )


def param_count(shape: dict[str, Any]) -> int:
    """P of a Qwen2 / Qwen3 shape: per layer q/k/v/o projections (Qwen2: q/k/v biases; Qwen3: q/k
    RMSNorms over head_dim), SwiGLU MLP ``3 d f``, two RMSNorms ``2 d``; plus the embedding ``V d``,
    the final norm ``d`` and, when untied, the output head ``V d``."""
    x = dims(shape)
    d, f, q, kv = x["d"], x["f"], x["q"], x["kv"]
    attn = d * q + 2 * d * kv + q * d
    if shape["model_type"] == "qwen3":
        attn += 2 * x["hd"]
        if shape.get("attention_bias"):
            attn += q + 2 * kv + d
    else:
        attn += q + 2 * kv
    layer = attn + 3 * d * f + 2 * d
    head = 0 if shape.get("tie_word_embeddings", True) else x["V"] * d
    return x["L"] * layer + x["V"] * d + d + head


def state_bytes(p: int, precision: str) -> int:
    """Weights + gradients + AdamW moments: 16P for ``fp32``/``bf16-mixed``, 8P for ``bf16``."""
    return 8 * p if precision == "bf16" else 16 * p


def resident_bytes(p: int, precision: str) -> int:
    """Weights + AdamW after the optimizer step (gradients freed): 12P, or 6P in ``bf16``."""
    return 6 * p if precision == "bf16" else 12 * p


def adamw_step_temp_bytes(p: int, precision: str) -> int:
    """torch's foreach AdamW (the CUDA default) allocates ``sqrt(exp_avg_sq)`` for every parameter
    at once during ``step()``: one more copy of the weights, 4P (2P in ``bf16``)."""
    return 2 * p if precision == "bf16" else 4 * p


def autocast_cache_bytes(p: int, precision: str, fsdp: bool = False) -> int:
    """bf16 copies of the fp32 weights that autocast keeps until the model call ends: 2P in one
    process or DDP under ``bf16-mixed``; 0 under FSDP2 (mixed-precision policy, no autocast)."""
    return 2 * p if precision == "bf16-mixed" and not fsdp else 0


def reference_bytes(p: int, precision: str) -> int:
    """The frozen KL reference: bf16 (2P) unless the run is ``fp32`` (4P)."""
    return 4 * p if precision == "fp32" else 2 * p


def act_bytes_per_token_layer(shape: dict[str, Any]) -> int:
    """Saved activations of one decoder layer per token without checkpointing: ``20d + 4q + 4kv +
    8f`` (bf16 matmul inputs, fp32 residual stream and norm inputs, fused attention)."""
    x = dims(shape)
    return 20 * x["d"] + 4 * x["q"] + 4 * x["kv"] + 8 * x["f"]


def ckpt_bytes_per_token_layer(shape: dict[str, Any]) -> int:
    """With gradient checkpointing each layer keeps only its fp32 input: ``4d`` per token."""
    return 4 * dims(shape)["d"]


def kv_cache_bytes_per_token(shape: dict[str, Any]) -> int:
    """vLLM's bf16 KV cache: keys and values of every layer, ``2 x L x kv x 2``."""
    x = dims(shape)
    return 2 * x["L"] * x["kv"] * 2


def logits_block_bytes(rows: int, chunk: int, vocab: int) -> int:
    """One fp32 copy of a (rows, chunk, V) logits block of the chunked head."""
    return rows * chunk * vocab * 4


def block_bytes(shape: dict[str, Any], micro: int, response: int, chunk: int = LOGIT_CHUNK) -> int:
    """One fp32 logits block of a micro-batch: (micro, chunk, V); ``chunk = 0`` (no chunking):
    the whole (micro, response, V) logits."""
    block = min(chunk, response) if chunk else response
    return logits_block_bytes(micro, block, dims(shape)["V"])


def update_peak_bytes(
    shape: dict[str, Any],
    *,
    precision: str,
    micro: int,
    tokens: int,
    response: int,
    ref: bool,
    entropy: bool = False,
    ckpt: bool = True,
    chunk: int = LOGIT_CHUNK,
    shards: int = 1,
    fsdp_gathered: int = 0,
) -> dict[str, int]:
    """The update phase's allocated peak (no overhead O), the largest of three moments:

    - a micro-batch's forward: states + autocast cache + reference + the micro-batch's saved
      activations + the head's forward copies of a logits block;
    - its backward (the autocast cache is gone): states + reference + saved activations + the
      larger of one layer's recomputed activations and the head's backward copies;
    - the optimizer step: states + foreach AdamW's temporary + reference.

    Saved activations: every layer's fp32 input with checkpointing (``4d`` per token per layer),
    every layer's full activations without. Under FSDP2 over `shards` GPUs states, temporary and
    reference are divided, the autocast cache is gone and `fsdp_gathered` bf16 bytes of gathered
    layers take its place."""
    p = param_count(shape)
    x = dims(shape)
    states = state_bytes(p, precision) // shards
    reference = reference_bytes(p, precision) // shards if ref else 0
    cache = autocast_cache_bytes(p, precision, fsdp=shards > 1) + fsdp_gathered
    layer = micro * tokens * act_bytes_per_token_layer(shape)
    per_layer = ckpt_bytes_per_token_layer(shape) if ckpt else act_bytes_per_token_layer(shape)
    saved = micro * tokens * x["L"] * per_layer
    block = block_bytes(shape, micro, response, chunk)
    kind = "entropy" if entropy else "logp"
    forward = states + cache + reference + saved + LOGIT_COPIES["forward", kind] * block
    backward = states + reference + saved
    backward += max(layer if ckpt else 0, LOGIT_COPIES["backward", kind] * block)
    step = states + adamw_step_temp_bytes(p, precision) // shards + reference
    return dict(
        states=states,
        cache=cache,
        reference=reference,
        saved=saved,
        block=block,
        forward=forward,
        backward=backward,
        step=step,
        peak=max(forward, backward, step),
    )


def behaviour_peak_bytes(
    shape: dict[str, Any],
    *,
    precision: str,
    micro: int,
    tokens: int,
    response: int,
    ref: bool,
    chunk: int = LOGIT_CHUNK,
) -> int:
    """The behaviour pass (no grad, gradients freed): weights, autocast cache, reference, and the
    larger of one layer's activations of a micro-batch and the head's copies of a logits block
    (entropy and top-N are always computed there)."""
    p = param_count(shape)
    weights = 2 * p if precision == "bf16" else 4 * p
    reference = reference_bytes(p, precision) if ref else 0
    layer = micro * tokens * act_bytes_per_token_layer(shape)
    logits = LOGIT_COPIES["forward", "entropy"] * block_bytes(shape, micro, response, chunk)
    return weights + autocast_cache_bytes(p, precision) + reference + max(layer, logits)


def old_update_peak_bytes(
    shape: dict[str, Any], *, precision: str, micro: int, tokens: int, ref: bool
) -> int:
    """The first version of docs/gpu_memory.md's update formula (kept to compare; O left out):
    states 16P + autocast cache 2P + reference + micro x S x (5 fp32 copies of full logits
    ``20V`` + checkpointed activations ``4dL`` + one layer amortized)."""
    p = param_count(shape)
    x = dims(shape)
    per_token = 20 * x["V"] + x["L"] * ckpt_bytes_per_token_layer(shape)
    per_token += act_bytes_per_token_layer(shape)
    reference = reference_bytes(p, precision) if ref else 0
    return (
        state_bytes(p, precision)
        + autocast_cache_bytes(p, precision)
        + reference
        + (micro * tokens * per_token)
    )


def kv_tokens(shape: dict[str, Any], utilization: float, gpu_gib: float = H100_GIB) -> int:
    """Tokens of KV cache a vLLM engine with `utilization` of the GPU holds after its bf16 weights
    (2P) and ~2 GiB of its own activations and CUDA graphs."""
    free = utilization * gpu_gib * GIB - 2 * param_count(shape) - VLLM_ACT_GIB * GIB
    return int(free // kv_cache_bytes_per_token(shape))


def _g(x: float) -> str:
    return f"{x / GIB:.1f}"


def component_table() -> str:
    """docs/gpu_memory.md's per-model components (GiB; per 1k tokens where stated)."""
    head = (
        "| model | P (B) | bf16 weights 2P | fp32 weights 4P | fp32 grads 4P | AdamW 8P "
        "| bf16-mixed states 16P | foreach AdamW step temporary 4P | pure bf16 states 8P "
        "| autocast cache 2P | activations / 1k tokens, no ckpt | activations / 1k tokens, ckpt "
        "| logits block, 1 row, 1 copy (MiB) | head peak per row: 4 / 11 copies (GiB) "
        "| vLLM KV / 1k tokens (MiB) |\n" + "|---" * 15 + "|\n"
    )
    lines = []
    for name in ("Qwen2.5-Math-1.5B", "Qwen3-1.7B", "Qwen2.5-3B-Instruct", "Qwen2.5-Math-7B"):
        s = SHAPES[name]
        p, x = param_count(s), dims(s)
        nockpt = 1000 * x["L"] * act_bytes_per_token_layer(s)
        ckpt = 1000 * x["L"] * ckpt_bytes_per_token_layer(s)
        block = logits_block_bytes(1, LOGIT_CHUNK, x["V"])
        kv = 1000 * kv_cache_bytes_per_token(s)
        lines.append(
            f"| {name} | {p / 1e9:.3f} | {_g(2 * p)} | {_g(4 * p)} | {_g(4 * p)} | {_g(8 * p)} "
            f"| **{_g(16 * p)}** | {_g(4 * p)} | {_g(8 * p)} | {_g(2 * p)} | {nockpt / GIB:.2f} "
            f"| {ckpt / GIB:.2f} | {block / 2**20:.0f} | {4 * block / GIB:.2f} / {11 * block / GIB:.2f} "
            f"| {kv / 2**20:.1f} |"
        )
    return head + "\n".join(lines)


def bench_rows(path: Path = BENCH_RESULTS) -> list[dict[str, Any]]:
    """The H100 runs of the paper configs' default settings (first result of each config and
    logit chunk; the attention/padding/compile variants are left out)."""
    seen, out = set(), []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        variant = r.get("attn", "default") != "default" or r.get("pad") or r.get("compile")
        key = (r["config"], r["logit_chunk"], r["rows"])
        if variant or key in seen:
            continue
        seen.add(key)
        out.append(r)
    return out


def _gib(r: dict[str, Any], key: str) -> float | None:
    """A GiB number of a result line (older lines name them ``_gb``; their values are GiB)."""
    for k in (key, key.replace("_gib", "_gb")):
        if k in r:
            return r[k]
    return None


def measured_vs_predicted() -> list[dict[str, Any]]:
    """For each H100 run: the formulas at the run's sizes next to what was measured (GiB)."""
    import shaping
    from llm.config import load_config

    rows = []
    for r in bench_rows():
        cfg = load_config(ROOT / r["config"])
        needs = shaping.METHODS[cfg.method].needs_for(**cfg.loss_hyper)
        s = SHAPES[r["model"]]
        p = param_count(s)
        tokens = r["prompt_tokens"] + r["response_tokens"]
        kw = dict(
            precision=r["precision"],
            micro=r["micro_batch_size"],
            tokens=tokens,
            response=r["response_tokens"],
            ref=r["kl_coef"] > 0,
            chunk=r["logit_chunk"],
        )
        up = update_peak_bytes(
            s, ckpt=r["gradient_checkpointing"], entropy="entropy" in needs, **kw
        )
        old = old_update_peak_bytes(
            s, precision=r["precision"], micro=kw["micro"], tokens=tokens, ref=kw["ref"]
        )
        beh = behaviour_peak_bytes(s, **kw)
        build = 4 * p + (reference_bytes(p, r["precision"]) if kw["ref"] else 0)
        after = resident_bytes(p, r["precision"]) + (build - 4 * p)
        upd_mem = r.get("update_mem") or r.get("oom_mem") or {}
        rows.append(
            dict(
                config=Path(r["config"]).stem,
                rows=r["rows"],
                tokens=tokens,
                micro=r["micro_batch_size"],
                chunk=r["logit_chunk"],
                params_b=r["params_b"],
                pred_build=build / GIB,
                meas_build=_gib(r, "after_build_gib"),
                pred_behaviour=beh / GIB,
                meas_behaviour=_gib(r.get("behaviour_mem", {}), "peak_allocated_gib"),
                pred_forward=up["forward"] / GIB,
                pred_backward=up["backward"] / GIB,
                pred_step=up["step"] / GIB,
                old_update=old / GIB,
                pred_update=up["peak"] / GIB,
                meas_update=_gib(upd_mem, "peak_allocated_gib"),
                oom=r.get("oom"),
                pred_after=after / GIB,
                meas_after=_gib(r, "after_update_gib"),
            )
        )
    return rows


def measured_table() -> str:
    head = (
        "| config (chunk) | rows x tokens (micro) | after build: formula / H100 "
        "| behaviour peak: formula / H100 | update formula: forward / backward / optimizer step "
        "| update peak: formula / H100 (H100 - formula) | first doc's formula (no O) "
        "| after update: formula / H100 |\n" + "|---" * 8 + "|\n"
    )
    lines = []
    for m in measured_vs_predicted():

        def pair(a: float, b: float | None) -> str:
            return f"{a:.1f} / {b:.1f}" if b is not None else f"{a:.1f} / -"

        if m["oom"]:
            upd = f"{m['pred_update']:.1f} / **OOM** ({m['meas_update']:.1f} allocated)"
        else:
            diff = m["meas_update"] - m["pred_update"]
            upd = f"{m['pred_update']:.1f} / {m['meas_update']:.1f} ({diff:+.1f})"
        lines.append(
            f"| `{m['config']}` ({m['chunk']}) | {m['rows']} x {m['tokens']:,} ({m['micro']}) "
            f"| {pair(m['pred_build'], m['meas_build'])} "
            f"| {pair(m['pred_behaviour'], m['meas_behaviour'])} "
            f"| {m['pred_forward']:.1f} / {m['pred_backward']:.1f} / {m['pred_step']:.1f} | {upd} "
            f"| {m['old_update']:.1f} "
            f"| {pair(m['pred_after'], m['meas_after'])} |"
        )
    return head + "\n".join(lines)


def main() -> int:
    print(component_table())
    print()
    print(measured_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
