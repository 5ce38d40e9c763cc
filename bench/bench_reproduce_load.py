"""`make reproduce` idle and beside one CPU-bound process (issue 41 item 3): the wall time of each,
their ratio, and whether both reproduced the committed results byte for byte.

    python bench/bench_reproduce_load.py [--loads idle loaded] [--out bench/results/reproduce_load.json]
    python bench/bench_reproduce_load.py --study configs/study_X.toml   # a study instead

Each run is a fresh clone of this checkout's HEAD (``git clone --local``: no caches, no runs, the
base model built again) with this checkout's ``.venv`` linked in, running the Makefile's
``reproduce`` recipe with the virtual environment taken as built (``make -o``). The recipe ends with
``python -m numerics.compare figures``, which fails on any byte that differs from the committed
results, so a run that passes reproduced them. The busy core is a Python busy loop started before
the run and stopped after it. Takes ~13 min idle and ~20-25 min loaded on 2 cores; nothing else
should run beside it. With ``--study FILE`` each run is ``python -m llm study --config FILE
--workers 2`` in the clone instead (the file copied into its ``configs/``; the base model built
there too), and "reproduced" means every run's fingerprint (weights and per-problem counts at each
evaluated step) in both runs' ``study.json`` is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numerics

ROOT = Path(__file__).resolve().parents[1]


def run_reproduce(load: str, work: Path, study: Path | None = None) -> dict:
    """One `make reproduce` (or `study`) in a fresh clone under `work`; returns its seconds and
    outcome."""
    clone = work / f"clone_{load}"
    subprocess.run(["git", "clone", "-q", "--local", str(ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    cmd = ["make", "-o", ".venv/.stamp-core", "-o", ".venv/.stamp-llm", "reproduce"]
    if study is not None:
        shutil.copy(study, clone / "configs" / study.name)
        cmd = [sys.executable, "-m", "llm", "study", "--config", f"configs/{study.name}",
               "--workers", "2", "--out", "study"]  # fmt: skip
    hog = None
    if load == "loaded":
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    start = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=clone, capture_output=True, text=True)
    finally:
        if hog is not None:
            hog.kill()
    seconds = time.perf_counter() - start
    tail = (res.stdout + res.stderr).strip().splitlines()[-3:]
    row = {"seconds": round(seconds, 1), "returncode": res.returncode, "tail": tail}
    if study is not None and res.returncode == 0:
        # Every run's fingerprint: the SHA-256 of its weights and per-problem counts at each
        # evaluated step (`llm.orchestrate.sweep.run_fingerprint`); the rest of study.json follows
        # from them, but names the clone's paths.
        row["study"] = json.loads((clone / "study" / "study.json").read_text())["fingerprints"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", nargs="+", default=["idle", "loaded"], choices=["idle", "loaded"])
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    ap.add_argument("--study", type=Path, default=None, help="time this study file instead")
    args = ap.parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for load in args.loads:
            rows[load] = run_reproduce(load, Path(tmp), args.study)
            r = rows[load]
            print(f"{load:7s} {r['seconds'] / 60:6.1f} min  rc {r['returncode']}  {r['tail'][-1:]}",
                  flush=True)  # fmt: skip
    out = {"commit": head.stdout.strip(), "cpu": platform.processor() or platform.machine(),
           "cores": os.cpu_count(), "numerics": numerics.tag(), "runs": rows}  # fmt: skip
    ok = all(r["returncode"] == 0 for r in rows.values())
    if args.study is not None and ok and len(rows) == 2:
        idle, loaded = (rows[k].pop("study") for k in ("idle", "loaded"))
        ok = idle == loaded
        out["study"] = str(args.study)
    if {"idle", "loaded"} <= rows.keys():
        out["loaded_over_idle"] = round(rows["loaded"]["seconds"] / rows["idle"]["seconds"], 2)
        what = "the same run fingerprints" if args.study else "the committed results"
        print(f"loaded / idle: {out['loaded_over_idle']:.2f}x; both gave {what}: {ok}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
