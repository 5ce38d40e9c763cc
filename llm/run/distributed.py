"""Data-parallel training over processes started by ``torchrun`` (torch.distributed).

Nothing here shards anything by hand: the policy is wrapped by torch's own engines, DDP
(`torch.nn.parallel.DistributedDataParallel`) or FSDP2 (`torch.distributed.fsdp.fully_shard`,
applied to every decoder layer named by the model's ``_no_split_modules`` and then to the root,
the recipe of the FSDP2 tutorial and of TRL/accelerate's auto-wrap policy). This module adds the
two things the shaping losses need on top of them:

- **The loss is the single-process loss of the global batch.** A shaping loss is not a sum of
  per-response terms (token-mean over the whole batch, group statistics, DSDR's softmax), so every
  rank all-gathers the detached per-token quantities of all ranks (`gather_batch`, padded to the
  longest response and prompt of the step), evaluates the full-batch loss, and back-propagates
  only the gradient of its own rows (`local_rows`). The wrapped engines average gradients over
  ranks; multiplying the local surrogate by the world size turns that mean into the sum that the
  chain rule asks for, so one optimizer step equals the single-process step on the same global
  batch (tested with gloo on 2 CPU processes: tests/llm/test_distributed.py).
- **Gradient sync**: DDP's ``no_sync()`` skips the all-reduce on every micro-batch but the last
  (DDP gradients are full-size on every rank anyway). FSDP2 keeps gradient sync ON for every
  micro-batch (`grad_sync`): each backward reduce-scatters its gradients, so a rank only ever holds
  its 1/W shard of them (sync off would leave a full-size gradient on every rank until the last
  micro-batch: 4P bytes instead of 4P/W). The price is one reduce-scatter per micro-batch instead
  of one per optimizer step.
- **Memory under FSDP2** (`wrap_policy`, `wrap_reference`): the frozen KL reference is sharded like
  the policy (its no-grad forward all-gathers one layer at a time); with ``bf16-mixed`` the policy
  is wrapped with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: fp32 sharded
  master weights, bf16 all-gathers and compute, fp32 gradient reduction, and no autocast around
  the model (`autocast_precision`), so no autocast cache of bf16 weight copies either.

Rollouts are shared the same way: each rank samples its share of every mini-batch's prompts
(`rank_share`), alone or, under vLLM tensor parallelism, with its engine group (`generate_shared`).

Sources: torch docs "Getting Started with Fully Sharded Data Parallel (FSDP2)" and
`torch.distributed.fsdp.fully_shard` (``mp_policy``, ``reshard_after_forward``,
`MixedPrecisionPolicy`, FSDPModule.set_requires_gradient_sync); DDP docs
(`no_sync`). Checkpoints (`llm.run.checkpoint`): full state dicts on rank 0 for one process and DDP,
sharded `torch.distributed.checkpoint` save/load under FSDP2 (each rank writes and reads its shard).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "DistInfo",
    "autocast_precision",
    "broadcast_object",
    "close_distributed",
    "gather_batch",
    "generate_shared",
    "grad_sync",
    "init_distributed",
    "local_rows",
    "rank_share",
    "set_matmul_precision",
    "slice_rollout",
    "unwrap",
    "wrap_policy",
    "wrap_reference",
]

Tensor = torch.Tensor

# Keys of a shaping batch by the axis that differs between ranks (llm/CONTRACT.md shapes).
_TOKEN_AXIS = 2  # (B, G, T) and (B, G, T, N)
_PROMPT_KEYS = ("prompt_logp", "prompt_mask")  # (B, P)


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: rank r of W, its device; ``W = 1`` without torchrun."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def enabled(self) -> bool:
        """True when running with more than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and writes checkpoints."""
        return self.rank == 0


def check_device(device: str) -> None:
    """Refuse a CUDA `device` on a machine where torch has no CUDA device.

    Raises:
        ValueError: naming ``device``, its value and why it cannot run here.
    """
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU found"
        raise ValueError(
            f'system.device: {device!r} cannot run here ({why}); set system.device = "cpu" '
            "(--set system.device=cpu)"
        )
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"system.device: {device!r} cannot run here (only {torch.cuda.device_count()} CUDA "
            "devices)"
        )


def set_matmul_precision(device: str, tf32: bool) -> None:
    """float32 matrix products on TF32 tensor cores (``torch.set_float32_matmul_precision("high")``)
    when `tf32` and `device` is CUDA, else full float32 (``"highest"``, torch's default); a CPU
    run is never changed (`numerics` pins its code paths)."""
    if device.startswith("cuda"):
        torch.set_float32_matmul_precision("high" if tf32 else "highest")


def device_profiler(on: bool, cuda: bool) -> contextlib.AbstractContextManager:
    """`torch.profiler.profile` over host (and, with `cuda`, CUDA) activity when `on`, else a
    no-op context: where a benchmark's timed call spends its time."""
    if not on:
        return contextlib.nullcontext()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=acts)


