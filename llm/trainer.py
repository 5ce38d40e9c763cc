"""GRPO-family trainer on torch + transformers, driven by `shaping.METHODS` (issue 5).

One training step (CleanRL-style single loop, see `train`):

1. take B prompts in a deterministic order (a permutation per data epoch, seeded by
   ``(seed, epoch)``; the number of prompts consumed is the resumable data position);
2. sample G responses per prompt through the `RolloutBackend` with a per-step generator;
3. score them with `llm.tasks.compute_score` -> ``rewards (B, G)``;
4. behaviour pass: a no-grad forward of the current policy on prompt + response gives
   ``logp_old (B, G, T)``, the token entropy, the top-N candidates of pi_old with their
   log-probs (CaSP, Lambda^(n)) and the prompt log-probs (ProGRPO); with ``kl_coef > 0`` a frozen
   copy of the base model gives ``logp_ref``; DSDR's ``diversity (B, G)`` comes from
   `llm.diversity`;
5. mu inner epochs, each ONE optimizer step on the whole batch with gradients accumulated over
   micro-batches (`accumulate_gradients`), clipping, AdamW and a warm-up + decay schedule.

Why recompute ``logp_old`` rather than use the sampler's log-probs: verl's actor recomputes the old
log-probs with the training forward pass (TRL 1.16's `GRPOTrainer` does when it needs them: several
iterations, or vLLM with importance-sampling correction; with one iteration it takes the detached
log-probs of its gradient pass), so that the ratio is exactly 1 on the first inner epoch whatever
the sampler's numerics (KV cache, batching, vLLM kernels, top-p truncation). The sampler's own
log-probs weight the surrogate (truncated IS, ``rollout_is``) and are logged
(``charts/sampler_logp_gap``, ``charts/sampler_kl``). For the same reason the CaSP candidates are the top-N of that
pi_old forward (so ``sampled_rank``, ``cand_logp`` and ``logp_old`` share one distribution), and
the model stays in eval mode throughout (no dropout), as RL fine-tuning recipes do.

Micro-batching without changing the loss (`accumulate_gradients`): a shaping loss is not a sum of
per-response terms (group normalization, token-mean over the whole batch, DSDR's softmax over
the correct set), so it is evaluated ONCE on the full batch, on leaf copies of the per-token
policy quantities (``logp``, ``entropy``, ``cand_logp``, each (B, G, T[, N])). Backpropagating
that scalar gives the exact gradient with respect to those leaves; each micro-batch is then
re-forwarded with grad and backpropagates ``sum(leaf_grad * quantity)``, so by the chain rule the
accumulated parameter gradient equals the full-batch gradient of the full-batch loss, for every
method and aggregation mode, with any micro-batch size (whole groups or not). Cost: the
quantities at the current parameters are needed before the micro-batch passes; on the first
inner epoch they are the behaviour pass itself, later epochs add one no-grad forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

import shaping
from llm.config import TrainConfig, config_to_toml, load_config, save_config
from llm.distributed import (
    DistInfo,
    broadcast_object,
    gather_batch,
    grad_sync,
    init_distributed,
    local_rows,
    unwrap,
    wrap_policy,
)
from llm.task import Problem, load_train_problems, prompt_for, score_for

__all__ = [
    "PolicyOutputs",
    "Rows",
    "accumulate_gradients",
    "build_rows",
    "data_indices",
    "generate_shared",
    "latest_checkpoint",
    "load_train_problems",
    "make_scheduler",
    "policy_forward",
    "rollout_is_weight",
    "slice_rollout",
    "train",
]

Tensor = torch.Tensor
CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"


class RolloutBackendLike(Protocol):
    """The part of `llm.rollout.RolloutBackend` the trainer uses (see llm/CONTRACT.md)."""

    def generate(self, prompts: list[str], group_size: int, **kwargs: Any) -> Any: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...


# ---------------------------------------------------------------------------------------------
# Data


def data_indices(position: int, count: int, n: int, seed: int) -> list[int]:
    """Problem indices for prompts ``position .. position + count - 1`` of the data stream.

    The stream is a fresh permutation of ``range(n)`` per data epoch, drawn from
    ``np.random.default_rng((seed, epoch))``, so any position is reproducible without state.
    """
    out = []
    for p in range(position, position + count):
        epoch, offset = divmod(p, n)
        out.append(int(_permutation(n, seed, epoch)[offset]))
    return out


_PERM_CACHE: dict[tuple[int, int, int], np.ndarray] = {}


def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    key = (n, seed, epoch)
    if key not in _PERM_CACHE:
        _PERM_CACHE.clear()  # only the current epoch is ever needed again
        _PERM_CACHE[key] = np.random.default_rng((seed, epoch)).permutation(n)
    return _PERM_CACHE[key]


# ---------------------------------------------------------------------------------------------
# Policy forward pass on prompt + response


@dataclass
class Rows:
    """A rollout batch flattened to R = B * G rows of prompt + response.

    Attributes:
        input_ids: (R, P + T) prompt (left-padded) then response (right-padded).
        attention_mask: (R, P + T) 1 on real tokens.
        position_ids: (R, P + T) positions counted over real tokens (as `generate` does for
            left-padded prompts).
        response_ids: (R, T); response_mask: (R, T) float.
        prompt_len: P.
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    response_ids: Tensor
    response_mask: Tensor
    prompt_len: int

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, start: int, stop: int) -> Rows:
        return Rows(
            self.input_ids[start:stop],
            self.attention_mask[start:stop],
            self.position_ids[start:stop],
            self.response_ids[start:stop],
            self.response_mask[start:stop],
            self.prompt_len,
        )


