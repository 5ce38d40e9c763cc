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

import atexit
import json
import logging
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from llm.tasks.io import decode_utf8, jsonl_rows, parquet_failure
from llm.tasks.registry import Task

_logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# Problems


@dataclass(frozen=True)
class MathProblem:
    """One problem: the statement, the ground-truth final answer, and where it came from.

    Fields:
        problem: statement (LaTeX allowed).
        answer: ground-truth final answer as a string (LaTeX or a number), non-empty.
        id: unique id if the file has one (MATH500 `unique_id`, AIME `id`), else the row index.
        source: dataset name, e.g. "MATH500", "AIME24", "DAPO-Math-17k".
        level: MATH difficulty ("1" to "5") if known.
        subject: MATH subject if known, e.g. "Precalculus".

    Raises:
        ValueError: a field is not a string, or `answer` is blank.
    """

    problem: str
    answer: str
    id: str = ""
    source: str = ""
    level: str = ""
    subject: str = ""

    def __post_init__(self) -> None:
        for name in ("problem", "answer", "id", "source", "level", "subject"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"{name}: expected a string, got {value!r}")
        if not self.answer.strip():
            raise ValueError(f"answer: expected a non-empty string, got {self.answer!r}")

    def to_row(self) -> dict[str, str]:
        """The JSON Lines row written by `write_math_jsonl` (all six fields)."""
        return asdict(self)


# --------------------------------------------------------------------------------------------------
# Prompt templates

MathTemplateName = Literal["qwen-math", "qwen3", "qwen3-nothink", "plain"]
MATH_TEMPLATES: tuple[str, ...] = ("qwen-math", "qwen3", "qwen3-nothink", "plain")

# The instruction every template carries. Same sentence as the Qwen2.5-Math evaluation harness
# (QwenLM/Qwen2.5-Math, evaluation/utils.py, PROMPT_TEMPLATES "qwen25-math-cot") and the math
# advice of the Qwen3 model card ("Best Practices"); the grader reads the last \boxed{}.
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# Qwen2.5-Math chat format: the instruction is the system turn, the problem the user turn, the
# assistant turn is left open. Exactly the harness's "qwen25-math-cot" template.
_QWEN_MATH_HEAD = "<|im_start|>system\n" + BOXED_INSTRUCTION + "<|im_end|>\n<|im_start|>user\n"
_QWEN_MATH_TAIL = "<|im_end|>\n<|im_start|>assistant\n"

# Qwen3 chat format (the model's chat template with `add_generation_prompt=True`): no system turn,
# the instruction appended to the user turn as the model card advises. With thinking on (the
# template's default) the assistant turn is left open and the model starts with "<think>"; with
# `enable_thinking=False` the template pre-fills an empty think block, reproduced by
# "qwen3-nothink".
_QWEN3_HEAD = "<|im_start|>user\n"
_QWEN3_TAIL = "\n" + BOXED_INSTRUCTION + "<|im_end|>\n<|im_start|>assistant\n"
_QWEN3_EMPTY_THINK = "<think>\n\n</think>\n\n"

# Plain text for base models and the tiny CPU model: the harness's "cot"/"direct" layout
# ("Question: {input}\nAnswer: ", stripped of the trailing space by its construct_prompt) with the
# boxed instruction before the answer cue.
_PLAIN_HEAD = "Question: "
_PLAIN_TAIL = "\n" + BOXED_INSTRUCTION + "\nAnswer:"