def init_distributed(device: str, *, vllm: bool = False) -> DistInfo:
    """Join the process group torchrun set up (``WORLD_SIZE`` > 1), or return a single-process
    `DistInfo`. The backend is NCCL on CUDA and gloo on CPU; ``device = "cuda"`` becomes
    ``cuda:LOCAL_RANK``. With `vllm` (``rollout.backend = "vllm"``), ``NCCL_CUMEM_ENABLE=0`` is
    set first, before any NCCL communicator exists: NCCL's cuMem buffers and vLLM's sleep-mode
    allocator in one process break the engine (TRL and verl set it likewise).

    Raises:
        ValueError: ``device`` names one CUDA index while several processes share the node, or
            cannot run here (`check_device`).
    """
    check_device(device)
    if vllm:
        os.environ["NCCL_CUMEM_ENABLE"] = "0"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(device=device)
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        if ":" in device:
            raise ValueError(
                f"device: expected 'cuda' under torchrun (each rank takes cuda:LOCAL_RANK), "
                f"got {device!r}"
            )
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=device)


def close_distributed() -> None:
    """Leave the process group at the normal end of a torchrun launch: a barrier (no rank tears
    its connections down while a peer is still inside a collective), a garbage collection (the
    work objects a wrapped model still holds go while the interpreter is whole), then
    `destroy_process_group`, which torch asks of every trainer process before it exits. A
    process that skips it can abort in interpreter finalization when gloo's threads still hold
    tensors (pytorch/pytorch#179291, #190489: "terminate called without an active exception").
    No-op when no process group is initialized. Not for a failing rank: the barrier would wait
    for peers that are stuck elsewhere."""
    if not dist.is_initialized():
        return
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


def _parallel_kind(info: DistInfo, parallel: str) -> str:
    if parallel not in ("auto", "ddp", "fsdp2"):
        raise ValueError(f"parallel: expected auto, ddp or fsdp2, got {parallel!r}")
    return parallel if parallel != "auto" else ("fsdp2" if "cuda" in info.device else "ddp")


# Modules wrapped here whose FSDP2 all-gathers deliver bf16 parameters (a MixedPrecisionPolicy, or
# bf16 weights): they compute in bf16 by themselves and must not run under autocast.
_BF16_SHARDED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def _shard(
    model: torch.nn.Module, mp_policy: Any = None, reshard_after_forward: bool | None = None
) -> None:
    """FSDP2 `fully_shard` on every decoder layer (the classes in ``_no_split_modules``), then on
    the root, in place. ``reshard_after_forward=None`` is torch's default: True for the layers,
    False for the root (its embedding and head stay gathered until the backward frees them);
    True also reshards the root after its forward (a model that is never back-propagated)."""

    kw = {
        "mp_policy": mp_policy or MixedPrecisionPolicy(),
        "reshard_after_forward": reshard_after_forward,
    }
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module, **kw)
    fully_shard(model, **kw)


def wrap_policy(
    model: torch.nn.Module, info: DistInfo, parallel: str, precision: str = "fp32"
) -> torch.nn.Module:
    """The module to train: `model` itself (one process), DDP around it, or `model` after FSDP2's
    in-place `fully_shard` (``parallel = "auto"`` picks fsdp2 on CUDA and ddp on CPU).

    Under FSDP2 with ``precision = "bf16-mixed"`` every ``fully_shard`` gets
    ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``: the sharded parameters
    (what AdamW updates) stay float32, the all-gathered ones the forward and backward use are
    bfloat16, gradients are reduce-scattered in float32; callers then run the model without
    autocast (`autocast_precision`).

    Raises:
        ValueError: unknown `parallel`.
    """
    if not info.enabled:
        return model
    kind = _parallel_kind(info, parallel)
    if kind == "ddp":
        ids = [info.local_rank] if info.device.startswith("cuda") else None
        return DistributedDataParallel(model, device_ids=ids)

    mp_policy = None
    if precision == "bf16-mixed":
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    _shard(model, mp_policy)
    if mp_policy is not None or _all_bf16(model):
        _BF16_SHARDED.add(model)
    return model


