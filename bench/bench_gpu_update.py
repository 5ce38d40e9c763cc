"""Benchmark: the trainer's behaviour pass and update at the paper configs' sizes, on random weights.

For each config it builds the model of its `[model shape]` (`SHAPES`: the public `config.json`
values of Qwen2.5-Math-1.5B, Qwen3-1.7B, Qwen2.5-3B-Instruct and Qwen2.5-Math-7B, the same table as
docs/gpu_memory.md) with random weights directly on the device (nothing is downloaded), feeds a
rollout of random tokens of the config's prompt and response lengths (`--groups` groups of G
responses, every response at ``max_new_tokens``: the worst case every step meets) to the
trainer's own `llm.train.behaviour.behaviour_batch` and `llm.train.update.update_policy` (one optimizer step
over all rows, with the config's precision, gradient checkpointing, micro-batch, method and KL
reference), and reports:

- peak device memory of each phase (``torch.cuda.max_memory_allocated``, and reserved);
- seconds per phase (the second of ``--repeats`` updates; the first warms up the kernels), the
  update seconds per response and the extrapolation to one training step of the config
  (``prompts_per_step x G`` responses);
- model FLOPs utilization: model FLOPs (forward ``2 N S`` for the decoder's matmul weights,
  ``2 d V`` per response token for the head, ``2 L S^2 q`` for causal attention; backward twice
  the forward; gradient-checkpoint recomputation not counted) over time over the device's dense
  bf16 peak (``--peak-tflops``, default 989: H100 SXM).

Each case runs in its own process (a failed or out-of-memory case does not poison the next).
Results: one JSON line per case on stdout and in ``--out``.

    python bench/bench_gpu_update.py                               # the four one-GPU configs
    python bench/bench_gpu_update.py --configs configs/math_qwen25_math_7b_casp.toml  # 7B: OOM?
    python bench/bench_gpu_update.py --device cpu --shape tiny --groups 1 --max-new-tokens 8 \\
        --prompt-tokens 8 --configs configs/math_qwen3_1p7b_dsdr.toml          # smoke test
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_CONFIGS = [
    "configs/math_qwen25_math_1p5b_ds_grpo.toml",
    "configs/math_qwen3_1p7b_ds_grpo.toml",
    "configs/math_qwen3_1p7b_dsdr.toml",
    "configs/countdown_qwen25_3b_instruct_ds_grpo.toml",
]

#: Model shapes (public config.json values; docs/gpu_memory.md's first table).
SHAPES: dict[str, dict[str, Any]] = {
    "Qwen2.5-Math-1.5B": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
        tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=10000.0,
    ),
    "Qwen3-1.7B": dict(
        model_type="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        tie_word_embeddings=True, max_position_embeddings=40960, rope_theta=1000000.0,
    ),
    "Qwen2.5-3B-Instruct": dict(
        model_type="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
        tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1000000.0,
    ),
    "Qwen2.5-Math-7B": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        tie_word_embeddings=False, max_position_embeddings=4096, rope_theta=10000.0,
    ),
    # SmolLM2-135M-Instruct (configs/countdown_smollm2_gpu.toml's model_path: the folder name).
    "smollm2-135m-instruct": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
        tie_word_embeddings=True, max_position_embeddings=8192, rope_theta=100000.0,
    ),
    # A CPU smoke-test shape (not a real model).
    "tiny": dict(
        model_type="qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, vocab_size=1000,
        tie_word_embeddings=True, max_position_embeddings=4096,
    ),
}  # fmt: skip


def shape_of(model_path: str) -> str:
    """The `SHAPES` key a config's ``model_path`` names (its folder name)."""
    name = Path(model_path).name
    if name not in SHAPES:
        raise ValueError(f"model_path: no shape for {name!r}; known: {sorted(SHAPES)}")
    return name


