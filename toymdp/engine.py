"""The toy's execution engine, next to `toymdp.train.make_train` (PureJaxRL style): the compile
options of the small programs (`run_compiled`), `make_train` with the environment as data
(`train_over_envs`, vmapped over environments by the figures and the sweep), the persistent XLA
cache, and the code hash that keys cached results.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental.compilation_cache import compilation_cache

import numerics
from toymdp import train as T
from toymdp.env import TreeEnv

__all__ = [
    "COMPILE_OPTIONS",
    "code_hash",
    "jax_cache",
    "run_compiled",
    "run_over_draws",
    "train_over_envs",
]

#: XLA options for these small programs: the fast-compile level of `toymdp.train.FAST_COMPILE`
#: plus the classic (non-"fusion emitter") CPU code generator, which compiles the simulator's
#: scan about 3x faster here (0.25 s instead of 0.75 s for one method) at equal run time.
COMPILE_OPTIONS: dict[str, Any] = {**T.FAST_COMPILE, "xla_cpu_use_fusion_emitters": False}


def run_compiled(fn: Callable, *args: Any) -> Any:
    """`jax.jit(fn)(*args)` with `COMPILE_OPTIONS` (falling back to `T.FAST_COMPILE` on an XLA
    build that lacks the code-generator option), as NumPy arrays."""
    try:
        out = jax.jit(fn, compiler_options=COMPILE_OPTIONS)(*args)
    except Exception as err:  # XLA reports an unknown option as a runtime error
        if "compile option" not in str(err):
            raise
        out = jax.jit(fn, compiler_options=T.FAST_COMPILE)(*args)
    return jax.tree.map(np.asarray, out)


def train_over_envs(config: T.TrainConfig) -> Callable:
    """`train(base_logits, correct, settings, key)`: `make_train` with the environment as data.

    `make_train(config)` reads `config.env.base_logits` and `.correct` once, as arrays, and
    everything else (sizes, `train_prompts`, `sharing`) as static values. Tracing it with those
    two arrays replaced by the traced arguments gives one program for every environment that
    shares `config.env`'s static fields (vmap it over environments).

    Args (of the returned function):
        base_logits: `(P, N_int, V)`; correct: `(P, M)` bool; settings, key: as `make_train`.
    """

    def train(base_logits: jax.Array, correct: jax.Array, settings: T.Settings, key: jax.Array):
        env = copy.copy(config.env)
        object.__setattr__(env, "base_logits", base_logits)
        object.__setattr__(env, "correct", correct)
        traced = copy.copy(config)
        object.__setattr__(traced, "env", env)
        return T.make_train(traced)(settings, key)

    return train


_PACKAGES = ("numerics", "theory", "shaping", "experiment", "toymdp")
# What a sweep's runs (not their analysis) are computed by: the statistics of `experiment` and the
# study layer change the tables, not the runs, so editing them keeps the sweeps' caches.
RUN_SOURCES = ("numerics", "theory", "shaping", "toymdp/engine.py", "toymdp/env.py",
               "toymdp/environments.py", "toymdp/metrics.py", "toymdp/policy.py",
               "toymdp/reference.py", "toymdp/sweep.py", "toymdp/sweep_spec.py",
               "toymdp/train.py")  # fmt: skip


def code_hash(sources: tuple[str, ...] = _PACKAGES) -> str:
    """SHA-256 (first 12 hex digits) of every `.py` file of `sources` (packages or files under
    the repository root; default: every package the toy's results and analyses depend on) and of
    the numeric settings they were computed under (`numerics.tag()`: pinned or native)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for name in sources:
        where = root / name
        for path in sorted(where.rglob("*.py")) if where.is_dir() else [where]:
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    digest.update(numerics.tag().encode())
    return digest.hexdigest()[:12]


_CACHE_OPTIONS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")


@contextmanager
def jax_cache(path: Path) -> Iterator[None]:
    """XLA's persistent compilation cache in the folder `path` for the programs compiled inside
    (compilation dominates a small experiment: a rerun loads them), and the process's previous
    cache settings after. JAX reads its cache folder once, at the first compilation, and keeps
    it: set once for a whole process, every later sweep's programs went into the first one's
    folder (and warned once it was deleted), so each change is followed by `reset_cache`."""
    before = {name: getattr(jax.config, name) for name in _CACHE_OPTIONS}
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def run_over_draws(
    config: T.TrainConfig,
    envs: Sequence[TreeEnv],
    settings: T.Settings,
    keys: jax.Array,
    steps: Sequence[int],
    metrics: Sequence[str],
    *,
    fast_compile: bool = False,
) -> dict[str, np.ndarray]:
    """Train `config` on every environment draw × setting × seed in one compiled program
    (`vmap` of `train_over_envs`; the draws share `config.env`'s static fields).

    Args:
        envs: the `D` draws. settings: `N` stacked settings (`T.stack_settings`). keys: `(R,)`.
        steps: the evaluated updates (0: the base policy). metrics: names of `make_train`'s exact
            metrics (``distinct_correct`` keeps its first K).

    Returns:
        `{metric: (N, D, R, T steps, P[, k])}` float32 per-prompt exact metrics.
    """
    steps = np.asarray(steps)
    train = jax.vmap(train_over_envs(config), (None, None, None, 0))  # seeds
    train = jax.vmap(train, (None, None, 0, None))  # settings
    train = jax.vmap(train, (0, 0, None, None))  # draws
    base = np.stack([e.base_logits for e in envs]).astype(np.float32)
    correct = np.stack([e.correct for e in envs])

    def program(settings: T.Settings, keys: jax.Array) -> dict[str, jax.Array]:
        exact = train(base, correct, settings, keys)["exact"]  # (D, N, R, U + 1, P, ...)
        out = {k: exact[k][:, :, :, steps] for k in metrics}
        out["distinct_correct"] = out["distinct_correct"][..., 0]
        return out

    if fast_compile:
        out = jax.tree.map(
            np.asarray, jax.jit(program, compiler_options=T.FAST_COMPILE)(settings, keys)
        )
    else:
        out = run_compiled(program, settings, keys)
    return {k: np.swapaxes(v, 0, 1).astype(np.float32) for k, v in out.items()}
