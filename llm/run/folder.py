"""Never lose a user's data: what a run may do to its folder and to a model folder.

- `claim_run_folder`: a new run never mixes with an earlier run in the same folder (refused, or the
  old run moved aside on request); `--resume` needs the folder's ``config.toml``.
- `RunLock`: one live process per run folder (a lock file holding the owner's PID; a lock left by a
  dead process is taken over atomically).
- `check_base_model_folder`: the tiny base model is built only into a missing or empty folder, or
  into one that carries its own build marker, so a user's model folder is never replaced.
- `loadable_checkpoints` / `newest_loadable`: resume falls back from a corrupt newest checkpoint to
  the newest one that loads, and says which it skipped and why.
- `read_metrics`: ``metrics.jsonl`` with a torn last line (a kill mid-write) dropped, with a warning.
- `check_finite`: a non-finite loss or gradient norm stops the run before the optimizer step.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

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

LOCK_FILE = ".run.lock"
# What a run writes into its folder: any of these means the folder already holds a run.
RUN_ARTIFACTS = ("config.toml", "metrics.jsonl", "checkpoints", "tb")
# A corrupt lock file (e.g. a kill between create and write) younger than this may still be
# being written by its owner; older ones are stale.
_CORRUPT_LOCK_GRACE_S = 30.0

T = TypeVar("T")


class RunFolderError(RuntimeError):
    """A run folder or model folder that this run must not write into (as it is)."""


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """An exclusive lock on a run folder: ``with RunLock(out): ...``.

    The lock is the file ``out/.run.lock``, created with ``O_CREAT | O_EXCL`` and holding
    ``{"pid", "host", "started"}``. A lock whose owner is dead (same host, PID gone), or a corrupt
    one older than 30 s, is stale: it is renamed away (an atomic step only one contender wins) and
    the lock is taken. The file is removed on exit, and so is the folder when the lock created
    it and nothing else was written there (a refused command leaves nothing). A sweep or study
    takes its output folder's lock (`llm.orchestrate.sweep.run_sweep`), so that two never share one.

    Raises:
        RunFolderError: another live process holds the lock (its PID is named).
    """

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.path = Path(out) / LOCK_FILE
        self.held = False
        self.created = False

    def _owner(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None
        except (OSError, ValueError):
            return None

    def _stale(self, owner: dict[str, Any] | None) -> bool:
        if owner is None:
            try:
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:
                return True
            return age > _CORRUPT_LOCK_GRACE_S
        if owner.get("host") != socket.gethostname():
            return False  # cannot tell whether a process on another machine is alive
        return not _pid_alive(owner["pid"])

    def acquire(self) -> None:
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.created = True
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if not self._stale(owner):
                    who = f"PID {owner['pid']} on {owner['host']}" if owner else "another process"
                    raise RunFolderError(
                        f"{str(self.path.parent)!r} is in use by {who} (lock file {self.path}); "
                        "wait for it to finish, or remove the lock file if that process is gone"
                    ) from None
                try:
                    os.replace(self.path, self.path.with_name(f"{LOCK_FILE}.stale-{os.getpid()}"))
                except FileNotFoundError:
                    pass  # another contender moved it first; try again
                else:
                    stale_pid = owner["pid"] if owner else "unknown"
                    warnings.warn(
                        f"took over the stale lock of PID {stale_pid} in {self.path.parent}",
                        stacklevel=2,
                    )
                    self.path.with_name(f"{LOCK_FILE}.stale-{os.getpid()}").unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f)
            self.held = True
            return
        raise RunFolderError(f"could not take the lock {self.path} (contended)")

    def release(self) -> None:
        if self.held:
            owner = self._owner()
            if owner is not None and owner.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False
            if self.created:
                with contextlib.suppress(OSError):
                    self.path.parent.rmdir()  # only when empty

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


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