def model_flops(
    shape: dict[str, Any], prompt_tokens: int, response_tokens: int, rows: int
) -> float:
    """Forward-pass model FLOPs of `rows` rows of ``prompt_tokens + response_tokens`` tokens.

    ``2 x (decoder matmul weights) x S`` + ``2 x d x V`` per response position (the head runs on
    response positions only) + causal attention ``2 x L x S^2 x q`` (QK^T and AV, half the square).
    """
    d, f, n_layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = shape.get("head_dim", d // heads)
    q, kvd = heads * head_dim, kv * head_dim
    per_layer = d * q + 2 * d * kvd + q * d + 3 * d * f  # q, k, v, o projections and SwiGLU
    s = prompt_tokens + response_tokens
    dense = 2 * n_layers * per_layer * s
    head = 2 * d * shape["vocab_size"] * response_tokens
    attention = 2 * n_layers * s * s * q
    return float(rows * (dense + head + attention))


def _build_model(shape: dict[str, Any], device: str, dtype: Any, attn: str | None = None) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(shape)
    conf = AutoConfig.for_model(kw.pop("model_type"), **kw)
    extra = {"attn_implementation": attn} if attn else {}
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(conf, dtype=dtype, **extra)
    return model


def run_case(args: argparse.Namespace, config: str) -> dict[str, Any]:
    """One config: build, one behaviour pass + `--repeats` updates; the measured numbers."""
    import torch

    import llm.model.forward
    import shaping
    from llm.config import load_config
    from llm.model.load import enable_gradient_checkpointing
    from llm.rollout.base import RolloutBatch
    from llm.run.distributed import DistInfo, set_matmul_precision
    from llm.train.behaviour import behaviour_batch
    from llm.train.update import make_optimizer, update_policy

    if args.logit_chunk is not None:
        llm.model.forward.LOGIT_CHUNK = args.logit_chunk
        # policy_forward's keyword default was bound at definition: rebind it.
        llm.model.forward.policy_forward.__kwdefaults__["logit_chunk"] = args.logit_chunk
    torch.manual_seed(0)
    base = load_config(ROOT / config)
    groups = args.groups
    rollout = {"prompts_per_step": groups, "backend": "transformers"}
    if args.max_new_tokens:
        rollout["max_new_tokens"] = args.max_new_tokens
    cfg = load_config(
        ROOT / config,
        sets=args.sets,
        rollout=rollout,
        optim={"prompts_per_update": groups},
        system={"device": args.device},
    )
    name = args.shape or shape_of(base.model_path)
    shape = SHAPES[name]
    g = cfg.rollout.group_size
    p_len = args.prompt_tokens or cfg.rollout.max_prompt_tokens
    t_len = cfg.rollout.max_new_tokens
    rows = groups * g
    device = args.device
    cuda = device.startswith("cuda")
    set_matmul_precision(device, cfg.system.tf32)
    result: dict[str, Any] = {
        "config": config,
        "model": name,
        "method": cfg.method,
        "precision": cfg.system.precision,
        "gradient_checkpointing": cfg.system.gradient_checkpointing,
        "micro_batch_size": cfg.system.micro_batch_size,
        "rows": rows,
        "prompt_tokens": p_len,
        "response_tokens": t_len,
        "kl_coef": cfg.kl_coef,
        "logit_chunk": llm.model.forward.LOGIT_CHUNK,
        "attn": args.attn or "default",
        "pad": args.pad,
        "compile": args.compile,
        "tf32": cfg.system.tf32,
        "sets": args.sets,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
    }

    def mem() -> dict[str, float]:
        if not cuda:
            return {}
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        }

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    stage = "build"
    try:
        t0 = time.perf_counter()
        dtype = torch.bfloat16 if cfg.system.precision == "bf16" else torch.float32
        model = _build_model(shape, device, dtype, args.attn)
        model.eval()
        if cfg.system.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        if args.compile:  # each decoder layer compiled (one graph serves all layers)
            for layer in model.model.layers:
                layer.compile(dynamic=True)
        ref = None
        if cfg.kl_coef > 0:
            ref = _build_model(
                shape,
                device,
                torch.float32 if cfg.system.precision == "fp32" else torch.bfloat16,
                args.attn,
            )
            ref.requires_grad_(False).eval()
        n_params = sum(p.numel() for p in model.parameters())
        sync()
        result["build_s"] = time.perf_counter() - t0
        result["params_b"] = n_params / 1e9
        if cuda:
            result["after_build_gib"] = torch.cuda.memory_allocated() / 2**30

        vocab = shape["vocab_size"]
        gen = torch.Generator().manual_seed(1)
        roll = RolloutBatch(
            prompts=[""] * groups,
            prompt_ids=torch.randint(0, vocab, (groups, p_len), generator=gen),
            prompt_mask=_prompt_mask(groups, p_len, args.pad),
            response_ids=torch.randint(0, vocab, (groups, g, t_len), generator=gen),
            response_mask=torch.ones(groups, g, t_len),
            logp=-torch.rand(groups, g, t_len, generator=gen) * 3,
            texts=[[""] * g for _ in range(groups)],
        )
        rewards = (torch.rand(groups, g, generator=gen) > 0.5).float().to(device)
        hyper = cfg.loss_hyper
        needs = shaping.METHODS[cfg.method].needs_for(**hyper)
        diversity = torch.rand(groups, g, generator=gen).tolist() if "diversity" in needs else None
        optimizer, scheduler = make_optimizer(cfg, model)
        info = DistInfo(device=device)

        stage = "behaviour"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        behaviour = behaviour_batch(
            model, ref, roll, rewards, cfg=cfg, needs=needs, diversity=diversity
        )
        sync()
        result["behaviour_s"] = time.perf_counter() - t0
        result["behaviour_mem"] = mem()

        stage = "update"
        times = []
        for i in range(args.repeats):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            prof = _profiler(args.profile and i == args.repeats - 1, cuda)
            with prof:
                sync()
                t0 = time.perf_counter()
                update_policy(model, optimizer, scheduler, behaviour, cfg=cfg, info=info, step=1)
                sync()
            times.append(time.perf_counter() - t0)
            if args.profile and i == args.repeats - 1:
                sort = "cuda_time_total" if cuda else "cpu_time_total"
                print(prof.key_averages().table(sort_by=sort, row_limit=args.profile), flush=True)
        result["update_s"] = times[-1]
        result["update_s_all"] = times
        result["update_mem"] = mem()
        if cuda:
            result["after_update_gib"] = torch.cuda.memory_allocated() / 2**30
    except torch.cuda.OutOfMemoryError as e:
        result["oom"] = stage
        result["error"] = str(e).splitlines()[0][:300]
        result["oom_mem"] = mem()
        return result

    fwd = model_flops(shape, p_len, t_len, rows)
    peak = args.peak_tflops * 1e12
    result["behaviour_tflops"] = fwd / result["behaviour_s"] / 1e12
    result["update_tflops"] = 3 * fwd / result["update_s"] / 1e12
    result["behaviour_mfu"] = fwd / result["behaviour_s"] / peak
    result["update_mfu"] = 3 * fwd / result["update_s"] / peak
    per_row = (result["behaviour_s"] + result["update_s"]) / rows
    result["step_rows"] = base.rollout.prompts_per_step * g
    result["step_update_s_extrapolated"] = per_row * result["step_rows"] * base.optim.inner_epochs
    return result


