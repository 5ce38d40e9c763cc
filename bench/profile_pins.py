"""Where a numerics pin's time goes (issue 41 item 2): the tiny base model's warm start profiled
under two pins side by side, and each operator's self time under the second over the first.

    python bench/profile_pins.py [--modes pinned-v1 pinned] [--steps-problems 700] [--top 8]

Each mode runs in a fresh process (``SHARPENING_NUMERICS=<mode>``: a pin is read when the libraries
load): a short warm-up, then `llm.model.tiny.warm_start` on one torch thread (one epoch of
``--steps-problems`` problems, batch 64) under `torch.profiler`. Prints each mode's step time and
the top operators by self CPU time with their ratio to the first mode. Measured 2026-11-28 (AMD
EPYC family 25; `bench/results/pin_profile_v1_v2_2026-11-28.txt`): pin v2 / v1 = 1.7x per step,
all of it in MKL's GEMMs (``aten::mm`` 2.3x, ``aten::addmm`` 2.5x, SDPA 1.7x); the other
operators move by run-to-run noise (0.8-1.1x).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import numerics  # first: the pin holds before torch loads

# isort: split
from torch.profiler import ProfilerActivity, profile

from llm.model import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def profile_here(problems: int) -> dict:
    """This process's warm start under its own pin: ms per step and self CPU µs per operator."""
    cfg = dataclasses.replace(tiny.TinyConfig(), epochs=1, num_train_problems=problems)
    tok = tiny.build_tokenizer(cfg.max_target)
    data = tiny.tiny_problems(cfg, "train", cfg.num_train_problems)
    model = tiny.build_tiny_model(
        tok, seed=cfg.model_seed, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
    )  # fmt: skip
    tiny.warm_start(model, tok, data[:100], config=cfg, num_threads=1, progress=False)  # warm-up
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        losses = tiny.warm_start(model, tok, data, config=cfg, num_threads=1, progress=False)
    seconds = time.perf_counter() - start
    ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    return {"tag": numerics.tag(), "ms_per_step": 1000 * seconds / len(losses), "ops_us": ops}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs=2, default=["pinned-v1", "pinned"])
    ap.add_argument("--steps-problems", type=int, default=700)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(profile_here(args.steps_problems)))
        return 0
    rows = []
    for mode in args.modes:
        env = {**numerics.original_environ(), numerics.OPT_OUT_ENV: mode, "PYTHONPATH": ROOT}
        res = subprocess.run(
            [sys.executable, __file__, "--child", "--steps-problems", str(args.steps_problems)],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    a, b = rows
    print(f"{a['tag']}: {a['ms_per_step']:.0f} ms/step; {b['tag']}: {b['ms_per_step']:.0f} ms/step "
          f"({b['ms_per_step'] / a['ms_per_step']:.2f}x)")  # fmt: skip
    top = sorted(b["ops_us"], key=b["ops_us"].get, reverse=True)[: args.top]
    print(f"{'operator':44s} {'first ms':>9s} {'second ms':>10s} {'ratio':>6s}")
    for op in top:
        x, y = a["ops_us"].get(op, 0.0), b["ops_us"][op]
        print(f"{op[:44]:44s} {x / 1000:9.1f} {y / 1000:10.1f} {y / x if x else float('nan'):6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
