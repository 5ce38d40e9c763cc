"""Exhaustive Countdown solver and Solution Multiplicity (seed 000, Eq. 2).

"Distinct" solutions (the `distinct` argument):
- `"commutative"` (default): expression trees modulo swapping the operands of `+` and `*`
  (`expr.commutative_key`). Bracketing counts: `(a + b) + c` and `a + (b + c)` are two solutions.
- `"ac"`: modulo commutativity and associativity, `-` and `/` read as adding a negated term and
  multiplying by a reciprocal (`expr.ac_key`): `a + b + c` in every order and bracketing is one
  solution, as are `a - (b - c)` and `a + c - b`. Closer to what a person calls "a different
  solution"; seed 000 counted unique solutions with an LLM judge and gives no formal definition.
In both, equal numbers are interchangeable, intermediate values may be negative or fractional (the
verifier allows it, as TinyZero's `eval` does), and no division by zero occurs anywhere.

The fast path memoizes, per sub-multiset of the numbers, every value it can make and the canonical
expressions making it, and only combines the full set toward the target. `solve_brute_force` is the
obviously-correct reference: every tree over every ordering, every operator, then canonicalized.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fractions import Fraction
from itertools import permutations

from llm.tasks.countdown.problem import CountdownProblem
from llm.tasks.expr import (
    OPS,
    Distinct,
    Expr,
    ac_key,
    apply_op,
    evaluate,
    node_key,
    solution_key,
    to_infix,
)

# A 4-number sub-multiset has ~3,000 expressions (5 numbers: ~0.1 s per problem); a 5-number one
# ~100,000, which would make 6 numbers take seconds. Countdown-Tasks-3to4 uses 3 or 4.
MAX_SOLVER_NUMBERS = 5

# value -> {commutative key: canonical tree}
_Table = dict[Fraction, dict[str, Expr]]


def solve(problem: CountdownProblem, *, distinct: Distinct = "commutative") -> list[Expr]:
    """All distinct solutions of `problem`, one canonical tree per class, sorted by class key.

    For `"ac"` the representative of a class is its shortest rendering (ties: lexicographic).
    Render with `expr.to_infix` (`spaced=True` for the compact template).

    Raises:
        ValueError: more than `MAX_SOLVER_NUMBERS` numbers; unknown `distinct`.
    """
    if distinct not in ("commutative", "ac"):
        raise ValueError(f"distinct: expected 'commutative' or 'ac', got {distinct!r}")
    nums = tuple(sorted(problem.nums))
    if len(nums) > MAX_SOLVER_NUMBERS:
        raise ValueError(
            f"nums: the solver handles at most {MAX_SOLVER_NUMBERS} numbers, got {len(nums)}"
        )
    target = Fraction(problem.target)
    cache: dict[tuple[int, ...], _Table] = {}
    if len(nums) == 1:
        found = dict(_table(nums, cache).get(target, {}))
    else:
        found = {}
        for a, b in _splits(nums):
            _combine_to_target(_table(a, cache), _table(b, cache), found, target)
    if distinct == "commutative":
        return [found[k] for k in sorted(found)]
    classes: dict[str, Expr] = {}
    for expr in found.values():
        k = ac_key(expr)
        if k not in classes or _rank(expr) < _rank(classes[k]):
            classes[k] = expr
    return [classes[k] for k in sorted(classes)]


def _rank(expr: Expr) -> tuple[int, str]:
    s = to_infix(expr)
    return len(s), s


def count_solutions(problem: CountdownProblem, *, distinct: Distinct = "commutative") -> int:
    """Number of distinct solutions of `problem` (0 if unsolvable)."""
    return len(solve(problem, distinct=distinct))


def solution_multiplicity(
    problems: Iterable[CountdownProblem], *, distinct: Distinct = "commutative"
) -> float:
    """Solution Multiplicity: mean number of distinct correct solutions per problem (seed 000, Eq. 2).

    Raises:
        ValueError: no problems.
    """
    counts = [count_solutions(p, distinct=distinct) for p in problems]
    if not counts:
        raise ValueError("problems: expected at least one problem")
    return sum(counts) / len(counts)


def _splits(nums: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Unordered splits `{a, b}` of a sorted multiset into two non-empty sorted sub-multisets."""
    n = len(nums)
    seen = set()
    for mask in range(1, (1 << n) - 1):
        a = tuple(nums[i] for i in range(n) if mask >> i & 1)
        b = tuple(nums[i] for i in range(n) if not mask >> i & 1)
        pair = (a, b) if a <= b else (b, a)
        if pair not in seen:
            seen.add(pair)
            yield pair


