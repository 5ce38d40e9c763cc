"""FSDP2 over 2 gloo processes through the real weight sync (`VLLMBackend.sync_weights`): the
engine receives the full, unsharded weights, bit for bit, after every training step: those of the
step's checkpoint (step 1's sharded one reassembled by `export_checkpoint`, step 2's the final
consolidated export). tests/llm/weight_sync_worker.py; `vllm` itself is replaced by an
in-process engine model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from llm.rollout.vllm_engine import engine_seed
from llm.run.checkpoint import export_checkpoint
from tests.llm.test_distributed import _run

WORKER = Path(__file__).with_name("weight_sync_worker.py")


@pytest.mark.slow
def test_fsdp2_sync_gives_the_engine_the_full_trained_weights(tiny_model_path, tmp_path):
    _run([tiny_model_path, str(tmp_path)], world=2, worker=WORKER)
    base = load_file(Path(tiny_model_path) / "model.safetensors")
    sync = tmp_path / "sync"
    assert sorted(p.name for p in sync.iterdir()) == [
        f"rank{r}_call{k}.safetensors" for r in (0, 1) for k in (1, 2)
    ]  # one sync after each of the 2 steps, on both ranks
    previous = base
    for step in (1, 2):
        folder = tmp_path / "run" / "checkpoints" / f"step_{step:06d}"
        if step == 1:  # a sharded checkpoint: its weights reassembled from both ranks' shards
            folder = export_checkpoint(folder, tmp_path / "export1")
        ckpt = load_file(folder / "model.safetensors")
        for rank in (0, 1):
            got = load_file(sync / f"rank{rank}_call{step}.safetensors")
            assert got.keys() == ckpt.keys(), sorted(got.keys() ^ ckpt.keys())
            for name, want in ckpt.items():
                assert got[name].shape == want.shape, name  # unsharded
                assert torch.equal(got[name], want), (rank, step, name)  # bitwise
        moved = max((ckpt[k] - previous[k]).abs().max().item() for k in ckpt)
        assert moved > 1e-4, f"step {step} did not change the weights: the test would be vacuous"
        previous = ckpt
    seeds = [int((tmp_path / f"rank{r}.seed").read_text()) for r in (0, 1)]
    assert seeds == [engine_seed(5, r, 1) for r in (0, 1)] and seeds[0] != seeds[1]
