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

from typing import Any, Literal

from llm.tasks.countdown.grading import FORMAT_SCORE, compute_score, extract_answer
from llm.tasks.countdown.loaders import load_problems
from llm.tasks.countdown.problem import CountdownProblem, generate_problems
from llm.tasks.countdown.solver import count_solutions
from llm.tasks.expr import (
    OPS,
    Expr,
    parse_expression,
    solution_key,
    to_infix,
)
from llm.tasks.registry import Task

TemplateName = Literal["base", "qwen-instruct", "compact", "chatml-fewshot"]
TEMPLATES: tuple[str, ...] = ("base", "qwen-instruct", "compact", "chatml-fewshot")

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

# For a small chat model that cannot yet follow the instruction (SmolLM2-135M-Instruct: 0.00 pass@1
# and format rate with `qwen-instruct`, docs/gpu.md): ChatML with four solved two-number problems as
# earlier turns (one per operation), answer only, no reasoning; the assistant turn is left open.
_SHOT = "<|im_start|>user\nUsing the numbers {nums}, write an equation whose value is {target}.<|im_end|>\n"
_SHOTS = (
    ([3, 5], 8, "3 + 5"),
    ([20, 6], 14, "20 - 6"),
    ([12, 4], 3, "12 / 4"),
    ([7, 9], 63, "7 * 9"),
)
_CHATML_FEWSHOT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    + "".join(
        _SHOT.format(nums=str(n), target=t)
        + f"<|im_start|>assistant\n<answer> {a} </answer><|im_end|>\n"
        for n, t, a in _SHOTS
    )  # the solved turns hold no braces: the result formats like `_SHOT`
    + _SHOT
    + "<|im_start|>assistant\n"
)

# The compact template of the offline tiny model: every token a space-separated word.
COMPACT_WORDS: tuple[str, ...] = ("nums", "target", ":", "<answer>", "</answer>", "(", ")", *OPS)


def make_prompt(problem: CountdownProblem, template: TemplateName = "base") -> str:
    """The prompt for `problem` in one of `TEMPLATES`.

    `base` and `qwen-instruct` end with the `<think>` lead-in of TinyZero; the answer is expected on
    the last line, in `<answer> ... </answer>`. `chatml-fewshot` shows four solved problems as
    earlier ChatML turns and expects the answer alone. `compact` is `nums 3 5 7 target 22 :`; the tiny
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
    if template == "chatml-fewshot":
        return _CHATML_FEWSHOT.format(**fields)
    raise ValueError(f"template: expected one of {TEMPLATES}, got {template!r}")


def compact_completion(solution: Expr) -> str:
    """`<answer> ( 3 + 5 ) * 2 </answer>`: the completion of a compact prompt, one word per token."""
    return f"<answer> {to_infix(solution, spaced=True)} </answer>"


def compact_words(max_number: int) -> list[str]:
    """Every word of the compact format whose numbers (operands and targets) are `<= max_number`."""
    return [*COMPACT_WORDS, *(str(i) for i in range(max_number + 1))]


# --------------------------------------------------------------------------------------------------
# Verifier


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
    answer = extract_answer(text)
    expr = None if answer is None else parse_expression(answer)
    return None if expr is None else solution_key(expr, distinct=distinct)


def _describe(problem: CountdownProblem) -> dict[str, Any]:
    return {"nums": list(problem.nums), "target": problem.target}


# The exhaustive solver's cost grows factorially with the numbers; beyond 5 the count is skipped.
_COUNTED_NUMBERS = 5


def _solution_count(problem: CountdownProblem, distinct: str) -> int | None:
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