def _prompt_mask(groups: int, p_len: int, pad: int) -> Any:
    """(B, P) ones, with the first prompt left-padded by `pad` (so the model needs a padding mask,
    as real batches of prompts of different lengths do)."""
    import torch

    mask = torch.ones(groups, p_len)
    mask[0, : min(pad, p_len - 1)] = 0
    return mask


def _profiler(on: bool, cuda: bool) -> Any:
    from llm.run.distributed import device_profiler

    return device_profiler(on, cuda)


def main(argv: list[str] | None = None) -> int:
    from llm.config import add_set_argument

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    ap.add_argument("--groups", type=int, default=2, help="prompts (groups of G) to time")
    ap.add_argument("--repeats", type=int, default=2, help="updates; the last is reported")
    ap.add_argument("--max-new-tokens", type=int, default=0, help="override (0: the config's)")
    ap.add_argument("--prompt-tokens", type=int, default=0, help="0: max_prompt_tokens")
    ap.add_argument("--logit-chunk", type=int, default=None, help="llm.model.forward.LOGIT_CHUNK")
    ap.add_argument("--shape", default=None, choices=sorted(SHAPES), help="override the shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--out", default=None, help="append the JSON lines here")
    ap.add_argument("--attn", default=None, help="attn_implementation (default: transformers')")
    ap.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    ap.add_argument("--pad", type=int, default=0, help="left-pad the first prompt by this many")
    ap.add_argument("--profile", type=int, default=0, help="print the top-K ops of the last update")
    add_set_argument(ap, "config overrides (system.tf32=true ...)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:  # the child: one config, one JSON line
        print("RESULT " + json.dumps(run_case(args, args.configs[0])), flush=True)
        return 0
    results = []
    for config in args.configs:
        cmd = [sys.executable, __file__, "--one", "--configs", config]
        for flag in ("groups", "repeats", "max_new_tokens", "prompt_tokens", "logit_chunk",
                     "shape", "device", "peak_tflops", "profile", "attn", "pad"):  # fmt: skip
            value = getattr(args, flag)
            if value is not None:
                cmd += [f"--{flag.replace('_', '-')}", str(value)]
        if args.compile:
            cmd.append("--compile")
        if args.sets:
            cmd += ["--set", *args.sets]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if args.profile:
            print("\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("RESULT ")))
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if lines:
            res = json.loads(lines[-1][len("RESULT ") :])
        else:
            res = {"config": config, "error": proc.stderr.strip().splitlines()[-5:]}
        results.append(res)
        print(json.dumps(res), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(res) + "\n")
    print(_table(results))
    return 0 if all("error" not in r or "oom" in r for r in results) else 1


def _table(results: list[dict[str, Any]]) -> str:
    head = (
        "| config | rows x tokens | peak GiB behaviour / update | s behaviour / update | "
        "MFU behaviour / update | step update s (extrap.) |\n|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in results:
        name = Path(r["config"]).stem
        if "oom" in r:
            lines.append(f"| {name} | {r.get('rows')} | OOM in {r['oom']} | - | - | - |")
            continue
        if "error" in r:
            lines.append(f"| {name} | error | - | - | - | - |")
            continue
        bm, um = r["behaviour_mem"], r["update_mem"]
        mem = f"{bm['peak_allocated_gib']:.1f} / {um['peak_allocated_gib']:.1f}" if bm else "-"
        lines.append(
            f"| {name} | {r['rows']} x {r['prompt_tokens'] + r['response_tokens']} | {mem} | "
            f"{r['behaviour_s']:.2f} / {r['update_s']:.2f} | "
            f"{r['behaviour_mfu']:.0%} / {r['update_mfu']:.0%} | "
            f"{r['step_update_s_extrapolated']:.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
