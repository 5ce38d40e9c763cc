"""The speed cost of the pinned numeric paths (`numerics`, issue 19): each piece of the two-level
check timed as a whole process, pinned (this version), pinned to version 1 (``pinned-v1``: MKL's
AVX2 branch, the same bytes only among CPUs of one vendor) and native
(``SHARPENING_NUMERICS=native``) alternating in one run, and the ratios of the medians.

    python bench/bench_numerics.py [--rounds 3] [--only theory toy llm base]

Pieces: ``theory check`` (numpy, scipy, OpenBLAS on one thread when pinned), the quick toy sweep
(XLA), 20 steps of the tiny LLM trainer plus evaluation (torch), and the tiny base model's warm
start (``base``: 510 steps of larger matrix products). Prints one line per piece.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands(out: Path) -> dict[str, list[str]]:
    py = sys.executable
    toy = ["--config", "configs/toy/quick.toml", "--no-cache", "--out", str(out / "toy")]
    llm = ["--quick", "--steps", "20", "--methods", "entropy_bonus", "--out-runs", str(out / "llm")]
    return {
        "theory": [py, "-m", "theory", "check", "--json"],
        "toy": [py, "-m", "toymdp", "sweep", *toy],
        "llm": [py, "-m", "llm", "reproduce", *llm, "--figures", str(out / "fig")],
        "base": [py, "-c", "import sys; from llm.model.tiny import ensure_base_model; "
                 "ensure_base_model(sys.argv[1], progress=False)", str(out / "base")],
    }  # fmt: skip


MODES = ("pinned", "pinned-v1", "native")


def _time(cmd: list[str], mode: str, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "SHARPENING_NUMERICS": mode}
    # a fresh process decides its own pin: drop what this process may have inherited
    for key in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "XLA_FLAGS"):
        env.pop(key, None)
    for key in ("NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS"):
        env.pop(key, None)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=["theory", "toy", "llm", "base"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cmds = _commands(out / "out")
        for name in args.only or list(cmds):
            times: dict[str, list[float]] = {mode: [] for mode in MODES}
            for _ in range(args.rounds):
                for mode in MODES:
                    times[mode].append(_time(cmds[name], mode, out / "out"))
            p, v1, n = (statistics.median(times[mode]) for mode in MODES)
            print(
                f"{name:7s} pinned {p:6.2f} s  pinned-v1 {v1:6.2f} s  native {n:6.2f} s  "
                f"pinned/native {p / n:.2f}  pinned/pinned-v1 {p / v1:.2f}  "
                f"(median of {args.rounds}, whole processes)",
                flush=True,
            )


if __name__ == "__main__":
    main()
