"""One checker per theorem of the source papers, collected in `CHECKERS` (see `_registry`).

Importing this package imports every checker module, which registers its checkers.
"""

from tqdm import tqdm

from theory.checks import bias_and_optima, casp, dsdr, progrpo, theorem_3_4  # noqa: F401  (registration)
from theory.checks._registry import CHECKERS, Checker, CheckResult, checker_rng, register

__all__ = ["CHECKERS", "CheckResult", "Checker", "checker_rng", "register", "run_checks"]


def run_checks(
    names: list[str] | None = None, trials: int | None = None, seed: int = 0, progress: bool = False
) -> list[dict]:
    """Run the named checkers (all by default); return `{name, source, status, trials, violations,
    max_residual, ...}` rows in registry order.

    Raises:
        ValueError: an unknown checker name (the message lists the known ones), or `trials < 1`.
    """

    if trials is not None and trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials!r}")
    selected = list(CHECKERS) if not names else names
    unknown = [n for n in selected if n not in CHECKERS]
    if unknown:
        raise ValueError(f"unknown checker(s) {unknown}; known: {sorted(CHECKERS)}")
    rows = []
    for name in tqdm(selected, desc="theory check", disable=not progress, leave=False):
        chk = CHECKERS[name]
        res = chk.run(checker_rng(seed, name), trials or chk.default_trials)
        rows.append(
            {
                "name": name,
                "source": chk.source,
                "claim": chk.claim,
                "status": res.status,
                "trials": res.trials,
                "violations": res.violations,
                "counterexamples": res.counterexamples,
                "max_residual": float(res.max_residual),
                "details": res.details,
            }
        )
    return rows
