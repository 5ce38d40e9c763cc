"""FSDP2 training over gloo through the real vLLM weight sync, for tests/llm/test_weight_sync_fsdp.py.

Run as ``python weight_sync_worker.py MODEL OUT`` under ``torchrun --nproc_per_node 2``. Each rank
trains two steps of `dist_worker`'s scripted global batch with ``system.parallel = "fsdp2"`` and a
rollout backend that is `llm.rollout.vllm_engine.VLLMBackend` itself: its constructor (the
external-launcher branch, per-rank engine seed) and its `sync_weights` (``LLM.apply_model`` with
`iter_full_parameters`: wrapper names stripped, each FSDP2 DTensor gathered by ``full_tensor()``,
a collective both ranks reach in the same order) run unchanged. Only `vllm` is replaced, by a
module whose ``LLM`` holds a full, unsharded copy of the model read from the model folder, as
vLLM's engine does, and whose model's ``load_weights`` copies each streamed tensor in place as
vLLM's ``default_weight_loader`` does (``param.data.copy_``), refusing an unknown name, a shape
mismatch, a DTensor or a tensor that requires grad. Rollouts are `dist_worker.ScriptedBackend`'s.

After every ``sync_weights`` the rank writes the engine's weights to
``OUT/sync/rank{r}_call{k}.safetensors``; the trainer's checkpoints (``OUT/run``) are what the test
compares them with, bit for bit.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import torch
from dist_worker import ScriptedBackend, exit_launched_rank
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from llm.config import config_from_dict
from llm.data import load_train_problems
from llm.rollout.vllm_engine import PINNED_VLLM_VERSION, VLLMBackend
from llm.tasks import TASKS, compact_completion, solve
from llm.train.trainer import train


class EngineModel(torch.nn.Module):
    """The engine's own copy of the model and a `load_weights` with vLLM's loader's contract:
    (name, tensor) pairs consumed one at a time, each copied into the parameter of that name."""

    def __init__(self, path: str, dtype: str) -> None:
        super().__init__()
        self.hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        self.hf.requires_grad_(False)

    def load_weights(self, weights) -> set[str]:
        assert not isinstance(weights, list | tuple | dict), "weights must be streamed"
        params = dict(self.hf.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if name not in params:
                raise ValueError(f"engine model has no parameter {name!r}")
            if hasattr(tensor, "full_tensor") or type(tensor) is not torch.Tensor:
                raise TypeError(f"{name}: expected a plain tensor, got {type(tensor).__name__}")
            if tensor.requires_grad or tuple(tensor.shape) != tuple(params[name].shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} or requires_grad")
            params[name].data.copy_(tensor)
            loaded.add(name)
        missing = params.keys() - loaded
        if missing:
            raise ValueError(f"parameters never loaded: {sorted(missing)}")
        return loaded


class EngineLLM:
    """``vllm.LLM`` as `VLLMBackend` calls it, with the engine model in this process."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.engine_model = EngineModel(kwargs["model"], kwargs["dtype"])
        self.llm_engine = types.SimpleNamespace(model_executor=object())

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self, tags=None) -> None:
        pass

    def reset_prefix_cache(self) -> bool:
        return True

    def apply_model(self, func):
        return [func(self.engine_model)]


class ScriptedVLLM(VLLMBackend):
    """`VLLMBackend` with the scripted rollouts (the engine cannot sample here); `sync_weights`
    is the base class's, followed by a dump of what the engine now holds."""

    def __init__(self, model_path: str, tokenizer, answers: dict[str, str], out: Path) -> None:
        super().__init__(model_path, tokenizer, dtype="float32", seed=5)
        self.scripted = ScriptedBackend(tokenizer, answers)
        self.out, self.calls = out, 0

    def generate(self, prompts, group_size, **kw):
        return self.scripted.generate(prompts, group_size, **kw)

    def sync_weights(self, model: torch.nn.Module) -> None:
        super().sync_weights(model)
        self.calls += 1
        # Parameters, tied ones once (safetensors refuses shared storage).
        state = {k: v.detach().clone() for k, v in self.llm.engine_model.hf.named_parameters()}
        rank = torch.distributed.get_rank()
        self.out.mkdir(parents=True, exist_ok=True)
        save_file(state, str(self.out / f"rank{rank}_call{self.calls}.safetensors"))


def main(model: str, out: str) -> None:
    fake = types.ModuleType("vllm")
    fake.__version__ = PINNED_VLLM_VERSION
    fake.LLM, fake.SamplingParams, fake.TokensPrompt = EngineLLM, types.SimpleNamespace, dict
    sys.modules["vllm"] = fake
    cfg = config_from_dict(
        {
            "model_path": model,
            "method": "grpo",
            "steps": 2,
            "data": {"source": "generate", "n_problems": 8, "max_number": 9, "max_target": 30},
            "rollout": {"group_size": 4, "prompts_per_step": 4, "max_new_tokens": 12},
            "system": {"micro_batch_size": 3, "num_threads": 1, "parallel": "fsdp2"},
            "optim": {"lr": 1e-3},
            "run": {"save_every": 1, "tensorboard": False},
        }
    )
    answers = {
        TASKS[cfg.task].prompt(p, cfg.template): compact_completion(solve(p)[0])
        for p in load_train_problems(cfg)
    }
    engines: list[ScriptedVLLM] = []

    def factory(c, m, tok):
        engines.append(ScriptedVLLM(c.model_path, tok, answers, Path(out) / "sync"))
        return engines[-1]

    train(cfg, Path(out) / "run", backend_factory=factory, progress=False)
    (engine,) = engines
    rank = torch.distributed.get_rank()
    Path(out, f"rank{rank}.seed").write_text(str(engine.llm.kwargs["seed"]))


if __name__ == "__main__":
    main(*sys.argv[1:])
    exit_launched_rank()
