"""Countdown: problems, a generator, file I/O, prompt templates and TinyZero's reward without `eval`.

A problem gives numbers and a target; an answer is an equation over the numbers, each used exactly
once, with `+ - * /` and parentheses, whose value is the target. The data follow the public
Countdown-Tasks-3to4 set (columns `target`, `nums`; 3 or 4 numbers) used by TinyZero and by
seed 000, App. C.1.

Sources read (Jiayi-Pan/TinyZero, commit f36b1b8): `examples/data_preprocess/countdown.py`
(templates `base` and `qwen-instruct`, dataset columns) and `verl/utils/reward_score/countdown.py`
(answer extraction and the 1.0 / 0.1 / 0 scoring). Wording here is our own; structure and scoring
follow those files, with the differences listed in `verify`.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import numpy as np

from llm.tasks.expr import (
    MAX_EXPRESSION_CHARS,
    OPS,
    Expr,
    evaluate,
    leaves,
    parse_expression,
    to_infix,
)
from llm.tasks.io import jsonl_rows, parquet_failure
from llm.tasks.registry import Task


@dataclass(frozen=True)
class CountdownProblem:
    """Numbers `nums` (each to be used exactly once) and the `target` value of the equation.

    Raises:
        ValueError: `nums` empty or not non-negative integers; `target` not an integer.
    """

    nums: tuple[int, ...]
    target: int

    def __post_init__(self) -> None:
        if not isinstance(self.nums, (tuple, list)) or len(self.nums) == 0:
            raise ValueError(f"nums: expected a non-empty sequence of integers, got {self.nums!r}")
        if not all(_is_int(n) and n >= 0 for n in self.nums):
            raise ValueError(f"nums: expected non-negative integers, got {self.nums!r}")
        if not _is_int(self.target):
            raise ValueError(f"target: expected an integer, got {self.target!r}")
        # Normalize numpy integers and lists so that equality and hashing are by value.
        object.__setattr__(self, "nums", tuple(int(n) for n in self.nums))
        object.__setattr__(self, "target", int(self.target))

    def to_row(self) -> dict[str, Any]:
        """The dataset row `{"target": int, "nums": list[int]}`."""
        return {"target": self.target, "nums": list(self.nums)}


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


# --------------------------------------------------------------------------------------------------
# Generator


def generate_problems(
    n: int,
    *,
    seed: int | np.random.Generator,
    num_numbers: int | Sequence[int] = (3, 4),
    min_number: int = 1,
    max_number: int = 99,
    min_target: int = 1,
    max_target: int = 999,
    max_tries: int = 10_000,
) -> list[CountdownProblem]:
    """`n` problems that are solvable by construction, deterministic given `seed`.

    Each problem draws its size from `num_numbers`, its numbers uniformly from
    `[min_number, max_number]`, then a random expression over them (a random order, a random split
    at each node, a uniform operator) evaluated exactly; the value becomes the target when it is an
    integer in `[min_target, max_target]` and no division was by zero, else a new draw is made. The
    defaults mimic Countdown-Tasks-3to4 (3 or 4 numbers below 100); the construction shows that a
    solution exists, and the solver finds all of them.

    Raises:
        ValueError: a bound or size is invalid.
        RuntimeError: `max_tries` draws in a row produced no admissible target.
    """
    sizes = (num_numbers,) if isinstance(num_numbers, int) else tuple(num_numbers)
    if n < 0:
        raise ValueError(f"n: expected >= 0, got {n}")
    if not sizes or any(not isinstance(k, int) or k < 1 for k in sizes):
        raise ValueError(f"num_numbers: expected positive integers, got {num_numbers!r}")
    if not 0 <= min_number <= max_number:
        raise ValueError(
            f"min_number, max_number: expected 0 <= min <= max, got {min_number}, {max_number}"
        )
    if min_target > max_target:
        raise ValueError(
            f"min_target, max_target: expected min <= max, got {min_target}, {max_target}"
        )
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    problems = []
    for _ in range(n):
        k = int(sizes[rng.integers(len(sizes))])
        for _ in range(max_tries):
            nums = [int(x) for x in rng.integers(min_number, max_number + 1, size=k)]
            value = evaluate(_random_expr([nums[i] for i in rng.permutation(k)], rng))
            if value is not None and value.denominator == 1 and min_target <= value <= max_target:
                problems.append(CountdownProblem(tuple(nums), int(value)))
                break
        else:
            raise RuntimeError(
                f"no target in [{min_target}, {max_target}] after {max_tries} draws with "
                f"{k} numbers in [{min_number}, {max_number}]"
            )
    return problems


def _random_expr(nums: list[int], rng: np.random.Generator) -> Expr:
    if len(nums) == 1:
        return nums[0]
    split = int(rng.integers(1, len(nums)))
    op = OPS[int(rng.integers(len(OPS)))]
    return (op, _random_expr(nums[:split], rng), _random_expr(nums[split:], rng))


# --------------------------------------------------------------------------------------------------
# File I/O in the Countdown-Tasks-3to4 format


def problem_from_row(row: object, where: str) -> CountdownProblem:
    """Validate one dataset row (`target`, `nums`; other columns ignored).

    Raises:
        ValueError: the message starts with `where` (file and row) and names the field.
    """
    if not isinstance(row, Mapping):
        raise ValueError(
            f"{where}: expected an object with fields 'target' and 'nums', got {row!r}"
        )
    for field in ("target", "nums"):
        if field not in row:
            raise ValueError(f"{where}: missing field '{field}'")
    target, nums = row["target"], row["nums"]
    if not _is_int(target):
        raise ValueError(f"{where}: field 'target': expected an integer, got {target!r}")
    if not isinstance(nums, (list, tuple)) or not nums:
        raise ValueError(f"{where}: field 'nums': expected a non-empty list, got {nums!r}")
    for i, x in enumerate(nums):
        if not _is_int(x) or x < 0:
            raise ValueError(
                f"{where}: field 'nums'[{i}]: expected a non-negative integer, got {x!r}"
            )
    return CountdownProblem(tuple(nums), target)


def load_problems(path: str | os.PathLike[str]) -> list[CountdownProblem]:
    """Read problems from a local `.jsonl` file or a `.parquet` file (Countdown-Tasks-3to4 format).

    JSON Lines need nothing beyond the standard library (blank lines are skipped); Parquet is read
    through `datasets` (the `llm` extra), imported only here.

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
    raise ValueError(f"{path}: expected a .jsonl or .parquet file")


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
            f"{path}: reading Parquet needs the 'datasets' package (pip install 'sharpening[llm]'); "
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

