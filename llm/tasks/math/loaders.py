"""Math problem files: MATH / MATH500, AIME, AMC, DAPO-Math-17k and GSM8K-style `.jsonl`, `.json`,
`.parquet` and `.csv` files in (`MATH_LAYOUTS`), `.jsonl` out. `pyarrow` only inside the Parquet reader."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from llm.tasks.io import csv_rows, decode_utf8, jsonl_rows, parquet_failure
from llm.tasks.math.grading import extract_boxed
from llm.tasks.math.problem import MathProblem

# --------------------------------------------------------------------------------------------------
# Loading and writing

# DAPO-Math-17k wraps every problem in an instruction (user turn of its `prompt` column): a first
# paragraph starting with this sentence, the problem, and this closing reminder.
_DAPO_PREFIX = "Solve the following math problem step by step."
_DAPO_REMINDER = '\n\nRemember to put your answer on its own line after "Answer:".'

MATH_LAYOUTS = {
    "math": "MATH / MATH500 / AIME / AMC: problem, answer (or a solution with \\boxed{})",
    "dapo": "DAPO-Math-17k: prompt (chat messages or text), reward_model.ground_truth",
    "gsm8k": "GSM8K: question, answer ending in '#### <answer>'",
}


def load_math_problems(
    path: str | os.PathLike[str], *, limit: int | None = None, source: str | None = None
) -> list[MathProblem]:
    """Read problems from a local `.jsonl`, `.json`, `.parquet` or `.csv` file, detecting the layout.

    Layouts (column names are matched case-insensitively; extra columns are ignored):
    - MATH / MATH500 (HuggingFaceH4/MATH-500: problem, solution, answer, subject, level,
      unique_id), AIME (problem/Problem, answer/Answer, id/ID) and AMC (AI-MO/aimo-validation-amc:
      problem, answer, id): `problem` plus `answer`, or, if `answer` is absent or null, the last
      `\\boxed{}` of `solution` (Hendrycks MATH). Numeric answers become strings, integral floats
      without ".0" (27.0 -> "27"). `level` "Level 5" or 5 -> "5"; `subject` falls back to `type`;
      `id` is `unique_id` or `id`. This is also the layout `write_math_jsonl` writes.
    - DAPO-Math-17k (BytedTsinghua-SIA/DAPO-Math-17k, and open-r1/DAPO-Math-17k-Processed):
      `prompt` (chat messages, or plain text) and `reward_model` {"ground_truth": ...}; `id` from
      `extra_info` {"index": ...}. DAPO's wrapper ("Solve the following math problem step by
      step. The last line ... \\n\\n{problem}\\n\\nRemember to put your answer on its own line after
      \"Answer:\".") is removed when both its first sentence and its closing reminder are found
      exactly; otherwise the user turn is kept whole. The original release repeats each problem
      many times; rows are kept as they are (no de-duplication).
    - GSM8K (question, answer): the answer is the text after the last "####".

    A problem's `source` is the `source` argument if given, else the row's `data_source` or
    `source` field, else the file name without its suffix. `id` defaults to the 0-based row index. `limit` keeps the first
    `limit` problems (Parquet is then read only that far). JSON and JSON Lines are read with the
    standard library and Parquet with pyarrow: neither goes through `datasets.load_dataset`, which
    writes an Arrow cache under ~/.cache/huggingface for every file and needs HF_DATASETS_OFFLINE
    to stay off the network. A `.json` file may hold a list of rows, a dict of equal-length column
    lists, or JSON Lines. A `.csv` file has a header line and string cells (the MATH and GSM8K
    layouts; DAPO's nested fields do not fit a CSV cell).

    Raises:
        FileNotFoundError: no such file.
        ValueError: unknown suffix; invalid UTF-8 or JSON (including integers of more than 4,300
            digits and brackets nested too deeply to parse) or a corrupt Parquet file (the
            message names the file, and the line where there is one); unknown layout (the message lists the columns
            found and the layouts known); a row with a missing or bad field (the message names the
            file, the line (JSON Lines) or 0-based row, and the field); `limit` negative; pyarrow
            missing for a Parquet file.
    """
    path = Path(path)
    if limit is not None and limit < 0:
        raise ValueError(f"limit: expected None or >= 0, got {limit}")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = jsonl_rows(path)
    elif suffix == ".json":
        rows = _json_rows(path)
    elif suffix == ".parquet":
        rows = _parquet_rows(path)
    elif suffix == ".csv":
        rows = csv_rows(path)
    else:
        raise ValueError(f"{path}: expected a .jsonl, .json, .parquet or .csv file")
    problems: list[MathProblem] = []
    layout = None
    default_source = path.stem
    for index, (where, row) in enumerate(rows):
        if limit is not None and len(problems) >= limit:
            break
        if not isinstance(row, Mapping):
            raise ValueError(f"{where}: expected an object (a row with named fields), got {row!r}")
        fields = {str(k).lower(): v for k, v in row.items()}
        if layout is None:
            layout = _detect_layout(fields, path)
        problems.append(_problem_from_fields(fields, layout, where, index, source, default_source))
    return problems


def _detect_layout(fields: Mapping[str, Any], path: Path) -> str:
    if "reward_model" in fields and "prompt" in fields:
        return "dapo"
    if "problem" in fields and ("answer" in fields or "solution" in fields):
        return "math"
    if "question" in fields and "answer" in fields:
        return "gsm8k"
    known = "; ".join(f"{name} ({desc})" for name, desc in MATH_LAYOUTS.items())
    raise ValueError(
        f"{path}: unknown column layout; columns found: {sorted(fields)}; layouts known: {known}"
    )


def _problem_from_fields(
    fields: Mapping[str, Any],
    layout: str,
    where: str,
    index: int,
    source: str | None,
    default_source: str,
) -> MathProblem:
    if layout == "dapo":
        text = _dapo_problem(_required(fields, "prompt", where), where)
        reward_model = _required(fields, "reward_model", where)
        if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
            raise ValueError(
                f"{where}: field 'reward_model': expected an object with 'ground_truth', "
                f"got {reward_model!r}"
            )
        answer = _answer_text(reward_model["ground_truth"], where, "reward_model.ground_truth")
        extra = fields.get("extra_info")
        ident = extra.get("index") if isinstance(extra, Mapping) else None
        level = subject = ""
    elif layout == "gsm8k":
        text = _text_field(fields, "question", where)
        solution = _text_field(fields, "answer", where)
        if "####" not in solution:
            raise ValueError(
                f"{where}: field 'answer': expected a GSM8K solution ending in '#### <answer>', "
                f"got {solution[-80:]!r}"
            )
        answer = _answer_text(solution.rpartition("####")[2].replace(",", ""), where, "answer")
        ident = fields.get("id")
        level = subject = ""
    else:
        text = _text_field(fields, "problem", where)
        if fields.get("answer") is not None:
            answer = _answer_text(fields["answer"], where, "answer")
        elif fields.get("solution") is not None:
            solution = fields["solution"]
            boxed = extract_boxed(solution) if isinstance(solution, str) else None
            if not boxed:
                raise ValueError(
                    f"{where}: field 'solution': no \\boxed{{}} answer in it and no 'answer' field"
                )
            answer = boxed
        else:
            raise ValueError(f"{where}: missing field 'answer' (and no 'solution' to take it from)")
        ident = fields.get("unique_id", fields.get("id"))
        level = _optional_text(fields.get("level"), where, "level")
        level = level.removeprefix("Level ").strip()
        subject = _optional_text(fields.get("subject", fields.get("type")), where, "subject")
    if source is None:
        source = (
            _optional_text(fields.get("data_source", fields.get("source")), where, "source")
            or default_source
        )
    ident_text = str(index) if ident is None else _optional_text(ident, where, "id")
    return MathProblem(text, answer, ident_text, source, level, subject)


def _required(fields: Mapping[str, Any], name: str, where: str) -> Any:
    value = fields.get(name)
    if value is None:
        raise ValueError(f"{where}: missing field '{name}'")
    return value


def _text_field(fields: Mapping[str, Any], name: str, where: str) -> str:
    value = _required(fields, name, where)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: field '{name}': expected a non-empty string, got {value!r}")
    return value


def _optional_text(value: Any, where: str, name: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{where}: field '{name}': expected a string or a number, got {value!r}")
    return _number_text(value) if not isinstance(value, str) else value


def _answer_text(value: Any, where: str, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{where}: field '{name}': expected a string or a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: field '{name}': expected a finite number, got {value!r}")
    text = value.strip() if isinstance(value, str) else _number_text(value)
    if not text:
        raise ValueError(f"{where}: field '{name}': expected a non-empty answer, got {value!r}")
    return text


def _number_text(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _dapo_problem(prompt: Any, where: str) -> str:
    if isinstance(prompt, str):
        content = prompt
    elif isinstance(prompt, (list, tuple)):
        user = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if not user or not isinstance(user[0].get("content"), str):
            raise ValueError(
                f"{where}: field 'prompt': expected chat messages with a user turn, got {prompt!r}"
            )
        content = user[0]["content"]
    else:
        raise ValueError(f"{where}: field 'prompt': expected chat messages or text, got {prompt!r}")
    head, sep, body = content.strip().partition("\n\n")
    body = "\n\n" + body
    if head.startswith(_DAPO_PREFIX) and sep and body.endswith(_DAPO_REMINDER):
        inner = body[: -len(_DAPO_REMINDER)].strip()
        if inner:
            content = inner
    if not content.strip():
        raise ValueError(f"{where}: field 'prompt': empty problem")
    return content


def _json_rows(path: Path) -> Iterator[tuple[str, Any]]:
    text = decode_utf8(path.read_bytes(), str(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg != "Extra data":
            raise ValueError(f"{path}: invalid JSON: {e.msg} (line {e.lineno})") from None
        yield from jsonl_rows(path)
        return
    except RecursionError:
        raise ValueError(f"{path}: invalid JSON: brackets nested too deeply to parse") from None
    except ValueError as e:  # e.g. an integer of more than 4,300 digits
        raise ValueError(f"{path}: invalid JSON: {e}") from None
    if isinstance(data, Mapping) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) != 1:
            raise ValueError(f"{path}: columns of different lengths: {sorted(lengths)}")
        columns = list(data)
        data = [
            dict(zip(columns, values, strict=True)) for values in zip(*data.values(), strict=True)
        ]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of rows or a dict of columns")
    for i, row in enumerate(data):
        yield f"{path}: row {i}", row


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow as pa  # brought by `datasets` (the `llm` extra)
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"{path}: reading Parquet needs pyarrow (the llm extra: pip install 'pyarrow>=14'); "
            "or convert the file to JSON Lines"
        ) from None
    i = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                yield f"{path}: row {i}", row
                i += 1
    except (pa.ArrowException, OSError) as e:
        raise parquet_failure(path, e, i) from None


def write_math_jsonl(problems: Iterable[MathProblem], path: str | os.PathLike[str]) -> None:
    """Write one JSON object per problem (all six fields), readable by `load_math_problems`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(p.to_row(), ensure_ascii=False) + "\n")
    # Atomic replace: a crash never leaves a half-written data file behind.
    tmp.replace(path)