def make_math_prompt(problem: MathProblem, template: MathTemplateName = "qwen-math") -> str:
    """The prompt for `problem` in one of `MATH_TEMPLATES`, as an explicit string.

    Templates (no tokenizer needed, so prompts do not depend on a model folder):
    - "qwen-math": Qwen2.5-Math ChatML, system turn "Please reason step by step, and put your final
      answer within \\boxed{}." (Qwen2.5-Math harness, "qwen25-math-cot").
    - "qwen3": Qwen3 ChatML, user turn = problem + the same instruction, thinking mode ON (the
      assistant turn is open; the model writes `<think>...</think>` before its answer).
    - "qwen3-nothink": as "qwen3" with thinking OFF (`enable_thinking=False`: empty think block).
    - "plain": "Question: {problem}\\n{instruction}\\nAnswer:" for base models.

    The statement is inserted verbatim (no `str.format`, so LaTeX braces are safe).

    Raises:
        ValueError: unknown `template` (the message lists the known ones).
    """
    text = problem.problem
    if template == "qwen-math":
        return _QWEN_MATH_HEAD + text + _QWEN_MATH_TAIL
    if template == "qwen3":
        return _QWEN3_HEAD + text + _QWEN3_TAIL
    if template == "qwen3-nothink":
        return _QWEN3_HEAD + text + _QWEN3_TAIL + _QWEN3_EMPTY_THINK
    if template == "plain":
        return _PLAIN_HEAD + text + _PLAIN_TAIL
    raise ValueError(f"template: expected one of {MATH_TEMPLATES}, got {template!r}")


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
# Grader processes kept at most; one is started per concurrently grading thread, on demand.
MAX_GRADER_PROCESSES = max(1, min(4, os.cpu_count() or 1))


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


@lru_cache(maxsize=1)
def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as e:
        raise RuntimeError(
            "grading math answers needs math-verify: pip install 'math-verify[antlr4_13_2]'"
        ) from e
    # We run math-verify with its timeouts off and bound time ourselves (see
    # `answers_equivalent`); its one-time warning that timeouts are off is therefore noise.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return math_verify


@lru_cache(maxsize=1)
def _extraction_config() -> tuple[Any, ...]:
    # Only LaTeX extraction, boxed first: the input is always `\boxed{answer}`. The plain
    # expression extractor (ExprExtractionConfig) is left out because, when the LaTeX parse of a
    # garbled answer fails, it falls back to any number in the text, which could match by chance.
    mv = _math_verify()
    return (mv.LatexExtractionConfig(boxed_match_priority=0),)


@lru_cache(maxsize=1024)
def _parse_boxed(answer: str) -> tuple[Any, ...]:
    # Cached because a group of G responses shares one gold answer.
    mv = _math_verify()
    parsed = mv.parse(
        "\\boxed{" + answer + "}", extraction_config=_extraction_config(), parsing_timeout=None
    )
    return tuple(parsed)


def _verify_here(gold: str, pred: str) -> bool:
    """math-verify in this process with its timeouts off (thread-safe, unbounded)."""
    mv = _math_verify()
    try:
        return bool(
            mv.verify(list(_parse_boxed(gold)), list(_parse_boxed(pred)), timeout_seconds=None)
        )
    except Exception:
        # math-verify already maps its own errors to False (raise_on_error=False); this only
        # catches what escapes it, e.g. RecursionError on deeply nested input.
        return False


# The child's program: import this module from the package and serve requests on stdin/stdout.
_GRADER_BOOT = "from llm.tasks.math import _serve_grader; _serve_grader()"
# The directory holding the `llm` package, put on the child's PYTHONPATH.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_START_TIMEOUT_S = 120.0