TemplateName = Literal["base", "qwen-instruct", "compact"]
TEMPLATES: tuple[str, ...] = ("base", "qwen-instruct", "compact")

# The user turn shared by `base` and `qwen-instruct`. Same structure as TinyZero's
# `make_prefix` (examples/data_preprocess/countdown.py): numbers as a Python list, the target, the
# allowed operations, the once-each rule, <think> and <answer> tags with a worked format example.
_USER_TURN = (
    "Using the numbers {nums}, write an equation whose value is {target}. You may use the basic "
    "arithmetic operations (+, -, *, /), and every number must be used exactly once. Reason inside "
    "<think> </think> tags, then give only the final equation inside <answer> </answer> tags, "
    "for example <answer> (1 + 2) / 3 </answer>."
)
_LEAD_IN = "Let me work through this step by step.\n<think>"

# TinyZero `base`: a plain-text dialogue for any base model. The scorer's optional split on
# "Assistant:" relies on that marker appearing first at the assistant turn, so the preamble
# never writes "Assistant:" (and the example answer sits in the user turn, before the split).
_BASE = (
    "A conversation between a User and an Assistant. The User asks a question and the Assistant "
    "answers it: the Assistant first reasons about the problem privately, then gives the User the "
    "answer.\nUser: " + _USER_TURN + "\nAssistant: " + _LEAD_IN
)

# TinyZero `qwen-instruct`: the same content in Qwen's ChatML, the assistant turn left open.
_QWEN_INSTRUCT = (
    "<|im_start|>system\nYou are a helpful assistant. You first reason about the problem privately "
    "and then give the user the answer.<|im_end|>\n<|im_start|>user\n" + _USER_TURN + "<|im_end|>\n"
    "<|im_start|>assistant\n" + _LEAD_IN
)

# The compact template of the offline tiny model: every token a space-separated word.
COMPACT_WORDS: tuple[str, ...] = ("nums", "target", ":", "<answer>", "</answer>", "(", ")", *OPS)


