"""Arithmetic expressions over integers with `+ - * /`: a bounded parser, exact evaluation, canonical forms.

This is the safe replacement for the `eval` in TinyZero's Countdown reward
(`verl/utils/reward_score/countdown.py`, Jiayi-Pan/TinyZero): text is parsed with `ast` in
`mode="eval"` and walked, never executed, and values are exact `fractions.Fraction`s.

An expression is a tree, `Expr = int | tuple[op, Expr, Expr]` with `op` one of `"+", "-", "*", "/"`:
a leaf is a non-negative integer literal, a node a binary operation. Parentheses are not stored;
`to_infix` puts back exactly those needed to re-parse the same tree.

Two canonical forms name the classes of "the same solution" (see `commutative_key`, `ac_key`);
the Countdown solver and the evaluation of distinct correct answers both use them.
"""

from __future__ import annotations

import ast
from fractions import Fraction
from typing import Literal, TypeAlias

Expr: TypeAlias = "int | tuple[str, Expr, Expr]"

OPS: tuple[str, ...] = ("+", "-", "*", "/")

# Bounds on untrusted text. A Countdown answer with 6 two-digit numbers is about 50 characters,
# 11 nodes, at most 6 levels deep; the bounds leave room for any honest answer and keep work tiny.
MAX_EXPRESSION_CHARS = 200
MAX_NODES = 63
MAX_DEPTH = 32

# TinyZero's whitelist is `^[\d+\-*/().\s]+$`. We keep its operators and parentheses but take ASCII
# digits only (`\d` also matches e.g. Arabic-Indic digits) and drop `.`: a float literal is never a
# valid Countdown number here (TinyZero would accept `3. + 5.` through `eval`). `\n` cannot occur
# because the verifier only looks at the last line.
_ALLOWED_CHARS = frozenset("0123456789+-*/() \t\r\f\v")

_AST_OPS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_COMMUTATIVE = frozenset("+*")


class _Rejected(Exception):
    """Internal: the text is not an expression of the allowed grammar or exceeds a bound."""


def parse_expression(text: str) -> Expr | None:
    """Parse `text` into an `Expr`, or `None` when it is not one. Never raises, never executes.

    Grammar: non-negative integer literals, binary `+ - * /`, parentheses, ASCII whitespace.
    Rejected (returns `None`): more than `MAX_EXPRESSION_CHARS` characters, any other character,
    a syntax error (including Python's ban on leading zeros such as `07`), unary `+`/`-`, `**`,
    `//`, `%`, float literals, calls, names, more than `MAX_NODES` nodes or `MAX_DEPTH` levels.
    """
    if not isinstance(text, str) or len(text) > MAX_EXPRESSION_CHARS:
        return None
    if not text.strip() or not _ALLOWED_CHARS.issuperset(text):
        return None
    try:
        # The length and character bounds make the parser's own limits (200 nested parentheses)
        # unreachable; the except clause is the last line of defence, not the expected path.
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    budget = [MAX_NODES]
    try:
        return _convert(tree.body, 1, budget)
    except _Rejected:
        return None


def _convert(node: ast.AST, depth: int, budget: list[int]) -> Expr:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise _Rejected
    if isinstance(node, ast.Constant):
        # `type(...) is int` rather than isinstance: rejects bool (cannot arise from the character
        # set, but the check costs nothing) and keeps floats and complex out.
        if type(node.value) is int and node.value >= 0:
            return node.value
        raise _Rejected
    if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
        left = _convert(node.left, depth + 1, budget)
        right = _convert(node.right, depth + 1, budget)
        return (_AST_OPS[type(node.op)], left, right)
    raise _Rejected


def evaluate(expr: Expr) -> Fraction | None:
    """Exact value of `expr`; `None` if any division has a zero divisor."""
    if isinstance(expr, int):
        return Fraction(expr)
    op, left, right = expr
    a = evaluate(left)
    if a is None:
        return None
    b = evaluate(right)
    if b is None:
        return None
    return apply_op(op, a, b)


