"""`python -m llm train` with ``rollout.backend = "vllm"`` end to end through the real engine: engine
build, generate, weight sync after every step, sampler log-probs against the trainer's.

It needs a vLLM that can build an engine here: a CUDA GPU (the `gpu` extra's vLLM is a CUDA
build). On a machine without one the test is skipped with `NO_ENGINE`: vLLM's CPU build is not on
PyPI (PyPI's `vllm` wheels are CUDA builds; vLLM's own CPU wheels are attached to its GitHub
releases or built from source, and the trainer refuses ``rollout.backend = "vllm"`` off CUDA).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

import torch  # noqa: E402

from llm.model.tiny import build_tiny_model, build_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NO_ENGINE = (
    "no CUDA GPU: the installed vLLM is a CUDA build, and vLLM's CPU build is not on PyPI "
    "(only on vLLM's GitHub releases or from source); the end-to-end vLLM run needs a GPU"
)
STEPS = 2


def _model(path: Path) -> str:
    """A random tiny model with head size 64 (vLLM's attention kernels refuse very small heads)."""
    tok = build_tokenizer(30)
    model = build_tiny_model(
        tok, seed=0, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=256,
    )  # fmt: skip
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_ENGINE)
def test_train_through_the_engine(tmp_path):
    config = tmp_path / "vllm.toml"
    config.write_text(
        f"""model_path = "{_model(tmp_path / "model")}"
method = "grpo"
steps = {STEPS}
[data]
source = "generate"
n_problems = 8
max_number = 9
max_target = 30
[rollout]
backend = "vllm"
group_size = 4
prompts_per_step = 4
max_new_tokens = 12
[vllm]
gpu_memory_utilization = 0.2
enforce_eager = true
dtype = "float32"
[system]
device = "cuda"
[optim]
lr = 1e-3
[run]
tensorboard = false
"""
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # sleep mode refuses expandable segments
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "llm", "train", "--config", str(config), "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == STEPS
    for m in lines:
        assert math.isfinite(m["losses/loss"]) and m["charts/response_len"] > 0
        # The engine samples from the trainer's weights (fp32 both): the log-probs it reports
        # are the trainer's up to kernel rounding, so the weight sync reached it each step.
        assert m["charts/sampler_logp_gap"] < 1e-2, m["charts/sampler_logp_gap"]
