"""Base pass@k of a model on Countdown variants: which variant can an RL run learn?

    python bench/gpu/base_passk.py --model models/smollm2-135m-instruct --device cuda \
        --variants 2:1-20:1-100 3:1-20:1-100 --problems 256 --samples 64 --out base_passk.json

A variant is ``NUMBERS:MIN-MAX:TARGET_MIN-TARGET_MAX`` (how many numbers a problem has, the range
its numbers are drawn from, the range of its target; `llm.tasks.countdown.problem.generate_problems`).
Each variant's held-out problems (seed `--seed`) are sampled `--samples` times by the base model
through the trainer's transformers backend with the evaluation settings of `--config`, and scored
by the task's verifier (`llm.eval.heldout.evaluate`). Prints one table row per variant (pass@1,
pass@k, the well-formed rate, distinct correct answers per problem, seconds) and writes them to
`--out` as JSON. Issue 23 asks for a variant with base pass@1 in roughly 0.1-0.4 and room at large k.
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

from llm.config import load_config
from llm.eval.heldout import evaluate
from llm.model.load import load_model_and_tokenizer
from llm.rollout.backend import make_backend
from llm.run.distributed import check_device
from llm.tasks import TASKS

ROOT = Path(__file__).resolve().parents[2]


def parse_variant(text: str) -> dict[str, object]:
    """``"3:1-20:1-100"`` as `DataConfig` fields.

    Raises:
        ValueError: naming the variant when it is not ``N:A-B:C-D`` with integers.
    """
    try:
        n, numbers, targets = text.split(":")
        lo, hi = (int(x) for x in numbers.split("-"))
        tlo, thi = (int(x) for x in targets.split("-"))
        return {"num_numbers": [int(n)], "min_number": lo, "max_number": hi,
                "min_target": tlo, "max_target": thi}  # fmt: skip
    except ValueError:
        raise ValueError(
            f"--variants: {text!r} is not NUMBERS:MIN-MAX:TARGET_MIN-TARGET_MAX (e.g. 3:1-20:1-100)"
        ) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model folder")
    ap.add_argument(
        "--config",
        default=str(ROOT / "configs/countdown_smollm2.toml"),
        help="train config whose template and [eval] sampling settings are used",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--variants", nargs="+", default=["2:1-20:1-100", "3:1-20:1-100"])
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=0, help="0: the config's")
    ap.add_argument("--prompts-per-batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1234, help="held-out problem seed")
    ap.add_argument("--out", default="", help="JSON file for the table")
    ap.add_argument("--show", type=int, default=0, help="print this many sampled responses")
    args = ap.parse_args(argv)
    hf_logging.disable_progress_bar()
    variants = [(v, parse_variant(v)) for v in args.variants]
    check_device(args.device)
    cfg = load_config(args.config)
    model, tokenizer = load_model_and_tokenizer(Path(args.model), args.device)
    backend = make_backend(cfg, model, tokenizer)
    task = TASKS[cfg.task]
    max_new = args.max_new_tokens or cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    rows = []
    print(f"{'variant':<16} {'pass@1':>7} {'pass@' + str(args.samples):>8} {'format':>7} "
          f"{'distinct':>8} {'s':>6}")  # fmt: skip
    for name, fields in variants:
        vcfg = load_config(
            args.config, sets=[f"data.{k}={json.dumps(v)}" for k, v in fields.items()]
        )
        problems = task.generate(args.problems, args.seed, vcfg.data)
        start = time.perf_counter()
        r = evaluate(backend, task, problems, template=cfg.template, samples=args.samples,
                     max_new_tokens=max_new, temperature=cfg.eval.temperature,
                     top_p=cfg.eval.top_p, top_k=cfg.eval.top_k, seed=0,
                     prompts_per_batch=args.prompts_per_batch, bleu=False)  # fmt: skip
        seconds = time.perf_counter() - start
        ks = r["pass_at_k"]
        row = {"variant": name, **fields, "problems": args.problems, "samples": args.samples,
               "pass_at_k": ks, "format_rate": r["format_rate"],
               "distinct_correct": r["distinct_correct"], "seconds": round(seconds, 1),
               "max_new_tokens": max_new}  # fmt: skip
        rows.append(row)
        print(f"{name:<16} {ks['1']:7.3f} {ks[str(args.samples)]:8.3f} {r['format_rate']:7.3f} "
              f"{r['distinct_correct']:8.2f} {seconds:6.1f}", flush=True)  # fmt: skip
        if args.out:
            doc = {"model": args.model, "device": args.device,
                   "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
                   "torch": torch.__version__, "python": platform.python_version(),
                   "template": cfg.template, "temperature": cfg.eval.temperature,
                   "seed": args.seed, "rows": rows}  # fmt: skip
            Path(args.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if args.show:
        prompts = [task.prompt(p, cfg.template) for p in problems[: args.show]]
        roll = backend.generate(prompts, 1, max_new_tokens=max_new,
                                temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                                top_k=cfg.eval.top_k, want_logprobs=False)  # fmt: skip
        for p, t in zip(problems, roll.texts, strict=False):
            print(f"--- {p}\n{t[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
