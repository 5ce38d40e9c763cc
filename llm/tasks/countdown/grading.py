"""Countdown grading: TinyZero's answer extraction and 1.0 / 0.1 / 0 reward, without `eval`.

Sources read (Jiayi-Pan/TinyZero, commit f36b1b8): `verl/utils/reward_score/countdown.py`
(answer extraction and the 1.0 / 0.1 / 0 scoring). Wording here is our own; structure and scoring
follow that file, with the differences listed in `verify`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from llm.tasks.countdown.problem import CountdownProblem
from llm.tasks.expr import (
    MAX_EXPRESSION_CHARS,
    Expr,
    evaluate,
    leaves,
    parse_expression,
)

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
