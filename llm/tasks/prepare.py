"""A run's data file from local downloads: `python -m llm prepare-data` (docs/llm.md, "Preparing
data files").

Files the user downloaded (JSON Lines, JSON, Parquet or CSV, in any layout the task's loader reads:
`llm.tasks.countdown.loaders.load_problems`, `llm.tasks.math.loaders.load_math_problems`) go in;
one file in the loader's own layout comes out (`.jsonl` or `.parquet`, by the suffix of the output
path), readable as ``[data] path`` or an entry of ``[eval] paths``. In between, in this order: the
inputs concatenated, the filters (math: `levels`, `drop_cjk`), `dedupe` (first occurrence kept),
then the slice of `skip` and `rows` (TinyZero's Countdown split: the first 327,680 rows, then
the next 1,024).

Output layouts: Countdown ``{"target": int, "nums": [int, ...]}`` per row; math the six string
fields of `MathProblem.to_row` (problem, answer, id, source, level, subject).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from llm.tasks.registry import TASKS, Problem

PREPARE_TASKS = ("countdown", "math")
OUTPUT_SUFFIXES = (".jsonl", ".parquet")

# Kana, CJK ideographs (extension A, unified, compatibility) and Hangul: a problem statement
# holding one of them is not English (DAPO-Math-17k mixes Chinese problems into its English ones).
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


def prepare_problems(
    task: str,
    inputs: Sequence[str | os.PathLike[str]],
    *,
    skip: int = 0,
    rows: int | None = None,
    dedupe: bool = False,
    drop_cjk: bool = False,
    levels: Iterable[int] = (),
) -> list[Problem]:
    """The problems of `inputs`, read by the task's loader, filtered, de-duplicated and sliced.

    Args:
        task: "countdown" or "math".
        inputs: local files, read in order by ``TASKS[task].load``.
        skip: problems dropped from the front after filtering and de-duplication.
        rows: problems kept after `skip` (None: all).
        dedupe: keep the first of problems with the same statement (math: the problem text;
            Countdown: the numbers and target).
        drop_cjk: math only: drop problems whose statement holds a CJK or kana character.
        levels: math only: keep problems of these MATH levels (1-5; empty: all levels).

    Returns:
        The problems, in input order.

    Raises:
        ValueError: an unknown task, a math-only filter with Countdown, `skip` < 0, `rows` < 1,
            a level outside 1-5, no inputs, or no problem left (naming the filters); the
            loaders' errors (file, line or row, field).
        FileNotFoundError: an input does not exist.
    """
    if task not in PREPARE_TASKS:
        raise ValueError(f"task: expected one of {PREPARE_TASKS}, got {task!r}")
    if not inputs:
        raise ValueError("inputs: expected at least one file")
    if skip < 0:
        raise ValueError(f"skip: expected >= 0, got {skip}")
    if rows is not None and rows < 1:
        raise ValueError(f"rows: expected >= 1 (or None for all), got {rows}")
    levels = sorted(set(levels))
    if task == "countdown" and (drop_cjk or levels):
        raise ValueError("drop_cjk and levels: math only; Countdown problems have neither")
    if any(not 1 <= lv <= 5 for lv in levels):
        raise ValueError(f"levels: expected MATH levels in 1..5, got {levels}")
    problems: list[Problem] = []
    for path in inputs:
        problems.extend(TASKS[task].load(path))
    if levels:
        wanted = {str(lv) for lv in levels}
        problems = [p for p in problems if p.level in wanted]
    if drop_cjk:
        problems = [p for p in problems if not _CJK.search(p.problem)]
    if dedupe:
        seen: set[object] = set()
        unique = []
        for p in problems:
            key = p.problem if task == "math" else (p.nums, p.target)
            if key not in seen:
                seen.add(key)
                unique.append(p)
        problems = unique
    problems = problems[skip:] if rows is None else problems[skip : skip + rows]
    if not problems:
        raise ValueError(
            f"no problems left from {[str(p) for p in inputs]} after levels={levels}, "
            f"drop_cjk={drop_cjk}, dedupe={dedupe}, skip={skip}, rows={rows}"
        )
    return problems


def check_output(
    path: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = ()
) -> Path:
    """`path` as the output of `write_problems`, checked before anything is read or written.

    Raises:
        ValueError: `path`'s suffix is neither `.jsonl` nor `.parquet`, or `path` is one of
            `inputs` (an input is never overwritten).
    """
    path = Path(path)
    if path.suffix not in OUTPUT_SUFFIXES:
        raise ValueError(
            f"out: expected a path ending in {' or '.join(OUTPUT_SUFFIXES)}, got {path}"
        )
    if any(path.resolve() == Path(p).resolve() for p in inputs):
        raise ValueError(f"out: {path} is one of the inputs; write the prepared file elsewhere")
    return path


def write_problems(
    problems: Sequence[Problem],
    path: str | os.PathLike[str],
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """Write `problems` (one task's) as `.jsonl` or `.parquet` in the loader's layout
    (`to_row`), atomically: a temporary file beside `path`, renamed once complete.

    Raises:
        ValueError: as `check_output` (with `inputs`, the files the problems were read from),
            or `problems` is empty.
    """
    path = check_output(path, inputs)
    if not problems:
        raise ValueError(f"{path}: no problems to write")
    rows = [p.to_row() for p in problems]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".jsonl":
        with tmp.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)
    return path
