"""The results store: atomic writes (a temporary sibling renamed over the target, so a reader or a
crash never sees half a file), JSON and npz io.

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
import re
import secrets
import threading
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "config_error",
    "read_json",
    "read_toml",
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


def read_toml(path: PathLike) -> dict[str, Any]:
    """The parsed TOML file.

    Raises:
        ValueError: invalid TOML, or a file that is not UTF-8 text (the message names the file
            and the line).
        OSError: the file cannot be read.
    """
    data = Path(path).read_bytes()
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(
            f"{path}, line {line}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); "
            "a TOML file is UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None


_KEY = re.compile(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*")


def _key_line(text: str, key: str) -> int | None:
    """The line (1-based) of the TOML file `text` that sets the dotted `key` (``steps``,
    ``optim.lr``; a table's own line or ``table.name = ...``), or None."""
    *tables, name = key.split(".")
    table, want = "", ".".join(tables)
    for i, line in enumerate(text.splitlines(), 1):
        head = line.split("#", 1)[0].strip()
        if head.startswith("["):
            table = head.strip("[] ")
            continue
        lhs = head.split("=", 1)[0].strip() if "=" in head else ""
        full = f"{table}.{lhs}" if table else lhs
        if lhs and (full == key or (table == want and lhs == name)):
            return i
    return None


def config_error(path: PathLike, err: Exception, given: Iterable[str] = ()) -> ValueError:
    """`err`, a value error of the config file `path` whose message starts with the key
    (``optim.lr: expected ...``), as a ValueError naming the file and, when the file sets that
    key, its line: ``PATH, line N: optim.lr: expected ...``. A key in `given` (set by ``--set``,
    not by the file) gets no line."""
    text = str(err)
    where = str(path)
    m = _KEY.match(text)
    if m is not None and m.group(0) not in set(given):
        try:
            line = _key_line(Path(path).read_text(encoding="utf-8"), m.group(0))
        except (OSError, ValueError):
            line = None
        if line is not None:
            where += f", line {line}"
    return ValueError(f"{where}: {text}")


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
