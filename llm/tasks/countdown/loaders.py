"""Countdown problem files: `.jsonl`, Countdown-Tasks-3to4 `.parquet` and `.csv` in, `.jsonl` out."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from llm.tasks.countdown.problem import CountdownProblem, problem_from_row
from llm.tasks.io import csv_rows, jsonl_rows, parquet_failure, parse_json


def load_problems(path: str | os.PathLike[str]) -> list[CountdownProblem]:
    """Read problems from a local `.jsonl`, `.parquet` (Countdown-Tasks-3to4 format) or `.csv` file.

    Every format has the fields `target` (an integer) and `nums` (a non-empty list of
    non-negative integers); other fields are ignored. JSON Lines and CSV need nothing beyond the
    standard library (blank lines are skipped); a CSV file has a header line and writes `nums` as
    a JSON list (``"[3, 5, 7]"``) or as integers separated by spaces. Parquet is read through
    `datasets` (the `llm` extra), imported only here.

    Raises:
        ValueError: unknown suffix; a line that is not UTF-8 or not JSON (including integers of
            more than 4,300 digits and brackets nested too deeply to parse) or a bad row (the
            message names the file, the line or row and the field); a corrupt Parquet file (the
            message names it); `datasets` missing for a Parquet file.
        FileNotFoundError: no such file.
    """
    path = Path(path)
    if path.suffix == ".jsonl":
        return _load_jsonl(path)
    if path.suffix == ".parquet":
        return _load_parquet(path)
    if path.suffix == ".csv":
        return [problem_from_row(_csv_cells(row, where), where) for where, row in csv_rows(path)]
    raise ValueError(f"{path}: expected a .jsonl, .parquet or .csv file")


def _csv_cells(row: dict[str, str], where: str) -> dict[str, object]:
    """A CSV row's `target` and `nums` cells as JSON values (`problem_from_row` checks them)."""
    out: dict[str, object] = dict(row)
    if "target" in row:
        text = row["target"].strip()
        out["target"] = int(text) if text.lstrip("-").isdigit() else text
    if "nums" in row:
        text = row["nums"].strip()
        if text.startswith("["):
            out["nums"] = parse_json(text, f"{where}: field 'nums'")
        else:
            out["nums"] = [int(x) if x.isdigit() else x for x in text.replace(",", " ").split()]
    return out


def _load_jsonl(path: Path) -> list[CountdownProblem]:
    return [problem_from_row(row, where) for where, row in jsonl_rows(path)]


def _load_parquet(path: Path) -> list[CountdownProblem]:
    if not path.is_file():
        raise FileNotFoundError(path)
    try:
        import datasets  # the `llm` extra; it brings pyarrow
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"{path}: reading Parquet needs the 'datasets' package (the llm extra: pip install 'datasets>=3.0'); "
            "or convert the file to JSON Lines"
        ) from None
    # Wrap the Arrow table rather than call `Dataset.from_parquet`, which prepares an Arrow cache
    # under ~/.cache/huggingface even with keep_in_memory=True.
    try:
        table = datasets.Dataset(pq.read_table(path))
    except (pa.ArrowException, OSError) as e:
        raise parquet_failure(path, e) from None
    return [problem_from_row(row, f"{path}: row {i}") for i, row in enumerate(table)]


def write_problems_jsonl(
    problems: Iterable[CountdownProblem], path: str | os.PathLike[str]
) -> None:
    """Write one `{"target": ..., "nums": [...]}` object per line (readable by `load_problems`)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(p.to_row()) + "\n")
    # Atomic replace: a crash never leaves a half-written data file behind.
    tmp.replace(path)


# --------------------------------------------------------------------------------------------------
# Prompt templates
