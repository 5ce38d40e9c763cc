"""Math problems: a statement and a ground-truth answer (`MathProblem`), the prompt templates
(`MATH_TEMPLATES`) and an offline generator of arithmetic problems."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

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