def build_rows(
    prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor
) -> Rows:
    """Flatten ``prompt_ids (B, P)`` and ``response_ids (B, G, T)`` into `Rows` (R = B * G)."""
    b, g, t = response_ids.shape
    p_ids = prompt_ids.repeat_interleave(g, dim=0)
    p_mask = prompt_mask.to(torch.long).repeat_interleave(g, dim=0)
    r_ids = response_ids.reshape(b * g, t)
    r_mask = response_mask.reshape(b * g, t).to(torch.float32)
    attn = torch.cat([p_mask, r_mask.to(torch.long)], dim=1)
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return Rows(torch.cat([p_ids, r_ids], dim=1), attn, pos, r_ids, r_mask, prompt_ids.shape[1])


@dataclass
class PolicyOutputs:
    """Per-row quantities of one forward pass (R rows, T response tokens, N candidates).

    Attributes:
        logp: (R, T) log-prob of each response token.
        entropy: (R, T) token entropy, or None.
        cand_ids: (R, T, N) the top-N token ids of this distribution, rank 1 first, or None.
        cand_logp: (R, T, N) log-probs at the candidate ids, or None.
        prompt_logp: (R, P - 1) log-prob of prompt tokens 2..P, or None.
    """

    logp: Tensor
    entropy: Tensor | None = None
    cand_ids: Tensor | None = None
    cand_logp: Tensor | None = None
    prompt_logp: Tensor | None = None


def policy_forward(
    model: torch.nn.Module,
    rows: Rows,
    *,
    temperature: float,
    want_entropy: bool = False,
    n_top: int = 0,
    cand_ids: Tensor | None = None,
    want_prompt: bool = False,
    precision: str = "fp32",
) -> PolicyOutputs:
    """Log-probs of `rows` under `model` with logits / `temperature` (the sampling distribution,
    as TRL's `GRPOTrainer` scales them; top-p truncation is not applied, as there).

    Args:
        n_top: return the top-`n_top` candidates of this distribution (ignored if `cand_ids`).
        cand_ids: (R, T, N) candidate ids at which to read log-probs (the behaviour policy's).
        precision: ``bf16-mixed`` runs the model under bf16 autocast; log-softmax is always
            computed in float32.
    """
    p = rows.prompt_len
    t = rows.response_ids.shape[1]
    # Only the positions that predict response tokens need logits (a (P, V) float block per row
    # is gigabytes at a 150k vocabulary); ProGRPO's prompt log-probs need them all.
    keep = {} if want_prompt else {"logits_to_keep": t + 1}
    with _autocast(rows.input_ids.device, precision):
        out = model(
            input_ids=rows.input_ids,
            attention_mask=rows.attention_mask,
            position_ids=rows.position_ids,
            use_cache=False,
            **keep,
        )
    logits = out.logits.float() / temperature  # (R, P + T, V), or (R, T + 1, V)
    # Position i predicts token i + 1: response token t comes from position P - 1 + t.
    resp_logits = logits[:, -t - 1 : -1]  # (R, T, V)
    logprobs = torch.log_softmax(resp_logits, dim=-1)
    res = PolicyOutputs(logp=logprobs.gather(-1, rows.response_ids.unsqueeze(-1)).squeeze(-1))
    if want_entropy:
        res.entropy = shaping.token_entropy(resp_logits)
    if cand_ids is None and n_top > 0:
        cand_ids = resp_logits.detach().topk(n_top, dim=-1).indices
    if cand_ids is not None:
        res.cand_ids = cand_ids
        res.cand_logp = logprobs.gather(-1, cand_ids)
    if want_prompt and p > 1:
        prompt_lp = torch.log_softmax(logits[:, : p - 1], dim=-1)
        res.prompt_logp = prompt_lp.gather(-1, rows.input_ids[:, 1:p].unsqueeze(-1)).squeeze(-1)
    return res


def _autocast(device: torch.device, precision: str) -> Any:
    if precision != "bf16-mixed":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def _forward_all(
    model: torch.nn.Module, rows: Rows, micro_batch_size: int, **kw: Any
) -> PolicyOutputs:
    """`policy_forward` over micro-batches without grad, concatenated."""
    parts = []
    with torch.no_grad():
        for s, e in _chunks(len(rows), micro_batch_size):
            sub_kw = dict(kw)
            if kw.get("cand_ids") is not None:
                sub_kw["cand_ids"] = kw["cand_ids"][s:e]
            parts.append(policy_forward(model, rows.slice(s, e), **sub_kw))

    def cat(name: str) -> Tensor | None:
        vals = [getattr(x, name) for x in parts]
        return None if vals[0] is None else torch.cat(vals, dim=0)

    return PolicyOutputs(**{k: cat(k) for k in PolicyOutputs.__dataclass_fields__})


