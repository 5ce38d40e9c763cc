"""The registry of theorem checkers behind `python -m theory check`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Status = Literal["holds", "counterexample"]


@dataclass
class CheckResult:
    """What one checker found over its random instances.

    Attributes:
        trials: instances checked.
        violations: instances that violate the claim *as the project documents it* (exit code 1).
        max_residual: largest numerical residual seen (e.g. |closed form − numerical optimum|, or the
            amount by which an inequality failed); 0.0 when the check is purely combinatorial.
        counterexamples: instances where the paper's claim, read literally, fails although the
            project documents why (the status is then "counterexample"; no exit 1).
        details: JSON-serializable extra facts (e.g. a minimal counterexample).
    """

    trials: int
    violations: int = 0
    max_residual: float = 0.0
    counterexamples: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> Status:
        return "counterexample" if self.counterexamples > 0 else "holds"


CheckFn = Callable[[np.random.Generator, int], CheckResult]


@dataclass(frozen=True)
class Checker:
    """A numerical check of one claim: `run(rng, trials) -> CheckResult`."""

    name: str
    source: str
    claim: str
    run: CheckFn
    default_trials: int


CHECKERS: dict[str, Checker] = {}


def register(
    name: str, *, source: str, claim: str, trials: int = 20
) -> Callable[[CheckFn], CheckFn]:
    """Decorator adding a checker to `CHECKERS`.

    Raises:
        ValueError: a checker of that name is already registered.
    """

    def wrap(fn: CheckFn) -> CheckFn:
        if name in CHECKERS:
            raise ValueError(f"checker {name!r} is already registered")
        CHECKERS[name] = Checker(
            name=name, source=source, claim=claim, run=fn, default_trials=trials
        )
        return fn

    return wrap


def checker_rng(seed: int, name: str) -> np.random.Generator:
    """An RNG per (seed, checker), so a checker's instances do not depend on which others ran."""
    return np.random.default_rng([seed, *name.encode()])
