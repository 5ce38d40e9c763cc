"""The configuration of `python -m toymdp sweep` (`SweepConfig`, `load_config`): the keys both
drivers share (`experiment.spec`) and the toy's own tables, declared with `experiment.schema`
options: ``[env]`` (`EnvSpec`, one environment per draw seed, built by `toymdp.environments`:
figure 6's popularity dataset with its constants as arguments, or a single prompt), ``[train]``
(`TrainSpec`), ``[frontier]``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import shaping
from experiment import schema, spec
from experiment.schema import meta, option
from toymdp import train as T
from toymdp.train import OPTIMIZERS

__all__ = [
    "KINDS",
    "TABLES",
    "EnvSpec",
    "FrontierSpec",
    "SweepConfig",
    "TrainSpec",
    "describe",
    "is_data",
    "load_config",
    "parse_config",
    "parse_env",
    "parse_table",
    "parse_train",
]

KINDS = ("dataset", "single")


@dataclass(frozen=True)
class EnvSpec:
    """``[env]``: the environment and its draws (module docstring)."""

    kind: str = option("dataset", choices=KINDS)
    """dataset (multi-prompt, half held out) or single (one prompt)"""
    num_actions: int = option(4, ge=2)
    """V: actions per node"""
    depth: int = option(3, ge=1)
    """H: tree depth"""
    draws: list[int] = field(default_factory=lambda: [0], metadata=meta(ge=0, length=(1, None)))
    """environment draw seeds (a dataset or a tree per seed)"""
    skew: float = option(1.0, ge=0)
    """base logits ~ Normal(0, skew^2); 0 = uniform base policy"""
    base_correctness: float = option(0.0, ge=0, lt=1)
    """tilt every prompt's base correctness to this value (0 = no tilt)"""
    multiplicities: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8, 16], metadata=meta(ge=1, length=(1, None))
    )
    """dataset: correct-set sizes, each <= M = V^H"""
    per_size: int = option(8, ge=1)
    """dataset: training and held-out prompts per multiplicity"""
    zipf: float = option(1.0, ge=0)
    """dataset: Zipf exponent of the trajectories' popularity"""
    correct: list[str] = field(default_factory=list)
    """single: the correct trajectories by label (e.g. 'ABC'), or give correct_size"""
    correct_size: int = option(0, ge=0)
    """single: a random correct set of this size (0 = use correct)"""


def parse_env(table: object) -> EnvSpec:
    """Validate the ``[env]`` table.

    Raises:
        ValueError: naming ``env.<key>`` and the bad value.
    """
    env = schema.build(EnvSpec, "env", table)
    m = env.num_actions**env.depth
    if max(env.multiplicities) > m:
        raise ValueError(f"env.multiplicities: expected sizes <= M = {m}, got {env.multiplicities}")
    if env.kind == "single" and bool(env.correct) == bool(env.correct_size):
        raise ValueError("env: a single prompt needs exactly one of `correct` or `correct_size`")
    if env.correct_size > m:
        raise ValueError(f"env.correct_size: expected at most M = {m}, got {env.correct_size}")
    return env


@dataclass(frozen=True)
class TrainSpec:
    """``[train]``: training and evaluation (module docstring)."""

    optimizer: str = option("adam", choices=OPTIMIZERS)
    """the optimizer"""
    lr: float = option(0.1, gt=0)
    """learning rate (a grid may sweep it)"""
    updates: int = option(100, ge=1)
    """U: policy updates"""
    group_size: int = option(8, ge=1)
    """G: responses per prompt"""
    epochs: int = option(1, ge=1)
    """mu: passes over each batch"""
    kl_coef: float = option(0.0, ge=0)
    """default of every method's kl_coef (a grid may sweep it)"""
    seed: int = option(0, ge=0)
    """root of the training keys (seeds index its split)"""
    pass_k: list[int] = field(
        default_factory=lambda: [1, 4, 16, 64], metadata=meta(ge=1, length=(1, None))
    )
    """k of the exact pass@k"""
    distinct_k: int = option(16, ge=1)
    """K of the expected distinct correct responses"""
    fast_compile: bool = False
    """XLA's optimization level 0 alone (`toymdp.train.FAST_COMPILE`); the default compiles a
    sweep faster (`toymdp.engine.COMPILE_OPTIONS`: the same level and the classic code generator)"""


def parse_train(table: object) -> TrainSpec:
    """Validate the ``[train]`` table.

    Raises:
        ValueError: naming ``train.<key>`` and the bad value.
    """
    return schema.build(TrainSpec, "train", table)


@dataclass(frozen=True)
class FrontierSpec:
    """``[frontier]``: the lift analysis."""

    num_resamples: int = option(2000, ge=1)
    """draws of the means behind the lift intervals"""


TABLES = {"env": EnvSpec, "train": TrainSpec, "frontier": FrontierSpec}
"""The toy sweep's configuration: the shared keys (`experiment.spec`) and, by name."""


def parse_table(name: str, table: object) -> Any:
    """Validate the toy table `name` of `TABLES` (``env`` also checks its cross-field rules).

    Raises:
        ValueError: naming ``name.<key>`` and the bad value.
    """
    return parse_env(table) if name == "env" else schema.build(TABLES[name], name, table)


