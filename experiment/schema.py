"""Options declared once: dataclass fields whose metadata carries their documentation and rules.

Each field is declared once: its default and rules (choices, bounds) with `option` or
``field(default_factory=..., metadata=meta(...))``, its documentation as the docstring under it
(CleanRL's dataclass of arguments, whose field docstrings are the ``--help``). A root dataclass
holds scalar and list fields, free tables (``dict`` fields, e.g. a method's ``[hyper]``) and
one-level sub-tables (fields whose type is another such dataclass).

On that metadata, one engine: `check_fields` (one validation loop, errors naming the field),
`describe` (every key with its default, help and accepted values), `from_dict` (a dataclass tree
from a parsed TOML document, unknown keys named), `build` (one checked table of a file),
`parse_value` and `apply_overrides` (the ``--set KEY=VALUE`` of a command line), `toml_value`
(writing values back). Around it, the rest of reading a config file: `read_toml`, `config_error`
(an error named with the file and the key's line), `removed`, `refuse_moved` and `migrate_moved`
(removed spellings), and `check_hyper` (a shaping method's hyper-parameters, both legs). Every
error is a ``ValueError`` whose message names the key.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import functools
import inspect
import itertools
import math
import os
import re
import textwrap
import tomllib
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

import shaping

__all__ = [
    "NOUNS",
    "apply_overrides",
    "apply_pairs",
    "build",
    "check_fields",
    "check_hyper",
    "config_error",
    "default_of",
    "describe",
    "field_docs",
    "from_dict",
    "meta",
    "migrate_moved",
    "option",
    "options",
    "parse_value",
    "read_toml",
    "refuse_moved",
    "removed",
    "require",
    "rule_text",
    "tables",
    "toml_value",
    "value_ok",
]

_PathLike = str | os.PathLike[str]


def meta(
    *,
    choices: Sequence[str] | Callable[[], Sequence[str]] = (),
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    length: tuple[int, int | None] | None = None,
    pattern: str | None = None,
    expect: str = "",
    hint: str = "",
) -> dict[str, Any]:
    """The metadata of a config field: the rules `check_fields` applies (its documentation is the
    field's docstring, `field_docs`).

    Args:
        choices: the allowed strings, or a function giving them when validating (a registry).
        ge, gt, le, lt: bounds of a number, or of every element of a list of numbers.
        length: ``(min, max)`` number of elements of a list (``max`` None: unbounded), or
            characters of a string.
        pattern: a regular expression a string must match in full.
        expect: what the field accepts, in words, where the rules above do not say it well.
        hint: said after the choices (``one of [...] or HINT``): where more come from (a
            registry the user adds to, e.g. by ``--import``).
    """
    rules = {"choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "length": length}
    return {**rules, "pattern": pattern, "expect": expect, "hint": hint}


def option(default: Any, **rules: Any) -> Any:
    """A dataclass field with an immutable `default` and ``metadata=meta(**rules)``; list and
    table fields use ``field(default_factory=..., metadata=meta(...))`` directly."""
    return field(default=default, metadata=meta(**rules))


# ---------------------------------------------------------------------------------------------
# The fields of a dataclass tree


def tables(cls: type) -> dict[str, type]:
    """The one-level sub-tables of the dataclass `cls`: ``{field name: dataclass}``, in
    declaration order (the fields whose type is a dataclass)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)
            if dataclasses.is_dataclass(hints[f.name])}  # fmt: skip


def options(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    """(field, resolved type) of every field of `cls` but the sub-tables, in declaration order."""
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)
            if not dataclasses.is_dataclass(hints[f.name])]  # fmt: skip


def _free_tables(cls: type) -> list[str]:
    """The ``dict`` fields of `cls` (free tables whose keys the dataclass does not declare)."""
    return [f.name for f, hint in options(cls) if typing.get_origin(hint) is dict]


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The documentation of each field of the dataclass `cls`: the string literal right after
    its declaration in the class body (its attribute docstring, as CleanRL's and tyro's
    ``--help``; a base class's fields included), whitespace collapsed; '' if none."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        for st, nxt in itertools.pairwise(body):
            if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):  # fmt: skip
                docs[st.target.id] = " ".join(nxt.value.value.split())
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


