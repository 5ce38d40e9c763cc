"""One sweep grammar for both drivers (``python -m toymdp sweep`` and ``python -m llm sweep``).

The keys every sweep file shares (each leg adds its own tables: the toy ``[env]`` and ``[train]``,
the LLM ``base``, ``[train]`` and ``[eval]``)::

    seeds = [0, 1, 2]            # training seeds, one run per method setting and seed (paired)
    checkpoints = 3              # evaluated steps: a count c (steps round(i·steps/c), i = 1..c)
                                 # or a list; the last step is always evaluated, step 0 is the base
    reference = ["grpo"]         # labels whose models form the reference curve (a string is one)
    tune = { lr = [0.03, 0.1] }  # tuning axes (toy: lr, kl_coef; LLM: "optim.lr", kl_coef):
                                 # their product crossed with every entry's settings, the
                                 # reference's included, so every method gets the same budget

    [[methods]]
    method = "ds_grpo"           # a `shaping.METHODS` name
    label = "ds_grpo"            # optional (default: method); unique; letters, digits, _ . + -
    fixed = { gamma_n = 0.05 }   # values every setting of the entry takes
    grid = { gamma_p = [0.3, 1.0] }               # Cartesian product of these lists
    zip = { eta_pos = [0.1, 0.3], eta_neg = [0.1, 0.3] }  # aligned lists (one axis), x grid
    # or: points = [{}, { kl_coef = 0.1 }]        # an explicit list of settings (no grid/zip)

An old spelling that was removed (the toy's ``hyper``, now ``fixed``, and ``[frontier] reference``,
now ``reference``; the LLM's ``mode = "zip"``, now ``zip``) is a one-line error naming the key that
replaced it (`removed`).
Which keys a setting may hold (a method's hyper-parameters, a leg's own keys) is the leg's call:
`parse_methods` asks it through `check_key`.

**Equal tuning budgets**: a study compares each method with GRPO's reference curve, so each method
must get the reference's tuning, or a lift says "this learning rate beats that one" rather than
anything about shaping. `tune` gives every entry the same axes; `budget_difference` (run by both
study drivers, `check_budget`) finds a method whose learning rates, ``kl_coef`` values or evaluated
checkpoints differ from the reference's, whichever way they were written.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import shaping
from experiment.cli import OWN_METHOD
from experiment.schema import apply_pairs, removed
from experiment.schema import describe as describe_options

__all__ = [
    "BUDGET_EQUAL",
    "BUDGET_UNEQUAL",
    "COMMON_KEYS",
    "METHOD_KEYS",
    "Budget",
    "MethodEntry",
    "apply_sets",
    "budget_difference",
    "check_budget",
    "confirmation_methods",
    "describe",
    "extend_checkpoints",
    "parse_checkpoints",
    "parse_methods",
    "parse_reference",
    "parse_seeds",
    "parse_tune",
    "untune",
]

COMMON_KEYS = ("seeds", "checkpoints", "reference", "tune", "methods")
"""The top-level keys every sweep file may hold (besides its leg's tables)."""
METHOD_KEYS = ("method", "label", "fixed", "grid", "zip", "points")
"""The keys of one ``[[methods]]`` entry."""
_LABEL = re.compile(r"[A-Za-z0-9_.+-]+")

_HELP = {
    "seeds": "training seeds: a list of distinct integers >= 0 (one run per setting and seed)",
    "checkpoints": "evaluated steps: a count c (steps round(i*steps/c), i = 1..c) or a list of "
    "steps; the last step is always evaluated, step 0 is the base model/policy",
    "reference": "label(s) of the [[methods]] entries whose models form the reference curve "
    "(default: the grpo entries)",
    "tune": "a table of non-empty lists (e.g. a learning rate's values): their Cartesian product "
    "is crossed with every [[methods]] entry's settings, the reference's included",
    "methods.method": "a shaping.METHODS name",
    "methods.label": "the entry's name (default: method); unique; letters, digits, _ . + -",
    "methods.fixed": "a table of values every setting of the entry takes",
    "methods.grid": "a table of non-empty lists: their Cartesian product (x zip)",
    "methods.zip": "a table of lists of one length, taken side by side as one axis",
    "methods.points": "an explicit list of settings (tables); excludes grid and zip",
}


def describe(tables: Mapping[str, type], extra: Sequence[tuple[str, str]] = ()) -> str:
    """Every key of a sweep file, one line each (``--describe`` of both drivers): the shared keys,
    a leg's `extra` ``(key, help)`` pairs, then each leg table's keys (`experiment.schema` options
    of the dataclass `tables[name]`) as ``name.key = default  # help (accepted values)``."""
    lines = [f"{key}  # {help_}" for key, help_ in (*_HELP.items(), *extra)]
    for name, cls in tables.items():
        lines += [f"{name}.{line}" for line in describe_options(cls).splitlines()]
    return "\n".join(lines)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class MethodEntry:
    """One ``[[methods]]`` entry: a method, its label, the values every setting takes and the
    swept values of each setting (`points`, in file order: grid product outer, zip inner)."""

    method: str
    label: str
    fixed: dict[str, Any] = field(default_factory=dict)
    points: tuple[dict[str, Any], ...] = ({},)


def _table(entry: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = entry.get(key, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}.{key}: expected a table, got {value!r}")
    return dict(value)


def _lists(table: Mapping[str, Any], where: str) -> dict[str, list[Any]]:
    for k, v in table.items():
        if not isinstance(v, list) or not v:
            raise ValueError(f"{where}.{k}: expected a non-empty list, got {v!r}")
    return dict(table)


def _points(entry: dict[str, Any], where: str) -> list[dict[str, Any]]:
    grid = _lists(_table(entry, "grid", where), f"{where}.grid")
    zipped = _lists(_table(entry, "zip", where), f"{where}.zip")
    points = entry.get("points")
    if points is not None:
        if grid or zipped:
            raise ValueError(f"{where}: give either grid/zip or points, not both")
        if (
            not isinstance(points, list)
            or not points
            or not all(isinstance(p, Mapping) for p in points)
        ):
            raise ValueError(f"{where}.points: expected a non-empty list of tables, got {points!r}")
        return [dict(p) for p in points]
    sizes = {k: len(v) for k, v in zipped.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"{where}.zip: expected lists of one length, got {sizes}")
    overlap = sorted(set(grid) & set(zipped))
    if overlap:
        raise ValueError(f"{where}: {overlap} in both grid and zip")
    rows = list(zip(*zipped.values(), strict=True)) if zipped else [()]
    return [
        {**dict(zip(grid, combo, strict=True)), **dict(zip(zipped, row, strict=True))}
        for combo in itertools.product(*grid.values())
        for row in rows
    ]


def _refuse_old(entry: Mapping[str, Any], where: str) -> None:
    """Refuse an entry's removed spellings (`removed`): ``hyper`` (now ``fixed``) and ``mode``
    (``zip`` for aligned lists, ``grid`` for their product)."""
    if "hyper" in entry:
        removed(f"{where}.hyper", f"{where}.fixed")
    if "mode" in entry:
        removed(f"{where}.mode", f"{where}.zip (aligned lists) or {where}.grid (their product)")


def parse_tune(value: object) -> dict[str, list[Any]]:
    """The ``tune`` table: tuning axes, each a non-empty list of distinct values ({} when absent).

    Raises:
        ValueError: not a table, or a value that is not a non-empty list of distinct values (the
            message names ``tune.<key>``).
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"tune: expected a table of lists, got {value!r}")
    out = _lists(value, "tune")
    for k, v in out.items():
        if len({json.dumps(x, sort_keys=True) for x in v}) != len(v):
            raise ValueError(f"tune.{k}: expected distinct values, got {v!r}")
    return out


def _tuned(points: list[dict[str, Any]], tune: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Every point crossed with the product of the `tune` axes (innermost: a setting's tuning
    values follow its own, e.g. ``gamma_p=1.0,optim.lr=0.0001``)."""
    combos = [dict(zip(tune, c, strict=True)) for c in itertools.product(*tune.values())]
    return [{**p, **c} for p in points for c in combos]


def parse_methods(
    entries: object,
    check_key: Callable[[str, str, str], None] | None = None,
    tune: object = None,
) -> tuple[MethodEntry, ...]:
    """Validate the ``[[methods]]`` array.

    Args:
        entries: the parsed TOML value of ``methods``.
        check_key: ``check_key(method, key, where)`` raises `ValueError` when a setting may not
            hold `key` (each leg knows its keys); called for every key of fixed, grid, zip,
            points and tune.
        tune: the parsed ``tune`` table (`parse_tune`): its product is crossed with every
            entry's settings (innermost).

    Returns:
        One `MethodEntry` per entry, in file order; its `points` include the tuning values.

    Raises:
        ValueError: naming ``methods[i]`` (or ``methods[label]``) and the key: an unknown key or
            method, a bad label, a repeated label or setting, lists of unequal length in zip, a
            key that an entry gives and ``tune`` tunes too.
    """
    axes = parse_tune(tune)
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"methods: expected a non-empty array of tables, got {entries!r}")
    out: list[MethodEntry] = []
    for i, raw in enumerate(entries):
        where = f"methods[{i}]"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a table, got {raw!r}")
        _refuse_old(raw, where)
        entry = dict(raw)
        bad = sorted(set(entry) - set(METHOD_KEYS))
        if bad:
            raise ValueError(f"{where}: unknown key(s) {bad}; known: {sorted(METHOD_KEYS)}")
        method = entry.get("method")
        if method not in shaping.METHODS:
            raise ValueError(
                f"{where}.method: expected one of {sorted(shaping.METHODS)} or {OWN_METHOD}, "
                f"got {method!r}"
            )
        label = entry.get("label", method)
        if not isinstance(label, str) or not _LABEL.fullmatch(label):
            raise ValueError(f"{where}.label: expected letters, digits, _ . + -, got {label!r}")
        if any(e.label == label for e in out):
            raise ValueError(f"{where}.label: {label!r} is used twice; give each entry its own")
        where = f"methods[{label}]"
        fixed = _table(entry, "fixed", where)
        points = _points(entry, where)
        both = sorted(set(axes) & {*fixed, *(k for p in points for k in p)})
        if both:
            raise ValueError(f"{where}: {both} tuned for every method (tune) and given here too")
        points = _tuned(points, axes)
        seen: set[str] = set()
        for point in points:
            overlap = sorted(set(fixed) & set(point))
            if overlap:
                raise ValueError(f"{where}: {overlap} given in fixed and swept")
            key = json.dumps(point, sort_keys=True)
            if key in seen:
                raise ValueError(f"{where}: the setting {point} appears twice")
            seen.add(key)
        if check_key is not None:
            for k in dict.fromkeys([*fixed, *(k for p in points for k in p)]):
                check_key(method, k, where)
        out.append(MethodEntry(method, label, fixed, tuple(points)))
    return tuple(out)


def parse_seeds(value: object) -> tuple[int, ...]:
    """The ``seeds`` list: distinct integers >= 0.

    Raises:
        ValueError: anything else (the message names ``seeds``).
    """
    if (
        not isinstance(value, list)
        or not value
        or not all(_is_int(s) and s >= 0 for s in value)
        or len(set(value)) != len(value)
    ):
        raise ValueError(f"seeds: expected a list of distinct integers >= 0, got {value!r}")
    return tuple(value)


def parse_checkpoints(value: object, steps: int) -> tuple[int, ...]:
    """The evaluated steps, ascending, ending at `steps` (step 0, the base, is implicit).

    A count c gives steps ``round(i·steps/c)`` for i = 1..c; a list is taken as given (0 dropped)
    with `steps` added.

    Raises:
        ValueError: a count outside [1, steps], a step outside [0, steps], or not a count/list.
    """
    if _is_int(value):
        if not 1 <= value <= steps:
            raise ValueError(f"checkpoints: expected a count in [1, steps = {steps}], got {value}")
        return tuple(sorted({round(i * steps / value) for i in range(1, value + 1)}))
    if not isinstance(value, list | tuple) or not value or not all(_is_int(v) for v in value):
        raise ValueError(f"checkpoints: expected a count or a list of steps, got {value!r}")
    if min(value) < 0 or max(value) > steps:
        raise ValueError(f"checkpoints: expected steps in [0, steps = {steps}], got {value!r}")
    return tuple(sorted({*value, steps} - {0}))


def extend_checkpoints(checkpoints: Sequence[int], steps: int) -> tuple[int, ...]:
    """The evaluated steps of a setting that trains `steps` steps where the sweep's runs are
    evaluated at `checkpoints` (ascending, `parse_checkpoints`): those up to `steps`, continued
    at their last spacing, and `steps` itself. E.g. ``[40, 80, 120]`` for 240 steps gives
    ``[40, 80, 120, 160, 200, 240]``, for 100 steps ``[40, 80, 100]``.

    Raises:
        ValueError: `steps` < 1 or no checkpoints.
    """
    if steps < 1 or not checkpoints:
        raise ValueError(f"steps: expected >= 1 with checkpoints, got {steps} and {checkpoints!r}")
    gap = checkpoints[-1] - (checkpoints[-2] if len(checkpoints) > 1 else 0)
    out = {c for c in checkpoints if c <= steps} | {steps}
    out |= set(range(checkpoints[-1] + gap, steps, gap))
    return tuple(sorted(out))


def parse_reference(value: object, entries: Sequence[MethodEntry]) -> tuple[str, ...]:
    """The reference labels (a string is one label; None: every grpo entry, else the first).

    Raises:
        ValueError: a label that names no entry, or an empty list.
    """
    labels = [e.label for e in entries]
    if value is None:
        ref = tuple(e.label for e in entries if e.method == "grpo") or (labels[0],)
    else:
        ref = (
            (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else ()
        )
    missing = sorted(set(ref) - set(labels))
    if not ref or missing:
        raise ValueError(f"reference: expected label(s) among {labels}, got {value!r}")
    return ref


def untune(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the sweep `doc` without its ``tune`` table, each ``[[methods]]`` entry written
    with the same settings as explicit ``points`` (the tuning values in each): for a study's
    confirmation, which rewrites entries one by one (a pick is one setting, its tuning values
    included). A `doc` without ``tune`` comes back equal.

    Raises:
        ValueError: a bad ``tune`` or ``methods`` (`parse_methods`).
    """
    out = copy.deepcopy(dict(doc))
    tune = parse_tune(out.pop("tune", None))
    if not tune:
        return out
    out["methods"] = [
        {"method": e.method, "label": e.label, **({"fixed": dict(e.fixed)} if e.fixed else {}),
         "points": [dict(p) for p in e.points]}
        for e in parse_methods(doc.get("methods"), tune=tune)
    ]  # fmt: skip
    return out


def confirmation_methods(
    untuned: Mapping[str, Any],
    reference: Sequence[str],
    picks: Mapping[str, Mapping[str, Any]],
    entry: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """A study confirmation's ``[[methods]]`` (both legs): of the `untuned` sweep document's
    entries (`untune`), in file order, the `reference` labels' as written and, for each label of
    `picks`, the leg's `entry(written entry, picked parameters)` (one setting, its tuning values
    included); the other entries are dropped."""
    out = []
    for e in untuned["methods"]:
        label = e.get("label", e["method"])
        if label in reference:
            out.append(e)
        elif label in picks:
            out.append(entry(e, picks[label]["params"]))
    return out


BUDGET_EQUAL = "equal"
"""`check_budget`'s word when every method gets the reference's tuning axes."""
BUDGET_UNEQUAL = "unequal (explicit)"
"""`check_budget`'s word when they differ and the study says so (``unequal_budget = true``)."""


@dataclass(frozen=True)
class Budget:
    """One setting's tuning: its method `label`, its `coefficients` (the setting without its
    tuning values, e.g. ``"gamma_p=1.0,gamma_n=0.2"``, ``"default"``) and the value of each tuning
    axis its leg knows, e.g. ``{"optim.lr": 1e-4, "kl_coef": 0.0, "checkpoints": (50, 100,
    150)}`` (the steps at which its models are read; hashable values)."""

    label: str
    coefficients: str
    axes: Mapping[str, Any]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    return str(v)


def _values(values: Iterable[Any]) -> str:
    return "[" + ", ".join(_fmt(v) for v in sorted(values)) + "]"


def budget_difference(rows: Sequence[Budget], reference: Sequence[str]) -> str | None:
    """The first method setting whose tuning differs from the reference's, in words; None when
    every one gets the same.

    The reference's tuning is the set of axis combinations over all its settings (e.g. GRPO at
    two learning rates × its checkpoints). Each setting of a compared method, with its tuning
    values stripped (`Budget.coefficients`), must be trained at exactly those combinations: first
    each axis's values are compared (the message names the axis and both lists), then the
    combinations (a method whose learning rates are zipped with its coefficient differs there).

    Args:
        rows: one `Budget` per setting of the sweep (the leg's, e.g. `llm.orchestrate.study.budgets`).
        reference: the reference labels.
    """
    ref = [dict(r.axes) for r in rows if r.label in reference]
    groups: dict[tuple[str, str], list[Budget]] = {}
    for r in rows:
        if r.label not in reference:
            groups.setdefault((r.label, r.coefficients), []).append(r)
    who = f"the reference ({', '.join(reference)})"
    for (label, coefficients), group in groups.items():
        names = [a for a in group[0].axes if all(a in r for r in ref)]
        mine = {tuple(r.axes[a] for a in names) for r in group}
        theirs = {tuple(r[a] for a in names) for r in ref}
        where = f"methods[{label}] ({coefficients})"
        for i, axis in enumerate(names):
            a, b = {m[i] for m in mine}, {t[i] for t in theirs}
            if a != b:
                return f"{where} is tuned over {axis} {_values(a)}, {who} over {_values(b)}"
        if mine != theirs:
            return (f"{where} is tuned over ({', '.join(names)}) in {_values(mine)}, {who} in "
                    f"{_values(theirs)}")  # fmt: skip
    return None


def check_budget(
    rows: Sequence[Budget], reference: Sequence[str], *, unequal: bool
) -> tuple[str, str | None]:
    """`(BUDGET_EQUAL, None)` when every compared method gets the reference's tuning
    (`budget_difference`), `(BUDGET_UNEQUAL, the difference in words)` when it does not and
    `unequal` (a study's ``unequal_budget = true``) says that this is meant.

    Raises:
        ValueError: the budgets differ and `unequal` is False; one line naming the method
            setting, the axis and both lists of values.
    """
    diff = budget_difference(rows, reference)
    if diff is None:
        return BUDGET_EQUAL, None
    if unequal:
        return BUDGET_UNEQUAL, diff
    raise ValueError(f"unequal tuning budgets: {diff}; give every method the reference's "
                     "tuning (a top-level tune table) or set [study] unequal_budget = true")  # fmt: skip


def apply_sets(doc: Mapping[str, Any], sets: Iterable[str], keys: Iterable[str]) -> dict[str, Any]:
    """A copy of the parsed sweep `doc` with each ``KEY=VALUE`` applied (`schema.apply_pairs`),
    e.g. ``seeds=[0]``, ``train.steps=20``, ``eval.problems=8``; VALUE is a TOML literal.

    Args:
        keys: the sweep's top-level keys (`COMMON_KEYS` and the leg's tables): KEY's first part
            must be one of them.

    Raises:
        ValueError: a pair without ``=``, an unknown key, or a path through a non-table (the
            message names the pair).
    """
    known = sorted(keys)

    def check(key: str, pair: str) -> None:
        if key.split(".")[0] not in known:
            raise ValueError(f"--set {pair!r}: unknown sweep key {key!r}; known: {known}")

    return apply_pairs(doc, sets, check, "train.steps=20")
