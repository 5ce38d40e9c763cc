"""Smoke test of bench/bench_trl.py: both trainers run a few steps on a random tiny model, see the
same prompts in the same order, and the JSON report holds finite per-step times and ratios."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from tests.llm.conftest import save_random_tiny_model

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_trl.py"


def load_bench():
    """bench/bench_trl.py as a module (bench/ is no package); registered, as dataclasses need."""
    if "bench_trl" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_trl", BENCH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_trl"] = module
        spec.loader.exec_module(module)
    return sys.modules["bench_trl"]


@pytest.fixture(scope="module")
def random_tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random one-layer model with the full compact vocabulary (targets up to 100)."""
    return save_random_tiny_model(tmp_path_factory.mktemp("bench_trl_model"), max_number=100)


def test_bench_trl_smoke(random_tiny: str, tmp_path: Path) -> None:
    bench = load_bench()
    out = tmp_path / "bench.json"
    argv = [
        "--model", random_tiny, "--steps", "3", "--warmup", "1", "--threads", "1",
        "--group-size", "4", "--prompts-per-step", "2", "--micro-batch-size", "4",
        "--max-new-tokens", "6", "--batched", "2", "--out", str(out),
    ]  # fmt: skip
    res = bench.main(argv)
    saved = json.loads(out.read_text())
    assert saved["summary"] == pytest.approx(res["summary"], nan_ok=True)
    assert saved["same_prompts"] is True
    for name in ("ours", "trl"):
        (run,) = saved[name]
        assert len(run["step"]) == 3
        assert all(t > 0 for t in run["step"])
    s = saved["summary"]
    for key in ("ours_step_s", "trl_step_s", "ratio_step", "ratio_loop", "batched_step_s",
                "ratio_batched_step"):  # fmt: skip
        assert math.isfinite(s[key]) and s[key] > 0, key
    (batched,) = saved["batched"]
    assert len(batched["step"]) == 3 and s["batched_runs"] == 2
    assert len(saved["differences"]) >= 5


def test_bench_trl_rejects_other_methods(random_tiny: str, tmp_path: Path) -> None:
    bench = load_bench()
    cfg = tmp_path / "dr.toml"
    cfg.write_text('method = "dr_grpo"\n')
    with pytest.raises(SystemExit, match="compares GRPO"):
        bench.make_config(bench.Args(config=str(cfg)), random_tiny)


@pytest.mark.slow
def test_call_in_own_process_returns_and_reports_errors(monkeypatch, random_tiny):
    """`--vllm` runs each trainer in a fresh spawned process (one vLLM engine per process): the
    result comes back, a failure names the child's exception, a child that dies its exit code."""
    import os

    bench = load_bench()
    # The spawned child unpickles the bench's functions by module name (run as a script: __main__).
    monkeypatch.syspath_prepend(str(BENCH.parent))
    assert bench.call(os.getpid) == os.getpid()
    child_pid = bench.call(os.getpid, own_process=True)
    assert isinstance(child_pid, int) and child_pid != os.getpid()
    with pytest.raises(RuntimeError, match="invalid literal"):
        bench.call(int, "not a number", own_process=True)
    with pytest.raises(RuntimeError, match="exited with code 3 without a result"):
        bench.call(os._exit, 3, own_process=True)  # dies without a result (a native crash)
    # What `run` sends to its children with --vllm pickles (the runs' results are plain lists).
    import pickle

    cfg = bench.make_config(bench.Args(model=random_tiny, steps=2), random_tiny)
    pickle.loads(pickle.dumps((bench.run_ours, bench.run_trl, cfg, bench.prompt_stream(cfg))))
