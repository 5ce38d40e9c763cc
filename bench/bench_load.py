"""The trainer on a busy machine (issue 41 item 3): the tiny LLM trainer's step time idle and with
one CPU-bound process beside it, under OpenMP's default wait policy, the one `numerics` chooses
(``auto``), ``OMP_WAIT_POLICY=PASSIVE`` and two shorter spins (``GOMP_SPINCOUNT``), alternating in one run; the ratios of the medians, and whether every
run's numbers (its metrics but the timings) are the same bytes.

    python bench/bench_load.py [--rounds 3] [--steps 60] [--threads 2]

Each run is a fresh process (`python -m llm train --config configs/countdown_tiny.toml`), so each
wait policy is read when libgomp loads; the busy core is a Python busy loop. The step time is the
median of ``time/step`` over the run's steps after the fifth (start-up and compilation excluded).
Prints one line per (load, policy) and the ratios loaded/idle and passive/default.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: OpenMP wait settings compared (libgomp's variables; `default` is libgomp's own, ~300,000 spins
#: at a barrier; `auto` is what `numerics.choose_wait_policy` picks, passive beside a busy core).
POLICIES: dict[str, dict[str, str]] = {
    "default": {"SHARPENING_WAIT": "active"},
    "auto": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin1k": {"GOMP_SPINCOUNT": "1000"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
}


def _run(out: Path, steps: int, threads: int, policy: dict[str, str]) -> tuple[float, list[dict]]:
    """One training run; returns (median step seconds, its metrics without timings)."""
    shutil.rmtree(out, ignore_errors=True)
    drop = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SHARPENING_WAIT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(policy)
    cmd = [sys.executable, "-m", "llm", "train", "--config", "configs/countdown_tiny.toml",
           "--out", str(out), "--set", f"steps={steps}", "run.save_every=100000",
           "run.tensorboard=false", f"system.num_threads={threads}"]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = statistics.median(r["time/step"] for r in rows[5:])
    numbers = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
    return step, numbers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument(
        "--threads", type=int, default=2, help="torch threads of the run (2: the CPU default)"
    )
    args = ap.parse_args()
    times: dict[tuple[str, str], list[float]] = {}
    numbers: dict[tuple[str, str], list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for load in ("idle", "loaded"):
            hog = None
            if load == "loaded":
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                for _ in range(args.rounds):
                    for name, policy in POLICIES.items():
                        out = Path(tmp) / f"{load}_{name}"
                        t, nums = _run(out, args.steps, args.threads, policy)
                        times.setdefault((load, name), []).append(t)
                        numbers.setdefault((load, name), nums)
            finally:
                if hog is not None:
                    hog.kill()
    med = {k: statistics.median(v) for k, v in times.items()}
    for (load, name), v in times.items():
        print(f"{load:7s} {name:8s} step {med[(load, name)] * 1000:7.1f} ms  (runs: "
              + ", ".join(f"{x * 1000:.0f}" for x in v) + ")")  # fmt: skip
    for name in POLICIES:
        print(f"loaded/idle, {name}: {med[('loaded', name)] / med[('idle', name)]:.2f}x")
    for load in ("idle", "loaded"):
        for name in list(POLICIES)[1:]:
            ratio = med[(load, name)] / med[(load, "default")]
            print(f"{name}/default, {load}: {ratio:.2f}x")
    reference = numbers[("idle", "default")]
    same = all(v == reference for v in numbers.values())
    print("every run's numbers: " + ("the same bytes" if same else "DIFFER"))


if __name__ == "__main__":
    main()
