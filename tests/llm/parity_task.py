"""A new task in one file: the parity of a few bits, registered as ``TASKS["parity"]``.

The prompt ``nums 1 0 1 :`` uses only words of the tiny model's vocabulary (`llm.model.tiny`); the
answer is ``<answer> 0 </answer>`` (even number of ones) or ``<answer> 1 </answer>``. This is what
a contributor writes to add a task: problems, a generator, a loader, a prompt, a verifier and an
answer key, then one `register_task` call; nothing else in the package changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import numpy as np

from llm.tasks import TASKS, Task, extract_answer, register_task
from llm.tasks.io import jsonl_rows


@dataclass(frozen=True)
class ParityProblem:
    """Bits whose parity (sum mod 2) is the answer."""

    bits: tuple[int, ...]

    @property
    def parity(self) -> int:
        return sum(self.bits) % 2


def generate(n: int, seed: int, data: Any = None) -> list[ParityProblem]:
    """`n` problems of 3 to 5 random bits, deterministic given `seed`."""
    rng = np.random.default_rng(seed)
    return [
        ParityProblem(tuple(int(b) for b in rng.integers(0, 2, size=int(rng.integers(3, 6)))))
        for _ in range(n)
    ]


def load(path: str | os.PathLike[str]) -> list[ParityProblem]:
    """``{"bits": [0, 1, ...]}`` per line of a JSON Lines file.

    Raises:
        ValueError: a bad line (named with the file and line).
    """
    problems = []
    for where, row in jsonl_rows(Path(path)):
        bits = row.get("bits") if isinstance(row, dict) else None
        if not isinstance(bits, list) or not bits or any(b not in (0, 1) for b in bits):
            raise ValueError(
                f"{where}: field 'bits': expected a non-empty list of 0/1, got {bits!r}"
            )
        problems.append(ParityProblem(tuple(bits)))
    return problems


def prompt(problem: ParityProblem, template: str) -> str:
    return "nums " + " ".join(map(str, problem.bits)) + " :"


def answer_key(text: str, distinct: str = "commutative") -> str | None:
    answer = extract_answer(text)
    return answer if answer in ("0", "1") else None


def score(text: str, problem: ParityProblem, *, format_score: float = 0.0) -> float:
    key = answer_key(text)
    if key is None:
        return format_score if extract_answer(text) is not None else 0.0
    return 1.0 if int(key) == problem.parity else format_score


PARITY = Task(
    name="parity",
    templates=("bits",),
    load=load,
    generate=generate,
    prompt=prompt,
    score=score,
    answer_key=answer_key,
    describe=lambda p: {"bits": list(p.bits)},
)

if "parity" not in TASKS:  # the module may be imported under two names by pytest
    register_task(PARITY)
