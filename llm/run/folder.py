"""Never lose a user's data: what a run may do to its folder and to a model folder.

- `claim_run_folder`: a new run never mixes with an earlier run in the same folder (refused, or the
  old run moved aside on request); `--resume` needs the folder's ``config.toml``.
- `RunLock`: one live process per run folder (`experiment.lock`, the one lock of both legs: a lock
  file holding the owner's PID; a lock left by a dead process is taken over atomically).
- `check_base_model_folder`: the tiny base model is built only into a missing or empty folder, or
  into one that carries its own build marker, so a user's model folder is never replaced.
- `loadable_checkpoints` / `newest_loadable`: resume falls back from a corrupt newest checkpoint to
  the newest one that loads, and says which it skipped and why.
- `read_metrics`: ``metrics.jsonl`` with a torn last line (a kill mid-write) dropped, with a warning.
- `check_finite`: a non-finite loss or gradient norm stops the run before the optimizer step.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from experiment.lock import LOCK_FILE, RunFolderError, RunLock

__all__ = [
    "LOCK_FILE",
    "RUN_ARTIFACTS",
    "NonFiniteError",
    "RunFolderError",
    "RunLock",
    "check_base_model_folder",
    "check_finite",
    "claim_run_folder",
    "loadable_checkpoints",
    "newest_loadable",
    "read_metrics",
    "restore_files",
    "snapshot_files",
]

# What a run writes into its folder: any of these means the folder already holds a run.
RUN_ARTIFACTS = ("config.toml", "metrics.jsonl", "checkpoints", "tb")

T = TypeVar("T")


class NonFiniteError(FloatingPointError):
    """A training quantity became NaN or infinite; the run stopped before using it."""


NON_FINITE_ADVICE = (
    "the newest checkpoint is the last good state; continue it with a lower lr or max_grad_norm: "
    "python -m llm train ... --resume --change-optimizer --set optim.lr=..."
)
"""The end of every `NonFiniteError` message."""


# ---------------------------------------------------------------------------------------------
# Run folder


def _run_artifacts(out: Path) -> list[str]:
    return [name for name in RUN_ARTIFACTS if (out / name).exists()]


def claim_run_folder(
    out: str | os.PathLike[str], *, resume: bool, move_aside: bool = False
) -> Path | None:
    """Check that a run may write into `out`; returns where an old run was moved, if it was.

    A fresh run (``resume=False``) into a folder that already holds a run (any of
    `RUN_ARTIFACTS`) is refused, unless `move_aside`, which renames the folder to
    ``<out>.old-<YYYYmmdd-HHMMSS>`` first (never deletes it). ``resume=True`` on a folder with
    checkpoints but no ``config.toml`` is refused (the config it was trained with is unknown).

    Raises:
        RunFolderError: `out` is a file, holds a run and neither `resume` nor `move_aside` is
            set, or is resumed without its ``config.toml``.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"--out {str(out)!r} is a file, not a folder")
    found = _run_artifacts(out) if out.is_dir() else []
    if resume:
        if (out / "checkpoints").exists() and not (out / "config.toml").is_file():
            raise RunFolderError(
                f"--resume: {str(out)!r} has checkpoints but no config.toml, so the config it "
                "was trained with is unknown; restore config.toml or start a new run elsewhere"
            )
        return None
    if not found:
        return None
    if not move_aside:
        raise RunFolderError(
            f"--out {str(out)!r} already holds a run ({', '.join(found)}); pass --resume to "
            "continue it, --move-aside to move it aside and start afresh, or choose another --out"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = out.with_name(f"{out.name}.old-{stamp}")
    n = 1
    while target.exists():
        target = out.with_name(f"{out.name}.old-{stamp}-{n}")
        n += 1
    os.replace(out, target)
    warnings.warn(f"moved the earlier run in {out} to {target}", stacklevel=2)
    return target


def snapshot_files(out: str | os.PathLike[str], names: Iterable[str]) -> dict[str, bytes | None]:
    """The bytes of each file `names` of `out` (None: missing), for `restore_files` to put back
    after a refused command (a resume whose start fails writes nothing)."""
    out = Path(out)
    return {name: (out / name).read_bytes() if (out / name).is_file() else None for name in names}


def restore_files(out: str | os.PathLike[str], snapshot: dict[str, bytes | None]) -> None:
    """Put the files of `snapshot` (`snapshot_files`) back as they were: rewritten, or removed
    when they did not exist."""
    out = Path(out)
    for name, data in snapshot.items():
        path = out / name
        if data is None:
            path.unlink(missing_ok=True)
        elif not path.is_file() or path.read_bytes() != data:
            tmp = path.with_name(f"{name}.restore-{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Model folder


def check_base_model_folder(path: str | os.PathLike[str], marker: str) -> None:
    """Refuse to build the tiny base model into a folder that is not its own.

    Allowed: a missing folder, an empty one, or one that holds `marker` (the build record that
    `llm.model.tiny.ensure_base_model` writes). Anything else is a user's folder and is left alone.

    Raises:
        RunFolderError: `path` is a file, or a non-empty folder without `marker`.
    """
    path = Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise RunFolderError(f"model_path {str(path)!r} is a file, not a model folder")
    if (path / marker).is_file() or not any(path.iterdir()):
        return
    raise RunFolderError(
        f"model_path {str(path)!r} is a non-empty folder that was not built by this package (no "
        f"{marker}); build_base_model = true would replace it, so nothing was written. Point "
        "model_path at an empty or new folder, or set build_base_model = false to train it"
    )


# ---------------------------------------------------------------------------------------------
# Checkpoints and metrics


def loadable_checkpoints(
    out: str | os.PathLike[str], complete: Callable[[Path], bool]
) -> list[Path]:
    """Complete checkpoints ``out/checkpoints/step_*`` (per `complete`), newest first; each
    incomplete one (e.g. its trainer_state.pt deleted) is named in a warning."""
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return []
    found = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True)
    for p in found:
        if not complete(p):
            warnings.warn(
                f"--resume: skipped checkpoint {p} (incomplete: its trainer state or COMPLETE "
                "marker is missing)",
                stacklevel=2,
            )
    return [p for p in found if complete(p)]


def newest_loadable(candidates: list[Path], load: Callable[[Path], T]) -> tuple[Path, T] | None:
    """The newest of `candidates` (newest first) that `load` reads without an exception.

    Each skipped checkpoint is reported with a warning that names it and the error. Returns None
    when `candidates` is empty.

    Raises:
        RunFolderError: every candidate failed to load (each is named with its error).
    """
    failures: list[str] = []
    for ckpt in candidates:
        try:
            value = load(ckpt)
        except Exception as e:  # any corruption: truncated pickle, bad safetensors, missing keys
            failures.append(f"{ckpt.name}: {type(e).__name__}: {e}")
            warnings.warn(
                f"--resume: skipped checkpoint {ckpt} ({type(e).__name__}: {e})", stacklevel=2
            )
            continue
        return ckpt, value
    if failures:
        raise RunFolderError("--resume: no checkpoint loads: " + "; ".join(failures))
    return None


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``; a torn last line (a kill mid-write) is dropped with a
    warning.

    Raises:
        ValueError: a line other than the last is not a JSON object (named by line number).
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError("not a step record")
        except ValueError as e:
            if i == len(lines):
                warnings.warn(f"{path}: dropped a torn last line {i} ({e})", stacklevel=2)
                break
            raise ValueError(f"{path}, line {i}: not a metrics record ({e})") from None
        records.append(record)
    return records


def _items(values: dict[str, float]) -> Iterator[tuple[str, float]]:
    for name, value in values.items():
        yield name, float(value)


def check_finite(step: int, **values: float) -> None:
    """Stop on a non-finite training quantity (call before the optimizer step).

    Raises:
        NonFiniteError: naming the step, the quantity and its value.
    """
    for name, value in _items(values):
        if not math.isfinite(value):
            raise NonFiniteError(
                f"step {step}: {name} is {value}; training stopped before the optimizer step, so "
                + NON_FINITE_ADVICE
            )