def default_of(f: dataclasses.Field[Any]) -> Any:
    """The default value of the dataclass field `f` (its factory called, if it has one)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


# ---------------------------------------------------------------------------------------------
# Rules in words and the validation of one value


def _choices(meta: Mapping[str, Any]) -> tuple[str, ...]:
    choices = meta.get("choices") or ()
    return tuple(choices() if callable(choices) else choices)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _bounds_text(meta: Mapping[str, Any]) -> str:
    lo = (meta.get("ge"), "[") if meta.get("ge") is not None else (meta.get("gt"), "(")
    hi = (meta.get("le"), "]") if meta.get("le") is not None else (meta.get("lt"), ")")
    if lo[0] is not None and hi[0] is not None:
        return f" in {lo[1]}{_fmt(lo[0])}, {_fmt(hi[0])}{hi[1]}"
    if lo[0] is not None:
        return f" {'>=' if lo[1] == '[' else '>'} {_fmt(lo[0])}"
    if hi[0] is not None:
        return f" {'<=' if hi[1] == ']' else '<'} {_fmt(hi[0])}"
    return ""


NOUNS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
"""The scalar types an option may have, each with its name in the error messages."""
_PLURALS = {bool: "booleans", int: "integers", float: "finite numbers", str: "strings"}


def rule_text(hint: Any, meta: Mapping[str, Any]) -> str:
    """What a field accepts, in words (e.g. 'an integer >= 2'): the errors' and --describe's text."""
    if meta.get("expect"):
        return meta["expect"]
    if typing.get_origin(hint) is dict:
        return "a table"
    if typing.get_origin(hint) is list:
        (elem,) = typing.get_args(hint)
        n_min, n_max = meta.get("length") or (0, None)
        if n_min == n_max:
            head = f"a list of {n_min}"
        else:
            head = "a non-empty list of" if n_min >= 1 else "a list of"
            head += f" at most {n_max}" if n_max is not None else ""
        return f"{head} {_PLURALS[elem]}{_bounds_text(meta)}"
    if _choices(meta):
        more = f" or {meta['hint']}" if meta.get("hint") else ""
        return f"one of {list(_choices(meta))}{more}"
    if meta.get("pattern"):
        return f"a string matching {meta['pattern']!r}"
    if hint is str and (meta.get("length") or (0,))[0] >= 1:
        return "a non-empty string"
    return NOUNS[hint] + _bounds_text(meta)


def _scalar_ok(value: Any, hint: Any, meta: Mapping[str, Any]) -> bool:
    if hint is bool or hint is str:
        return isinstance(value, hint)
    # bool is an int subclass, and an integer is a valid float (TOML writes 1e-4 but also 0).
    numeric = (int, float) if hint is float else (int,)
    if isinstance(value, bool) or not isinstance(value, numeric):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return not (
        (meta.get("ge") is not None and value < meta["ge"])
        or (meta.get("gt") is not None and value <= meta["gt"])
        or (meta.get("le") is not None and value > meta["le"])
        or (meta.get("lt") is not None and value >= meta["lt"])
    )


def value_ok(value: Any, hint: Any, meta: Mapping[str, Any]) -> bool:
    """Whether `value` has the type `hint` and obeys the rules in `meta` (see `meta`)."""
    if typing.get_origin(hint) is dict:
        return isinstance(value, dict)
    if typing.get_origin(hint) is list:
        (elem,) = typing.get_args(hint)
        n_min, n_max = meta.get("length") or (0, None)
        return (
            isinstance(value, list)
            and n_min <= len(value)
            and (n_max is None or len(value) <= n_max)
            and all(_scalar_ok(v, elem, meta) for v in value)
        )
    if hint is str and isinstance(value, str):
        n_min, n_max = meta.get("length") or (0, None)
        choices, pattern = _choices(meta), meta.get("pattern")
        return (
            n_min <= len(value)
            and (n_max is None or len(value) <= n_max)
            and (not choices or value in choices)
            and (pattern is None or re.fullmatch(pattern, value) is not None)
        )
    return _scalar_ok(value, hint, meta)


def require(ok: bool, name: str, value: object, expect: str) -> None:
    """Raise ``ValueError("NAME: expected EXPECT, got VALUE")`` unless `ok`."""
    if not ok:
        raise ValueError(f"{name}: expected {expect}, got {value!r}")


def check_fields(root: Any) -> None:
    """Check every field of the dataclass instance `root` and of its sub-tables against its
    metadata (type, choices, bounds, length, pattern; see `meta`).

    Raises:
        ValueError: the first invalid field, named (``TABLE.NAME`` in a sub-table) with its value.
    """
    subs = tables(type(root))
    for prefix, obj in (("", root), *((f"{n}.", getattr(root, n)) for n in subs)):
        for f, hint in options(type(obj)):
            value = getattr(obj, f.name)
            require(
                value_ok(value, hint, f.metadata),
                prefix + f.name,
                value,
                rule_text(hint, f.metadata),
            )


def describe(root: type | Any) -> str:
    """Every key of the dataclass tree `root` (a type or an instance) with its default (as TOML),
    documentation and accepted values, one line each: top-level keys, then ``TABLE.NAME`` ones."""
    cls = root if isinstance(root, type) else type(root)
    lines = []
    for prefix, sub in (("", cls), *((f"{n}.", c) for n, c in tables(cls).items())):
        docs = field_docs(sub)
        for f, hint in options(sub):
            rule = rule_text(hint, f.metadata)
            help_ = docs[f.name]
            lines.append(f"{prefix}{f.name} = {toml_value(default_of(f))}  # {help_} ({rule})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Building from a parsed document, --set overrides


def _build(cls: type, table: Mapping[str, Any], where: str) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"{where}unknown key(s) {unknown}; known: {sorted(known)}")
    return cls(**table)


def from_dict(cls: type, raw: Mapping[str, Any]) -> Any:
    """An instance of the dataclass `cls` from a parsed TOML document (not yet validated: call
    `check_fields`). Sub-tables are built as their dataclasses; free tables stay dicts.

    Raises:
        ValueError: a table that is not a table, or an unknown key (named with its table).
    """
    raw = dict(raw)
    subs = tables(cls)
    parts = {name: raw.pop(name, {}) for name in subs}
    free = [(name, raw.get(name, {})) for name in _free_tables(cls)]
    for name, table in (*parts.items(), *free):
        if not isinstance(table, dict):
            raise ValueError(f"{name}: expected a table, got {table!r}")
    known = {f.name for f in dataclasses.fields(cls)} - set(subs)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; known: {sorted(known | set(subs))}")
    built = {name: _build(sub, parts[name], f"{name}: ") for name, sub in subs.items()}
    return cls(**raw, **built)  # a frozen dataclass too: every table given at construction


def build(cls: type, section: str, table: object) -> Any:
    """`cls` from the TOML table `section` of a file: built (`from_dict`), checked
    (`check_fields`), integers given for float options made floats.

    Raises:
        ValueError: naming ``section.key`` (or ``section: unknown key(s) ...``) and the value.
    """
    try:
        obj = from_dict(cls, table if isinstance(table, Mapping) else {"": table})
        check_fields(obj)
    except ValueError as err:
        text = str(err)
        raise ValueError(
            f"{section}: {text}" if text.startswith("unknown") else f"{section}.{text}"
        ) from None
    floats = {f.name: float(getattr(obj, f.name)) for f, hint in options(cls) if hint is float}
    return dataclasses.replace(obj, **floats)


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML literal (``3e-4``, ``true``, ``"grpo"``, ``[1, 8]``,
    ``{seed = 3}``, ``inf``), else `text` itself as a string (so ``method=ds_grpo`` works)."""
    try:
        doc = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    return doc["v"] if doc.keys() == {"v"} else text


