"""Benchmark (issue 22): batched runs against one process per run, side by side in one call.

Three measurements, each timed in this process, one torch thread, back to back:

1. **Sweep throughput**: the reproduce sweep (`configs/sweep_countdown_tiny.toml`, reduced by
   ``--steps``/``--problems``/``--seeds``) run by `llm.orchestrate.sweep.run_sweep` with
   ``--workers 1`` under ``engine="process"`` (each run trained alone by
   `llm.train.trainer.train`, evaluated through transformers' `generate`) and
   ``engine="batched"`` (`llm.train.batched.train_batch` in batches of
   `llm.orchestrate.sweep.MAX_BATCH`, stacked evaluation). With one worker the wall
   clock is the core time: runs per core-hour = runs / hours. Goal: batched >= 3x.
2. **Step time per run**: the training step of the reproduce config alone (`train`) and in a
   batch of R runs (`train_batch`, the batch's step time / R).
3. **Evaluation throughput**: completions per core-second of `llm.eval.heldout.evaluate`
   (transformers' `generate`, one model) and `evaluate_models` (M models stacked).

Where the time goes is printed with the numbers: the tiny model's forward is compute-bound
(about 1.7 MFLOP per token), so batching removes the per-call overhead and the repeated prompt
work, not the arithmetic. The TRL step ratio comes from ``bench/bench_trl.py`` (run it next to
this one; its ``ours_step_s`` is the one-run step, which item 2 divides).

    python bench/bench_batched.py [--steps 40] [--problems 64] [--seeds 0] [--runs 8]
                                  [--out bench/results/batched.json]
"""

from __future__ import annotations

import argparse
import copy
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

from experiment.study_report import cpu_model
from llm.config import load_config
from llm.eval.heldout import evaluate, evaluate_models
from llm.model.load import load_model_and_tokenizer
from llm.model.tiny import TinyConfig, ensure_base_model, tiny_problems
from llm.orchestrate.sweep import run_sweep
from llm.orchestrate.sweep_spec import load_sweep
from llm.rollout.base import stop_token_ids
from llm.rollout.hf import HFGenerateBackend
from llm.train.batched import train_batch
from llm.train.trainer import train

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "configs" / "sweep_countdown_tiny.toml"
CONFIG = ROOT / "configs" / "countdown_tiny.toml"
METHODS = [("grpo", {}), ("ds_grpo", {"gamma_p": 1.0, "gamma_n": 0.2}),
           ("entropy_bonus", {"eta": 0.1}), ("casp", {"alpha": 0.5}),
           ("unlikeliness", {"beta_rank": 0.3})]  # fmt: skip


