"""FSDP2 memory (issue 12, items 1-3) over 2 gloo processes, one launch for all checks
(tests/llm/fsdp_worker.py): gradients stay sharded during accumulation, the KL reference is
sharded, and ``bf16-mixed`` runs through a `MixedPrecisionPolicy` instead of autocast. That one
update equals the single-process update in fp32 is tests/llm/test_distributed.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).with_name("fsdp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _launch(args: list[str], world: int) -> subprocess.Popen:
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
    return subprocess.Popen(
        [*launcher, str(WORKER), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(proc: subprocess.Popen) -> None:
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-5000:]


def _params(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "checkpoints" / "step_000001" / "model.safetensors")


@pytest.fixture(scope="module")
def runs(tiny_model_path, tmp_path_factory) -> tuple[Path, list[dict]]:
    """The 2-rank launch (fp32 and bf16-mixed FSDP2 steps) and the single-process bf16-mixed
    step, in one folder; each rank's record."""
    out = tmp_path_factory.mktemp("fsdp_memory")
    # Both launches at once: most of each is process start-up and imports.
    procs = [
        _launch([tiny_model_path, str(out), "single"], 1),
        _launch([tiny_model_path, str(out)], 2),
    ]
    try:
        for proc in procs:
            _wait(proc)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_gradients_stay_sharded_during_accumulation(runs):
    """After every micro-batch's backward each rank holds only its shard of the gradients (the
    micro-batches reduce-scatter); with gradient sync off, the same count sees every element."""
    _, records = runs
    total = records[0]["param_numel"]
    for rec in records:
        assert len(rec["grad_counts"]) == 3  # 8 rows per rank, micro-batches of 3
        for count in rec["grad_counts"] + rec["bf16_grad_counts"]:
            assert 0 < count <= rec["param_local_bound"] < total
        # The counter is not blind to unsharded gradients: sync off holds them all.
        assert rec["unsynced_grad_count"] == total
    assert sum(rec["grad_counts"][-1] for rec in records) == total


@pytest.mark.slow
def test_reference_is_sharded(runs):
    """The frozen KL reference is sharded like the policy, and stays sharded after its no-grad
    forward (the root reshards too)."""
    _, records = runs
    for rec in records:
        assert rec["ref_sharded"] and not rec["ref_requires_grad"]
        assert 0 < rec["ref_local_numel"] <= rec["param_local_bound"] < rec["ref_numel"]
    assert sum(rec["ref_local_numel"] for rec in records) == records[0]["ref_numel"]


@pytest.mark.slow
def test_bf16_mixed_uses_mixed_precision_policy_not_autocast(runs, tiny_model_path):
    """bf16-mixed under FSDP2: the decoder weights seen inside the forward are the bf16 gathers
    of fp32 sharded master weights, without autocast; the reference is bf16. The step stays close
    to the single-process bf16-mixed step (autocast over fp32 weights): the two differ only by
    bf16 rounding in different places."""
    out, records = runs
    for rec in records:
        seen = rec["bf16_forward_seen"]
        assert any(s["grad"] for s in seen) and any(not s["grad"] for s in seen)
        for s in seen:
            assert s["weight_dtype"] == "torch.bfloat16" and not s["weight_is_sharded"]
            assert not s["autocast"]
        assert rec["bf16_master_dtypes"] == ["torch.float32"]
        assert rec["bf16_ref_dtypes"] == ["torch.bfloat16"]
    base = load_file(Path(tiny_model_path) / "model.safetensors")
    got, want = _params(out / "bf16"), _params(out / "single_bf16")
    assert got.keys() == want.keys()
    assert all(v.dtype == torch.float32 for v in got.values())
    moved = torch.cat([(want[k] - base[k]).flatten() for k in want])
    diff = torch.cat([(got[k] - want[k]).flatten() for k in want])
    assert moved.abs().max() > 1e-4, "the step did not change the parameters"
    # AdamW's first step moves each weight by about lr * sign(grad) (lr 1e-3): a gradient entry
    # near zero may flip sign under bf16 rounding, so nearly all entries, not each, must agree.
    assert (diff.abs() <= 1e-4).float().mean() >= 0.99
    ours, single = (_metrics(out / name) for name in ("bf16", "single_bf16"))
    assert ours["losses/loss"] == pytest.approx(single["losses/loss"], rel=1e-3)
    assert ours["charts/grad_norm"] == pytest.approx(single["charts/grad_norm"], rel=1e-2)


def _metrics(out: Path) -> dict[str, float]:
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])


def test_one_process_keeps_autocast_and_the_reference_whole():
    """Without FSDP2 nothing changes: the model is returned as is and bf16-mixed keeps autocast."""
    from llm.run.distributed import DistInfo, autocast_precision, wrap_policy, wrap_reference

    model = torch.nn.Linear(2, 2)
    assert wrap_policy(model, DistInfo(), "fsdp2", "bf16-mixed") is model
    assert wrap_reference(model, DistInfo(), "fsdp2") is model
    assert wrap_reference(None, DistInfo(world_size=2), "fsdp2") is None
    for precision in ("fp32", "bf16-mixed", "bf16"):
        assert autocast_precision(model, precision) == precision