def _check_override_key(cls: type, key: str, pair: str) -> None:
    *path, name = key.split(".")
    subs, free = tables(cls), _free_tables(cls)
    if not path:
        known = [f.name for f in dataclasses.fields(cls)]
    elif len(path) == 1 and path[0] in free:
        return  # a free table's names are checked by the caller's validation
    elif len(path) == 1 and path[0] in subs:
        known = [f.name for f in dataclasses.fields(subs[path[0]])]
    else:
        raise ValueError(
            f"--set {pair}: unknown key {key!r}; dotted keys are TABLE.NAME with TABLE one of "
            f"{[*free, *subs]}"
        )
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {close}?" if close else f"known: {known}"
        raise ValueError(f"--set {pair}: unknown key {key!r}; {hint} (see --describe)")


def apply_overrides(
    cls: type,
    raw: Mapping[str, Any],
    pairs: Iterable[str],
    *,
    example: str = "name=3 or table.name=3",
) -> dict[str, Any]:
    """A copy of the parsed document `raw` (of the dataclass `cls`) with each ``KEY=VALUE`` of
    `pairs` applied in order (`apply_pairs`); KEY is a top-level field of `cls` or
    ``TABLE.NAME`` (a sub-table's field, or any name of a free table).

    Raises:
        ValueError: a pair without ``=``, or an unknown key (the message names the pair and
            suggests close names).
    """
    return apply_pairs(raw, pairs, lambda key, pair: _check_override_key(cls, key, pair), example)


