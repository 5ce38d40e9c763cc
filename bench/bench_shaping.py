"""Benchmark: every shaping method's loss + backward on torch CPU, next to plain GRPO.

At the default (B*G, T) = (64, 1024) (B = 8 prompts, G = 8 responses, N = 3 candidates) each
method's ``loss(batch)`` followed by ``backward()`` is timed against GRPO in the same run: the
two are interleaved within every repeat (GRPO, method, GRPO, method, ...), so machine load drifts
hit both alike, and the table reports medians and the ratio of the method's median to GRPO's
median over the same repeats. Goal: ratio <= 1.5 for every method.

Timing uses the process CPU clock and one torch thread by default: on a machine shared with other
jobs, wall-clock medians of millisecond calls swing by several times, CPU time does not
(``--clock wall --threads 0`` gives the wall-clock, multi-threaded view).

The batch is what the llm driver hands to ``shaping``: float32 per-token tensors with
``requires_grad`` on ``logp`` (and ``entropy``, ``cand_logp``); producing them from a model is not
part of the timing.

    python bench/bench_shaping.py            # 30 interleaved repeats
    python bench/bench_shaping.py --quick    # 5 repeats, for a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import numpy as np
import torch

import shaping

GOAL = 1.5


@dataclass
class Args:
    """Command-line arguments (see ``--help``)."""

    prompts: int = 8
    """B, prompts per batch."""
    group: int = 8
    """G, responses per prompt."""
    tokens: int = 1024
    """T, padded response length."""
    candidates: int = 3
    """N, top-N candidates per token (CaSP)."""
    repeats: int = 30
    """interleaved repeats per method (the median is reported)."""
    warmup: int = 3
    """untimed repeats first."""
    threads: int = 1
    """torch intra-op threads (0 keeps torch's default)."""
    clock: str = "cpu"
    """"cpu" (process CPU time: robust when other jobs share the machine) or "wall"."""
    seed: int = 0
    """seed of the synthetic batch."""


def make_batch(args: Args) -> dict[str, np.ndarray]:
    """A seeded float32 batch with every batch key but ``is_weight`` (`shaping.example_batch`)."""
    needs = set(shaping.BATCH_KEYS) - {"is_weight"}
    b, g, t, n = args.prompts, args.group, args.tokens, args.candidates
    return shaping.example_batch(needs, b, g, t, n, np, seed=args.seed, P=128, dtype=np.float32)


def settings(name: str, tokens: int) -> dict[str, object]:
    """Hyper-parameters that switch on each method's full computation (defaults otherwise)."""
    if name in ("entropy_bonus", "entropy_penalty"):
        return {"form": "token"}
    if "max_response_length" in shaping.get_method(name).defaults:
        return {"max_response_length": tokens}  # Dr. GRPO's constant: the padded length here
    return {}


class Timed:
    """One method's loss + backward on fixed torch leaves."""

    def __init__(self, name: str, batch: dict[str, np.ndarray]) -> None:
        self.method = shaping.get_method(name)
        self.hyper = settings(name, batch["mask"].shape[-1])
        needs = self.method.needs_for(**self.hyper) | {"rewards", "mask", "logp", "logp_old"}
        self.batch = {k: torch.from_numpy(np.ascontiguousarray(batch[k])) for k in needs}
        self.leaves = [
            self.batch[k].requires_grad_(True)
            for k in ("logp", "entropy", "cand_logp")
            if k in self.batch
        ]

    def __call__(self, clock=time.process_time) -> float:
        for leaf in self.leaves:
            leaf.grad = None
        start = clock()
        loss, _ = self.method.loss(self.batch, **self.hyper)
        loss.backward()
        return clock() - start


def run(args: Args) -> list[tuple[str, float, float]]:
    """(name, method median s, GRPO median s) for every registered method."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock not in ("cpu", "wall"):
        raise ValueError(f"clock must be 'cpu' or 'wall', got {args.clock!r}")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    batch = make_batch(args)
    grpo = Timed("grpo", batch)
    rows = []
    for name in sorted(shaping.METHODS):
        timed = Timed(name, batch)
        for _ in range(args.warmup):
            grpo()
            timed()
        base, mine = [], []
        for i in range(args.repeats):
            # Alternate which goes first so neither always runs on a warmer cache.
            if i % 2:
                mine.append(timed(clock))
                base.append(grpo(clock))
            else:
                base.append(grpo(clock))
                mine.append(timed(clock))
        rows.append((name, statistics.median(mine), statistics.median(base)))
    return rows


def table(rows: list[tuple[str, float, float]], args: Args) -> str:
    """The result as a Markdown table."""
    head = (
        f"torch {torch.__version__} CPU, {torch.get_num_threads()} threads; "
        f"(B*G, T) = ({args.prompts * args.group}, {args.tokens}), N = {args.candidates}; "
        f"{args.clock} clock, median of {args.repeats} interleaved repeats of loss + backward\n\n"
        "| method | ms | GRPO ms (same repeats) | ratio | <= 1.5x |\n|---|---:|---:|---:|:---:|"
    )
    lines = [head]
    for name, mine, base in rows:
        ratio = mine / base
        ok = "yes" if ratio <= GOAL else "NO"
        lines.append(f"| {name} | {mine * 1e3:.2f} | {base * 1e3:.2f} | {ratio:.2f} | {ok} |")
    return "\n".join(lines)


def parse() -> Args:
    """Parse the command line into `Args` (``--quick`` = 5 repeats, 1 warmup)."""
    defaults = Args()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field, value in vars(defaults).items():
        parser.add_argument(f"--{field}", type=type(value), default=value)
    parser.add_argument("--quick", action="store_true", help="5 repeats, 1 warmup")
    ns = parser.parse_args()
    if ns.quick:
        ns.repeats, ns.warmup = 5, 1
    return Args(**{k: v for k, v in vars(ns).items() if k != "quick"})


def main() -> None:
    args = parse()
    print(table(run(args), args))


if __name__ == "__main__":
    main()