def _table(nums: tuple[int, ...], cache: dict[tuple[int, ...], _Table]) -> _Table:
    """Every value reachable from the multiset `nums` and its canonical expressions (memoized)."""
    if nums in cache:
        return cache[nums]
    if len(nums) == 1:
        table: _Table = {Fraction(nums[0]): {str(nums[0]): nums[0]}}
    else:
        table = {}
        for a, b in _splits(nums):
            _combine(_table(a, cache), _table(b, cache), table)
    cache[nums] = table
    return table


def _combine(ta: _Table, tb: _Table, out: _Table) -> None:
    """Add every `x op y` to `out`: x from `ta`, y from `tb`, both operand orders for `-` and `/`."""
    for va, ea in ta.items():
        for vb, eb in tb.items():
            for op in OPS:
                for vl, el, vr, er in _orders(op, va, ea, vb, eb):
                    value = apply_op(op, vl, vr)
                    if value is not None:
                        _add_keys(op, el, er, out.setdefault(value, {}))


def _combine_to_target(ta: _Table, tb: _Table, out: dict[str, Expr], target: Fraction) -> None:
    """Add to `out` every `x op y` (as in `_combine`) whose value is `target`.

    Instead of trying all value pairs, solve `x op y = target` for `y` and look it up: linear in
    the smaller table rather than quadratic, which makes the top level cheap. The roles of the two
    tables are symmetric (both operand orders are tried), so the smaller one is scanned.
    """
    if len(ta) > len(tb):
        ta, tb = tb, ta
    for va, ea in ta.items():
        for op in OPS:
            for vb in _partners(op, va, target, tb):
                eb = tb[vb]
                for vl, el, vr, er in _orders(op, va, ea, vb, eb):
                    if apply_op(op, vl, vr) == target:
                        _add_keys(op, el, er, out)


def _partners(op: str, va: Fraction, target: Fraction, tb: _Table) -> list[Fraction]:
    """Values `vb` in `tb` with `va op vb == target` or `vb op va == target` (a superset is fine)."""
    if op == "+":
        candidates = [target - va]
    elif op == "-":
        candidates = [va - target, va + target] if target != 0 else [va]
    elif op == "*":
        if va == 0:
            return list(tb) if target == 0 else []
        candidates = [target / va]
    else:
        # va / vb = t  ->  vb = va / t;  vb / va = t  ->  vb = t * va  (va != 0).
        if target == 0:
            return list(tb)
        candidates = [va / target]
        if va != 0 and target * target != 1:
            # t = ±1 makes both equations ask for the same vb; listing it twice would only repeat work.
            candidates.append(target * va)
    return [vb for vb in candidates if vb in tb]


def _orders(
    op: str, va: Fraction, ea: dict[str, Expr], vb: Fraction, eb: dict[str, Expr]
) -> tuple[tuple[Fraction, dict[str, Expr], Fraction, dict[str, Expr]], ...]:
    # `+` and `*` need one operand order: the other gives the same keys.
    if op in "+*":
        return ((va, ea, vb, eb),)
    return ((va, ea, vb, eb), (vb, eb, va, ea))


def _add_keys(op: str, el: dict[str, Expr], er: dict[str, Expr], bucket: dict[str, Expr]) -> None:
    for kl, xl in el.items():
        for kr, xr in er.items():
            key, swap = node_key(op, kl, kr)
            if key not in bucket:
                bucket[key] = (op, xr, xl) if swap else (op, xl, xr)


def solve_brute_force(problem: CountdownProblem, *, distinct: Distinct = "commutative") -> set[str]:
    """Reference: class keys of all solutions by enumerating every tree over every ordering.

    Trees over ordered leaves with every split point and operator cover all permutations x operator
    choices x bracketings; no memoization, no pruning.
    """
    keys = set()
    for perm in set(permutations(problem.nums)):
        for expr in _trees_in_order(perm):
            if evaluate(expr) == problem.target:
                keys.add(solution_key(expr, distinct=distinct))
    return keys


def _trees_in_order(nums: tuple[int, ...]) -> Iterator[Expr]:
    if len(nums) == 1:
        yield nums[0]
        return
    for split in range(1, len(nums)):
        for left in _trees_in_order(nums[:split]):
            for right in _trees_in_order(nums[split:]):
                for op in OPS:
                    yield (op, left, right)
