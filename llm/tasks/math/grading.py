"""Math grading: the last `\\boxed{...}` of a response, compared with the answer by math-verify
(huggingface/Math-Verify 0.9.0) in a grader process with a hard wall-clock limit (see
`answers_equivalent` for why): 1 if equivalent, `format_score` if boxed but wrong, else 0."""

from __future__ import annotations

import re
from typing import NamedTuple

from llm.tasks.math.grader import _GRADERS, _verify_here
from llm.tasks.math.problem import MathProblem

# --------------------------------------------------------------------------------------------------
# Answer extraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, stripped; None if absent.

    Braces are matched with escapes skipped (`\\{`, `\\}` and `\\\\` are not grouping), so nested
    groups such as `\\boxed{\\frac{1}{2}}` and sets `\\boxed{\\{1,2\\}}` come out whole. The
    brace-less form `\\boxed 5` takes the text up to the next `$` or line end, as the MATH
    reference code does (Hendrycks et al., `last_boxed_only_string`). The last command decides: if
    it is unclosed (a truncated response) or empty-handed, the result is None, not an earlier box,
    so an answer the response moved away from is never used. Linear time in `len(text)`.
    """
    # Last occurrence of each command; each search only moves left, so the scan stays linear.
    found = {name: text.rfind(name) for name in _BOX_COMMANDS}
    while True:
        name = max(found, key=found.__getitem__)
        start = found[name]
        if start < 0:
            return None
        after = start + len(name)
        # `\boxedfoo` is another command: keep looking to the left of it.
        if after < len(text) and text[after].isalpha():
            found[name] = text.rfind(name, 0, start)
            continue
        return _box_argument(text, after)


def _box_argument(text: str, pos: int) -> str | None:
    n = len(text)
    while pos < n and text[pos] in " \t":
        pos += 1
    if pos >= n:
        return None
    if text[pos] != "{":
        stop = pos
        while stop < n and text[stop] not in "$\n":
            stop += 1
        content = text[pos:stop].strip()
        return content or None
    depth = 0
    i = pos
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[pos + 1 : i].strip()
        i += 1
    return None


# --------------------------------------------------------------------------------------------------
# Grading

# Longest boxed answer handed to math-verify. Competition answers are short (a number, a
# fraction, an interval, a small matrix); a longer box is judged wrong without parsing, which
# keeps parsing cheap on degenerate output.
MAX_ANSWER_CHARS = 1000
# Deepest bracket nesting ((, [, { together) of a boxed answer handed to math-verify. Its LaTeX
# parser takes time exponential in nesting depth (measured with math-verify 0.9.0: `{...{1}...}`
# 10 deep 0.7 s, 15 deep 7 s, 20 deep over 4 minutes), and looping models do emit such strings;
# a tuple of fractions of roots, deep for an answer, nests 3 levels.
MAX_ANSWER_DEPTH = 10
# Wall-clock limit on one grading call (parse gold, parse answer, compare). math-verify's own
# defaults are 5 s per parse and 5 s per comparison (math_verify/parser.py `parse`,
# math_verify/grader.py `verify`); legitimate answers take milliseconds.
GRADE_TIMEOUT_S = 5.0


class MathVerdict(NamedTuple):
    """Outcome of `math_verdict`, small enough for evaluation logs.

    Fields:
        answer: content of the last `\\boxed{}` of the response, None if it has none.
        correct: math-verify judged `answer` equivalent to the problem's answer.
        has_box: the response has a (closed) `\\boxed{}`.
        timed_out: grading hit `timeout_s` (or the grader process died); `correct` is then False.
    """

    answer: str | None
    correct: bool
    has_box: bool
    timed_out: bool = False


def math_verdict(
    text: str, problem: MathProblem, *, timeout_s: float | None = GRADE_TIMEOUT_S
) -> MathVerdict:
    """Grade a response to `problem`: extract its last box and compare it with `problem.answer`.

    Only the boxed answer counts (every template asks for one): a response without a box is not
    searched for other answer forms. A box that is blank, longer than `MAX_ANSWER_CHARS` or
    nested deeper than `MAX_ANSWER_DEPTH` is wrong without parsing. Never raises on any `str`;
    takes at most about `timeout_s` (see `answers_equivalent`).
    """
    answer = extract_boxed(text)
    if answer is None:
        return MathVerdict(None, False, False)
    if not answer or len(answer) > MAX_ANSWER_CHARS or _nesting_depth(answer) > MAX_ANSWER_DEPTH:
        return MathVerdict(answer, False, True)
    correct, timed_out = _judge(problem.answer, answer, timeout_s)
    return MathVerdict(answer, correct, True, timed_out)


def _nesting_depth(answer: str) -> int:
    depth = deepest = 0
    for ch in answer:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth = max(depth - 1, 0)
    return deepest


def compute_math_score(
    text: str,
    problem: MathProblem,
    *,
    format_score: float = 0.0,
    timeout_s: float | None = GRADE_TIMEOUT_S,
) -> float:
    """The reward: 1.0 if correct, `format_score` if boxed but wrong (or timed out), else 0.0.

    Binary by default: seed 000 assumes a binary reward (Sec. 2) and seed 001 trains math with
    "binary verifier rewards" (App. A). Never raises on any `str`; bounded by about `timeout_s` seconds.
    """
    verdict = math_verdict(text, problem, timeout_s=timeout_s)
    if verdict.correct:
        return 1.0
    return format_score if verdict.has_box else 0.0


def answers_equivalent(gold: str, pred: str, *, timeout_s: float | None = GRADE_TIMEOUT_S) -> bool:
    """Whether math-verify judges the answer `pred` equivalent to the reference `gold`.

    Both are bare answers (the content of a box); each is wrapped in `\\boxed{}` and parsed with
    `math_verify.parse(..., [LatexExtractionConfig(boxed_match_priority=0)])`, then compared with
    `math_verify.verify(gold, pred)` (not symmetric: `gold` first). A `gold` that is itself boxed
    is unwrapped first. Identical strings (up to spacing commands) are equal without parsing.

    Time limit. math-verify bounds `parse` and `verify` with `signal.alarm` (math_verify/utils.py
    `timeout`), which raises ValueError outside the main thread; its documented escape
    (`parsing_timeout=None`, `timeout_seconds=None`, see the error text in `parse` and `verify`)
    turns the limit off and leaves it to the caller. A limit is needed: answers such as
    `9^{9^{9}}` or `(10^{8})!` make SymPy compute for minutes. We therefore call math-verify with
    its timeouts off inside a child Python process and wait at most `timeout_s` seconds for the
    verdict; on overrun the child is killed (and restarted on the next call) and the answer counts
    as wrong. Children are reused across calls, one per concurrently grading thread up to
    `MAX_GRADER_PROCESSES`, so threads also grade in parallel. This works from any thread, never
    touches the caller's signal handlers, stops computations that a signal cannot interrupt (long
    C-level big-integer work), and frees the memory they took. A child's start (about 1 s, with a
    warm-up parse) is not counted in `timeout_s`. `timeout_s=None` grades in this process with no
    limit at all, for callers that bound time themselves.

    Raises:
        ValueError: `timeout_s` is not None and not positive.
        RuntimeError: the grader process cannot start (math-verify is not installed).
    """
    return _judge(gold, pred, timeout_s)[0]


_SPACING = re.compile(r"(?:\s|\\[,;:! ]|\\q?quad\b|\\left\b|\\right\b)+")
# A space is dropped unless it separates two letters: `\pi r` must not become `\pir`.
_DROPPABLE_SPACE = re.compile(r"(?<![A-Za-z]) | (?![A-Za-z])")


def _canonical(answer: str) -> str:
    """`answer` with spacing and sizing commands removed; equal canonical forms are equal answers."""
    spaced = _SPACING.sub(" ", answer).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return _DROPPABLE_SPACE.sub("", spaced.strip())


def _judge(gold: str, pred: str, timeout_s: float | None) -> tuple[bool, bool]:
    """(correct, timed_out) for the bare answers `gold` and `pred`."""
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s: expected None or > 0, got {timeout_s}")
    if "\\boxed" in gold or "\\fbox" in gold:
        gold = extract_boxed(gold) or gold
    canonical = _canonical(pred)
    if canonical and canonical == _canonical(gold):
        return True, False
    if timeout_s is None:
        return _verify_here(gold, pred), False
    return _GRADERS.judge(gold, pred, timeout_s)
