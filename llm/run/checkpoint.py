"""Checkpoints, resume and the metrics log of a training run.

A checkpoint is ``DIR/checkpoints/step_NNNNNN/``, written atomically (into
``.tmp_step_NNNNNN/``, renamed once complete), in one of two layouts:

- **full** (one process, and DDP): the model and tokenizer (`save_pretrained`) and
  ``trainer_state.pt`` (optimizer, scheduler, the Python / NumPy / torch RNG states, the data
  position and the step); under DDP rank 0 writes it.
- **sharded** (FSDP2 under torchrun): ``sharded/`` is a `torch.distributed.checkpoint` (DCP)
  folder of the model and optimizer states in which every rank writes only its own shards
  (``__<rank>_0.distcp``; rank 0 adds ``.metadata``) and from which every rank reads only its own
  shards on resume; ``rng/rank_RRRRR.pt`` holds each rank's RNG states; ``trainer_state.pt`` holds
  the step, data position, scheduler and world size (no optimizer state); the model config and
  tokenizer sit beside them; ``COMPLETE`` is written last (after every rank has finished), and a
  sharded checkpoint without it is never resumed from. At the last step of the run (``final``)
  the folder also gets a consolidated Hugging Face export of the weights (``model.safetensors``
  and ``config.json``, gathered to rank 0; no optimizer state), so ``python -m llm eval --model
  DIR`` evaluates the final model (`latest_checkpoint` returns the newest checkpoint holding
  weights). An intermediate sharded checkpoint becomes a model folder with `export_checkpoint`.

Either layout may hold ``reference/``: the weights of the KL reference after a reference reset
(``control.reference_reset_every``, `llm.train.control.reset_reference`), a Hugging Face model
folder (`save_pretrained`, gathered to rank 0 under FSDP2) that a resumed run loads as its
reference (`reference_folder`).

Resuming restores all of it, so a resumed run repeats the uninterrupted one exactly;
`MetricsLogger` drops the lines of steps the resumed run redoes.

Sources for the sharded layout: torch docs "torch.distributed.checkpoint" (`save`, `load`,
`FileSystemReader`, and `torch.distributed.checkpoint.state_dict`: `get_state_dict`,
`set_state_dict`, `get_model_state_dict`, `StateDictOptions`) and the tutorial "Getting Started
with Distributed Checkpoint (DCP)" (save and load the sharded state dicts of a model and
optimizer from `get_state_dict`, then `set_state_dict`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from experiment.store import read_json, write_json
from llm.config import TrainConfig, config_to_toml, load_config, load_saved_config, save_config
from llm.run.distributed import DistInfo, unwrap
from llm.run.folder import loadable_checkpoints, newest_loadable, read_metrics

__all__ = [
    "CHECKPOINTS",
    "COMPLETE_FILE",
    "CONFIG_MIGRATED",
    "REFERENCE_DIR",
    "RNG_DIR",
    "SHARDED_DIR",
    "STATE_FILE",
    "CheckpointState",
    "MetricsLogger",
    "check_resume_config",
    "export_checkpoint",
    "find_resume_checkpoint",
    "is_sharded_checkpoint",
    "latest_checkpoint",
    "load_optimizer_state",
    "reference_folder",
    "restore_checkpoint",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "trainer_extra",
    "upgrade_run_config",
    "weights_folder",
]

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"
SHARDED_DIR = "sharded"  # the DCP folder of a sharded checkpoint
RNG_DIR = "rng"  # rank_RRRRR.pt: each rank's RNG states (sharded checkpoints)
COMPLETE_FILE = "COMPLETE"  # written last into a sharded checkpoint
REFERENCE_DIR = "reference"  # the reset KL reference's weights (a model folder)
_SHARDED = "sharded"  # trainer_state.pt's "layout" of a sharded checkpoint


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


def is_sharded_checkpoint(ckpt: str | os.PathLike[str]) -> bool:
    """Whether `ckpt` has the sharded layout (a DCP folder of FSDP2 shards; module docstring)."""
    return (Path(ckpt) / SHARDED_DIR).is_dir()


def _complete(ckpt: Path) -> bool:
    # A renamed full checkpoint is complete; a sharded one also needs COMPLETE, which rank 0
    # writes after every rank has written its shards and RNG states.
    if not (ckpt / STATE_FILE).is_file():
        return False
    return not is_sharded_checkpoint(ckpt) or (ckpt / COMPLETE_FILE).is_file()


def _has_weights(ckpt: Path) -> bool:
    return (ckpt / "config.json").is_file() and any(ckpt.glob("*.safetensors"))


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete ``DIR/checkpoints/step_NNNNNN`` that holds Hugging Face weights (every
    full checkpoint; a sharded one only with its export, written at the last step), or None.
    Temp dirs are ignored. This is the model folder that ``python -m llm eval --model DIR``
    evaluates."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if _complete(p) and _has_weights(p))
    return done[-1] if done else None


def weights_folder(ckpt: Path | None, model_path: str | os.PathLike[str]) -> str | Path:
    """The folder the policy's weights load from before `restore_checkpoint`: a full
    checkpoint itself, else (a fresh run, or a sharded checkpoint, whose shards
    `restore_checkpoint` loads into the wrapped model) the base model `model_path`."""
    if ckpt is None or is_sharded_checkpoint(ckpt):
        return model_path
    return ckpt


_STATE_KEYS = ("step", "data_position", "optimizer", "scheduler", "rng")
_SHARDED_KEYS = ("step", "data_position", "scheduler", "world_size", "layout")


def _rng_file(ckpt: Path, rank: int) -> Path:
    return ckpt / RNG_DIR / f"rank_{rank:05d}.pt"


def _check_weights(ckpt: Path) -> None:
    """Read ``config.json`` and every safetensors header and tensor slice of `ckpt` (a truncated
    file fails here, not mid-training)."""

    json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    weights = sorted(ckpt.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{ckpt}: no *.safetensors weights")
    for f in weights:
        with safe_open(str(f), framework="pt") as handle:
            for key in handle.keys():
                handle.get_slice(key)


def _check_sharded(ckpt: Path, state: dict[str, Any]) -> None:
    """Check the parts of a sharded checkpoint: the COMPLETE marker, the DCP metadata, that every
    shard file it names is there and long enough for every byte range it lists, and each rank's
    RNG file."""

    marker = json.loads((ckpt / COMPLETE_FILE).read_text(encoding="utf-8"))
    if marker.get("step") != state["step"]:
        raise ValueError(f"{ckpt / COMPLETE_FILE}: step {marker.get('step')} != {state['step']}")
    metadata = FileSystemReader(str(ckpt / SHARDED_DIR)).read_metadata()
    need: dict[str, int] = {}
    for item in (metadata.storage_data or {}).values():
        need[item.relative_path] = max(need.get(item.relative_path, 0), item.offset + item.length)
    if not need:
        raise ValueError(f"{ckpt / SHARDED_DIR}: the metadata lists no shard")
    for name, size in sorted(need.items()):
        f = ckpt / SHARDED_DIR / name
        have = f.stat().st_size if f.is_file() else -1
        if have < size:
            raise ValueError(f"{f}: missing or truncated ({max(have, 0)} of {size} bytes)")
    for rank in range(int(state["world_size"])):
        rng = torch.load(_rng_file(ckpt, rank), weights_only=False)
        if not isinstance(rng, dict) or "torch" not in rng:
            raise ValueError(f"{_rng_file(ckpt, rank)}: not an RNG state")
    if any(ckpt.glob("*.safetensors")):
        _check_weights(ckpt)  # the Hugging Face export of the last step


def _read_checkpoint(ckpt: Path) -> dict[str, Any]:
    """``trainer_state.pt`` of `ckpt`, after checking that its weights and config (full layout)
    or its shards, RNG files and completion marker (sharded layout) are readable.

    Raises:
        any loading error (the caller falls back to an older checkpoint); ValueError for a
        state without the keys a resume needs, or a torn sharded checkpoint.
    """
    # mmap: the check reads the pickle, not every optimizer tensor (restore_checkpoint loads them)
    state = torch.load(ckpt / STATE_FILE, weights_only=False, mmap=True)
    sharded = isinstance(state, dict) and state.get("layout") == _SHARDED
    keys = _SHARDED_KEYS if sharded else _STATE_KEYS
    missing = [k for k in keys if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{ckpt / STATE_FILE}: missing {missing}")
    if sharded:
        _check_sharded(ckpt, state)
    else:
        _check_weights(ckpt)
    return state


def find_resume_checkpoint(out_dir: str | os.PathLike[str], steps: int) -> Path | None:
    """The checkpoint a ``--resume`` of `out_dir` continues from: the newest that loads.

    Corrupt newer checkpoints (a truncated file; a sharded checkpoint with a missing or short
    shard) are skipped with a warning naming each and its error; a sharded checkpoint without its
    ``COMPLETE`` marker is not a candidate. A run already at `steps` is finished: a warning says
    so and the checkpoint is returned (nothing is trained).

    Raises:
        ValueError: the checkpoint is past `steps` (``--steps`` at or below it cannot continue).
        llm.run.folder.RunFolderError: checkpoints exist but none loads.
    """
    found = newest_loadable(loadable_checkpoints(out_dir, _complete), _read_checkpoint)
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


def _is_fsdp2(policy: torch.nn.Module) -> bool:

    return isinstance(policy, FSDPModule)


def _full_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights gathered to rank 0's CPU memory (other ranks get ``{}``):
    ``full_state_dict`` with ``cpu_offload`` keeps them on rank 0 only (StateDictOptions docs).
    Collective: every rank calls it."""

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(policy, options=options)
    # The gathered dict names tied weights twice (lm_head = embeddings) as separate tensors;
    # keep the names `named_parameters` keeps so `save_pretrained` writes what it would.
    inner = unwrap(policy)
    own = {n for n, _ in inner.named_parameters()} | {n for n, _ in inner.named_buffers()}
    return {k: v for k, v in state.items() if k in own}


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What a checkpoint holds of a run after `step` (`save_checkpoint`).

    Attributes:
        step: the training steps done.
        policy: the policy (a transformers model, or its DDP / FSDP2 wrapping).
        tokenizer: saved beside the weights (`save_pretrained`).
        optimizer, scheduler: AdamW and its learning-rate schedule.
        position: the data position, prompts consumed (`llm.data.data_indices`).
        extra: the trainer's own state (`llm.train.control.Controls.state`), stored in
            ``trainer_state.pt`` and read back by `trainer_extra`, or None.
        reference: a reset KL reference, written to ``reference/``, or None.
    """

    step: int
    policy: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    position: int
    extra: dict[str, Any] | None = None
    reference: torch.nn.Module | None = None


def save_checkpoint(
    out_dir: Path, state: CheckpointState, info: DistInfo, *, last: bool = False
) -> Path:
    """Write ``step_NNNNNN`` of `state` atomically (a temp folder renamed by rank 0 after every
    rank is done).

    One process or DDP: the full layout, written by rank 0 (under DDP the full optimizer state is
    gathered to it through torch.distributed.checkpoint.state_dict). FSDP2: the sharded layout,
    each rank writing its own shards and RNG states; with `last` (the run's last step) rank 0 adds
    the Hugging Face export of the full weights (module docstring). The reference, when set, is
    written to ``reference/`` (collective under FSDP2)."""
    root = out_dir / CHECKPOINTS
    target = root / f"step_{state.step:06d}"
    tmp = root / f".tmp_step_{state.step:06d}"
    if info.enabled and _is_fsdp2(state.policy):
        _save_sharded(tmp, state, info, last)
    else:
        _save_full(tmp, state, info)
    if state.reference is not None:
        _save_reference(tmp, state.reference, info)
    if info.is_main:
        # A directory rename is atomic on POSIX: a checkpoint is either complete or absent.
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    if info.enabled:
        torch.distributed.barrier()
    return target


def _save_full(tmp: Path, s: CheckpointState, info: DistInfo) -> None:
    model_state, optim_state = None, s.optimizer.state_dict()
    if info.enabled:
        model_state = _full_weights(s.policy)
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optim_state = get_optimizer_state_dict(s.policy, s.optimizer, options=options)
    if info.is_main:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        unwrap(s.policy).save_pretrained(tmp, state_dict=model_state)
        s.tokenizer.save_pretrained(tmp)
        state = {
            "step": s.step,
            "data_position": s.position,
            "world_size": info.world_size,
            "optimizer": optim_state,
            "scheduler": s.scheduler.state_dict(),
            "rng": rng_state(),
        }
        if s.extra is not None:
            state["extra"] = s.extra
        torch.save(state, tmp / STATE_FILE)


def _save_sharded(tmp: Path, s: CheckpointState, info: DistInfo, export: bool) -> None:

    if info.is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / RNG_DIR).mkdir(parents=True)
    torch.distributed.barrier()  # the fresh temp folder exists before any rank writes into it
    # The default options give sharded state dicts (DTensors): each rank's dict holds its shards,
    # and DCP's FileSystemWriter writes each rank's into its own __<rank>_0.distcp.
    model_state, optim_state = get_state_dict(s.policy, s.optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=tmp / SHARDED_DIR)
    torch.save(rng_state(), _rng_file(tmp, info.rank))
    weights = _full_weights(s.policy) if export else None
    if info.is_main:
        inner = unwrap(s.policy)
        if weights is not None:
            inner.save_pretrained(tmp, state_dict=weights)
        else:
            inner.config.save_pretrained(tmp)
        s.tokenizer.save_pretrained(tmp)
        state = {
            "step": s.step,
            "data_position": s.position,
            "world_size": info.world_size,
            "layout": _SHARDED,
            "scheduler": s.scheduler.state_dict(),
        }
        if s.extra is not None:
            state["extra"] = s.extra
        torch.save(state, tmp / STATE_FILE)
    torch.distributed.barrier()  # every rank's shards and RNG file are written
    if info.is_main:
        marker = {"layout": _SHARDED, "step": s.step, "world_size": info.world_size}
        (tmp / COMPLETE_FILE).write_text(json.dumps(marker), encoding="utf-8")


def _save_reference(tmp: Path, reference: torch.nn.Module, info: DistInfo) -> None:
    """The reference's weights as a model folder ``tmp/reference`` (rank 0 writes; under FSDP2
    every rank takes part in the gather)."""
    weights = _full_weights(reference) if info.enabled and _is_fsdp2(reference) else None
    if info.is_main:
        unwrap(reference).save_pretrained(tmp / REFERENCE_DIR, state_dict=weights)
    if info.enabled:
        torch.distributed.barrier()


def reference_folder(ckpt: Path | None, saved: dict[str, Any] | None) -> Path | None:
    """The reset reference's model folder in `ckpt` when its trainer state `saved` says the
    reference was reset (``reference_step > 0``), else None (the reference is the base model).

    Raises:
        ValueError: the state names a reset but the checkpoint holds no ``reference/``.
    """
    if ckpt is None or not saved or not saved.get("reference_step"):
        return None
    folder = ckpt / REFERENCE_DIR
    if not folder.is_dir():
        raise ValueError(
            f"--resume: {ckpt} says its reference was reset at step {saved['reference_step']} "
            f"but holds no {REFERENCE_DIR}/ folder"
        )
    return folder


def _load_sharded(
    ckpt: Path, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo
) -> None:
    """Load the model and optimizer shards of this rank from ``ckpt/sharded`` (DCP reads only the
    byte ranges of the local shards; with another world size it reshards)."""
    if not (info.enabled and _is_fsdp2(policy)):
        raise ValueError(
            f"--resume: {ckpt} is a sharded (FSDP2) checkpoint; resume it under torchrun with "
            "parallel = fsdp2 (or turn it into a model folder with "
            "llm.run.checkpoint.export_checkpoint)"
        )

    model_state, optim_state = get_state_dict(policy, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=ckpt / SHARDED_DIR)
    set_state_dict(
        policy, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def export_checkpoint(ckpt: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write the weights of the sharded checkpoint `ckpt` as a Hugging Face model folder `out`
    (`save_pretrained` and the tokenizer), in one process without torchrun: DCP reassembles the
    full tensors from every rank's shards (reading only the model entries, no optimizer state).

    Raises:
        ValueError: `ckpt` is not a sharded checkpoint.
    """

    ckpt, out = Path(ckpt), Path(out)
    if not is_sharded_checkpoint(ckpt):
        raise ValueError(f"{ckpt} is not a sharded checkpoint (no {SHARDED_DIR}/)")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ckpt))
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # load() warns that it loads in one process, as asked
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=ckpt / SHARDED_DIR, no_dist=True)
    model.load_state_dict(state["model"])
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(ckpt).save_pretrained(out)
    return out


