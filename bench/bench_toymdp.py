"""Throughput of the vmapped JAX simulator over the NumPy reference: 1,024 CaSP-tree GRPO runs.

Both run the same algorithm (`toymdp.configs.casp_config("grpo")`: G = 8, 200 updates, Adam) with
exact metrics after every update. The JAX side runs all 1,024 runs (32 settings: 4 learning
rates x 8 KL coefficients, times 32 seeds) in one `jax.jit(jax.vmap(jax.vmap(train)))` call; the
reference (`toymdp.reference.reference_train`, one run per Python loop) is timed on a few runs and
its per-run cost extrapolated to 1,024. Printed ratios: steady state (compiled), including the
one-time compilation, and against the reference's training loop alone (no per-step metrics).
Issue 4's goal: >= 100x.

Run: `python bench/bench_toymdp.py [--ref-runs 3] [--updates 200]`.
"""

from __future__ import annotations

import argparse
import time

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import jax
import numpy as np

from toymdp import configs
from toymdp import reference as R
from toymdp import train as T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ref-runs", type=int, default=3, help="reference runs to time")
    parser.add_argument("--updates", type=int, default=200, help="updates per run")
    parser.add_argument("--seeds", type=int, default=32, help="seeds (x 32 settings)")
    args = parser.parse_args()

    cfg = configs.casp_config("grpo", num_updates=args.updates)
    grid = T.settings_grid(
        cfg, lr=[0.03, 0.1, 0.3, 1.0], kl_coef=[0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
    )
    keys = T.seed_keys(0, args.seeds)
    runs = 32 * args.seeds
    fn = T.vmap_train(T.make_train(cfg))

    start = time.perf_counter()
    compiled = fn.lower(grid, keys).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(grid, keys))  # warm-up
    times = []
    for _ in range(2):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(grid, keys))
        times.append(time.perf_counter() - start)
    jax_s = min(times)
    assert np.isfinite(np.asarray(out["exact"]["correctness"])).all()

    ref_full, ref_train = [], []
    for r in range(args.ref_runs):
        settings = jax.tree.map(lambda a, r=r: float(a[(7 * r) % 32]), grid)
        uniforms = np.asarray(T.sampling_uniforms(cfg, keys[r]))
        start = time.perf_counter()
        R.reference_train(cfg, settings, uniforms)
        ref_full.append(time.perf_counter() - start)
        start = time.perf_counter()
        R.reference_train(cfg, settings, uniforms, every_step=False)
        ref_train.append(time.perf_counter() - start)
    per_run_full, per_run_train = float(np.mean(ref_full)), float(np.mean(ref_train))

    print(f"config: CaSP tree GRPO, G={cfg.group_size}, {cfg.num_updates} updates, "
          f"mu={cfg.num_epochs}, {cfg.optimizer}; {runs} runs = 32 settings x {args.seeds} seeds")  # fmt: skip
    print(f"JAX   : compile {compile_s:.2f} s, run {jax_s:.3f} s ({jax_s / runs * 1e3:.3f} ms/run)")
    print(
        f"NumPy : {per_run_full:.3f} s/run with per-step metrics, {per_run_train:.3f} s/run "
        f"training only (mean of {args.ref_runs}); extrapolated to {runs} runs: "
        f"{per_run_full * runs:.1f} s / {per_run_train * runs:.1f} s"
    )
    print(f"ratio (steady state, same metrics)   : {per_run_full * runs / jax_s:8.1f}x")
    print(
        f"ratio (including JAX compilation)    : {per_run_full * runs / (jax_s + compile_s):8.1f}x"
    )
    print(f"ratio (vs reference training only)   : {per_run_train * runs / jax_s:8.1f}x")


if __name__ == "__main__":
    main()