def _slice_outputs(out: PolicyOutputs, start: int, stop: int) -> PolicyOutputs:
    """Rows ``start:stop`` of every per-row field (the prompt log-probs included)."""
    return PolicyOutputs(
        **{
            k: None if getattr(out, k) is None else getattr(out, k)[start:stop]
            for k in PolicyOutputs.__dataclass_fields__
        }
    )


def sampled_rank(cand_ids: Tensor, response_ids: Tensor) -> Tensor:
    """0-based rank of each sampled token among the candidates (R, T, N) -> (R, T); N if absent."""
    match = cand_ids == response_ids.unsqueeze(-1)
    first = match.to(torch.int64).argmax(dim=-1)
    return torch.where(match.any(dim=-1), first, torch.full_like(first, cand_ids.shape[-1]))


# ---------------------------------------------------------------------------------------------
# The update: full-batch shaping loss, micro-batched gradients


_GRAD_KEYS = ("logp", "entropy", "cand_logp")


def accumulate_gradients(
    model: torch.nn.Module,
    rows: Rows,
    fixed: dict[str, Tensor],
    current: PolicyOutputs,
    *,
    method: str,
    hyper: dict[str, Any],
    temperature: float,
    micro_batch_size: int,
    precision: str = "fp32",
    info: DistInfo | None = None,
) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """Accumulate into ``.grad`` the exact gradient of the full-batch shaping loss.

    With several processes (`info`), the full batch is the global one: every rank gathers the
    detached quantities of all ranks (`llm.distributed.gather_batch`), evaluates the same loss,
    and back-propagates the gradient of its own rows scaled by the world size, so that the
    engines' gradient mean over ranks is the full-batch gradient.

    Args:
        model: the policy (a transformers model, or its DDP / FSDP2 wrapping).
        rows: this rank's R = B * G rows.
        fixed: no-grad batch entries already shaped (B, G, ...): rewards, mask, logp_old and the
            method's other non-differentiable keys.
        current: the policy quantities at the current parameters (no grad), per row; their values
            enter the loss, their gradients come from the micro-batch passes.
        method, hyper: `shaping.METHODS[method].loss(batch, **hyper)`.

    Returns:
        (loss, metrics, batch): the full-batch loss (detached) equal to the shaping core's value,
        its metrics, and the (global) batch it was evaluated on (leaves detached).
    """
    info = info or DistInfo()
    b, g = fixed["rewards"].shape
    t = rows.response_mask.shape[1]
    needs = shaping.METHODS[method].needs_for(**hyper)
    local: dict[str, Tensor] = {}
    for key in _GRAD_KEYS:
        value = getattr(current, key)
        if key == "logp" or key in needs:
            if value is None:
                raise ValueError(f"{method}: needs {key!r} but the forward pass did not compute it")
            local[key] = value.detach().reshape(b, g, *value.shape[1:])
    batch = gather_batch({**fixed, **local}, info)
    leaves = {k: batch[k].detach().requires_grad_(True) for k in local}
    batch.update(leaves)
    loss, metrics = shaping.METHODS[method].loss(batch, **hyper)
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    # d loss / d leaf for this rank's rows, flattened back to rows (R, T[, N]); an unused leaf has
    # zero gradient. The world-size factor undoes the engines' mean over ranks.
    leaf_grads = {
        k: local_rows(torch.zeros_like(v) if gr is None else gr, info, b, t).reshape(
            b * g, *local[k].shape[2:]
        )
        * info.world_size
        for (k, v), gr in zip(leaves.items(), grads, strict=True)
    }
    cand_ids = current.cand_ids
    chunks = _chunks(len(rows), micro_batch_size)
    for i, (s, e) in enumerate(chunks):
        with grad_sync(model, enabled=i == len(chunks) - 1):
            out = policy_forward(
                model,
                rows.slice(s, e),
                temperature=temperature,
                want_entropy="entropy" in leaves,
                cand_ids=None if "cand_logp" not in leaves else cand_ids[s:e],
                precision=precision,
            )
            surrogate = sum((getattr(out, k) * leaf_grads[k][s:e]).sum() for k in leaves)
            surrogate.backward()
    detached = {k: v.detach() for k, v in batch.items()}
    return loss.detach(), metrics, detached


# ---------------------------------------------------------------------------------------------
# Optimizer schedule, checkpoints, RNG