def load_optimizer_state(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], info: DistInfo
) -> None:
    """Load the saved (full) optimizer state into `optimizer` (sharded again under FSDP2).

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
    """Load the optimizer, scheduler and RNG states of `ckpt` (the weights of a full checkpoint
    are loaded with the model, see `weights_folder`; those of a sharded one here, each rank its
    shards); returns ``(step, data_position)`` to continue from, ``(0, 0)`` for a fresh run
    (`ckpt` None).

    The optimizer settings of `optimizer` and `scheduler` as made from this run's config (``lr``,
    ``weight_decay``, ``adam_betas``: each param group's, and the scheduler's base lr) are kept
    over the saved ones, so that ``--resume --change-optimizer`` applies what it records; the
    lr continues at the restored step of this config's schedule. Unchanged settings are left
    as loaded (a plain resume repeats an uninterrupted run to the bit).

    Raises:
        ValueError: see `load_optimizer_state`; a sharded checkpoint outside FSDP2.
    """
    if ckpt is None:
        return 0, 0
    wanted = [{k: g[k] for k in _GROUP_SETTINGS} for g in optimizer.param_groups]
    base_lrs = list(scheduler.base_lrs)
    state = torch.load(ckpt / STATE_FILE, weights_only=False)
    if state.get("layout") == _SHARDED:
        _load_sharded(ckpt, policy, optimizer, info)
        saved_world = int(state["world_size"])
        if saved_world != info.world_size:
            warnings.warn(
                f"--resume: {ckpt} was written by {saved_world} processes, this run has "
                f"{info.world_size}: the shards are resharded, but ranks without a saved RNG "
                "state take rank 0's, so the run does not repeat an uninterrupted one exactly",
                stacklevel=2,
            )
        rng_file = _rng_file(ckpt, info.rank if info.rank < saved_world else 0)
        rng = torch.load(rng_file, weights_only=False)
    else:
        load_optimizer_state(policy, optimizer, state, info)
        rng = state["rng"]
    scheduler.load_state_dict(state["scheduler"])
    _apply_settings(optimizer, scheduler, wanted, base_lrs)
    set_rng_state(rng)
    return state["step"], state["data_position"]


_GROUP_SETTINGS = ("betas", "weight_decay")
"""AdamW's param-group settings besides the lr that the config sets (`make_optimizer`)."""


