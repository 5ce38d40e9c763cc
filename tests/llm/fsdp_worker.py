"""FSDP2 memory checks over gloo, for tests/llm/test_fsdp_memory.py.

Run as ``python fsdp_worker.py MODEL OUT`` under ``torchrun --nproc_per_node 2`` (both checks in
one launch) or as one process (``single``: the single-process bf16-mixed step only). Under
torchrun each rank trains one step of the scripted global batch of `dist_worker` twice, with a
KL reference (``kl_coef > 0``):

- ``fp32/``: FSDP2 in fp32. After every micro-batch backward it counts the gradient elements the
  rank holds (sharded ``.grad`` plus any unsharded gradient FSDP2 keeps for a later reduction),
  and the local elements of the sharded reference. Then, as the "before" measurement, one
  backward with ``set_requires_gradient_sync(False)`` (the previous behaviour) and the same count.
- ``bf16/``: FSDP2 with ``precision = "bf16-mixed"``: the dtype of a decoder weight seen inside
  the forward, whether autocast was on there, and the dtypes of the sharded parameters.

Each rank writes ``rank{r}.json``; the checkpoints are what the test compares.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import torch
from dist_worker import ScriptedBackend, exit_launched_rank

import llm.train.trainer
import llm.train.update
from llm.config import config_from_dict
from llm.data import load_train_problems
from llm.tasks import TASKS, compact_completion, solve
from llm.train.trainer import train


def _local_numel(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    return (t.to_local() if hasattr(t, "to_local") else t).numel()


def held_grad_elements(model: torch.nn.Module) -> int:
    """Gradient elements this rank holds: each parameter's (sharded) ``.grad`` plus the unsharded
    gradients FSDP2 keeps between backwards when it does not reduce-scatter (private attributes
    of torch's FSDPParam, read only here; their absence fails loudly)."""
    total = sum(_local_numel(p.grad) for p in model.parameters())
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        group = None if state is None else state._fsdp_param_group
        for fp in [] if group is None else group.fsdp_params:
            total += _local_numel(fp.unsharded_accumulated_grad)
            unsharded = fp.__dict__.get("_unsharded_param")
            if unsharded is not None:
                total += _local_numel(unsharded.grad)
    return total


def _config(model: str, precision: str, parallel: str):
    return config_from_dict(
        {
            "model_path": model,
            "method": "grpo",
            "steps": 1,
            "kl_coef": 0.1,
            "data": {"source": "generate", "n_problems": 8, "max_number": 9, "max_target": 30},
            "rollout": {
                "group_size": 4,
                "prompts_per_step": 4,
                "max_new_tokens": 12,
                "rollout_is_cap": 1.2,
            },
            "system": {
                "micro_batch_size": 3,  # 8 rows per rank: micro-batches of 3, 3 and 2
                "num_threads": 1,
                "parallel": parallel,
                "precision": precision,
            },
            "optim": {"lr": 1e-3},
            "run": {"save_every": 1, "tensorboard": False},
        }
    )


def _train(model: str, out: Path, precision: str, parallel: str) -> None:
    cfg = _config(model, precision, parallel)
    answers = {
        TASKS[cfg.task].prompt(p, cfg.template): compact_completion(solve(p)[0])
        for p in load_train_problems(cfg)
    }
    train(cfg, out, backend_factory=lambda c, m, tok: ScriptedBackend(tok, answers), progress=False)


class Recorder:
    """Wraps the trainer's `wrap_policy`, `wrap_reference` and `grad_sync` to observe them."""

    def __init__(self) -> None:
        self.policy: torch.nn.Module | None = None
        self.ref: torch.nn.Module | None = None
        self.grad_counts: list[int] = []
        self.forward_seen: list[dict[str, object]] = []
        self._wrap_policy = llm.train.trainer.wrap_policy
        self._wrap_reference = llm.train.trainer.wrap_reference
        self._grad_sync = llm.train.update.grad_sync
        llm.train.trainer.wrap_policy = self.wrap_policy
        llm.train.trainer.wrap_reference = self.wrap_reference
        llm.train.update.grad_sync = self.grad_sync

    def wrap_policy(self, *args, **kw):
        self.policy = self._wrap_policy(*args, **kw)
        # A Linear inside a decoder layer: not an FSDP module itself, so its hook runs while the
        # layer's parameters are all-gathered.
        layer = next(m for m in self.policy.modules() if type(m).__name__.endswith("DecoderLayer"))
        next(m for m in layer.modules() if isinstance(m, torch.nn.Linear)).register_forward_hook(
            self._seen
        )
        return self.policy

    def wrap_reference(self, *args, **kw):
        self.ref = self._wrap_reference(*args, **kw)
        return self.ref

    def _seen(self, module, args, output) -> None:
        self.forward_seen.append(
            {
                "weight_dtype": str(module.weight.dtype),
                "weight_is_sharded": hasattr(module.weight, "to_local"),
                "input_dtype": str(args[0].dtype),
                "output_dtype": str(output.dtype),
                "autocast": torch.is_autocast_enabled("cpu"),
                "grad": torch.is_grad_enabled(),
            }
        )

    @contextlib.contextmanager
    def grad_sync(self, policy, enabled):
        with self._grad_sync(policy, enabled):
            yield
        self.grad_counts.append(held_grad_elements(policy))


def _unsynced_count(policy: torch.nn.Module, device: str) -> int:
    """Gradient elements held after one backward with gradient sync off (the old behaviour)."""
    policy.zero_grad(set_to_none=True)
    policy.set_requires_gradient_sync(False)
    ids = torch.arange(2, 10, device=device).reshape(2, 4)
    policy(input_ids=ids, use_cache=False).logits.float().sum().backward()
    count = held_grad_elements(policy)
    policy.set_requires_gradient_sync(True)
    return count


def main(model: str, out: str, mode: str = "dist") -> None:
    if mode == "single":
        _train(model, Path(out) / "single_bf16", "bf16-mixed", "auto")
        return
    rank = int(os.environ["RANK"])
    rec = Recorder()
    _train(model, Path(out) / "fp32", "fp32", "fsdp2")
    record = {
        "param_numel": sum(p.numel() for p in rec.policy.parameters()),
        "param_local_bound": sum(
            -(-p.shape[0] // 2) * p[0].numel() if p.ndim else 1 for p in rec.policy.parameters()
        ),
        "grad_counts": rec.grad_counts,
        "ref_numel": sum(p.numel() for p in rec.ref.parameters()),
        "ref_local_numel": sum(_local_numel(p) for p in rec.ref.parameters()),
        "ref_sharded": all(hasattr(p, "to_local") for p in rec.ref.parameters()),
        "ref_requires_grad": any(p.requires_grad for p in rec.ref.parameters()),
    }
    record["unsynced_grad_count"] = _unsynced_count(rec.policy, "cpu")
    rec.grad_counts, rec.forward_seen = [], []
    _train(model, Path(out) / "bf16", "bf16-mixed", "fsdp2")
    record["bf16_forward_seen"] = rec.forward_seen
    record["bf16_master_dtypes"] = sorted({str(p.dtype) for p in rec.policy.parameters()})
    record["bf16_ref_dtypes"] = sorted({str(p.dtype) for p in rec.ref.parameters()})
    record["bf16_grad_counts"] = rec.grad_counts
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    rec.policy = rec.ref = None  # the FSDP modules go before the process group does


if __name__ == "__main__":
    main(*sys.argv[1:])
    exit_launched_rank()
