"""Benchmark: the samplers' new tokens per second at the study's batch shapes.

    python bench/gpu/sampler_speed.py --model models/smollm2-random --device cuda \
        --config configs/countdown_smollm2_gpu.toml --shapes 16x8 16x32 32x32 64x32 --out s.json
    python bench/gpu/sampler_speed.py ... --samplers generate stacked   # side by side, a ratio

`--samplers`: transformers' ``generate`` (`llm.rollout.hf`, the trainer's and by default the
evaluation's) and the package's ``stacked`` sampler (`llm.rollout.stacked`, ``eval.sampler =
"stacked"``: each prompt run once, its keys and values shared by its samples, a cache of fixed
size read once per key-value head), each shape timed under each in turn; with both, the stacked
sampler's speed-up (generate's seconds / stacked's) per shape.

A shape ``PxN`` is P prompts (Countdown problems of `--config`'s data bounds, rendered with its
template) sampled N times in one `generate` call of the trainer's backend (`llm.rollout.hf`):
16x8 is one training step of configs/study_countdown_smollm2.toml (with per-token log-probs and
the top-3 candidates it keeps), 16x32 and 32x32 one evaluation call at ``eval.prompts_per_batch``
16 and 32. Each shape runs `--repeats` times; the last is reported (the first pays for the
kernels' warm-up): seconds, sequences/s, new tokens/s (the response masks' sum, so a model
that stops early is credited only with what it wrote) and the peak GPU memory. On random
weights every response runs to ``max_new_tokens``: the worst case per call. One JSON document
with every row goes to `--out`; `--profile K` prints the top K operators of each shape's last
call (torch.profiler: where the time of a call goes).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numerics  # noqa: F401  (first: pins the numeric code paths before torch loads)

# isort: split
import torch
from transformers.utils import logging as hf_logging

from llm.config import EVAL_PRECISION, add_set_argument, load_config
from llm.model.load import load_model_and_tokenizer
from llm.model.stacked import StackedLM
from llm.rollout.backend import make_backend
from llm.rollout.base import stop_token_ids
from llm.rollout.stacked import sample_groups
from llm.run.distributed import check_device, device_profiler, set_matmul_precision
from llm.tasks import TASKS


def parse_shape(text: str) -> tuple[int, int]:
    """``"16x8"`` as (prompts, samples per prompt).

    Raises:
        ValueError: naming `text` when it is not two positive integers joined by ``x``.
    """
    a, sep, b = text.partition("x")
    if not (sep and a.isdigit() and b.isdigit() and int(a) > 0 and int(b) > 0):
        raise ValueError(f"--shapes: {text!r} is not PROMPTSxSAMPLES (e.g. 16x8)")
    return int(a), int(b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model folder")
    ap.add_argument("--config", required=True, help="train config (template, data, sampling)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", nargs="+", default=["16x8", "16x32", "32x32"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tf32", action="store_true", help="TF32 matmuls (system.tf32)")
    ap.add_argument("--dtype", choices=tuple(EVAL_PRECISION), default="float32",
                    help="the policy's weights while sampling (eval.dtype)")  # fmt: skip
    ap.add_argument("--samplers", nargs="+", choices=("generate", "stacked"), default=["generate"],
                    help="the samplers timed, each shape under each (eval.sampler)")  # fmt: skip
    add_set_argument(ap, "config overrides (data.max_target=20 ...)")
    ap.add_argument(
        "--profile", type=int, default=0, help="print the top-K ops of each shape's last call"
    )
    ap.add_argument("--out", default="", help="JSON file for the rows")
    args = ap.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes]
    if args.repeats < 1:
        raise ValueError(f"--repeats: need at least 1, got {args.repeats}")
    hf_logging.disable_progress_bar()
    check_device(args.device)
    cuda = args.device.startswith("cuda")
    set_matmul_precision(args.device, args.tf32)
    cfg = load_config(args.config, sets=args.sets)
    model, tokenizer = load_model_and_tokenizer(
        Path(args.model), args.device, EVAL_PRECISION[args.dtype]
    )
    backend = make_backend(cfg, model, tokenizer)
    stacked = StackedLM([model])
    stops = stop_token_ids(tokenizer, args.model)
    task = TASKS[cfg.task]
    problems = task.generate(max(p for p, _ in shapes), 4321, cfg.data)
    max_new = cfg.rollout.max_new_tokens
    rows = []
    print(f"{'sampler':>8} {'shape':>7} {'s/call':>7} {'seq/s':>8} {'tok/s':>9} {'GiB':>6}")
    for (p, n), sampler in ((s, x) for s in shapes for x in args.samplers):
        prompts = [task.prompt(q, cfg.template) for q in problems[:p]]
        train = n == cfg.rollout.group_size  # a training call keeps log-probs and candidates
        gen = torch.Generator(device=args.device if sampler == "stacked" else "cpu").manual_seed(0)
        sampling = {"max_new_tokens": max_new, "temperature": cfg.rollout.temperature,
                    "top_p": cfg.rollout.top_p, "top_n": cfg.rollout.top_n if train else 0,
                    "want_logprobs": train}  # fmt: skip
        # The timed calls, then (--profile) one more under the profiler, whose overhead would
        # otherwise be in the time (the 2026-11-26 third lease timed a profiled call: 1.19 s
        # against 0.61 s).
        for i in range(args.repeats + bool(args.profile)):
            profiled = i == args.repeats
            if cuda:
                torch.cuda.synchronize()
                if not profiled:
                    torch.cuda.reset_peak_memory_stats()
            prof = device_profiler(profiled, cuda)
            with prof:
                start = time.perf_counter()
                if sampler == "stacked":
                    roll = sample_groups(stacked, tokenizer, [prompts], n, generators=[gen],
                                         stop_token_ids=stops, **sampling)[0]  # fmt: skip
                else:
                    roll = backend.generate(prompts, n, generator=gen, **sampling)
                if cuda:
                    torch.cuda.synchronize()
                if not profiled:
                    seconds = time.perf_counter() - start
                    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        if args.profile:  # where a call's time goes: device time when on CUDA, else host time
            sort = "cuda_time_total" if cuda else "cpu_time_total"
            print(prof.key_averages().table(sort_by=sort, row_limit=args.profile), flush=True)
        tokens = int(roll.response_mask.sum())
        row = {
            "sampler": sampler, "shape": f"{p}x{n}", "prompts": p, "samples": n, "sequences": p * n,
            "training_call": train, "max_new_tokens": max_new,
            "prompt_tokens_max": int(roll.prompt_mask.sum(-1).max()),
            "seconds": round(seconds, 4), "new_tokens": tokens,
            "sequences_per_s": round(p * n / seconds, 1), "tokens_per_s": round(tokens / seconds),
            "peak_gib": round(peak, 2) if cuda else None,
        }  # fmt: skip
        if sampler == "stacked" and "generate" in args.samplers:
            ref = next(r for r in rows if r["shape"] == row["shape"] and r["sampler"] == "generate")
            row["speedup_vs_generate"] = round(ref["seconds"] / seconds, 2)
        rows.append(row)
        ratio = (
            f"  {row['speedup_vs_generate']:.2f}x generate" if "speedup_vs_generate" in row else ""
        )
        print(f"{sampler:>8} {row['shape']:>7} {seconds:7.3f} {row['sequences_per_s']:8.1f} "
              f"{row['tokens_per_s']:9d} {row['peak_gib'] or 0:6.2f}{ratio}", flush=True)  # fmt: skip
    if args.out:
        doc = {"model": args.model, "device": args.device, "tf32": args.tf32, "dtype": args.dtype,
               "gpu": torch.cuda.get_device_name(0) if cuda else None,
               "torch": torch.__version__, "python": platform.python_version(),
               "template": cfg.template, "rows": rows}  # fmt: skip
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
