"""The results store: atomic writes (a temporary sibling renamed over the target, so a reader or a
crash never sees half a file), JSON and npz io.

One definition of "write a temp file, then rename" for the package (toymdp figures and caches, LLM
sweeps, run configs, evaluation files, generated data files). `os.replace` is atomic on POSIX when
source and target are on one file system, which a sibling path guarantees.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "read_json",
    "read_toml",
    "save_npz",
    "write_bytes",
    "write_json",
    "write_lines",
    "write_text",
]

PathLike = str | os.PathLike[str]


def _tmp(path: Path, suffix: str = ".tmp") -> Path:
    return path.with_name(path.name + suffix)


def write_text(path: PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically; returns the path.

    Raises:
        OSError: the parent folder is missing or not writable (the target is left as it was).
    """
    path = Path(path)
    tmp = _tmp(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_bytes(path: PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically, creating its parent folders; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def write_lines(path: PathLike, lines: Iterable[str]) -> Path:
    """Write each string of `lines` followed by a newline to `path` atomically (streamed, so a long
    JSONL file is never held in memory whole); returns the path."""
    path = Path(path)
    tmp = _tmp(path)
    with tmp.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, path)
    return path


def write_json(path: PathLike, data: Any, *, indent: int | None = 2, **dump_kwargs: Any) -> Path:
    """Write `data` as JSON (``indent`` 2, a final newline) to `path` atomically; returns the path.
    `dump_kwargs` go to `json.dumps` (e.g. ``sort_keys=True``)."""
    return write_text(path, json.dumps(data, indent=indent, **dump_kwargs) + "\n")


def read_toml(path: PathLike) -> dict[str, Any]:
    """The parsed TOML file.

    Raises:
        ValueError: invalid TOML (the message names the file).
        OSError: the file cannot be read.
    """
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None


def read_json(path: PathLike) -> Any:
    """The parsed JSON file, or None when it is missing or unreadable (a half-written marker of a
    killed process counts as missing)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def save_npz(path: PathLike, arrays: Mapping[str, np.ndarray]) -> Path:
    """`np.savez(path, **arrays)` atomically (uncompressed); returns the path."""
    path = Path(path)
    tmp = _tmp(path, ".tmp.npz")  # np.savez appends .npz to a name without it
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return path
