"""The task registry: every task with a verifiable reward, by name.

A task is one frozen `Task` record of plain functions: where its problems come from (`load`,
`generate`), how a problem becomes a prompt (`prompt`), how a response is rewarded (`score`) and
what counts as the same answer (`answer_key`, used for distinct answers in `llm.eval.heldout` and DSDR's
formula uniqueness in `llm.eval.diversity`). The trainer, the evaluator and the config look tasks up in
`TASKS` by the config's ``task`` name and never inspect a problem's type, so adding a task is one
module defining a `Task` plus one `register_task` call (see `llm.tasks.__init__`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from shaping import code_digest

__all__ = ["TASKS", "Problem", "Task", "UnknownTaskError", "register_task"]

Problem = Any
"""A task's own problem record (frozen dataclass); only its `Task` reads its fields."""


def _no_fields(problem: Problem) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Task:
    """One task: problems, prompts, rewards and answer identity.

    Attributes:
        name: registry key, the config's ``task``.
        templates: prompt template names `prompt` accepts (the config's ``template`` must be one).
        load: ``load(path) -> list[Problem]`` from a local file. Raises ``ValueError`` naming the
            file (and line or row) for bad content, ``FileNotFoundError`` for a missing file.
        generate: ``generate(n, seed, data=None) -> list[Problem]``, deterministic given `seed`;
            `data` is the config's ``[data]`` table (`llm.config.DataConfig`, bounds of the
            generator) or None for the task's defaults.
        prompt: ``prompt(problem, template) -> str``.
        score: ``score(text, problem, format_score=...) -> float``: 1.0 iff the response is
            correct, `format_score` if it is well-formed but wrong, else 0.0. Never raises on a
            ``str``.
        answer_key: ``answer_key(text, distinct="commutative") -> str | None``: the canonical form
            of the response's final answer (equal keys = the same answer), None if it states
            none. `distinct` is the config's ``distinct`` (Countdown's solution equivalence);
            tasks with a single canonical form ignore it.
        formulas: ``formulas(text, distinct="commutative") -> frozenset[str]``, DSDR's ``F_i``
            (seed 001 Eq. 7-8, docs/formulas.md §DSDR: the mathematical expressions of a
            response); None means ``{answer_key(text)}`` (empty without an answer).
        describe: ``describe(problem) -> dict``: JSON-ready fields that identify a problem in
            ``eval.json``'s ``per_problem`` (e.g. Countdown's nums and target, math's id).
        solution_count: ``solution_count(problem, distinct) -> int | None``: how many distinct
            correct answers exist (None if unknown); when set, evaluation reports
            ``solution_coverage``.
        format_key: another name under which evaluation reports ``format_rate`` (math's older
            ``boxed_rate``), or None.
        tiny_data: whether `llm.model.tiny`'s train and held-out streams (``data.source = "tiny"``)
            hold this task's problems.
        code: set by `register_task` for a task whose functions are defined outside the package
            (a user's ``--import``): the SHA-256 (16 hex digits) of their files as registered
            (`shaping.code_digest`), which run reuse, evaluation reuse and ``--resume`` are keyed
            by (an edited task's runs train again); None for the package's tasks.
    """

    name: str
    templates: tuple[str, ...]
    load: Callable[[str | os.PathLike[str]], list[Problem]]
    generate: Callable[..., list[Problem]]
    prompt: Callable[[Problem, str], str]
    score: Callable[..., float]
    answer_key: Callable[..., str | None]
    formulas: Callable[..., frozenset[str]] | None = None
    describe: Callable[[Problem], dict[str, Any]] = field(default=_no_fields)
    solution_count: Callable[[Problem, str], int | None] | None = None
    format_key: str | None = None
    tiny_data: bool = False
    code: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"name: expected an identifier-like string, got {self.name!r}")
        if not self.templates or not all(isinstance(t, str) and t for t in self.templates):
            raise ValueError(
                f"templates: expected a non-empty tuple of names (task {self.name!r}), "
                f"got {self.templates!r}"
            )
        object.__setattr__(self, "templates", tuple(self.templates))

    def formula_set(self, text: str, distinct: str = "commutative") -> frozenset[str]:
        """DSDR's ``F_i`` of one response (see `formulas`)."""
        if self.formulas is not None:
            return self.formulas(text, distinct=distinct)
        key = self.answer_key(text, distinct=distinct)
        return frozenset() if key is None else frozenset({key})


class UnknownTaskError(KeyError, ValueError):
    """`TASKS[name]` of an unregistered name; the message lists the known names.

    A `KeyError` for the mapping protocol (``in``, ``.get``) and a `ValueError` for callers that
    report bad input (the config, the command line)."""

    def __str__(self) -> str:
        return str(self.args[0])


class _Registry(Mapping[str, Task]):
    """Read-only ``name -> Task``; a miss raises `UnknownTaskError` naming the known tasks."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def __getitem__(self, name: str) -> Task:
        try:
            return self._tasks[name]
        except (KeyError, TypeError):
            raise UnknownTaskError(f"unknown task {name!r}; known: {sorted(self._tasks)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def __repr__(self) -> str:
        return f"TASKS({sorted(self._tasks)})"


TASKS: Mapping[str, Task] = _Registry()
"""Every registered task by name (read-only; add with `register_task`)."""


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # llm/


def register_task(task: Task) -> Task:
    """Add `task` to `TASKS` and return the registered record: `task` with its `Task.code` (the
    digest of its functions' files where they are not the package's).

    Raises:
        ValueError: a task of that name is already registered, or `task` is not a `Task`.
    """
    if not isinstance(task, Task):
        raise ValueError(f"task: expected a llm.tasks.Task, got {type(task).__name__}")
    tasks = TASKS._tasks  # type: ignore[attr-defined]
    if task.name in tasks:
        raise ValueError(f"task {task.name!r} is already registered")
    functions = [getattr(task, f.name) for f in fields(task)]
    code = code_digest([f for f in functions if callable(f)], _PACKAGE)
    if code != task.code:  # a copy of another task: its code is its own
        task = replace(task, code=code)
    tasks[task.name] = task
    return task