def _apply_settings(
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    wanted: list[dict[str, Any]],
    base_lrs: list[float],
) -> None:
    """Put this run's param-group settings `wanted` and base lrs `base_lrs` back over the ones a
    checkpoint loaded (`restore_checkpoint`); the lr of a changed base is the schedule's at the
    restored step."""
    for group, want in zip(optimizer.param_groups, wanted, strict=True):
        for key, value in want.items():
            if group[key] != value:
                group[key] = value
    if list(scheduler.base_lrs) == base_lrs:
        return
    scheduler.base_lrs = base_lrs
    rates = zip(base_lrs, scheduler.lr_lambdas, strict=True)
    lrs = [base * f(scheduler.last_epoch) for base, f in rates]
    for group, base, lr in zip(optimizer.param_groups, base_lrs, lrs, strict=True):
        group["initial_lr"], group["lr"] = base, lr
    scheduler._last_lr = lrs  # what get_last_lr() reports until the next step


def trainer_extra(ckpt: Path | None) -> dict[str, Any] | None:
    """The trainer's own state that `save_checkpoint` stored with `extra` in `ckpt`, or None (no
    checkpoint, or one saved without it)."""
    if ckpt is None:
        return None
    state = torch.load(ckpt / STATE_FILE, weights_only=False, mmap=True)
    return state.get("extra")


