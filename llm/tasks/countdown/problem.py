"""Countdown problems: numbers and a target (seed 000, App. C.1; Countdown-Tasks-3to4 columns
`target`, `nums`), a generator of solvable ones and the reading of one data row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llm.tasks.expr import (
    OPS,
    Expr,
    evaluate,
)


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
