"""Checkpoints, resume and the metrics log of a training run.

A checkpoint is ``DIR/checkpoints/step_NNNNNN/``: the model and tokenizer (`save_pretrained`) and
``trainer_state.pt`` (optimizer, scheduler, the Python / NumPy / torch RNG states, the data
position and the step), written atomically. Resuming restores all of it, so a resumed run repeats
the uninterrupted one exactly; `MetricsLogger` drops the lines of steps the resumed run redoes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm.config import TrainConfig, config_to_toml, load_config
from llm.distributed import DistInfo, unwrap
from llm.runfolder import loadable_checkpoints, newest_loadable, read_metrics

__all__ = [
    "CHECKPOINTS",
    "STATE_FILE",
    "MetricsLogger",
    "check_resume_config",
    "find_resume_checkpoint",
    "latest_checkpoint",
    "load_optimizer_state",
    "restore_checkpoint",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    """The Python, NumPy (legacy global), torch CPU and, when present, CUDA RNG states."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned (CUDA only when saved and available)."""
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


_STATE_KEYS = ("step", "data_position", "optimizer", "scheduler", "rng")


def _read_checkpoint(ckpt: Path) -> dict[str, Any]:
    """``trainer_state.pt`` of `ckpt`, after checking that its weights and config are readable
    (a truncated safetensors file fails its header check here, not mid-training).

    Raises:
        any loading error (the caller falls back to an older checkpoint); ValueError for a
        state without the keys a resume needs.
    """
    from safetensors import safe_open

    json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    weights = sorted(ckpt.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{ckpt}: no *.safetensors weights")
    for f in weights:
        with safe_open(str(f), framework="pt") as handle:
            for key in handle.keys():
                handle.get_slice(key)
    # mmap: the check reads the pickle, not every optimizer tensor (restore_checkpoint loads them)
    state = torch.load(ckpt / STATE_FILE, weights_only=False, mmap=True)
    missing = [k for k in _STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{ckpt / STATE_FILE}: missing {missing}")
    return state


def find_resume_checkpoint(out_dir: str | os.PathLike[str], steps: int) -> Path | None:
    """The checkpoint a ``--resume`` of `out_dir` continues from: the newest that loads.

    Corrupt newer checkpoints are skipped with a warning naming each and its error. A run already
    at `steps` is finished: a warning says so and the checkpoint is returned (nothing is trained).

    Raises:
        ValueError: the checkpoint is past `steps` (``--steps`` at or below it cannot continue).
        llm.runfolder.RunFolderError: checkpoints exist but none loads.
    """
    found = newest_loadable(
        loadable_checkpoints(out_dir, lambda p: (p / STATE_FILE).is_file()), _read_checkpoint
    )
    if found is None:
        return None
    ckpt, state = found
    if state["step"] > steps:
        raise ValueError(
            f"--resume: {ckpt} is at step {state['step']}, past steps = {steps}; pass --steps "
            f"above {state['step']} to train further"
        )
    if state["step"] == steps:
        warnings.warn(
            f"--resume: {out_dir} is already at step {steps} = steps; nothing to train (pass a "
            "larger --steps to continue)",
            stacklevel=2,
        )
    return ckpt


def save_checkpoint(
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
            "rng": rng_state(),
        }
        torch.save(state, tmp / STATE_FILE)
        # A directory rename is atomic on POSIX: a checkpoint is either complete or absent.
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    if info.enabled:
        torch.distributed.barrier()
    return final


def load_optimizer_state(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], info: DistInfo
) -> None:
    """Load the saved optimizer state into `optimizer` (sharded again under FSDP2).

    Raises:
        ValueError: the checkpoint was written by a single process and this run has several, or
            the other way round.
    """
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


def restore_checkpoint(
    ckpt: Path | None,
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    info: DistInfo,
) -> tuple[int, int]:
    """Load the optimizer, scheduler and RNG states of `ckpt` (the weights are loaded with the
    model); returns ``(step, data_position)`` to continue from, ``(0, 0)`` for a fresh run
    (`ckpt` None).

    Raises:
        ValueError: see `load_optimizer_state`.
    """
    if ckpt is None:
        return 0, 0
    state = torch.load(ckpt / STATE_FILE, weights_only=False)
    load_optimizer_state(policy, optimizer, state, info)
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state["step"], state["data_position"]


def check_resume_config(cfg: TrainConfig, out_dir: Path) -> None:
    """Check that `cfg` equals the run's saved ``config.toml`` except `steps` (no-op if none).

    Raises:
        ValueError: a key differs (the message lists the first differing lines).
    """
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


class MetricsLogger:
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
        keep = [r for r in read_metrics(self.path) if r["step"] <= start_step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
        os.replace(tmp, self.path)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append ``{"step": step, **metrics}`` to metrics.jsonl (and TensorBoard)."""
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.writer is not None:
            for k, v in metrics.items():
                self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