def make_prompt(problem: CountdownProblem, template: TemplateName = "base") -> str:
    """The prompt for `problem` in one of `TEMPLATES`.

    `base` and `qwen-instruct` end with the `<think>` lead-in of TinyZero; the answer is expected on
    the last line, in `<answer> ... </answer>`. `compact` is `nums 3 5 7 target 22 :`; the tiny
    model completes it with `compact_completion`.

    Raises:
        ValueError: unknown template.
    """
    if template == "compact":
        return "nums " + " ".join(map(str, problem.nums)) + f" target {problem.target} :"
    fields = {"nums": str(list(problem.nums)), "target": problem.target}
    if template == "base":
        return _BASE.format(**fields)
    if template == "qwen-instruct":
        return _QWEN_INSTRUCT.format(**fields)
    raise ValueError(f"template: expected one of {TEMPLATES}, got {template!r}")


def compact_completion(solution: Expr) -> str:
    """`<answer> ( 3 + 5 ) * 2 </answer>`: the completion of a compact prompt, one word per token."""
    return f"<answer> {to_infix(solution, spaced=True)} </answer>"


def compact_words(max_number: int) -> list[str]:
    """Every word of the compact format whose numbers (operands and targets) are `<= max_number`."""
    return [*COMPACT_WORDS, *(str(i) for i in range(max_number + 1))]


# --------------------------------------------------------------------------------------------------
# Verifier

Reason = Literal[
    "no_answer",
    "too_long",
    "invalid_expression",
    "wrong_numbers",
    "division_by_zero",
    "wrong_value",
    "correct",
]

FORMAT_SCORE = 0.1
CORRECT_SCORE = 1.0
_OPEN, _CLOSE = "<answer>", "</answer>"
_ASSISTANT_MARKERS = ("Assistant:", "<|im_start|>assistant")


@dataclass(frozen=True)
class Verdict:
    """Outcome of `verify`: the `score`, why (`reason`), the extracted `equation` and its `value`."""

    score: float
    reason: Reason
    equation: str | None = None
    value: Fraction | None = None


def extract_answer(text: str, *, split_on_assistant: bool = False) -> str | None:
    """The equation in the last `<answer>...</answer>` of the last line of `text`, stripped.

    TinyZero's `extract_solution`: keep only the last line (`split('\\n')[-1]`), take the content of
    the last non-overlapping `<answer>(.*?)</answer>` match, `strip()` it. With
    `split_on_assistant=True` (for prompt + response text, as TinyZero receives it) everything up to
    the first `Assistant:`, else the first `<|im_start|>assistant`, is dropped first, and text
    without either marker yields `None`. The scan is linear-time (the regex is quadratic on a line of
    many unclosed `<answer>` tags) and matches the regex exactly; a test checks that.
    """
    if split_on_assistant:
        for marker in _ASSISTANT_MARKERS:
            if marker in text:
                text = text.split(marker, 1)[1]
                break
        else:
            return None
    line = text.rpartition("\n")[2]
    found = None
    pos = 0
    while (start := line.find(_OPEN, pos)) != -1:
        end = line.find(_CLOSE, start + len(_OPEN))
        if end == -1:
            break
        found = (start + len(_OPEN), end)
        pos = end + len(_CLOSE)
    return None if found is None else line[found[0] : found[1]].strip()