TOP_KEYS = (*spec.COMMON_KEYS, "env", "train", "frontier")


@dataclass(frozen=True)
class SweepConfig:
    """A parsed, validated sweep configuration (`parse_config`)."""

    env: EnvSpec
    train: TrainSpec
    methods: tuple[spec.MethodEntry, ...]
    reference: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    eval_steps: tuple[int, ...] = ()  # step 0 (the base policy) and the checkpoints
    num_resamples: int = 2000
    doc: Mapping[str, Any] = field(default_factory=dict)
    """the sweep document as written (results.json's ``config``; `digest`)"""

    def digest(self) -> str:
        """SHA-256 (12 hex digits) of the configuration's canonical JSON."""
        text = json.dumps(self.doc, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def is_data(method: str, name: str) -> bool:
    """Whether `name` is traced (swept as data): the learning rate and float hyper-parameters."""
    default = shaping.METHODS[method].defaults.get(name)
    return name == "lr" or (isinstance(default, float) and name not in T._STATIC)


def _check_key(method: str, key: str, where: str) -> None:
    known = {"lr", *shaping.METHODS[method].defaults}
    if key not in known:
        raise ValueError(
            f"{where}.{key}: unknown hyper-parameter for {method!r}; known: {sorted(known)}"
        )


def _check_settings(entry: spec.MethodEntry, tr: TrainSpec, env: EnvSpec) -> None:
    """Every setting of `entry` against its method's declared rules (`experiment.schema.check_hyper`,
    the LLM sweep's check) and a swept ``lr`` against ``[train] lr``'s (``> 0``).

    Raises:
        ValueError: naming ``methods[label]``, the method, the key and the value.
    """
    where = f"methods[{entry.label}]"
    default_n = shaping.METHODS[entry.method].defaults.get("top_n")
    for point in entry.points:
        setting = {"kl_coef": tr.kl_coef, **entry.fixed, **point}
        lr = setting.pop("lr", tr.lr)
        schema.require(schema.value_ok(lr, float, {"gt": 0}), f"{where}.lr", lr, "a number > 0")
        # The candidates the toy computes (`toymdp.train.TrainConfig.num_candidates`).
        top_n = setting.get("top_n", default_n)
        n = min(top_n, env.num_actions) if schema.value_ok(top_n, int, {"ge": 1}) else 1
        schema.check_hyper(
            entry.method, setting, where=where, group_size=tr.group_size, num_candidates=n
        )


def parse_config(doc: Mapping[str, Any], *, check_bounds: bool = True) -> SweepConfig:
    """Validate a TOML document (a dict) into a `SweepConfig`.

    `check_bounds=False` skips the methods' declared bounds (`_check_settings`), for one caller:
    figure 6's program-internal family (`toymdp.experiments.passk.FAMILY`), which runs DS-GRPO's
    advantage with signed coefficients to train the entropy bonus and penalty in the same
    compiled program (seed 000 Lemma B.4; its tests check each row equals its method). A config
    file is always checked.

    Raises:
        ValueError: naming the section and key of the first bad value.
    """
    unknown = sorted(set(doc) - set(TOP_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; known: {sorted(TOP_KEYS)}")
    schema.refuse_moved(doc, {"train.seeds": "seeds", "train.eval_steps": "checkpoints",
                            "frontier.reference": "reference"})  # fmt: skip
    env = parse_env(doc.get("env", {}))
    tr = parse_train(doc.get("train", {}))
    checkpoints = spec.parse_checkpoints(doc.get("checkpoints", 4), tr.updates)
    methods = spec.parse_methods(doc.get("methods"), _check_key, doc.get("tune"))
    for m in methods:
        if "lr" in m.fixed:
            raise ValueError(f"methods[{m.label}].fixed.lr: set lr in [train] or sweep it")
        if check_bounds:
            _check_settings(m, tr, env)
    num_resamples = parse_table("frontier", doc.get("frontier", {})).num_resamples
    return SweepConfig(
        env, tr, methods, spec.parse_reference(doc.get("reference"), methods),
        spec.parse_seeds(doc.get("seeds", [0, 1, 2, 3])), (0, *checkpoints), num_resamples,
        dict(doc),
    )  # fmt: skip


def describe() -> str:
    """Every key of a toy sweep file with its help (``python -m toymdp sweep --describe``)."""
    return spec.describe(TABLES)


def load_config(path: Path, sets: Iterable[str] = ()) -> SweepConfig:
    """Read a sweep TOML file, apply ``--set`` pairs (`experiment.spec.apply_sets`: ``seeds=[0]``,
    ``train.lr=0.05``; TOML literals) and validate it.

    Raises:
        ValueError: naming where the bad value came from (`experiment.schema.source_error`):
            ``--set KEY`` for a key a pair gave, else the file, the line that sets the key and the
            key (TOML syntax errors included); a bad pair or an unknown key names the pair.
    """
    doc = spec.apply_sets(schema.read_toml(path), sets, TOP_KEYS)
    try:
        return parse_config(doc)
    except ValueError as err:
        given = [pair.split("=", 1)[0].strip() for pair in sets]
        raise schema.source_error(path, err, given, given) from None