OPTIMIZER_KEYS = tuple(
    f"optim.{k}"
    for k in ("lr", "weight_decay", "adam_betas", "max_grad_norm", "schedule", "warmup_steps")
)
"""Keys that ``--resume --change-optimizer`` may change (`check_resume_config`): AdamW and its
schedule, not the update's structure (``optim.inner_epochs``, ``optim.prompts_per_update``)."""

CONFIG_CHANGES = "config_changes.jsonl"
"""One JSON line per accepted change of a resumed run's config: ``{"time", "changes": {key: [old,
new]}}``."""


CONFIG_MIGRATED = "config_migrated.json"
"""The record of a run folder's saved config upgraded on read (`upgrade_run_config`):
``{"moved": {old key: new key}, "original": the config.toml text before the first upgrade}``."""


def upgrade_run_config(out_dir: Path) -> dict[str, str]:
    """Rewrite the run folder's ``config.toml`` saved under removed spellings
    (`llm.config.OLD_KEYS`, e.g. ``eval.n_samples``) with the keys that replaced them
    (`llm.config.load_saved_config`: the values move as they are, so the run keeps its meaning and
    its resolved config, `config_to_toml`, is the one it was trained under), after recording the
    moves and the original text in `CONFIG_MIGRATED` (merged with an earlier record; nothing is
    lost; both writes atomic). Returns the moves made now, ``{old: new}`` (empty: nothing to
    upgrade, or no ``config.toml``).

    Raises:
        ValueError: the saved config is invalid even after the moves, or sets an old key and its
            replacement both (naming the file).
    """
    path = Path(out_dir) / "config.toml"
    if not path.is_file():
        return {}
    cfg, moved = load_saved_config(path)
    if moved:
        record = read_json(Path(out_dir) / CONFIG_MIGRATED) or {}
        write_json(
            Path(out_dir) / CONFIG_MIGRATED,
            {"moved": {**record.get("moved", {}), **moved},
             "original": record.get("original", path.read_text(encoding="utf-8"))},
        )  # fmt: skip
        save_config(cfg, path)
    return moved


