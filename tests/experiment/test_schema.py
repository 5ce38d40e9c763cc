"""The generic option engine (`experiment.schema`) on a throwaway dataclass tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from experiment import schema
from experiment.schema import meta, option


@dataclass
class Inner:
    seed: int = option(1, ge=0, le=9)
    """a seed"""


@dataclass
class Root:
    name: str = option("a", choices=("a", "b"))
    """a choice"""
    rate: float = option(0.5, gt=0, lt=1)
    """a rate"""
    pair: list[float] = field(
        default_factory=lambda: [0.1, 0.2], metadata=meta(ge=0, length=(2, 2))
    )
    """two numbers"""
    extra: dict[str, Any] = field(default_factory=dict)
    """a free table"""
    inner: Inner = field(default_factory=Inner)
    """a sub-table"""


def _check(raw: dict[str, Any]) -> Root:
    obj = schema.from_dict(Root, raw)
    schema.check_fields(obj)
    return obj


def test_defaults_pass_and_tables_are_built():
    obj = _check({"inner": {"seed": 3}, "extra": {"anything": 1}})
    assert obj.inner == Inner(seed=3) and obj.extra == {"anything": 1}
    assert schema.tables(Root) == {"inner": Inner}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"rate": 1.0}, "rate: expected a finite number in (0, 1), got 1.0"),
        ({"rate": True}, "rate: expected a finite number in (0, 1), got True"),
        ({"name": "c"}, "name: expected one of ['a', 'b'], got 'c'"),
        ({"pair": [0.1]}, "pair: expected a list of 2 finite numbers >= 0, got [0.1]"),
        ({"pair": [0.1, -1]}, "pair: expected a list of 2 finite numbers >= 0"),
        ({"inner": {"seed": 10}}, "inner.seed: expected an integer in [0, 9], got 10"),
        ({"inner": 3}, "inner: expected a table, got 3"),
        ({"extra": [1]}, "extra: expected a table, got [1]"),
        ({"rat": 0.5}, "unknown key(s) ['rat']; known: ['extra', 'inner', 'name', 'pair', 'rate']"),
        ({"inner": {"sed": 1}}, "inner: unknown key(s) ['sed']; known: ['seed']"),
    ],
)
def test_bad_values_and_keys_are_named(raw, message):
    with pytest.raises(ValueError) as e:
        _check(raw)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [("3e-4", 3e-4), ("true", True), ('"x"', "x"), ("[1, 8]", [1, 8]), ("ds_grpo", "ds_grpo")],
)
def test_parse_value_reads_toml_literals_else_the_text(text, value):
    assert schema.parse_value(text) == value


def test_apply_overrides_sets_merges_and_suggests():
    raw = schema.apply_overrides(
        Root, {"inner": {"seed": 2}}, ["rate=0.25", "inner={seed = 4}", "extra.k=1"]
    )
    assert raw == {"rate": 0.25, "inner": {"seed": 4}, "extra": {"k": 1}}
    with pytest.raises(ValueError, match=r"unknown key 'rat'; did you mean \['rate'\]"):
        schema.apply_overrides(Root, {}, ["rat=1"])
    with pytest.raises(ValueError, match=r"TABLE one of \['extra', 'inner'\]"):
        schema.apply_overrides(Root, {}, ["a.b.c=1"])
    with pytest.raises(ValueError, match=r"expected KEY=VALUE \(e.g. rate=0.1\)"):
        schema.apply_overrides(Root, {}, ["rate"], example="rate=0.1")


def test_describe_lists_every_key_with_default_help_and_rule():
    lines = schema.describe(Root).splitlines()
    assert lines[0] == "name = \"a\"  # a choice (one of ['a', 'b'])"
    assert "pair = [0.1, 0.2]  # two numbers (a list of 2 finite numbers >= 0)" in lines
    assert lines[-1] == "inner.seed = 1  # a seed (an integer in [0, 9])"
    assert schema.describe(Root()) == schema.describe(Root)


SWEEP_LIKE = """\
base = "x.toml"
seeds = [0]

[train]
steps = 20
rollout.group_size = 4

[env]
kind = "dataset"
skew = 1.0
"""


@pytest.mark.parametrize(
    ("message", "line"),
    [
        ("steps: expected an integer", None),  # top-level key the file does not set
        ("base: no such file", 1),
        ("train: steps: expected an integer >= 1, got 20.5", 5),  # a chain: train.steps
        ("train: rollout: unknown key(s) ['group_size']; known: []", 6),  # the unknown key's line
        ("train: rollout: expected a table", 6),  # a dotted table: its first key
        ("env: unknown key(s) ['skew', 'kind']; known: []", 10),  # the first one listed
        ("env: expected kind = dataset", 8),  # a table: its header
        ("unknown key(s) ['seeds']; known: []", 2),
        ("train.steps: expected an integer", 5),
    ],
)
def test_a_config_error_names_the_line_of_the_key_it_is_about(tmp_path, message, line):
    """`schema.config_error` reads the key off the message, nested tables' chains and the first
    unknown key it lists included, and names the line that sets it (the sweep and study files'
    errors: ``train: steps: ...``)."""
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP_LIKE)
    where = f"{path}, line {line}" if line is not None else str(path)
    assert str(schema.config_error(path, ValueError(message))) == f"{where}: {message}"
    assert str(schema.config_error(path, ValueError(message), given=["train.steps"])) == (
        f"{path}: {message}" if message.startswith(("train: steps", "train.steps")) else
        f"{where}: {message}"
    )  # fmt: skip
    by_set = schema.source_error(path, ValueError(message), sets=["train.steps"])
    assert str(by_set).startswith("--set ") == message.startswith(("train: steps", "train.steps"))