class _GraderProcess:
    """One child Python process that answers `{"gold", "pred"}` lines with `{"correct"}` lines."""

    # Set once any grader of this process has started: from then on a failed restart is a
    # transient fault (counted as a timed-out answer), not a broken installation (raised).
    started_once = False

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def judge(self, gold: str, pred: str, timeout_s: float) -> tuple[bool, bool]:
        if self._proc is None or self._proc.poll() is not None:
            try:
                self._start()
            except RuntimeError:
                if not _GraderProcess.started_once:
                    raise
                _logger.warning("math grader process failed to restart", exc_info=True)
                return False, True
        assert self._proc is not None
        request = json.dumps({"gold": gold, "pred": pred}).encode() + b"\n"
        deadline = time.monotonic() + timeout_s
        try:
            # The child has read every earlier request, so this short line fits in the empty
            # pipe buffer and the write does not block.
            _write_all(self._proc, request)
            line = self._read_line(deadline)
        except (OSError, EOFError):
            self.kill()
            return False, True
        if line is None:
            self.kill()
            return False, True
        try:
            return bool(json.loads(line)["correct"]), False
        except (ValueError, KeyError, TypeError):
            self.kill()
            return False, True

    def _start(self) -> None:
        self.kill()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
        )
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _GRADER_BOOT],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                bufsize=0,
            )
        except OSError as e:
            raise RuntimeError(f"math grader process failed to start: {e}") from e
        try:
            line = self._read_line(time.monotonic() + _START_TIMEOUT_S)
        except (OSError, EOFError):
            line = None
        ready = None
        if line is not None:
            try:
                ready = json.loads(line)
            except ValueError:
                ready = None
        if not isinstance(ready, dict) or ready.get("ready") is not True:
            self.kill()
            reason = (
                ready.get("error")
                if isinstance(ready, dict)
                else "no answer from it (see its stderr)"
            )
            raise RuntimeError(f"math grader process failed to start: {reason}")
        _GraderProcess.started_once = True

    def _read_line(self, deadline: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        # poll, not select: select fails on descriptors above 1023, common in a trainer process.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not poller.poll(math.ceil(remaining * 1000)):
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("grader process closed its output")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def kill(self) -> None:
        proc, self._proc = self._proc, None
        self._buffer = b""
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def abandon(self) -> None:
        """Forget a process inherited through `fork`: close our copies of its pipes, never kill."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
            proc.returncode = 0  # so that Popen.__del__ does not track a process we do not own


def _write_all(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    view = memoryview(data)
    while view:
        written = proc.stdin.write(view)
        view = view[written or 0 :]


class _GraderPool:
    """Up to `MAX_GRADER_PROCESSES` grader processes, each serving one calling thread at a time."""

    def __init__(self) -> None:
        self._reset()
        atexit.register(self.close)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._idle: list[_GraderProcess] = []
        self._all: list[_GraderProcess] = []

    def judge(self, gold: str, pred: str, timeout_s: float) -> tuple[bool, bool]:
        with self._cond:
            while not self._idle and len(self._all) >= MAX_GRADER_PROCESSES:
                self._cond.wait()
            if self._idle:
                grader = self._idle.pop()
            else:
                grader = _GraderProcess()
                self._all.append(grader)
        try:
            return grader.judge(gold, pred, timeout_s)
        finally:
            with self._cond:
                self._idle.append(grader)
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            graders = list(self._all)
        for grader in graders:
            grader.kill()

    def after_fork_in_child(self) -> None:
        # A forked child shares the parent's pipes (and maybe a held lock): start afresh.
        for grader in self._all:
            grader.abandon()
        self._reset()


_GRADERS = _GraderPool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_GRADERS.after_fork_in_child)


def _serve_grader() -> None:
    """Main loop of a grader process: one JSON request per stdin line, one reply per line."""
    # Ctrl-C in a terminal reaches the whole process group; the parent decides when we stop (it
    # closes our stdin or kills us), so a KeyboardInterrupt here would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Replies go to a private copy of stdout; anything else printed lands on stderr, so that no
    # stray output can corrupt the protocol.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    try:
        _math_verify()
    except RuntimeError as e:
        replies.write(json.dumps({"ready": False, "error": str(e)}) + "\n")
        replies.flush()
        return
    # Warm up (ANTLR parser set-up, SymPy caches: about 0.4 s) before reporting ready, so that
    # the first request's time limit is spent on the request.
    _verify_here("\\frac{1}{2}", "0.5")
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            correct = _verify_here(str(request["gold"]), str(request["pred"]))
        except Exception:
            correct = False
        replies.write(json.dumps({"correct": correct}) + "\n")
        replies.flush()


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
    """Read problems from a local `.jsonl`, `.json` or `.parquet` file, detecting the layout.

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
    lists, or JSON Lines.

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
    else:
        raise ValueError(f"{path}: expected a .jsonl, .json or .parquet file")
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
            f"{path}: reading Parquet needs pyarrow (pip install 'sharpening[llm]'); "
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


# --------------------------------------------------------------------------------------------------
# Offline generator

_EXPRESSION_PHRASES = (
    "What is ${}$?",
    "Compute ${}$.",
    "Evaluate ${}$.",
    "Find the value of ${}$.",
)
_NAMES = ("Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana")
_ITEMS = ("apples", "marbles", "stickers", "books", "coins", "shells")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2}
_LATEX_OPS = {"+": "+", "-": "-", "*": "\\times"}


