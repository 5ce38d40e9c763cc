"""Speed of the closed forms and measures on a 4**10-leaf tree, and of `python -m theory check`.

Budgets (issue 2): each closed form and measure on 4**10 leaves ≤ 1 s; `python -m theory check` at
default trials ≤ 60 s on 2 cores. As a side-by-side reference, each log-space closed form is timed
against the same formula evaluated naively in probability space (exp, multiply, normalize: fast but
underflows on deep trees), so the printed ratio is the price of exactness.

Run: `python bench/bench_theory.py [--skip-check]`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import numpy as np

from theory import measures, optimum, trees


def _best_of(fn: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--skip-check", action="store_true", help="do not time `python -m theory check`"
    )
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    v, h = 4, 10
    log_pb = trees.random_base_policy(rng, v, h, skew=1.0)
    correct = trees.random_correct_set(rng, v**h)
    reward = correct.astype(float)
    pb = np.exp(log_pb)
    beta, eta, gp, gn = 0.5, 0.2, 0.1, 0.05

    def naive_kl() -> np.ndarray:
        w = pb * np.exp(reward / beta)
        return w / w.sum()

    def naive_entropy() -> np.ndarray:
        w = pb ** (beta / (beta + eta)) * np.exp(reward / (beta + eta))
        return w / w.sum()

    def naive_ds_base() -> np.ndarray:
        w = np.where(correct, np.exp(1 / beta) * pb ** (1 - gp / beta), pb ** (1 + gn / beta))
        return w / w.sum()

    ds = optimum.differential_smoothing(log_pb, correct, beta, gp, gn)
    rows = [
        ("kl_regularized", lambda: optimum.kl_regularized(log_pb, reward, beta), naive_kl),
        (
            "entropy_regularized",
            lambda: optimum.entropy_regularized(log_pb, reward, beta, eta),
            naive_entropy,
        ),
        (
            "differential_smoothing (policy)",
            lambda: optimum.differential_smoothing(log_pb, correct, beta, gp, gn),
            None,
        ),
        (
            "differential_smoothing (base)",
            lambda: optimum.differential_smoothing(log_pb, correct, beta, gp, gn, "base"),
            naive_ds_base,
        ),
        ("correctness", lambda: measures.correctness(ds, correct), lambda: pb[correct].sum()),
        ("normalized_variance", lambda: measures.normalized_variance(ds, correct), None),
        ("divergence kl", lambda: measures.divergence(ds, log_pb, "kl"), None),
        ("divergence chi2 (reverse)", lambda: measures.divergence(log_pb, ds, "chi2"), None),
        (
            "trajectory_log_probs",
            lambda: trees.trajectory_log_probs(trees.random_base_logits(rng, v, h), v, h),
            None,
        ),
        ("logits_from_log_probs", lambda: trees.logits_from_log_probs(log_pb, v, h), None),
    ]
    print(f"tree: V={v}, H={h}, M={v**h:,} leaves; best of 5; budget 1.000 s each")
    print(f"{'function':<34} {'seconds':>8} {'naive prob-space':>17} {'ratio':>7}  ok")
    worst = 0.0
    for name, fast, naive in rows:
        t = _best_of(fast)
        worst = max(worst, t)
        if naive is not None:
            t_ref = _best_of(naive)
            print(
                f"{name:<34} {t:>8.3f} {t_ref:>17.3f} {t / t_ref:>7.1f}  {'yes' if t <= 1 else 'NO'}"
            )
        else:
            print(f"{name:<34} {t:>8.3f} {'-':>17} {'-':>7}  {'yes' if t <= 1 else 'NO'}")
    print(f"slowest: {worst:.3f} s (budget 1 s)")

    if not args.skip_check:
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "theory", "check", "--json"], check=False, capture_output=True
        )
        t = time.perf_counter() - start
        print(
            f"python -m theory check (default trials): {t:.1f} s (budget 60 s, ratio {t / 60:.2f})"
        )


if __name__ == "__main__":
    main()