def verify(
    text: str,
    problem: CountdownProblem,
    *,
    split_on_assistant: bool = False,
    format_score: float = FORMAT_SCORE,
    score: float = CORRECT_SCORE,
) -> Verdict:
    """Score a response to `problem` as TinyZero does, but by parsing, never `eval`.

    Rules (TinyZero `verl/utils/reward_score/countdown.py`, `compute_score`):
    - no `<answer>...</answer>` on the last line (see `extract_answer`): 0;
    - an answer that is not a valid expression, uses the numbers other than exactly once each
      (multiset equality: missing, extra or reused numbers), divides by zero, or has another value:
      `format_score` (0.1), whatever its content, even empty;
    - otherwise `score` (1.0).

    Deliberate differences from TinyZero, all on inputs it would score 1.0 through `eval`: only
    integer literals (TinyZero accepts `3.` or `3.0` if the digits match), no unary `+`/`-`, no `**`
    or `//` (its whitelist lets them through), exact equality of `Fraction`s instead of
    `abs(result - target) < 1e-5`, and at most `MAX_EXPRESSION_CHARS` characters, `MAX_NODES`
    nodes and `MAX_DEPTH` levels. With these rules the verifier accepts an expression iff its
    commutative class is among the solver's solutions. Never raises on any `str`.
    """
    equation = extract_answer(text, split_on_assistant=split_on_assistant)
    if equation is None:
        return Verdict(0.0, "no_answer")
    if len(equation) > MAX_EXPRESSION_CHARS:
        return Verdict(format_score, "too_long", equation)
    expr = parse_expression(equation)
    if expr is None:
        return Verdict(format_score, "invalid_expression", equation)
    if Counter(leaves(expr)) != Counter(problem.nums):
        return Verdict(format_score, "wrong_numbers", equation)
    value = evaluate(expr)
    if value is None:
        return Verdict(format_score, "division_by_zero", equation)
    if value != problem.target:
        return Verdict(format_score, "wrong_value", equation, value)
    return Verdict(score, "correct", equation, value)


def compute_score(
    text: str,
    problem: CountdownProblem,
    *,
    split_on_assistant: bool = False,
    format_score: float = FORMAT_SCORE,
    score: float = CORRECT_SCORE,
) -> float:
    """The reward of `verify`: `score` (1.0), `format_score` (0.1) or 0.0."""
    return verify(
        text, problem, split_on_assistant=split_on_assistant, format_score=format_score, score=score
    ).score


def solves(expr: Expr, problem: CountdownProblem) -> bool:
    """Whether the tree `expr` is a correct answer: numbers used exactly once, exact value."""
    if Counter(leaves(expr)) != Counter(problem.nums):
        return False
    return evaluate(expr) == problem.target


# --------------------------------------------------------------------------------------------------
# The registry entry (llm.tasks.TASKS["countdown"])


def generate_for(n: int, seed: int, data: Any = None) -> list[CountdownProblem]:
    """`generate_problems` with the bounds of a config's ``[data]`` table (`llm.config.DataConfig`:
    num_numbers, min/max_number, min/max_target), or the generator's defaults if `data` is None.

    Raises:
        ValueError, RuntimeError: as `generate_problems`.
    """
    if data is None:
        return generate_problems(n, seed=seed)
    return generate_problems(
        n,
        seed=seed,
        num_numbers=tuple(data.num_numbers),
        min_number=data.min_number,
        max_number=data.max_number,
        min_target=data.min_target,
        max_target=data.max_target,
    )


def answer_key(text: str, distinct: str = "commutative") -> str | None:
    """The canonical form (`llm.tasks.solution_key` under `distinct`) of the response's `<answer>`
    equation, or None if it has none or it does not parse. Never raises on a `str`."""
    from llm.tasks.countdown_solver import solution_key  # the solver imports this module

    answer = extract_answer(text)
    expr = None if answer is None else parse_expression(answer)
    return None if expr is None else solution_key(expr, distinct=distinct)


def _describe(problem: CountdownProblem) -> dict[str, Any]:
    return {"nums": list(problem.nums), "target": problem.target}


# The exhaustive solver's cost grows factorially with the numbers; beyond 5 the count is skipped.
_COUNTED_NUMBERS = 5


def _solution_count(problem: CountdownProblem, distinct: str) -> int | None:
    from llm.tasks.countdown_solver import count_solutions

    if len(problem.nums) > _COUNTED_NUMBERS:
        return None
    return count_solutions(problem, distinct=distinct)  # type: ignore[arg-type]


def _score(text: str, problem: CountdownProblem, *, format_score: float = FORMAT_SCORE) -> float:
    return compute_score(text, problem, format_score=format_score)


COUNTDOWN = Task(
    name="countdown",
    templates=TEMPLATES,
    load=load_problems,
    generate=generate_for,
    prompt=make_prompt,
    score=_score,
    answer_key=answer_key,
    describe=_describe,
    solution_count=_solution_count,
    tiny_data=True,
)
"""Countdown (seed 000 App. C.1): TinyZero's prompts and 1.0 / 0.1 / 0 reward, answers equal up to
`distinct`."""