def check_resume_config(
    cfg: TrainConfig, out_dir: Path, *, change_optimizer: bool = False
) -> dict[str, list[Any]]:
    """Check that `cfg` equals the run's saved ``config.toml`` except `steps` (no-op if none) and,
    with `change_optimizer`, the `OPTIMIZER_KEYS`; returns the changed keys ``{key: [old, new]}``,
    a table's keys dotted (``optim.lr``; the caller records them in `CONFIG_CHANGES` and saves the
    new config). A config saved under removed spellings (`llm.config.OLD_KEYS`) is upgraded
    first (`upgrade_run_config`, recorded in `CONFIG_MIGRATED`).

    Raises:
        ValueError: a key differs that may not (the message names the keys and values).
    """
    saved_path = out_dir / "config.toml"
    if not saved_path.exists():
        return {}
    upgrade_run_config(out_dir)
    saved = load_config(saved_path, steps=cfg.steps)
    # Compared as written (config_to_toml resolves the method's hyper-parameter defaults).
    old, new = (_dotted(tomllib.loads(config_to_toml(c))) for c in (saved, cfg))
    changed = {
        k: [old.get(k), new.get(k)] for k in old.keys() | new.keys() if old.get(k) != new.get(k)
    }
    allowed = OPTIMIZER_KEYS if change_optimizer else ()
    refused = {k: v for k, v in changed.items() if k not in allowed}
    if refused:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(refused.items())[:5])
        hint = (
            " (only steps may change; --change-optimizer also lets "
            + ", ".join(OPTIMIZER_KEYS)
            + " change)"
            if not change_optimizer
            else f" (--change-optimizer allows {', '.join(OPTIMIZER_KEYS)} only)"
        )
        raise ValueError(f"--resume: the config differs from {saved_path}{hint}: {listed}")
    return changed


def _dotted(doc: dict[str, Any]) -> dict[str, Any]:
    """A parsed config with each table's keys as ``TABLE.NAME`` (``[hyper]`` stays one value)."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict) and k != "hyper":
            out.update({f"{k}.{name}": x for name, x in v.items()})
        else:
            out[k] = v
    return out


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
