"""The runner layer (`toymdp.engine`): the environment-as-data program against `make_train`,
`run_compiled`, and the cache key `code_hash`."""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from toymdp import engine
from toymdp import train as T
from toymdp.experiments import methods


def test_train_over_envs_equals_make_train() -> None:
    """Tracing `make_train` with the environment as data gives the run of `make_train` on that
    environment (same draws, same metrics up to float32 rounding)."""
    envs = methods.environments(np.random.default_rng(1))
    config = T.TrainConfig(envs[1], method="grpo", num_updates=5, group_size=4, pass_k=(1,))
    settings, key = T.default_settings(config), jax.random.key(3)
    fast = engine.COMPILE_OPTIONS  # the engine's own; the equality holds at any level
    ref = jax.jit(lambda s, k: T.make_train(config)(s, k)["exact"], compiler_options=fast)(
        settings, key
    )
    train = engine.train_over_envs(
        T.TrainConfig(envs[0], method="grpo", num_updates=5, group_size=4, pass_k=(1,))
    )
    got = jax.jit(lambda b, c, s, k: train(b, c, s, k)["exact"], compiler_options=fast)(
        envs[1].base_logits.astype(np.float32), envs[1].correct, settings, key
    )
    for name in ("correctness", "normalized_variance", "entropy"):
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(ref[name]), atol=2e-5)


def test_run_compiled_returns_numpy() -> None:
    out = engine.run_compiled(lambda x: {"double": 2 * x}, jnp.arange(3.0))
    assert isinstance(out["double"], np.ndarray)
    np.testing.assert_array_equal(out["double"], [0.0, 2.0, 4.0])


def test_code_hash_is_stable() -> None:
    """Twelve hex digits, the same on a second call (an unchanged tree reuses its cache)."""
    digest = engine.code_hash()
    assert len(digest) == 12 and int(digest, 16) >= 0
    assert engine.code_hash() == digest


def test_run_sources_cover_what_the_runs_import_and_not_the_analysis() -> None:
    """The sweep cache's key: every toymdp module that a run's code imports (transitively) is in
    `RUN_SOURCES`, and the statistics (`experiment`) and study layer are not, so editing them keeps
    the cached runs."""
    root = Path(engine.__file__).resolve().parent.parent
    files = {s for s in engine.RUN_SOURCES if s.endswith(".py")}
    for name in sorted(files):
        tree = ast.parse((root / name).read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("toymdp")
            ):
                mods = [node.module] if node.module != "toymdp" else [
                    f"toymdp.{a.name}" for a in node.names]  # fmt: skip
                for mod in mods:
                    assert mod.replace(".", "/") + ".py" in files, (name, mod)
    assert "experiment" not in engine.RUN_SOURCES and "toymdp/study.py" not in files
    assert engine.code_hash(engine.RUN_SOURCES) != engine.code_hash()


def test_each_sweep_caches_its_programs_in_its_own_folder(tmp_path) -> None:
    """`engine.jax_cache`: the programs compiled inside go to its folder, a second folder's
    programs to the second (JAX keeps the folder it read first unless its cache is reset), and
    the process's settings are back after."""
    before = jax.config.jax_compilation_cache_dir

    def compiled_into(folder: Path, scale: float) -> list[Path]:
        with engine.jax_cache(folder):
            assert jax.config.jax_compilation_cache_dir == str(folder)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.jit(lambda x: jnp.sin(x) * scale)(1.0).block_until_ready()
        return sorted(folder.rglob("*-cache"))

    assert compiled_into(tmp_path / "a", 2.0) and compiled_into(tmp_path / "b", 3.0)
    assert jax.config.jax_compilation_cache_dir == before
    assert jax.config.jax_persistent_cache_min_compile_time_secs != 0.0
