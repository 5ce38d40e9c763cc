"""bench/bench_roofline.py on the offline tiny model, on the CPU: both engines' work, time and
fraction of the ceiling are written, the work is positive and the batched engine's per run-step
work is at most the single run's (it shares the prompt work)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_roofline_writes_both_engines(tmp_path, tiny_model_path):
    spec = importlib.util.spec_from_file_location("roofline", ROOT / "bench/bench_roofline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "roofline.json"
    args = ["--steps", "3", "--runs", "2", "--repeats", "1", "--model", tiny_model_path,
            "--out", str(out), "--set", "data.source=\"generate\"", "data.n_problems=64",
            "data.max_number=9", "data.max_target=20"]  # fmt: skip
    assert module.main(args) == 0
    doc = json.loads(out.read_text())
    eng = doc["engines"]
    assert set(eng) == {"single", "batched"} and doc["ceiling"]["weighted_gflops"] > 0
    for e in eng.values():
        assert e["gflop_per_run_step"] > 0 and e["s_per_run_step"] > 0
        assert e["fraction_of_ceiling"] > 0
    assert eng["batched"]["gflop_per_run_step"] <= eng["single"]["gflop_per_run_step"] * 1.0001
