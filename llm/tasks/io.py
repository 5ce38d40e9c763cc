"""Reading task data files so that every bad input is a `ValueError` naming the file and line.

The standard library's own failures name nothing: a text-mode read of invalid UTF-8 raises
`UnicodeDecodeError` with a byte offset, `json.loads` raises a bare `ValueError` for an integer
of more than `sys.get_int_max_str_digits()` digits (4,300 by default) and `RecursionError` for
deeply nested brackets, and pyarrow raises `ArrowInvalid` for a corrupt Parquet file.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["csv_rows", "decode_utf8", "jsonl_rows", "parquet_failure", "parse_json"]


def decode_utf8(data: bytes, where: str) -> str:
    """`data` as UTF-8 text.

    Raises:
        ValueError: invalid UTF-8; the message starts with `where` and gives the byte offset.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{where}: invalid UTF-8 (byte {e.start}: {data[e.start : e.start + 4]!r}); "
            "data files must be UTF-8"
        ) from None


def parse_json(text: str, where: str) -> Any:
    """`json.loads(text)` with every failure a `ValueError` that starts with `where`.

    Raises:
        ValueError: invalid JSON (with its line when `text` has several), an integer longer than
            Python's int-to-string limit, or nesting too deep to parse.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        line = f" (line {e.lineno})" if "\n" in text.strip() else ""
        raise ValueError(f"{where}: invalid JSON: {e.msg}{line}") from None
    except RecursionError:
        raise ValueError(f"{where}: invalid JSON: brackets nested too deeply to parse") from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise ValueError(f"{where}: invalid JSON: {e}") from None


def jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for each non-blank line of a JSON Lines file; `where` is
    ``"{path}: line {n}"`` (1-based).

    Raises:
        ValueError: a line that is not UTF-8 or not JSON (`parse_json`'s cases), naming the line.
        FileNotFoundError: no such file.
    """
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}: line {lineno}"
            line = decode_utf8(raw, where)
            if not line.strip():
                continue
            yield where, parse_json(line, where)


def csv_rows(path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """``(where, row)`` for each data row of a CSV file with a header line (the standard
    library's dialect: commas, double quotes); `where` is ``"{path}: line {n}"``, the 1-based
    line the row starts on. Cells are strings; blank rows are skipped.

    Raises:
        ValueError: not UTF-8 (a byte-order mark is allowed), no header, a header with an empty
            or repeated column name, a row with more or fewer cells than the header, or a
            malformed quote, naming the file and line.
        FileNotFoundError: no such file.
    """
    text = decode_utf8(path.read_bytes(), str(path)).removeprefix("\ufeff")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty CSV file; expected a header line")
        names = [h.strip() for h in header]
        if any(not n for n in names) or len(set(names)) != len(names):
            raise ValueError(f"{path}: line 1: header {header!r} has an empty or repeated column")
        start = reader.line_num + 1
        for cells in reader:
            where = f"{path}: line {start}"
            start = reader.line_num + 1
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(names):
                raise ValueError(
                    f"{where}: {len(cells)} cells, expected {len(names)} (columns {names})"
                )
            yield where, dict(zip(names, cells, strict=True))
    except csv.Error as e:
        raise ValueError(f"{path}: line {reader.line_num}: malformed CSV: {e}") from None


def parquet_failure(path: Path, error: Exception, rows_read: int | None = None) -> ValueError:
    """The `ValueError` to raise when pyarrow cannot read `path` (corrupt or not Parquet)."""
    after = "" if not rows_read else f" after row {rows_read - 1}"
    return ValueError(f"{path}: not a readable Parquet file{after}: {error}")
