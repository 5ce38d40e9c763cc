"""Competition math with a verifiable reward: problems, loaders, prompts, and a math-verify grader.

A problem is a statement and a ground-truth final answer (LaTeX or a number). A response is scored
on the content of its last `\\boxed{...}`, which math-verify (huggingface/Math-Verify 0.9.0) parses
to SymPy and compares with the answer: 1 if equivalent, `format_score` if boxed but wrong, else 0.

The setups this serves: seed 000 (DS-GRPO), Sec. 4.3 and App. C.3, trains Qwen2.5-Math-1.5B/7B,
Qwen3-1.7B and Ministral-8B on DAPO-Math-17k (English) + MATH12k and evaluates on MATH500,
OlympiadBench, AMC23, AIME24, AIME25; seed 001 (DSDR), Sec. 4.1 and App. A, trains Qwen2.5-Math-1.5B
and Qwen3-1.7B/4B on open-r1/DAPO-Math-17K-Processed with binary verifier rewards. The prompt
boxes of both papers (seed 000 App. C.3, seed 001 App. B.3) did not survive in the seed texts, so
the templates follow the model makers' documented math prompts; see `MATH_TEMPLATES`.

Grading runs math-verify in a separate Python process with a hard wall-clock limit; see
`answers_equivalent` for why. Pure Python: no torch; `pyarrow` (brought by `datasets`, the `llm`
extra) only inside the Parquet loader; math-verify only inside the grader.
"""

from __future__ import annotations

import re
from typing import Any

from llm.tasks.math.grading import compute_math_score, extract_boxed
from llm.tasks.math.loaders import load_math_problems
from llm.tasks.math.problem import (
    MATH_TEMPLATES,
    MathProblem,
    generate_math_problems,
    make_math_prompt,
)
from llm.tasks.registry import Task

# --------------------------------------------------------------------------------------------------
# The registry entry (llm.tasks.TASKS["math"])

# Openers of inline and display math, longest first so `$$` is not read as two `$`; an escaped
# dollar (`\$`, a currency sign in LaTeX) opens nothing.
_MATH_OPEN = re.compile(r"(?<!\\)\$\$|\\\[|\\\(|(?<!\\)\$")
_MATH_CLOSE = {"$$": "$$", "\\[": "\\]", "\\(": "\\)", "$": "$"}


def math_answer_key(text: str, distinct: str = "commutative") -> str | None:
    """The response's last boxed answer with whitespace runs collapsed (`extract_boxed`), or None
    without a box; `distinct` is ignored (math answers have one written form each). Two keys
    differ when the writing differs (``1/2`` and ``\\frac{1}{2}``): identity, not equivalence."""
    answer = extract_boxed(text)
    return None if answer is None else " ".join(answer.split())


def math_expressions(text: str, distinct: str = "commutative") -> frozenset[str]:
    """DSDR's formula set ``F_i`` of a math response (seed 001 Eq. 7: the mathematical expressions
    it contains): the contents of its ``$...$``, ``$$...$$``, ``\\(...\\)`` and ``\\[...\\]``
    segments and its boxed answer (`math_answer_key`), whitespace collapsed, blanks dropped.

    An unclosed opener ends the scan. Linear time in ``len(text)``; never raises on a `str`.
    """
    found: set[str] = set()
    pos = 0
    while (m := _MATH_OPEN.search(text, pos)) is not None:
        close = text.find(_MATH_CLOSE[m.group()], m.end())
        if close < 0:
            break
        segment = " ".join(text[m.end() : close].split())
        if segment:
            found.add(segment)
        pos = close + len(_MATH_CLOSE[m.group()])
    key = math_answer_key(text)
    if key:
        found.add(key)
    return frozenset(found)


def _generate(n: int, seed: int, data: Any = None) -> list[MathProblem]:
    # The arithmetic generator has its own bounds; [data]'s are Countdown's (llm.config.DataConfig).
    return generate_math_problems(n, seed=seed)


def _score(text: str, problem: MathProblem, *, format_score: float = 0.0) -> float:
    return compute_math_score(text, problem, format_score=format_score)


def _describe(problem: MathProblem) -> dict[str, Any]:
    return {"id": problem.id}


MATH = Task(
    name="math",
    templates=MATH_TEMPLATES,
    load=load_math_problems,
    generate=_generate,
    prompt=make_math_prompt,
    score=_score,
    answer_key=math_answer_key,
    formulas=math_expressions,
    describe=_describe,
    format_key="boxed_rate",
)
"""Competition math (seed 000 Sec. 4.3, seed 001 Sec. 4.1): boxed answers graded by math-verify."""