def make_scheduler(
    optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up from 0 over `warmup_steps`, then constant, cosine or linear decay to 0 at
    `total_steps` (optimizer steps), the shapes of `transformers.get_scheduler`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete ``DIR/checkpoints/step_NNNNNN`` (temp dirs are ignored), or None."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file())
    return done[-1] if done else None


def _save_checkpoint(
    out_dir: Path,
    step: int,
    policy: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    position: int,
    info: DistInfo,
) -> Path:
    """Write ``step_NNNNNN`` atomically; with several processes the full (unsharded) model and
    optimizer states are gathered to rank 0 (torch.distributed.checkpoint.state_dict), which
    writes them, and every rank waits for it."""
    root = out_dir / CHECKPOINTS
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    model_state, optim_state = None, optimizer.state_dict()
    if info.enabled:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(policy, options=options)
        # The gathered dict names tied weights twice (lm_head = embeddings) as separate tensors;
        # keep the names `named_parameters` keeps so `save_pretrained` writes what it would.
        inner = unwrap(policy)
        own = {n for n, _ in inner.named_parameters()} | {n for n, _ in inner.named_buffers()}
        model_state = {k: v for k, v in model_state.items() if k in own}
        optim_state = get_optimizer_state_dict(policy, optimizer, options=options)
    if info.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        unwrap(policy).save_pretrained(tmp, state_dict=model_state)
        tokenizer.save_pretrained(tmp)
        state = {
            "step": step,
            "data_position": position,
            "world_size": info.world_size,
            "optimizer": optim_state,
            "scheduler": scheduler.state_dict(),
            "rng": _rng_state(),
        }
        torch.save(state, tmp / STATE_FILE)
        # A directory rename is atomic on POSIX: a checkpoint is either complete or absent.
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    if info.enabled:
        torch.distributed.barrier()
    return final


def _load_optimizer_state(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], info: DistInfo
) -> None:
    saved_world = int(state.get("world_size", 1))
    if (saved_world > 1) != info.enabled:
        raise ValueError(
            f"--resume: the checkpoint was written by {saved_world} process(es), this run has "
            f"{info.world_size}; resume with the same kind of launch (torchrun or not)"
        )
    if not info.enabled:
        optimizer.load_state_dict(state["optimizer"])
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(
        policy,
        optimizer,
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(full_state_dict=True),
    )


# ---------------------------------------------------------------------------------------------
# Model, backend, logging helpers


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer of a local model folder, exactly as its ``tokenizer.json`` defines it.

    `AutoTokenizer` in transformers 5 picks the class from ``config.json``'s model type, and
    `Qwen2Tokenizer` then replaces the saved pre-tokenizer and decoder with Qwen's byte-level
    ones, which breaks the tiny model's word-level tokenizer (words glued, `<answer>` split).
    `PreTrainedTokenizerFast` loads ``tokenizer.json`` as saved, for real models too.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (Path(path) / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def load_model_and_tokenizer(
    path: str | os.PathLike[str], device: str, precision: str = "fp32"
) -> tuple[Any, Any]:
    """`AutoModelForCausalLM` (eval mode) and `load_tokenizer` from a local directory; weights in
    bfloat16 for ``precision = "bf16"``, float32 otherwise (``bf16-mixed`` keeps float32 master
    weights and computes under autocast).

    Raises:
        FileNotFoundError: `path` is not a local folder (models are never downloaded).
    """
    from transformers import AutoModelForCausalLM

    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"model folder {str(path)!r} does not exist (models load from local folders; "
            "nothing is downloaded)"
        )

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval(), load_tokenizer(path)