def wrap_reference(
    model: torch.nn.Module | None, info: DistInfo, parallel: str
) -> torch.nn.Module | None:
    """The frozen KL reference, sharded with FSDP2 `fully_shard` like the policy when the policy
    is (each rank keeps 1/W of its weights; its no-grad forward all-gathers one decoder layer at a
    time and frees it after use, the root's embedding and head included: ``reshard_after_forward
    = True`` everywhere, as no backward comes to free them), else `model` unchanged (one process,
    DDP: a frozen model needs no wrapper). Its weights keep their dtype (bf16 unless the run is
    fp32: `llm.model.load.load_policy_and_reference`), so no mixed-precision policy is needed; bf16
    weights run without autocast (`autocast_precision`), exactly as the bf16-mixed policy does.
    None stays None.

    Raises:
        ValueError: unknown `parallel`.
    """
    if model is None or not info.enabled or _parallel_kind(info, parallel) != "fsdp2":
        return model
    model.requires_grad_(False)
    _shard(model, reshard_after_forward=True)
    if _all_bf16(model):
        _BF16_SHARDED.add(model)
    return model


def _all_bf16(model: torch.nn.Module) -> bool:
    params = [p for p in model.parameters() if p.is_floating_point()]
    return bool(params) and all(p.dtype == torch.bfloat16 for p in params)


def autocast_precision(model: torch.nn.Module, precision: str) -> str:
    """The ``precision`` to pass to `llm.model.forward.policy_forward` for `model`: ``"fp32"`` (no
    autocast) when `model` is FSDP2-sharded by `wrap_policy` / `wrap_reference` and gathers bf16
    parameters (its mixed-precision policy or bf16 weights already make it compute in bf16;
    autocast would only add a cached bf16 copy of each weight), else `precision` unchanged."""
    if precision == "bf16-mixed" and model in _BF16_SHARDED:
        return "fp32"
    return precision


