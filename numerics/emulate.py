"""`python -m numerics.emulate`: the same bytes on another CPU, checked on an emulated one.

A short piece of every leg (`PIECES`: the theory check, a toy sweep, a tiny LLM sweep with its
weight hashes) runs twice in a fresh process: on this machine's CPU, then under QEMU's user-mode
emulator (``qemu-x86_64 -cpu max``: an AMD x86-64 CPU with AVX2 and FMA but no AVX-512 and no
native bf16, whose CPUID every library reads afresh; ``--cpu Haswell`` emulates an Intel one, which
MKL's vendor-specific branches tell apart). The pinned results must be equal byte for byte.
`tests/test_numerics.py` holds the same pieces to a weaker stand-in for another CPU (the libraries
forced down through their own variables); this one also catches what no variable controls, such
as torch's CPU ``sqrt``, which is not correctly rounded and rounds differently on the emulated
CPU (its kernel is not identified: docs/numerics.md).

Needs QEMU's user-mode emulator (Debian: ``apt-get install qemu-user``). Every piece runs in one
process (``--jobs 1``): a child process would start natively, outside the emulator. Takes ~4 min
here (the emulated LLM piece ~2 min). Prints one row per piece and exits 1 if any differs.

    python -m numerics.emulate [--piece theory --piece toy --piece llm] [--cpu max]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numerics

ROOT = Path(__file__).resolve().parents[1]

PIECES = ("theory", "toy", "llm")
"""The pieces, one per leg (`piece_command`)."""

QEMU = "qemu-x86_64"

EMULATED_ENV = "SHARPENING_EMULATED"
"""Set by `run_emulated` to the emulator's command line in the emulated process (`emulated`):
``/proc/cpuinfo`` there is the host's, so a record of the CPU must say it was emulated."""


def emulated() -> str | None:
    """The emulator this process runs under when `run_emulated` started it (e.g.
    ``"qemu-x86_64 -cpu max"``), else None."""
    return os.environ.get(EMULATED_ENV) or None


def run_emulated(args: list[str], cpu: str = "max") -> int:
    """Run this interpreter with `args` under ``qemu-x86_64 -cpu CPU``, in the current folder, in
    the environment as it was before the pin (the child pins itself), and return its exit code.
    The child runs in one process: a worker it spawned would start natively.

    Raises:
        FileNotFoundError: QEMU's user-mode emulator is not installed (``apt-get install
            qemu-user``).
    """
    if shutil.which(QEMU) is None:
        raise FileNotFoundError(f"{QEMU} not found: install QEMU's user-mode emulator "
                                "(apt-get install qemu-user)")  # fmt: skip
    env = piece_env()
    env[EMULATED_ENV] = f"{QEMU} -cpu {cpu}"
    return subprocess.run([QEMU, "-cpu", cpu, sys.executable, *args], env=env).returncode


def piece_command(name: str, out: Path) -> tuple[list[str], Path | None]:
    """Piece `name`'s command (run from the repository root with this interpreter) and the file
    it reports to (None: its standard output).

    Raises:
        ValueError: an unknown piece.
    """
    py = sys.executable
    if name == "theory":
        return [py, "-m", "theory", "check", "--json", "--trials", "3", "--seed", "0"], None
    if name == "toy":
        cmd = [py, "-m", "toymdp", "sweep", "--config", "configs/toy/quick.toml", "--out", str(out)]
        return [*cmd, "--no-cache"], out / "results.json"
    if name == "llm":
        cmd = [py, "-m", "llm", "reproduce", "--quick", "--steps", "20", "--out-runs", str(out)]
        cmd += ["--methods", "entropy_bonus", "--jobs", "1", "--figures", str(out / "figures")]
        return cmd, out / "quick" / "sweep" / "results.json"  # with every model's weight hash
    raise ValueError(f"piece: expected one of {', '.join(PIECES)}, got {name!r}")


def untimed(doc: Any) -> Any:
    """`doc` without its wall-clock fields (``*_seconds``), the only ones that may differ."""
    if isinstance(doc, dict):
        return {k: untimed(v) for k, v in doc.items() if not k.endswith("seconds")}
    if isinstance(doc, list):
        return [untimed(v) for v in doc]
    return doc


def piece_bytes(
    name: str, out: Path, env: dict[str, str], prefix: list[str] | None = None
) -> bytes:
    """Run piece `name` into `out` (emptied first) under `env`, its command after `prefix` (an
    emulator); return the bytes it reports (JSON reports without their wall-clock fields).

    Raises:
        RuntimeError: the command failed (its last output lines quoted).
    """
    shutil.rmtree(out, ignore_errors=True)
    cmd, report = piece_command(name, out)
    res = subprocess.run([*(prefix or []), *cmd], cwd=ROOT, env=env, capture_output=True,
                         timeout=3600)  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"{name}: {' '.join(cmd)} failed:\n{res.stderr.decode()[-3000:]}")
    if report is None:
        return res.stdout
    return json.dumps(untimed(json.loads(report.read_bytes())), sort_keys=True).encode()


def piece_env() -> dict[str, str]:
    """The environment a piece runs in: this process's, as it was before the pin (the child pins
    itself), with the repository importable."""
    env = numerics.original_environ()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--piece", action="append", choices=PIECES,
                        help="a piece to check (repeatable; default: all)")  # fmt: skip
    parser.add_argument("--cpu", default="max", help="QEMU's CPU model (default: max)")
    args = parser.parse_args(argv)
    if shutil.which(QEMU) is None:
        print(f"{QEMU} not found: install QEMU's user-mode emulator (apt-get install qemu-user)")
        return 2
    print(f"numerics: {numerics.tag()}; emulated CPU: {QEMU} -cpu {args.cpu}")
    print("| piece | native (s) | emulated (s) | bytes |\n|---|---|---|---|")
    env, failed = piece_env(), False
    with tempfile.TemporaryDirectory(prefix="numerics_emulate_") as tmp:
        out = Path(tmp) / "out"  # one folder for both: the outputs record their paths
        for name in args.piece or PIECES:
            times, got = [], []
            for prefix in ([], [QEMU, "-cpu", args.cpu]):
                start = time.perf_counter()
                got.append(piece_bytes(name, out, env, prefix))
                times.append(time.perf_counter() - start)
            same = got[0] == got[1]
            failed |= not same
            print(f"| {name} | {times[0]:.0f} | {times[1]:.0f} | "
                  f"{'identical' if same else 'DIFFERENT'} |", flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
