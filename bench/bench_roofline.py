"""Benchmark (issue 41, item 1): the tiny model's training step against the pinned CPU's ceiling.

One thread (as every sweep run trains), side by side in one call:

1. **Work per step**: the floating-point operations of one training step of the reproduce config
   (`configs/countdown_tiny.toml`: the rollout's generate, the behaviour pass, the update's
   forward and backward), counted by torch's own `torch.utils.flop_counter.FlopCounterMode` over
   a few steps of `llm.train.trainer.train` (one run alone) and `llm.train.batched.train_batch`
   (``--runs`` runs as one program), per run-step. Matrix products and attention only: the
   counter's scope (elementwise work, sampling and the optimizer are free for it).
2. **Time per step**: the median ``time/step`` of the same configs trained without the counter
   (its bookkeeping would be in the time), after ``WARM`` steps.
3. **The ceiling**: the pinned path's matrix-product throughput at the model's own shapes, the
   four projections of a decoder layer and the output head at the rows one step feeds them
   (``torch.mm``, best of ``--repeats``), and its flop-weighted mean (the time the step's products
   would take at those rates). The fraction of the ceiling a step reaches is its achieved rate
   (work / time) over it.

    python bench/bench_roofline.py [--steps 8] [--runs 8] [--model DIR] [--out bench/results/roofline.json]

Prints one line per engine: GFLOP per run-step, s per run-step, achieved GFLOP/s, the ceiling and
the fraction. Numbers depend on this machine and its load; the fraction is the comparable one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numerics  # first: pins the numeric code paths before numpy, torch, JAX load

# isort: split
import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from experiment.study_report import cpu_id
from llm.config import add_set_argument, load_config
from llm.train.batched import train_batch
from llm.train.trainer import train

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "countdown_tiny.toml"
WARM = 2
"""Steps left out of the median step time (the first calls pay for allocation and caches)."""


def _configs(
    steps: int, runs: int, model: str | None = None, sets: list[str] | None = None
) -> list[Any]:
    over = {"model_path": model, "build_base_model": False} if model else {}
    base = load_config(CONFIG, sets=sets or (), steps=steps,
                       run={"save_every": 0, "tensorboard": False}, system={"num_threads": 1},
                       **over)  # fmt: skip
    return [dataclasses.replace(base, seed=r) for r in range(runs)]


def work_per_step(cfgs: list[Any], batched: bool, steps: int) -> float:
    """FLOPs per run-step counted by `FlopCounterMode` over `steps` steps."""
    counter = FlopCounterMode(display=False)
    with tempfile.TemporaryDirectory(prefix="roofline_") as tmp, counter:
        if batched:
            train_batch(cfgs, [Path(tmp) / f"r{i}" for i in range(len(cfgs))])
        else:
            train(cfgs[0], Path(tmp) / "r0", progress=False)
    return counter.get_total_flops() / (steps * (len(cfgs) if batched else 1))


def time_per_step(cfgs: list[Any], batched: bool) -> float:
    """Median seconds per run-step after `WARM` steps, without the counter."""
    with tempfile.TemporaryDirectory(prefix="roofline_") as tmp:
        if batched:
            hist = train_batch(cfgs, [Path(tmp) / f"r{i}" for i in range(len(cfgs))])[0]
            per = len(cfgs)
        else:
            hist = train(cfgs[0], Path(tmp) / "r0", progress=False)
            per = 1
    return float(np.median([h["time/step"] for h in hist[WARM:]])) / per


def gemm_ceiling(model_path: Path, rows: int, repeats: int) -> dict[str, Any]:
    """GFLOP/s of ``torch.mm`` at the shapes of the model in `model_path` (its config.json) with
    `rows` rows (best of `repeats`), and their flop-weighted mean (total flops / total best
    time)."""
    mc = json.loads((model_path / "config.json").read_text())
    d, f, vocab = mc["hidden_size"], mc["intermediate_size"], mc["vocab_size"]
    shapes = {"attention q/k/v/o": (d, d), "mlp up/gate": (d, f), "mlp down": (f, d),
              "output head": (d, vocab)}  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}
    flops = secs = 0.0
    for name, (k, n) in shapes.items():
        a = torch.randn(rows, k, generator=gen)
        b = torch.randn(k, n, generator=gen)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(20):
                torch.mm(a, b)
            best = min(best, (time.perf_counter() - start) / 20)
        fl = 2.0 * rows * k * n
        out[name] = {"shape": [rows, k, n], "gflops": fl / best / 1e9}
        flops, secs = flops + fl, secs + best
    out["weighted_gflops"] = flops / secs / 1e9
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="training steps per measurement (> 2)")
    ap.add_argument("--runs", type=int, default=8, help="runs in the batched engine's batch")
    ap.add_argument("--repeats", type=int, default=5, help="repeats of each product (best kept)")
    ap.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    ap.add_argument(
        "--model",
        default=None,
        help="a base model folder (default: the config's, built on first use)",
    )
    add_set_argument(ap, "config overrides (data.max_target=20 ...)")
    args = ap.parse_args(argv)
    if args.steps <= WARM:
        raise SystemExit(f"--steps: expected more than {WARM} (the warm steps), got {args.steps}")
    torch.set_num_threads(1)
    cfgs = _configs(args.steps, args.runs, args.model, args.sets)
    measured = {}
    for name, batched in (("single", False), ("batched", True)):  # trains the base model first
        group = cfgs if batched else cfgs[:1]
        measured[name] = (work_per_step(group, batched, args.steps), time_per_step(group, batched))
    # A step's products see B x G rows of ~40 tokens (prompt and response) in the behaviour pass
    # and the update; the rollout's decode steps see B x G rows of one token (less efficient).
    rows = cfgs[0].rollout.prompts_per_step * cfgs[0].rollout.group_size * 40
    ceiling = gemm_ceiling(Path(cfgs[0].model_path), rows, args.repeats)
    result: dict[str, Any] = {"cpu": cpu_id(), "numerics": numerics.tag(), "threads": 1,
                              "ceiling": ceiling, "engines": {}}  # fmt: skip
    print(f"ceiling: torch.mm at the model's shapes ({rows} rows), one thread: "
          + ", ".join(f"{k} {v['gflops']:.1f}" for k, v in ceiling.items() if k != "weighted_gflops")
          + f" GFLOP/s; flop-weighted {ceiling['weighted_gflops']:.1f}")  # fmt: skip
    for name, (work, secs) in measured.items():
        rate = work / secs / 1e9
        frac = rate / ceiling["weighted_gflops"]
        result["engines"][name] = {"gflop_per_run_step": work / 1e9, "s_per_run_step": secs,
                                   "achieved_gflops": rate, "fraction_of_ceiling": frac}  # fmt: skip
        print(f"{name:8s} {work / 1e9:7.3f} GFLOP/run-step  {secs * 1e3:7.1f} ms/run-step  "
              f"{rate:6.2f} GFLOP/s  = {100 * frac:5.1f}% of the ceiling")  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