def unwrap(policy: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a DDP wrapper (FSDP2 shards in place: itself)."""
    return getattr(policy, "module", policy)


@contextlib.contextmanager
def grad_sync(policy: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Within the block, backward passes synchronize gradients across ranks only if `enabled`:
    DDP skips its all-reduce (``no_sync``) when not `enabled`.

    FSDP2 ignores `enabled` and always synchronizes: every micro-batch's backward reduce-scatters
    its gradients and adds them to the rank's gradient shard, so no rank ever holds a full-size
    gradient (with sync off, FSDP2 keeps each parameter's unsharded gradient until the synced
    backward: 4P bytes per rank in fp32 instead of 4P/W). Cost: one reduce-scatter of all
    gradients per micro-batch (each rank sends and receives ~(W-1)/W x 4P bytes in float32 per
    micro-batch) instead of one per optimizer step; the parameter all-gathers happen per
    micro-batch either way (forward, and again in backward, since layers reshard after forward
    and after backward).
    """
    if hasattr(policy, "no_sync") and not enabled:  # DDP
        with policy.no_sync():
            yield
        return
    if hasattr(policy, "set_requires_gradient_sync"):  # FSDP2: sharded gradients throughout
        policy.set_requires_gradient_sync(True)
    yield


def _pad_to(x: Tensor, axis: int, size: int) -> Tensor:
    if x.shape[axis] == size:
        return x
    pad_shape = list(x.shape)
    pad_shape[axis] = size - x.shape[axis]
    return torch.cat([x, torch.zeros(pad_shape, dtype=x.dtype, device=x.device)], dim=axis)


def _axis(key: str, x: Tensor) -> int | None:
    if key in _PROMPT_KEYS:
        return 1
    return _TOKEN_AXIS if x.ndim >= 3 else None


def gather_batch(batch: dict[str, Tensor], info: DistInfo) -> dict[str, Tensor]:
    """All ranks' batches concatenated along B in rank order (identity with one process).

    Per-token entries (B, G, T[, N]) are zero-padded to the longest T of all ranks and prompt
    entries (B, P) to the longest P; padding carries mask 0, so the shaping core ignores it.
    Gradients do not flow through the gather (inputs are detached copies).

    Args:
        batch: this rank's entries, the same keys on every rank, B rows each.
    """
    if not info.enabled:
        return batch
    keys = sorted(batch)
    sizes = torch.zeros(2, dtype=torch.int64, device=info.device)
    for k in keys:
        axis = _axis(k, batch[k])
        if axis is not None:
            slot = 1 if axis == 1 else 0
            sizes[slot] = max(int(sizes[slot]), batch[k].shape[axis])
    dist.all_reduce(sizes, op=dist.ReduceOp.MAX)
    out = {}
    for k in keys:
        x = batch[k].detach()
        axis = _axis(k, x)
        if axis is not None:
            x = _pad_to(x, axis, int(sizes[1 if axis == 1 else 0]))
        parts = [torch.empty_like(x) for _ in range(info.world_size)]
        dist.all_gather(parts, x.contiguous())
        out[k] = torch.cat(parts, dim=0)
    return out


def local_rows(x: Tensor, info: DistInfo, b: int, t: int | None = None) -> Tensor:
    """This rank's `b` rows of a gathered (W*b, ...) tensor, cut back to its own length `t` on the
    token axis (axis 2) when given."""
    part = x[info.rank * b : (info.rank + 1) * b]
    if t is not None and part.ndim >= 3:
        part = part[:, :, :t]
    return part


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's `obj` on every rank (identity with one process)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---------------------------------------------------------------------------------------------
# Rollouts over ranks


def rank_share(indices: list[int], info: DistInfo, per_update: int) -> list[int]:
    """This rank's prompts of a step: its 1/W of every mini-batch of `per_update` consecutive
    prompts, so mini-batch j of every rank together is mini-batch j of the single-process run."""
    m = per_update // info.world_size
    return [
        i
        for start in range(0, len(indices), per_update)
        for i in indices[start + info.rank * m : start + (info.rank + 1) * m]
    ]


def generate_shared(
    backend: Any,
    prompts: list[str],
    info: DistInfo,
    *,
    share: int,
    seed_of: Callable[[int], int],
    group_size: int,
    sampling: Any,
) -> Any:
    """This rank's rollouts from `backend` (an `llm.rollout.base.RolloutBackend`), generated alone
    (``share = 1``) or by its group of `share` consecutive ranks together (vLLM tensor
    parallelism: every rank of an engine's group must submit the same requests, as TRL's colocate
    mode gathers them).

    The group's prompts are all-gathered, sampled with the generator of the group's first rank
    (``seed_of(rank)``), and this rank keeps its own prompts' rows (`slice_rollout`).
    `sampling` (an `llm.rollout.base.Sampling`) goes to the backend as it is.

    Raises:
        ValueError: the world size is not a multiple of `share`.
    """
    if share <= 1 or not info.enabled:
        # A CPU generator on every device: the backends only draw seeds from it (a CUDA
        # generator cannot feed torch.randint's CPU draw).
        gen = torch.Generator().manual_seed(seed_of(info.rank))
        with torch.no_grad():
            return backend.generate(prompts, group_size, sampling=sampling, generator=gen)
    if info.world_size % share:
        raise ValueError(
            f"vllm.tensor_parallel_size: {share} does not divide the {info.world_size} processes"
        )
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, prompts)
    lead = info.rank - info.rank % share
    group = gathered[lead : lead + share]
    gen = torch.Generator().manual_seed(seed_of(lead))
    with torch.no_grad():
        roll = backend.generate(
            [p for part in group for p in part], group_size, sampling=sampling, generator=gen
        )
    start = sum(len(part) for part in group[: info.rank - lead])
    return slice_rollout(roll, start, start + len(prompts))


def slice_rollout(roll: Any, start: int, stop: int) -> Any:
    """Prompts ``start:stop`` of a `RolloutBatch` (every per-prompt field; padding is kept)."""
    fields = {}
    for f in dataclasses.fields(roll):
        value = getattr(roll, f.name)
        fields[f.name] = None if value is None else value[start:stop]
    return type(roll)(**fields)
