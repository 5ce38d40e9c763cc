"""Data parallelism: one update step over 2 gloo processes (torchrun; DDP and FSDP2) gives the
parameters of the single-process step on the same global batch (llm/run/distributed.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.tolerance import DATA_PARALLEL_N, assert_close

WORKER = Path(__file__).with_name("dist_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], world: int, worker: Path = WORKER) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
    }
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    launcher = [sys.executable]
    if world > 1:
        launcher += [
            "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
        ]  # fmt: skip
    proc = subprocess.run(
        [*launcher, str(worker), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def _params(out: Path, step: int = 1) -> dict[str, torch.Tensor]:
    return load_file(out / "checkpoints" / f"step_{step:06d}" / "model.safetensors")


def _loss(out: Path) -> float:
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["losses/loss"]


@pytest.fixture(scope="module")
def single(tiny_model_path, tmp_path_factory):
    """The single-process reference run, one per worker setting (shared by DDP and FSDP2)."""
    runs = {}

    def get(method: str, per_update: str, *more: str) -> Path:
        key = (method, per_update, *more)
        if key not in runs:
            out = tmp_path_factory.mktemp(f"single_{method}")
            _run([tiny_model_path, str(out), "auto", method, per_update, *more], world=1)
            runs[key] = out
        return runs[key]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(
    ("parallel", "method", "per_update"),
    [("ddp", "grpo", "0"), ("fsdp2", "grpo", "0"), ("ddp", "entropy_bonus", "0"),
     ("fsdp2", "grpo", "2")],
)  # fmt: skip
def test_two_processes_equal_one(parallel, method, per_update, single, tiny_model_path, tmp_path):
    ref = single(method, per_update)
    _run([tiny_model_path, str(tmp_path), parallel, method, per_update], world=2)
    want, got = _params(ref), _params(tmp_path)
    base = load_file(Path(tiny_model_path) / "model.safetensors")
    assert want.keys() == got.keys()
    moved = max((want[k] - base[k]).abs().max().item() for k in want)
    assert moved > 1e-4, "the step did not change the parameters: the test would be vacuous"
    for k in want:
        assert_close(got[k], want[k], dtype="float32", n=DATA_PARALLEL_N, elementwise=True)
    assert_close(_loss(tmp_path), _loss(ref), dtype="float32", n=DATA_PARALLEL_N)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_kl_controls_under_two_processes_equal_one(parallel, single, tiny_model_path, tmp_path):
    """The KL in the reward, the adaptive coefficients and a reference reset after every step
    (docs/formulas.md §2.35-§2.37): the sharded reference is reset from the sharded policy, and
    its gathered copy in the checkpoint is the policy of the reset step."""
    ref, out = single("grpo+kl", "0", "2"), tmp_path / "two"
    _run([tiny_model_path, str(out), parallel, "grpo+kl", "0", "2"], world=2)
    want, got = _params(ref, 2), _params(out, 2)
    for k in want:
        assert_close(got[k], want[k], dtype="float32", n=DATA_PARALLEL_N, elementwise=True)
    for step in (1, 2):
        one = load_file(
            ref / "checkpoints" / f"step_{step:06d}" / "reference" / "model.safetensors"
        )
        folder = out / "checkpoints" / f"step_{step:06d}"
        two = load_file(folder / "reference" / "model.safetensors")
        for k in want:
            assert torch.equal(one[k], _params(ref, step)[k]), (step, k)
            assert_close(two[k], one[k], dtype="float32", n=DATA_PARALLEL_N, elementwise=True)
        if (folder / "model.safetensors").is_file():  # FSDP2 exports the weights at the last step
            policy = load_file(folder / "model.safetensors")
            assert all(torch.equal(policy[k], two[k]) for k in policy), step
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["control/reference_step"] for r in rows] == [1.0, 2.0]
    assert rows[1]["control/kl"] == 0.0  # step 2 samples from the reference itself


def test_generate_shared_gives_a_group_the_same_requests(tiny_model_path, tmp_path):
    """vLLM tensor parallelism: both ranks of a group submit the group's prompts with the first
    rank's seed, and each keeps its own prompts' rollouts."""
    _run([tiny_model_path, str(tmp_path), "ddp", "grpo", "0", "1", "share"], world=2)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["calls"] == r1["calls"] == [[r0["mine"] + r1["mine"], 1000]]
    for r in (r0, r1):
        assert r["roll_prompts"] == r["mine"] and r["rows"] == 2
