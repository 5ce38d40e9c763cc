"""The results store: atomic writes (a temporary sibling renamed over the target, so a reader or a
crash never sees half a file), JSON and npz io (reading a TOML config is `experiment.schema.read_toml`).

One definition of "write a temp file, then rename" for the package (toymdp figures and caches, LLM
sweeps, run configs, evaluation files, generated data files). `os.replace` is atomic on POSIX when
source and target are on one file system, which a sibling path guarantees. The temporary file's
name is unique to the writer (process, thread and a random suffix: two processes writing one
target never share it) and a failed write removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "read_json",
    "save_npz",
    "write_bytes",
    "write_json",
    "write_lines",
    "write_text",
]

PathLike = str | os.PathLike[str]


@contextlib.contextmanager
def _atomic(path: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary sibling of `path` to write (hidden, unique to this process and thread, ending
    in `suffix`), renamed over `path` when the block ends, removed when it raises."""
    tmp = path.with_name(
        f".{path.name}.{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}{suffix}"
    )
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically; returns the path.

    Raises:
        OSError: the parent folder is missing or not writable (the target is left as it was).
    """
    path = Path(path)
    with _atomic(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def write_bytes(path: PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically, creating its parent folders; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _atomic(path) as tmp:
        tmp.write_bytes(data)
    return path


def write_lines(path: PathLike, lines: Iterable[str]) -> Path:
    """Write each string of `lines` followed by a newline to `path` atomically (streamed, so a long
    JSONL file is never held in memory whole); returns the path."""
    path = Path(path)
    with _atomic(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
    return path


def write_json(path: PathLike, data: Any, *, indent: int | None = 2, **dump_kwargs: Any) -> Path:
    """Write `data` as JSON (``indent`` 2, a final newline) to `path` atomically; returns the path.
    `dump_kwargs` go to `json.dumps` (e.g. ``sort_keys=True``)."""
    return write_text(path, json.dumps(data, indent=indent, **dump_kwargs) + "\n")


def read_json(path: PathLike) -> Any:
    """The parsed JSON file, or None when it is missing or unreadable (a half-written marker of a
    killed process counts as missing)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def save_npz(path: PathLike, arrays: Mapping[str, np.ndarray], *, compressed: bool = False) -> Path:
    """`np.savez(path, **arrays)` (`np.savez_compressed` with `compressed`) atomically; returns
    the path."""
    path = Path(path)
    with _atomic(path, ".tmp.npz") as tmp:  # np.savez appends .npz to a name without it
        (np.savez_compressed if compressed else np.savez)(tmp, **arrays)
    return path