def apply_pairs(
    raw: Mapping[str, Any],
    pairs: Iterable[str],
    check_key: Callable[[str, str], None],
    example: str,
) -> dict[str, Any]:
    """The one ``--set`` parser: a copy of the parsed TOML document `raw` with each ``KEY=VALUE``
    of `pairs` applied in order. KEY is dotted (``table.name``), checked by ``check_key(key,
    pair)``; VALUE is parsed by `parse_value`; a table value (``data={seed = 3}``) is merged into
    the table. Values are checked later (`from_dict`, `check_fields`). `example` shows a valid
    pair in the error of a pair without ``=``.

    Raises:
        ValueError: a pair without ``=``, a key `check_key` refuses, or a path through a value
            that is not a table (the message names the pair).
    """
    out = copy.deepcopy(dict(raw))
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set {pair!r}: expected KEY=VALUE (e.g. {example})")
        check_key(key, pair)
        value = parse_value(text.strip())
        *path, name = key.split(".")
        target = out
        for t in path:
            target = target.setdefault(t, {})
            if not isinstance(target, dict):
                raise ValueError(f"--set {pair}: [{t}] of the document is {target!r}, not a table")
        if isinstance(value, dict) and isinstance(target.get(name), dict):
            target[name] = {**target[name], **value}
        else:
            target[name] = value
    return out


def toml_value(v: object) -> str:
    """`v` (bool, int, finite float, str, list, tuple or dict of those) as a TOML literal.

    Raises:
        ValueError: a non-finite float or another type.
    """
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write non-finite float {v!r} to TOML")
        return repr(v)
    if isinstance(v, str):
        # JSON string escapes are valid TOML basic-string escapes for these characters.
        escaped = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise ValueError(f"cannot write {type(v).__name__} {v!r} to TOML")


# ---------------------------------------------------------------------------------------------
# Reading a TOML file, naming a key's line; removed spellings; a method's [hyper]