def sweep_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Item 1: the reduced reproduce sweep under both engines, one worker each."""
    sets = [f"train.steps={args.steps}", f"checkpoints={args.checkpoints}",
            f"eval.problems={args.problems}", f"seeds={args.seeds}"]  # fmt: skip
    spec = load_sweep(SWEEP, sets)
    out: dict[str, Any] = {"sets": sets}
    with tempfile.TemporaryDirectory(prefix="bench_batched_") as tmp:
        for engine in ("process", "batched"):
            start = time.perf_counter()
            res = run_sweep(spec, Path(tmp) / engine, workers=1, progress=False,
                            num_resamples=10, engine=engine)  # fmt: skip
            hours = (time.perf_counter() - start) / 3600
            runs = len(res["runs"])
            out[engine] = {"runs": runs, "seconds": round(hours * 3600, 1),
                           "runs_per_core_hour": round(runs / hours, 1),
                           "pass1_mean": float(np.mean([m["pass1"] for m in res["models"]]))}  # fmt: skip
    out["ratio"] = out["batched"]["runs_per_core_hour"] / out["process"]["runs_per_core_hour"]
    return out


def step_times(args: argparse.Namespace) -> dict[str, Any]:
    """Item 2: the training step alone and in a batch of ``--runs``."""
    base = load_config(CONFIG, steps=args.step_steps, run={"save_every": 0, "tensorboard": False},
                       system={"num_threads": 1})  # fmt: skip
    cfgs = []
    for r in range(args.runs):
        method, hyper = METHODS[r % len(METHODS)]
        cfgs.append(dataclasses.replace(base, method=method, hyper=hyper, seed=r))
    with tempfile.TemporaryDirectory(prefix="bench_steps_") as tmp:
        alone = [train(c, Path(tmp) / f"a{i}", progress=False) for i, c in enumerate(cfgs[:2])]
        batch = train_batch(cfgs, [Path(tmp) / f"b{i}" for i in range(len(cfgs))])
    warm = 2

    def median(hist: list[dict[str, float]], key: str) -> float:
        return float(np.median([h[key] for h in hist[warm:]]))

    one = {k: float(np.mean([median(h, f"time/{k}") for h in alone]))
           for k in ("step", "rollout", "logprob", "optim")}  # fmt: skip
    many = {k: median(batch[0], f"time/{k}") / len(cfgs)
            for k in ("step", "rollout", "logprob", "optim")}  # fmt: skip
    return {"runs": len(cfgs), "alone_s": one, "batched_per_run_s": many,
            "ratio": one["step"] / many["step"]}  # fmt: skip


def eval_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Item 3: completions per core-second, one model through `generate` and M stacked."""
    path = ensure_base_model(ROOT / "runs" / "base_tiny")
    problems = tiny_problems(TinyConfig(), "heldout", args.problems)
    model, tok = load_model_and_tokenizer(path, "cpu")
    models = []
    for r in range(args.runs):
        m = copy.deepcopy(model)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.003 * torch.randn(p.shape, generator=torch.Generator().manual_seed(r)))
        models.append(m)
    kw = {"template": "compact", "samples": 16, "max_new_tokens": 16, "bleu": False}
    start = time.perf_counter()
    for m in models[:2]:
        evaluate(HFGenerateBackend(m, tok), "countdown", problems, **kw)
    one = (time.perf_counter() - start) / 2
    start = time.perf_counter()
    evaluate_models(models, tok, "countdown", problems,
                    stop_token_ids=stop_token_ids(tok, path), **kw)  # fmt: skip
    many = (time.perf_counter() - start) / len(models)
    n = len(problems) * 16
    return {"models": len(models), "completions_per_s_alone": n / one,
            "completions_per_s_batched": n / many, "ratio": one / many}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="sweep: training steps per run")
    parser.add_argument("--checkpoints", type=int, default=2, help="sweep: evaluated checkpoints")
    parser.add_argument("--problems", type=int, default=64, help="evaluation problems")
    parser.add_argument("--seeds", default="[0]", help="sweep: seeds (TOML list)")
    parser.add_argument("--runs", type=int, default=8, help="runs per batch (items 2, 3)")
    parser.add_argument("--step-steps", type=int, default=12, help="item 2: steps per run")
    parser.add_argument("--skip-sweep", action="store_true", help="items 2 and 3 only")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result: dict[str, Any] = {"cpu": cpu_model(),
                              "numerics": numerics.tag()}  # fmt: skip
    result["steps"] = step_times(args)
    s = result["steps"]
    print(f"step per run: alone {s['alone_s']['step'] * 1e3:.1f} ms (rollout "
          f"{s['alone_s']['rollout'] * 1e3:.1f}, update {s['alone_s']['optim'] * 1e3:.1f}); "
          f"batched x{s['runs']} {s['batched_per_run_s']['step'] * 1e3:.1f} ms (rollout "
          f"{s['batched_per_run_s']['rollout'] * 1e3:.1f}, update "
          f"{s['batched_per_run_s']['optim'] * 1e3:.1f}): {s['ratio']:.2f}x")  # fmt: skip
    result["eval"] = eval_throughput(args)
    e = result["eval"]
    print(
        f"evaluation: {e['completions_per_s_alone']:.0f} completions/s alone, "
        f"{e['completions_per_s_batched']:.0f} stacked x{e['models']}: {e['ratio']:.2f}x"
    )
    if not args.skip_sweep:
        result["sweep"] = sweep_throughput(args)
        w = result["sweep"]
        print(
            f"sweep ({w['process']['runs']} runs, {' '.join(w['sets'])}): process "
            f"{w['process']['runs_per_core_hour']:.0f} runs/core-h, batched "
            f"{w['batched']['runs_per_core_hour']:.0f}: {w['ratio']:.2f}x (goal >= 3)"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
