"""The toy's own sweep tables (`python -m toymdp sweep`; the shared keys are `experiment.spec`'s):
``[env]`` (`EnvSpec`) with one environment per draw seed (`environments`: figure 6's popularity
dataset with its constants as arguments, or a single prompt) and ``[train]`` (`TrainSpec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from theory import trees
from toymdp.env import TreeEnv
from toymdp.train import OPTIMIZERS

__all__ = [
    "KINDS",
    "EnvSpec",
    "TrainSpec",
    "environments",
    "parse_env",
    "parse_train",
    "popularity_dataset",
    "single_prompt",
]

KINDS = ("dataset", "single")


@dataclass(frozen=True)
class EnvSpec:
    """`[env]`: the environment and its draws (module docstring)."""

    kind: str = "dataset"
    num_actions: int = 4
    depth: int = 3
    draws: tuple[int, ...] = (0,)
    skew: float = 1.0
    base_correctness: float | None = None
    multiplicities: tuple[int, ...] = (1, 2, 4, 8, 16)
    per_size: int = 8
    zipf: float = 1.0
    correct: tuple[str, ...] | None = None
    correct_size: int | None = None


def _fields(section: str, table: object, cls: type) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise ValueError(f"[{section}] must be a table, got {type(table).__name__}")
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"{section}: unknown key(s) {unknown}; known: {sorted(known)}")
    out = dict(table)
    for name, value in out.items():
        default = cls.__dataclass_fields__[name].default
        if isinstance(value, list):
            out[name] = tuple(value)
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def _int_list(where: str, values: object, minimum: int) -> None:
    if not isinstance(values, tuple) or not values:
        raise ValueError(f"{where} must be a non-empty list of integers, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{where} must hold integers >= {minimum}, got {v!r}")


def _check_type(where: str, value: object, kind: type | tuple) -> None:
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise ValueError(f"{where} has the wrong type: {value!r}")


def parse_env(table: object) -> EnvSpec:
    """Validate the ``[env]`` table.

    Raises:
        ValueError: naming ``env.<key>`` and the bad value.
    """
    env = EnvSpec(**_fields("env", table, EnvSpec))
    if env.kind not in KINDS:
        raise ValueError(f"env.kind must be one of {list(KINDS)}, got {env.kind!r}")
    for name in ("num_actions", "depth", "per_size"):
        _int_list(f"env.{name}", (getattr(env, name),), 1)
    if env.num_actions < 2:
        raise ValueError(f"env.num_actions must be >= 2, got {env.num_actions}")
    _int_list("env.draws", env.draws, 0)
    _int_list("env.multiplicities", env.multiplicities, 1)
    m = env.num_actions**env.depth
    if max(env.multiplicities) > m:
        raise ValueError(f"env.multiplicities must be <= M = {m}, got {env.multiplicities}")
    _check_type("env.skew", env.skew, float)
    if env.skew < 0:
        raise ValueError(f"env.skew must be >= 0, got {env.skew}")
    bc = env.base_correctness
    if bc is not None and (
        isinstance(bc, bool) or not isinstance(bc, int | float) or not 0 < bc < 1
    ):
        raise ValueError(f"env.base_correctness must be in (0, 1), got {env.base_correctness!r}")
    if env.kind == "single" and (env.correct is None) == (env.correct_size is None):
        raise ValueError("env: a single prompt needs exactly one of `correct` or `correct_size`")
    if env.correct_size is not None and not 1 <= env.correct_size <= m:
        raise ValueError(f"env.correct_size must be in [1, M = {m}], got {env.correct_size!r}")

    return env


@dataclass(frozen=True)
class TrainSpec:
    """`[train]`: training and evaluation (module docstring)."""

    optimizer: str = "adam"
    lr: float = 0.1
    updates: int = 100
    group_size: int = 8
    epochs: int = 1
    kl_coef: float = 0.0
    seed: int = 0
    pass_k: tuple[int, ...] = (1, 4, 16, 64)
    distinct_k: int = 16
    fast_compile: bool = False


def parse_train(table: object) -> TrainSpec:
    """Validate the ``[train]`` table.

    Raises:
        ValueError: naming ``train.<key>`` and the bad value.
    """
    tr = TrainSpec(**_fields("train", table, TrainSpec))
    if tr.optimizer not in OPTIMIZERS:
        raise ValueError(f"train.optimizer must be one of {list(OPTIMIZERS)}, got {tr.optimizer!r}")
    for name in ("updates", "group_size", "epochs", "distinct_k"):
        _int_list(f"train.{name}", (getattr(tr, name),), 1)
    _int_list("train.seed", (tr.seed,), 0)
    _int_list("train.pass_k", tr.pass_k, 1)
    for name in ("lr", "kl_coef"):
        if isinstance(getattr(tr, name), bool) or not isinstance(getattr(tr, name), float):
            raise ValueError(f"train.{name} has the wrong type: {getattr(tr, name)!r}")
    if tr.lr <= 0:
        raise ValueError(f"train.lr must be > 0, got {tr.lr}")
    return tr


def _tilt(log_pb: np.ndarray, correct: np.ndarray, target: float) -> np.ndarray:
    """Rescale each row's mass on `C` to `target` (and off `C` to `1 − target`), keeping the
    base policy's preferences within `C` and within its complement (as figure 6)."""
    log_pc = np.logaddexp.reduce(np.where(correct, log_pb, -np.inf), axis=-1, keepdims=True)
    log_pw = np.logaddexp.reduce(np.where(correct, -np.inf, log_pb), axis=-1, keepdims=True)
    return np.where(correct, np.log(target) + log_pb - log_pc, np.log1p(-target) + log_pb - log_pw)


