"""The trainer's and evaluator's view of a task: problems, prompts and rewards.

Two tasks share one trainer: Countdown (`llm.tasks.countdown`, seed 000 App. C.1) and competition
math with boxed answers graded by math-verify (`llm.tasks.math`). Prompting and scoring dispatch
on the problem's type, so a batch never needs the config to be scored.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm.tasks import CountdownProblem, compute_score, generate_problems, load_problems, make_prompt
from llm.tasks.math import (
    MathProblem,
    compute_math_score,
    generate_math_problems,
    load_math_problems,
    make_math_prompt,
)

if TYPE_CHECKING:
    from llm.config import TrainConfig

__all__ = ["Problem", "load_eval_sets", "load_train_problems", "prompt_for", "score_for"]

Problem = CountdownProblem | MathProblem


def prompt_for(problem: Problem, template: str) -> str:
    """The prompt text of `problem` in `template` (a Countdown or a math template)."""
    if isinstance(problem, MathProblem):
        return make_math_prompt(problem, template)
    return make_prompt(problem, template)


def score_for(text: str, problem: Problem, *, format_score: float) -> float:
    """Verifier reward of one response: 1 correct, `format_score` well-formed but wrong, else 0."""
    if isinstance(problem, MathProblem):
        return compute_math_score(text, problem, format_score=format_score)
    return compute_score(text, problem, format_score=format_score)


def _generated(cfg: TrainConfig, n: int, seed: int) -> list[Any]:
    if cfg.task == "math":
        return generate_math_problems(n, seed=seed)
    d = cfg.data
    return generate_problems(
        n,
        seed=seed,
        num_numbers=tuple(d.num_numbers),
        min_number=d.min_number,
        max_number=d.max_number,
        min_target=d.min_target,
        max_target=d.max_target,
    )


def _from_file(task: str, path: str) -> list[Any]:
    problems = load_math_problems(path) if task == "math" else load_problems(path)
    if not problems:
        raise ValueError(f"{path}: holds no problems")
    return problems


def load_train_problems(cfg: TrainConfig) -> list[Problem]:
    """The training problems of ``cfg.data``: llm.tiny's train stream (Countdown), a local file,
    or generated with ``data.seed``.

    Raises:
        ValueError: an empty or malformed file (the loaders name the row and field).
        FileNotFoundError: ``data.path`` does not exist.
    """
    d = cfg.data
    if d.source == "tiny":
        from llm.tiny import TinyConfig, tiny_problems

        return tiny_problems(TinyConfig(), "train", d.n_problems)
    if d.source == "file":
        return _from_file(cfg.task, d.path)
    return _generated(cfg, d.n_problems, d.seed)


def load_eval_sets(cfg: TrainConfig) -> dict[str, list[Problem]]:
    """Held-out problems of ``cfg.eval`` by set name: ``{"heldout": [...]}`` for the tiny and
    generated sources, ``{file stem: [...]}`` per file of ``eval.paths`` (each cut to
    ``eval.n_problems``)."""
    e = cfg.eval
    if e.source == "tiny":
        from llm.tiny import TinyConfig, tiny_problems

        return {"heldout": tiny_problems(TinyConfig(), "heldout", e.n_problems)}
    if e.source == "generate":
        return {"heldout": _generated(cfg, e.n_problems, e.seed)}
    return {Path(p).stem: _from_file(cfg.task, p)[: e.n_problems] for p in e.paths}
