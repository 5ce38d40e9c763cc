"""The papers' update regime in the LLM trainer (issue 38 item 2): several optimizer steps per
rollout batch (PPO epochs x mini-batches) make the ratio move and clipping act; one step over
the whole batch is today's on-policy run, bit for bit."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from llm.run.checkpoint import latest_checkpoint
from llm.train.trainer import train
from tests.llm.test_trainer import PlantingBackend, _config


def _run(tiny_model_path, out, method="grpo", **over):
    cfg = _config(tiny_model_path, method, steps=2, prompts_per_step=4, **over)
    history = train(cfg, out, backend_factory=lambda c, m, t: PlantingBackend(m, t), progress=False)
    return history, latest_checkpoint(out)


def _weights(ckpt):
    return load_file(str(next(ckpt.glob("*.safetensors"))))


def test_one_mini_batch_one_epoch_is_the_on_policy_run(tiny_model_path, tmp_path):
    h0, c0 = _run(tiny_model_path, tmp_path / "a")
    h1, c1 = _run(tiny_model_path, tmp_path / "b", prompts_per_update=4, inner_epochs=1)
    assert [h["charts/optimizer_steps"] for h in h1] == [1, 1]
    w0, w1 = _weights(c0), _weights(c1)
    assert w0.keys() == w1.keys()
    for k in w0:
        assert torch.equal(w0[k], w1[k]), k
    assert all(h["charts/optimizer_steps"] == 1 for h in h0)


def test_epochs_and_mini_batches_move_the_ratio_so_clipping_acts(tiny_model_path, tmp_path):
    on, _ = _run(tiny_model_path, tmp_path / "on")
    off, _ = _run(tiny_model_path, tmp_path / "off", prompts_per_update=2, inner_epochs=2)
    clip = [k for k in off[0] if k.endswith("clip_frac")]
    assert clip, sorted(off[0])
    assert all(h[clip[0]] == 0 for h in on)  # one step: the ratio is 1 where the loss is taken
    assert any(h[clip[0]] > 0 for h in off)
    assert all(h["charts/optimizer_steps"] == 4 for h in off)  # 2 epochs x 2 mini-batches
