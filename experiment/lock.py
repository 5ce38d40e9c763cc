"""One live writer per output folder: `RunLock`, the lock every command that writes a folder takes
(an LLM run, sweep or study; a toy sweep or study), so that two never mix their files in one.

The lock is a file holding the owner's PID and host; a lock left by a dead process is taken over
atomically. Both legs import it from here (`toymdp` may not import `llm`: docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any

__all__ = ["LOCK_FILE", "RunFolderError", "RunLock", "check_folder"]

LOCK_FILE = ".run.lock"
# A corrupt lock file (e.g. a kill between create and write) younger than this may still be
# being written by its owner; older ones are stale.
_CORRUPT_LOCK_GRACE_S = 30.0


class RunFolderError(RuntimeError):
    """A run, sweep or study folder (or a model folder) that this command must not write into (as
    it is)."""


def check_folder(out: str | os.PathLike[str]) -> Path:
    """`out`, an output folder to write (it may not exist yet), as a `Path`.

    Raises:
        RunFolderError: `out` is a file.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"{str(out)!r} is a file, not a folder: an output folder is written "
                             "there; name another")  # fmt: skip
    return out


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
    it and nothing else was written there (a refused command leaves nothing). Every command that
    writes an output folder takes its lock: an LLM run (`llm.train.trainer`), sweep or study
    (`llm.orchestrate.sweep.run_sweep`, `llm.orchestrate.study.run_study`) and a toy sweep or
    study (`toymdp.sweep.sweep_config`, `toymdp.study.run_study`), so that two never share one.

    Raises:
        RunFolderError: another live process holds the lock (its PID is named), or the folder's
            path is a file.
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
        check_folder(self.path.parent)
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