def enable_gradient_checkpointing(model: Any) -> None:
    """Transformers' activation checkpointing (non-reentrant). Transformers only checkpoints in
    training mode (``GradientCheckpointingLayer`` checks ``self.training``), so the model is put in
    train mode; that is harmless for the Qwen/Llama families (no dropout by default) and a warning
    names any active dropout."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    active = sorted(
        {type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0}
    )
    rates = {
        k: getattr(model.config, k, 0.0)
        for k in ("attention_dropout", "hidden_dropout", "dropout")
        if getattr(model.config, k, 0.0)
    }
    if active or rates:
        warnings.warn(
            f"gradient_checkpointing puts the model in train mode; dropout is active ({rates or active})",
            stacklevel=2,
        )


def make_backend(cfg: TrainConfig, model: Any, tokenizer: Any) -> RolloutBackendLike:
    """The rollout backend named by ``cfg.backend`` (vllm: `llm.vllm_backend.VLLMBackend` on the
    model folder ``cfg.model_path`` with the ``[vllm]`` settings; it needs CUDA and the `gpu`
    extra)."""
    if cfg.backend == "transformers":
        from llm.rollout import HFGenerateBackend

        return HFGenerateBackend(model, tokenizer)
    if cfg.backend == "vllm":
        from llm.vllm_backend import VLLMBackend

        v = cfg.vllm
        return VLLMBackend(
            cfg.model_path,
            tokenizer,
            gpu_memory_utilization=v.gpu_memory_utilization,
            sleep_mode=v.sleep_mode,
            tensor_parallel_size=v.tensor_parallel_size,
            max_model_len=v.max_model_len,
            enforce_eager=v.enforce_eager,
            dtype=v.dtype,
            seed=cfg.seed,
        )
    raise ValueError(f"backend: unknown backend {cfg.backend!r}")


def _step_seed(seed: int, step: int, rank: int = 0) -> int:
    # Sampling uses a generator seeded per step (and rank), so a resumed run samples what it
    # would have; rank 0 keeps the single-process seeds.
    key = (seed, 7919, step) if rank == 0 else (seed, 7919, step, rank)
    return int(np.random.default_rng(key).integers(2**62))


class _Logger:
    """metrics.jsonl (always) and TensorBoard (when installed and enabled)."""

    def __init__(self, out_dir: Path, *, tensorboard: bool, start_step: int) -> None:
        self.path = out_dir / "metrics.jsonl"
        self._truncate(start_step)
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                warnings.warn("tensorboard is not installed: no TensorBoard events", stacklevel=2)
            else:
                self.writer = SummaryWriter(str(out_dir / "tb"), purge_step=start_step + 1)

    def _truncate(self, start_step: int) -> None:
        # A run killed after its last checkpoint logged steps that the resumed run redoes.
        if not self.path.exists():
            return
        keep = [
            line
            for line in self.path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line)["step"] <= start_step
        ]
        self.path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.writer is not None:
            for k, v in metrics.items():
                self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _stats(x: Tensor, prefix: str) -> dict[str, float]:
    x = x.detach().double()
    return {
        f"{prefix}/mean": x.mean().item(),
        f"{prefix}/std": x.std(correction=0).item(),
        f"{prefix}/min": x.min().item(),
        f"{prefix}/max": x.max().item(),
    }


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    return ((x * mask).sum() / mask.sum().clamp(min=1)).item()


def _check_resume_config(cfg: TrainConfig, out_dir: Path) -> None:
    saved_path = out_dir / "config.toml"
    if not saved_path.exists():
        return
    saved = load_config(saved_path, steps=cfg.steps)
    if config_to_toml(saved) != config_to_toml(cfg):
        old = config_to_toml(saved).splitlines()
        new = config_to_toml(cfg).splitlines()
        diff = [f"{a!r} -> {b!r}" for a, b in zip(old, new, strict=False) if a != b]
        raise ValueError(
            f"--resume: the config differs from {saved_path} (only steps may change): {diff[:5]}"
        )


# ---------------------------------------------------------------------------------------------
# The loop


def train(
    cfg: TrainConfig,
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = False,
    backend_factory: Callable[[TrainConfig, Any, Any], RolloutBackendLike] | None = None,
    stop_after: int | None = None,
    progress: bool = True,
) -> list[dict[str, float]]:
    """Train `cfg` into `out_dir`; returns the metrics of the steps run by this call.

    Writes ``DIR/config.toml``, ``DIR/metrics.jsonl`` (one line per logged step),
    ``DIR/tb/`` (TensorBoard) and ``DIR/checkpoints/step_NNNNNN/`` (model + tokenizer via
    `save_pretrained`, and ``trainer_state.pt``: optimizer, scheduler, RNG states, data
    position, step) every `save_every` steps and at the last step.

    Under ``torchrun --nproc_per_node W`` each of the W processes samples and scores
    ``prompts_per_step / W`` of the step's prompts, the update is the single-process update of the
    global batch (`accumulate_gradients`), the policy is wrapped by DDP or FSDP2 (``parallel``),
    and rank 0 logs and writes checkpoints.

    Args:
        resume: continue from the newest checkpoint in `out_dir` (fresh start if none); the
            config must equal the saved one except `steps`.
        backend_factory: ``(cfg, model, tokenizer) -> backend``; default `make_backend`.
        stop_after: stop after this step without saving (simulates a kill; tests use it).
        progress: show a tqdm bar (rank 0).

    Raises:
        ValueError: invalid config, a resumed run whose config differs, or a mini-batch
            (``prompts_per_update``, else ``prompts_per_step``) not divisible by the number of
            processes.
    """
    info = init_distributed(cfg.device)
    per_update = cfg.prompts_per_update or cfg.prompts_per_step
    if per_update % info.world_size:
        name = "prompts_per_update" if cfg.prompts_per_update else "prompts_per_step"
        raise ValueError(
            f"{name}: {per_update} is not divisible by the {info.world_size} processes (each "
            "rank takes whole groups of every mini-batch)"
        )
    device = info.device
    out = Path(out_dir)
    if resume:
        _check_resume_config(cfg, out)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.toml")
        if cfg.build_base_model:
            from llm.tiny import ensure_base_model

            ensure_base_model(cfg.model_path)
    if info.enabled:
        torch.distributed.barrier()
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)  # noqa: NPY002 (seeds the legacy global RNG that libraries use)
    torch.manual_seed(cfg.seed)

    ckpt = broadcast_object(latest_checkpoint(out) if resume else None, info)
    model, tokenizer = load_model_and_tokenizer(ckpt or cfg.model_path, device, cfg.precision)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    ref_model = None
    if cfg.kl_coef > 0:
        # Frozen: no fp32 master copy needed, bf16 unless the run is fp32 throughout.
        ref_precision = "fp32" if cfg.precision == "fp32" else "bf16"
        ref_model, _ = load_model_and_tokenizer(cfg.model_path, device, ref_precision)
        ref_model.requires_grad_(False)
    policy = wrap_policy(model, info, cfg.parallel)
    backend = (backend_factory or make_backend)(cfg, model, tokenizer)
    if ckpt is not None:
        backend.sync_weights(model)  # an engine with its own copy starts from cfg.model_path

    optimizer = torch.optim.AdamW(
        policy.parameters(),
        lr=cfg.lr,
        betas=tuple(cfg.adam_betas),
        weight_decay=cfg.weight_decay,
    )
    scheduler = make_scheduler(
        optimizer, cfg.schedule, cfg.warmup_steps, cfg.steps * cfg.inner_epochs
    )
    start, position = 0, 0
    if ckpt is not None:
        state = torch.load(ckpt / STATE_FILE, weights_only=False)
        _load_optimizer_state(policy, optimizer, state, info)
        scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        start, position = state["step"], state["data_position"]

    problems = load_train_problems(cfg)
    if cfg.max_prompt_tokens > 0:
        problems = _drop_long_prompts(problems, cfg, tokenizer)
    method = cfg.method
    hyper = cfg.method_hyper()
    needs = shaping.METHODS[method].needs_for(**hyper)
    n_cand = cfg.n_candidates
    encoder = None
    if "diversity" in needs:
        from llm.diversity import load_encoder

        encoder = load_encoder(device)

    logger = _Logger(out, tensorboard=cfg.tensorboard, start_step=start) if info.is_main else None
    history: list[dict[str, float]] = []
    last = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    bar = tqdm(
        range(start + 1, last + 1),
        disable=not (progress and info.is_main),
        desc=f"train {method}",
    )
    try:
        for step in bar:
            t0 = time.perf_counter()
            idx = data_indices(position, cfg.prompts_per_step, len(problems), cfg.data.seed)
            position += cfg.prompts_per_step
            idx = _rank_share(idx, info, cfg.prompts_per_update or cfg.prompts_per_step)
            batch_problems = [problems[i] for i in idx]
            prompts = [prompt_for(p, cfg.template) for p in batch_problems]
            roll = generate_shared(
                backend,
                prompts,
                info,
                share=cfg.vllm.tensor_parallel_size if cfg.backend == "vllm" else 1,
                seed_of=lambda rank, step=step: _step_seed(cfg.seed, step, rank),
                group_size=cfg.group_size,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
            )
            t_roll = time.perf_counter()

            metrics = _train_step(
                cfg,
                policy,
                ref_model,
                optimizer,
                scheduler,
                roll,
                batch_problems,
                needs=needs,
                hyper=hyper,
                n_cand=n_cand,
                encoder=encoder,
                info=info,
            )
            backend.sync_weights(model)
            t_end = time.perf_counter()
            metrics.update(
                {
                    "time/rollout": t_roll - t0,
                    "time/update": t_end - t_roll,
                    "time/step": t_end - t0,
                    "charts/prompts_seen": float(position),
                }
            )
            history.append({"step": step, **metrics})
            if logger is not None and (step % cfg.log_every == 0 or step == cfg.steps):
                logger.log(step, metrics)
            bar.set_postfix(reward=f"{metrics['charts/reward_mean']:.3f}")
            if step == cfg.steps or (cfg.save_every and step % cfg.save_every == 0):
                _save_checkpoint(out, step, policy, tokenizer, optimizer, scheduler, position, info)
    finally:
        if logger is not None:
            logger.close()
    return history


def generate_shared(
    backend: RolloutBackendLike,
    prompts: list[str],
    info: DistInfo,
    *,
    share: int,
    seed_of: Callable[[int], int],
    group_size: int,
    **sampling: Any,
) -> Any:
    """This rank's rollouts, generated alone (``share = 1``) or by its group of `share`
    consecutive ranks together (vLLM tensor parallelism: every rank of an engine's group must
    submit the same requests, as TRL's colocate mode gathers them).

    The group's prompts are all-gathered, sampled with the generator of the group's first rank
    (``seed_of(rank)``), and this rank keeps its own prompts' rows (`slice_rollout`).

    Raises:
        ValueError: the world size is not a multiple of `share`.
    """
    if share <= 1 or not info.enabled:
        # A CPU generator on every device: the backends only draw seeds from it (a CUDA
        # generator cannot feed torch.randint's CPU draw).
        gen = torch.Generator().manual_seed(seed_of(info.rank))
        with torch.no_grad():
            return backend.generate(prompts, group_size, generator=gen, **sampling)
    if info.world_size % share:
        raise ValueError(
            f"vllm.tensor_parallel_size: {share} does not divide the {info.world_size} processes"
        )
    gathered: list[Any] = [None] * info.world_size
    torch.distributed.all_gather_object(gathered, prompts)
    lead = info.rank - info.rank % share
    group = gathered[lead : lead + share]
    gen = torch.Generator().manual_seed(seed_of(lead))
    with torch.no_grad():
        roll = backend.generate(
            [p for part in group for p in part], group_size, generator=gen, **sampling
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


def _rank_share(indices: list[int], info: DistInfo, per_update: int) -> list[int]:
    """This rank's prompts of a step: its 1/W of every mini-batch of `per_update` consecutive
    prompts, so mini-batch j of every rank together is mini-batch j of the single-process run."""
    m = per_update // info.world_size
    return [
        i
        for start in range(0, len(indices), per_update)
        for i in indices[start + info.rank * m : start + (info.rank + 1) * m]
    ]


def _drop_long_prompts(problems: list[Problem], cfg: TrainConfig, tokenizer: Any) -> list[Problem]:
    """The problems whose prompt fits in ``max_prompt_tokens`` (verl's filter_overlong_prompts).

    Raises:
        ValueError: none fits.
    """
    prompts = [prompt_for(p, cfg.template) for p in problems]
    lengths = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
    kept = [p for p, n in zip(problems, lengths, strict=True) if n <= cfg.max_prompt_tokens]
    if not kept:
        raise ValueError(
            f"max_prompt_tokens: every prompt is longer than {cfg.max_prompt_tokens} tokens "
            f"(shortest {min(lengths)})"
        )
    if len(kept) < len(problems):
        warnings.warn(
            f"max_prompt_tokens: dropped {len(problems) - len(kept)} of {len(problems)} "
            f"problems whose prompt is longer than {cfg.max_prompt_tokens} tokens",
            stacklevel=2,
        )
    return kept


def _train_step(
    cfg: TrainConfig,
    policy: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    roll: Any,
    problems: Sequence[Problem],
    *,
    needs: frozenset[str],
    hyper: dict[str, Any],
    n_cand: int,
    encoder: Any,
    info: DistInfo | None = None,
) -> dict[str, float]:
    """Score, behaviour pass, mu full-batch optimizer steps; returns the step's metrics (of the
    global batch when several processes train)."""
    info = info or DistInfo(device=cfg.device)
    device = info.device
    b, g, t = roll.response_ids.shape
    rewards = torch.tensor(
        [
            [score_for(text, prob, format_score=cfg.format_score) for text in texts]
            for texts, prob in zip(roll.texts, problems, strict=True)
        ],
        dtype=torch.float32,
        device=device,
    )
    rows = build_rows(
        roll.prompt_ids.to(device),
        roll.prompt_mask.to(device),
        roll.response_ids.to(device),
        roll.response_mask.to(device),
    )
    mask = rows.response_mask.reshape(b, g, t)
    fwd = {"temperature": cfg.temperature, "precision": cfg.precision}

    t0 = time.perf_counter()
    old = _forward_all(
        policy,
        rows,
        cfg.micro_batch_size,
        want_entropy=True,
        n_top=n_cand,
        want_prompt="prompt_logp" in needs,
        **fwd,
    )
    fixed: dict[str, Tensor] = {
        "rewards": rewards,
        "mask": mask,
        "logp_old": old.logp.reshape(b, g, t),
    }
    sampler_logp = getattr(roll, "logp", None)
    if sampler_logp is not None:
        sampler_logp = sampler_logp.to(device=device, dtype=torch.float32)
    if cfg.rollout_is == "truncate" and sampler_logp is not None:
        fixed["is_weight"] = rollout_is_weight(
            fixed["logp_old"], sampler_logp, mask, cap=cfg.rollout_is_cap
        )
    if "logp_ref" in needs:
        assert ref_model is not None  # kl_coef > 0 loads it
        ref = _forward_all(ref_model, rows, cfg.micro_batch_size, **fwd)
        fixed["logp_ref"] = ref.logp.reshape(b, g, t)
    if "sampled_rank" in needs:
        fixed["sampled_rank"] = sampled_rank(old.cand_ids, rows.response_ids).reshape(b, g, t)
    if "cand_logp_old" in needs:
        fixed["cand_logp_old"] = old.cand_logp.reshape(b, g, t, -1)
    if "prompt_logp" in needs:
        # The prompt is the same for the G rows of a group: read it from each group's first row.
        p_mask = roll.prompt_mask.to(device=device, dtype=torch.float32)
        fixed["prompt_logp"] = old.prompt_logp[::g]
        fixed["prompt_mask"] = p_mask[:, 1:] * p_mask[:, :-1]
    div = None
    if "diversity" in needs:
        from llm.diversity import diversity_scores

        div = diversity_scores(roll.texts, encoder=encoder, distinct=cfg.distinct)
        fixed["diversity"] = torch.tensor(div, dtype=torch.float32, device=device)
    t_old = time.perf_counter()

    metrics: dict[str, float] = {}
    method = shaping.METHODS[cfg.method]
    # Mini-batches of whole groups (verl's ppo_mini_batch_size), in data order, each one
    # optimizer step; this rank's share of a mini-batch is prompts_per_update / W groups.
    per_update = (cfg.prompts_per_update or cfg.prompts_per_step) // info.world_size
    losses: list[Tensor] = []
    step_metrics: list[dict[str, Tensor]] = []
    norms: list[float] = []
    for epoch in range(cfg.inner_epochs):
        for start in range(0, b, per_update):
            stop = min(start + per_update, b)
            sub_rows = rows.slice(start * g, stop * g)
            if epoch == 0 and start == 0:
                current = _slice_outputs(old, start * g, stop * g)
            else:  # the parameters moved since the behaviour pass
                current = _forward_all(
                    policy,
                    sub_rows,
                    cfg.micro_batch_size,
                    want_entropy="entropy" in needs,
                    cand_ids=old.cand_ids[start * g : stop * g] if "cand_logp" in needs else None,
                    **fwd,
                )
            optimizer.zero_grad(set_to_none=True)
            loss, loss_metrics, _ = accumulate_gradients(
                policy,
                sub_rows,
                {k: v[start:stop] for k, v in fixed.items()},
                current,
                method=cfg.method,
                hyper=hyper,
                temperature=cfg.temperature,
                micro_batch_size=cfg.micro_batch_size,
                precision=cfg.precision,
                info=info,
            )
            clip = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
            norms.append(float(torch.nn.utils.clip_grad_norm_(policy.parameters(), clip)))
            optimizer.step()
            scheduler.step()
            # Free the gradients now: the rollout engine wakes up before the next zero_grad.
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss)
            step_metrics.append({k: v for k, v in loss_metrics.items() if v.numel() == 1})
    t_upd = time.perf_counter()

    # Reported over the global batch (the behaviour pass and the rollout), and as the mean over
    # the step's optimizer steps for the loss terms and the gradient norm.
    # The behaviour pass is the policy at the rollout: its values stand in for the current ones.
    local = {**fixed, "logp": fixed["logp_old"], "entropy": old.entropy.reshape(b, g, t)}
    if old.cand_logp is not None:
        local["cand_logp"] = old.cand_logp.reshape(b, g, t, -1)
    if sampler_logp is not None:
        local["sampler_logp"] = sampler_logp
    full = gather_batch(local, info)
    rewards, mask = full["rewards"], full["mask"]
    adv = method.advantages(full, **hyper)
    correct = (rewards > 0.5).float()
    metrics["charts/reward_mean"] = rewards.mean().item()
    metrics["charts/accuracy"] = correct.mean().item()
    metrics["charts/pass_rate"] = correct.amax(dim=1).mean().item()
    metrics["charts/format_rate"] = (rewards > 0).float().mean().item()
    metrics["charts/response_len"] = mask.sum(-1).mean().item()
    metrics["charts/entropy"] = _masked_mean(full["entropy"], mask)
    metrics["charts/lr"] = scheduler.get_last_lr()[0]
    metrics["charts/grad_norm"] = float(np.mean(norms))
    metrics["charts/optimizer_steps"] = float(len(norms))
    if "sampler_logp" in full:
        diff = full["logp_old"] - full["sampler_logp"]
        metrics["charts/sampler_logp_gap"] = _masked_mean(diff.abs(), mask)
        # k3 estimate of KL(sampler || trainer) per token: the mismatch TRL and verl log.
        metrics["charts/sampler_kl"] = _masked_mean(torch.expm1(diff) - diff, mask)
    if "is_weight" in full:
        w = full["is_weight"]
        metrics["charts/is_weight_mean"] = _masked_mean(w, mask)
        metrics["charts/is_weight_capped"] = _masked_mean((w >= cfg.rollout_is_cap).float(), mask)
    metrics["losses/loss"] = float(torch.stack(losses).mean())
    for k in step_metrics[0]:
        metrics[f"losses/{k}"] = float(np.mean([float(m[k]) for m in step_metrics]))
    metrics.update(_stats(adv, "adv"))
    if "cand_logp" in full:
        cand = full["cand_logp"]
        for n in range(cand.shape[-1]):
            metrics[f"topn/lambda_{n + 1}"] = _masked_mean(cand[..., n], mask)
    if div is not None:
        metrics["charts/diversity"] = _masked_mean(full["diversity"], torch.ones_like(rewards))
    metrics["time/logprob"] = t_old - t0
    metrics["time/optim"] = t_upd - t_old
    return metrics


def rollout_is_weight(
    logp_old: Tensor, logp_sampler: Tensor, mask: Tensor, *, cap: float
) -> Tensor:
    """Truncated importance weight of each sampled token, ``min(exp(logp_old - logp_sampler), cap)``
    (1 on padding): corrects the surrogate for sampling from the rollout engine's distribution
    rather than the trainer's (vLLM kernels, bf16, top-p), as TRL's
    ``vllm_importance_sampling_correction`` and verl's truncated IS (TIS) do.

    Args:
        logp_old, logp_sampler, mask: (B, G, T) trainer and sampler log-probs of the sampled
            tokens, and the response mask.
        cap: upper bound C >= 1 of the weight.
    """
    diff = torch.where(mask > 0, logp_old - logp_sampler, torch.zeros_like(logp_old))
    return torch.exp(diff.clamp(max=math.log(cap)))