def generate_math_problems(
    n: int,
    *,
    seed: int | np.random.Generator,
    num_operands: int | Sequence[int] = (2, 3),
    max_number: int = 20,
    max_answer: int = 999,
    word_fraction: float = 0.5,
    max_tries: int = 10_000,
) -> list[MathProblem]:
    """`n` arithmetic problems with non-negative integer answers, deterministic given `seed`.

    Each problem is, with probability `word_fraction`, a one-step word problem ("Ava has 12
    marbles and gets 7 more. ...", addition, subtraction or multiplication) and otherwise an
    expression over `num_operands` numbers in `[1, max_number]` with `+`, `-` and `\\times`
    (e.g. "What is $17 + 5 \\times 3$?"), drawn as a random tree and printed with the parentheses
    precedence needs. Answers lie in `[0, max_answer]` (else the draw is repeated). Ids are
    "arith-<i>", `source` "arithmetic", `subject` "Arithmetic". For offline pipelines and tests;
    no relation to competition difficulty.

    Raises:
        ValueError: an argument is out of range.
        RuntimeError: `max_tries` draws in a row gave no answer in range.
    """
    sizes = (num_operands,) if isinstance(num_operands, int) else tuple(num_operands)
    if n < 0:
        raise ValueError(f"n: expected >= 0, got {n}")
    if not sizes or any(not isinstance(k, int) or k < 2 for k in sizes):
        raise ValueError(f"num_operands: expected integers >= 2, got {num_operands!r}")
    if max_number < 1 or max_answer < 0:
        raise ValueError(
            f"max_number, max_answer: expected >= 1 and >= 0, got {max_number}, {max_answer}"
        )
    if not 0.0 <= word_fraction <= 1.0:
        raise ValueError(f"word_fraction: expected a probability, got {word_fraction}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    problems = []
    for i in range(n):
        word = bool(rng.random() < word_fraction)
        for _ in range(max_tries):
            if word:
                text, value = _word_problem(rng, max_number)
            else:
                text, value = _expression_problem(rng, sizes, max_number)
            if 0 <= value <= max_answer:
                problems.append(
                    MathProblem(text, str(value), f"arith-{i}", "arithmetic", "", "Arithmetic")
                )
                break
        else:
            raise RuntimeError(f"no answer in [0, {max_answer}] after {max_tries} draws")
    return problems


def _expression_problem(
    rng: np.random.Generator, sizes: tuple[int, ...], max_number: int
) -> tuple[str, int]:
    k = int(sizes[rng.integers(len(sizes))])
    latex, value, _ = _random_tree([int(x) for x in rng.integers(1, max_number + 1, k)], rng)
    phrase = _EXPRESSION_PHRASES[int(rng.integers(len(_EXPRESSION_PHRASES)))]
    return phrase.format(latex), value


def _random_tree(nums: list[int], rng: np.random.Generator) -> tuple[str, int, int]:
    """(LaTeX, value, precedence) of a random expression over `nums` in order."""
    if len(nums) == 1:
        return str(nums[0]), nums[0], 3
    split = int(rng.integers(1, len(nums)))
    op = "+-*"[int(rng.integers(3))]
    left, lv, lp = _random_tree(nums[:split], rng)
    right, rv, rp = _random_tree(nums[split:], rng)
    prec = _PRECEDENCE[op]
    if lp < prec:
        left = f"({left})"
    # a - (b + c) and a - (b - c) need their parentheses; a + (b - c) does not, but keep it simple.
    if rp < prec or (rp == prec and op == "-"):
        right = f"({right})"
    value = lv + rv if op == "+" else lv - rv if op == "-" else lv * rv
    return f"{left} {_LATEX_OPS[op]} {right}", value, prec


def _word_problem(rng: np.random.Generator, max_number: int) -> tuple[str, int]:
    name = _NAMES[int(rng.integers(len(_NAMES)))]
    item = _ITEMS[int(rng.integers(len(_ITEMS)))]
    a, b = (int(x) for x in rng.integers(1, max_number + 1, 2))
    kind = int(rng.integers(3))
    if kind == 0:
        text = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        return text, a + b
    if kind == 1:
        a, b = max(a, b), min(a, b)
        text = f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?"
        return text, a - b
    text = f"{name} buys {a} bags with {b} {item} in each bag. How many {item} is that in total?"
    return text, a * b


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