def apply_op(op: str, a: Fraction, b: Fraction) -> Fraction | None:
    """`a op b` exactly; `None` for division by zero."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return None
    return a / b


def leaves(expr: Expr) -> list[int]:
    """The integer literals of `expr`, left to right."""
    if isinstance(expr, int):
        return [expr]
    return leaves(expr[1]) + leaves(expr[2])


def to_infix(expr: Expr, *, spaced: bool = False) -> str:
    """Render `expr` with the fewest parentheses that re-parse to the same tree.

    Python's parser is left-associative, so a right operand of equal precedence keeps its
    parentheses (`a - (b - c)`, and also `a + (b + c)`: dropping them would give another tree).
    With `spaced=True` every token is a separate word (`( 3 + 5 ) * 2`), for word-level tokenizers.
    """
    tokens = _infix_tokens(expr)
    if spaced:
        return " ".join(tokens)
    out: list[str] = []
    for tok in tokens:
        if tok in _PRECEDENCE:
            out.append(f" {tok} ")
        else:
            out.append(tok)
    return "".join(out)


def _infix_tokens(expr: Expr) -> list[str]:
    if isinstance(expr, int):
        return [str(expr)]
    op, left, right = expr
    p = _PRECEDENCE[op]
    lt = _infix_tokens(left)
    rt = _infix_tokens(right)
    if not isinstance(left, int) and _PRECEDENCE[left[0]] < p:
        lt = ["(", *lt, ")"]
    if not isinstance(right, int) and _PRECEDENCE[right[0]] <= p:
        rt = ["(", *rt, ")"]
    return [*lt, op, *rt]


def node_key(op: str, left_key: str, right_key: str) -> tuple[str, bool]:
    """Commutative key of `(op, left, right)` from its children's keys, and whether to swap them.

    Shared by `commutative_key` and the solver, which builds keys bottom-up, so both agree exactly.
    """
    swap = op in _COMMUTATIVE and right_key < left_key
    if swap:
        left_key, right_key = right_key, left_key
    return f"({left_key}{op}{right_key})", swap


def commutative_key(expr: Expr) -> str:
    """Canonical form modulo commutativity of `+` and `*`.

    Fully parenthesized; the operands of `+` and `*` are ordered by their own keys (as strings).
    Two expressions share a key iff they are the same tree after swapping operands of `+`/`*`.
    Equal numbers are indistinguishable (`3 + 3` from either 3 is one expression).
    """
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr
    return node_key(op, commutative_key(left), commutative_key(right))[0]


def canonical_commutative(expr: Expr) -> Expr:
    """The representative tree of `expr`'s `commutative_key` class (operands of `+`/`*` ordered)."""
    if isinstance(expr, int):
        return expr
    op, left, right = expr
    left, right = canonical_commutative(left), canonical_commutative(right)
    _, swap = node_key(op, commutative_key(left), commutative_key(right))
    return (op, right, left) if swap else (op, left, right)


def ac_key(expr: Expr) -> str:
    """Canonical form modulo commutativity and associativity (with `-` and `/` as inverses).

    A maximal `+`/`-` subtree is flattened into a multiset of signed terms and a maximal `*`/`/`
    subtree into a multiset of factors with exponent ±1, so that e.g. `a + b + c` (any bracketing
    and order), `a - (b - c)` = `a + c - b` and `a / (b / c)` = `a * c / b` each form one class.
    Not identified: distributivity and sign or reciprocal rewrites such as `(a - b) * (c - d)` vs
    `(b - a) * (d - c)`, which are counted as different solutions.
    """
    if isinstance(expr, int):
        return str(expr)
    if expr[0] in "+-":
        terms: list[tuple[bool, Expr]] = []
        _flatten(expr, True, "+", "-", terms)
        parts = sorted(("+" if pos else "-") + ac_key(t) for pos, t in terms)
        return "S[" + ",".join(parts) + "]"
    factors: list[tuple[bool, Expr]] = []
    _flatten(expr, True, "*", "/", factors)
    parts = sorted(("*" if pos else "/") + ac_key(t) for pos, t in factors)
    return "P[" + ",".join(parts) + "]"


def _flatten(expr: Expr, pos: bool, plus: str, minus: str, out: list[tuple[bool, Expr]]) -> None:
    if isinstance(expr, int) or expr[0] not in (plus, minus):
        out.append((pos, expr))
        return
    op, left, right = expr
    _flatten(left, pos, plus, minus, out)
    _flatten(right, pos if op == plus else not pos, plus, minus, out)


Distinct = Literal["commutative", "ac"]
"""What makes two solutions different: commutativity of + and *, or also associativity."""


def solution_key(expr: Expr, *, distinct: Distinct = "commutative") -> str:
    """The class key of `expr` under `distinct`: equal keys, same solution."""
    return commutative_key(expr) if distinct == "commutative" else ac_key(expr)