def popularity_dataset(rng: np.random.Generator, spec: EnvSpec) -> TreeEnv:
    """Figure 6's popularity dataset (`toymdp.experiments.passk.toy_dataset`) with its constants
    as arguments: `per_size` training then `per_size` held-out prompts per multiplicity.

    Returns:
        A `TreeEnv` with `P = 2·per_size·len(multiplicities)` prompts, `sharing="factored"`.
    """
    v, h = spec.num_actions, spec.depth
    m = trees.num_trajectories(v, h)
    popularity = np.empty(m)
    popularity[rng.permutation(m)] = 1.0 / np.arange(1, m + 1) ** spec.zipf
    popularity /= popularity.sum()
    sizes = np.tile(np.repeat(spec.multiplicities, spec.per_size), 2)  # (P,)
    correct = np.zeros((sizes.size, m), dtype=bool)
    for p, size in enumerate(sizes):
        correct[p, rng.choice(m, size=size, replace=False, p=popularity)] = True
    log_pb = trees.trajectory_log_probs(
        np.stack([trees.random_base_logits(rng, v, h, spec.skew) for _ in sizes]), v, h
    )
    if spec.base_correctness is not None and not correct.all():
        log_pb = _tilt(log_pb, correct, float(spec.base_correctness))
    base = trees.logits_from_log_probs(log_pb, v, h)
    train = np.arange(sizes.size) < sizes.size // 2
    return TreeEnv(v, h, correct, base, train, sharing="factored")


def single_prompt(rng: np.random.Generator, spec: EnvSpec) -> TreeEnv:
    """One prompt: correct set by labels or drawn at random, base uniform (`skew = 0`) or random."""
    v, h = spec.num_actions, spec.depth
    m = trees.num_trajectories(v, h)
    correct = np.zeros((1, m), dtype=bool)
    if spec.correct is not None:
        labels = {lab: i for i, lab in enumerate(trees.trajectory_labels(v, h))}
        for item in spec.correct:
            if item not in labels:
                raise ValueError(f"env.correct: {item!r} is not a trajectory of V={v}, H={h}")
            correct[0, labels[item]] = True
    else:
        correct[0, rng.choice(m, size=spec.correct_size, replace=False)] = True
    n_int = trees.num_internal_nodes(v, h)
    logits = (
        trees.random_base_logits(rng, v, h, spec.skew) if spec.skew > 0 else np.zeros((n_int, v))
    )
    log_pb = trees.trajectory_log_probs(logits[None], v, h)
    if spec.base_correctness is not None and not correct.all():
        log_pb = _tilt(log_pb, correct, float(spec.base_correctness))
    base = trees.logits_from_log_probs(log_pb, v, h)
    return TreeEnv(v, h, correct, base, np.ones(1, dtype=bool))


def environments(spec: EnvSpec) -> list[TreeEnv]:
    """One environment per draw seed (`spec.draws`)."""
    build = popularity_dataset if spec.kind == "dataset" else single_prompt
    return [build(np.random.default_rng(d), spec) for d in spec.draws]