def read_toml(path: _PathLike) -> dict[str, Any]:
    """The parsed TOML file.

    Raises:
        ValueError: invalid TOML, or a file that is not UTF-8 text (the message names the file
            and the line).
        OSError: the file cannot be read.
    """
    data = Path(path).read_bytes()
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(
            f"{path}, line {line}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); "
            "a TOML file is UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None


_KEY = re.compile(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*")


_CHAIN = re.compile(rf"(?:{_KEY.pattern}: )+")
_UNKNOWN = re.compile(r"unknown key\(s\) \['([A-Za-z_][\w-]*)'")


def _message_key(text: str) -> str | None:
    """The dotted key an error message starts with: ``optim.lr: expected ...`` -> ``optim.lr``,
    a nested table's chain ``train: steps: expected ...`` -> ``train.steps``, else its first word
    (``lr must be ...`` -> ``lr``); an unknown key it lists is appended (``train: rollout:
    unknown key(s) ['group_sise']`` -> ``train.rollout.group_sise``). None when there is none."""
    m = _CHAIN.match(text)
    chain = None if m is None else ".".join(p for p in m.group(0).split(": ") if p)
    unknown = _UNKNOWN.search(text)  # the first unknown key is the one to point at
    if unknown is not None:
        return unknown.group(1) if chain is None else f"{chain}.{unknown.group(1)}"
    if chain is not None:
        return chain
    m = _KEY.match(text)
    return None if m is None else m.group(0)


def _key_line(text: str, key: str) -> int | None:
    """The line (1-based) of the TOML file `text` that sets the dotted `key` (``steps``,
    ``optim.lr``, as ``table.name = ...`` or under its table; a table: its header, or the first
    line that sets a key inside it, ``train.rollout``), or None."""
    *tables, name = key.split(".")
    table, want = "", ".".join(tables)
    for i, line in enumerate(text.splitlines(), 1):
        head = line.split("#", 1)[0].strip()
        if head.startswith("["):
            table = head.strip("[] ")
            if table == key:  # the table itself
                return i
            continue
        lhs = head.split("=", 1)[0].strip() if "=" in head else ""
        full = f"{table}.{lhs}" if table else lhs
        if lhs and (full == key or full.startswith(key + ".")
                    or (table == want and (lhs == name or lhs.startswith(name + ".")))):  # fmt: skip
            return i
    return None


def config_error(path: _PathLike, err: Exception, given: Iterable[str] = ()) -> ValueError:
    """`err`, a value error of the config file `path` whose message starts with the key
    (``optim.lr: expected ...``), as a ValueError naming the file and, when the file sets that
    key, its line: ``PATH, line N: optim.lr: expected ...``. A key in `given` (set by ``--set``,
    not by the file) gets no line."""
    text = str(err)
    where = str(path)
    key = _message_key(text)
    if key is not None and key not in set(given):
        try:
            line = _key_line(Path(path).read_text(encoding="utf-8"), key)
        except (OSError, ValueError):
            line = None
        if line is not None:
            where += f", line {line}"
    return ValueError(f"{where}: {text}")


def source_error(
    path: _PathLike | None,
    err: Exception,
    sets: Iterable[str],
    given: Iterable[str] = (),
) -> ValueError:
    """`err`, a value error whose message starts with the key (``optim.lr: expected ...``), named
    by where the value came from: ``--set optim.lr: expected ...`` for a key of `sets` (the
    ``--set`` pairs' keys), else the config file `path` and the key's line
    (`config_error`; a key of `given`, set otherwise than by the file, gets no
    line), else `err`'s message alone (no file)."""
    text = str(err)
    key = _message_key(text)
    if key is not None and key in set(sets):
        return ValueError(f"--set {text}")
    return ValueError(text) if path is None else config_error(path, err, given)


def removed(old: str, new: str) -> NoReturn:
    """The error for a key whose old spelling was removed (accepted with a warning for one release,
    then refused): one line that names the key replacing it.

    Raises:
        ValueError: always, ``OLD: removed; write NEW``.
    """
    raise ValueError(f"{old}: removed; write {new}")


def refuse_moved(doc: Mapping[str, Any], moves: Mapping[str, str]) -> None:
    """Refuse (`removed`) the first old key of `moves` present in `doc`: a top-level ``key`` or a
    table's ``table.key`` (one level), each mapped to the key that replaced it.

    Raises:
        ValueError: ``OLD: removed; write NEW``.
    """
    for old, new in moves.items():
        table, _, key = old.rpartition(".")
        holder = doc.get(table) if table else doc
        if isinstance(holder, Mapping) and key in holder:
            removed(old, new)


def migrate_moved(
    doc: Mapping[str, Any], moves: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """`doc` with every old key of `moves` present in it moved to the key that replaced it (a
    top-level ``key`` or a table's ``table.key``, one level, as `refuse_moved` reads them), and
    the moves made, ``{old: new}`` in `moves`' order. The value is moved as it is: a removed
    spelling names the same setting as its replacement, so a document written before the rename
    means what it meant then. `doc` is not changed.

    For files written by the program before a rename (a run folder's saved config); a file a
    person writes is refused instead (`refuse_moved`).

    Raises:
        ValueError: an old key and the key that replaced it both set (``OLD and NEW: both
            set``), or a new key's table that is not a table.
    """
    out = copy.deepcopy(dict(doc))
    made: dict[str, str] = {}
    for old, new in moves.items():
        table, _, key = old.rpartition(".")
        holder = out.get(table) if table else out
        if not (isinstance(holder, dict) and key in holder):
            continue
        new_table, _, new_key = new.rpartition(".")
        target = out.setdefault(new_table, {}) if new_table else out
        if not isinstance(target, dict):
            raise ValueError(f"{new_table}: {target!r} is not a table; cannot move {old} to {new}")
        if new_key in target:
            raise ValueError(f"{old} and {new}: both set; keep one")
        target[new_key] = holder.pop(key)
        made[old] = new
    return out, made


def check_hyper(
    method: str,
    hyper: Mapping[str, Any],
    *,
    where: str,
    group_size: int = 2,
    num_candidates: int = 1,
) -> None:
    """Check the values `hyper` of the shaping method `method`'s hyper-parameters: each name is
    one of its hyper-parameters, each value has the type of its default (a float default takes
    any finite number, an int default an integer, ...), then the method runs once on a tiny batch
    (B = 1, G = `group_size`, T = 2, `num_candidates` candidates per token) so that its own rules
    apply: its declared bounds (``shaping.METHODS[method].bounds``: ``gamma_p >= 0``, ``kl_coef
    >= 0``, ``alpha in [0, 1]``, ...), choices, integers (``top_n >= 1``) and ``k <= G``. The one
    check of both drivers' settings (`llm.config.TrainConfig`, `toymdp.sweep_spec.parse_config`).

    Args:
        where: the settings' place, the prefix of every key in the errors (``hyper``,
            ``methods[ds_grpo]``).

    Raises:
        ValueError: ``WHERE.KEY = VALUE: not a hyper-parameter ...``, ``WHERE.KEY: expected
            TYPE ..., got VALUE``, or ``WHERE (METHOD): METHOD: KEY must be BOUND, got VALUE``
            (the method's own rules).
    """
    m = shaping.METHODS[method]
    for key, value in hyper.items():
        if key not in m.defaults:
            raise ValueError(
                f"{where}.{key} = {value!r}: not a hyper-parameter of {method}; known: "
                f"{sorted(m.defaults)}"
            )
        default = m.defaults[key]
        if type(default) in NOUNS:
            require(
                value_ok(value, type(default), {}),
                f"{where}.{key}",
                value,
                f"{rule_text(type(default), {})} (as {method}'s default {default!r})",
            )
    try:
        needs = m.needs_for(**hyper)
        batch = shaping.example_batch(needs, 1, group_size, 2, max(num_candidates, 1), np)
        m.loss(batch, **hyper)
    except ValueError as e:
        raise ValueError(f"{where} ({method}): {e}") from None
