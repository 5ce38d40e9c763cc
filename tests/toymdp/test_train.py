"""The simulator: exact mode against theory's closed forms, every registry method, vmap, seeds,
and the sampled mode against the NumPy reference.

Compiling dominates the run time, so configs are tiny, compiled functions are shared through
module-scoped fixtures, every method is compiled into one program, and XLA runs at its fast-compile
level (`toymdp.train.FAST_COMPILE`).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import shaping
from theory import optimum, trees
from toymdp import engine
from toymdp import env as E
from toymdp import policy as pol
from toymdp import reference as R
from toymdp import train as T


def _final_log_probs(config: T.TrainConfig, params: dict) -> np.ndarray:
    env = config.env
    nodes, actions = pol.tree_index(env.num_actions, env.depth)
    logits = T.policy_logits(params, env.base_logits)
    lp = pol.trajectory_log_probs(pol.node_log_probs(logits), nodes, actions)
    return np.asarray(lp, np.float64)[env.train_index]


# ---- exact mode converges to theory's closed form ---------------------------------------------

EXACT_CASES = [
    ("kl", "policy", {}),
    ("entropy", "policy", {"eta": 0.2}),
    ("entropy", "base", {"eta": 0.2}),
    ("ds", "policy", {"gamma_p": 0.1, "gamma_n": 0.05}),
    ("ds", "base", {"gamma_p": 0.1, "gamma_n": 0.05}),
]


@pytest.mark.parametrize(("objective", "anchor", "values"), EXACT_CASES)
def test_exact_mode_converges_to_closed_form(objective: str, anchor: str, values: dict) -> None:
    rng = np.random.default_rng(5)
    env = E.single_tree(trees.random_instance(rng, num_actions=3, depth=2, skew=1.0))
    cfg = T.TrainConfig(
        env, mode="exact", objective=objective, anchor=anchor, num_updates=1500,
        learning_rate=0.05, beta=0.5,
    )  # fmt: skip
    settings = T.default_settings(cfg, **values)
    out = T.jit_train(T.make_train(cfg), fast_compile=True)(settings, jax.random.key(0))
    star = T.closed_form(cfg, settings)
    tv = 0.5 * np.abs(np.exp(_final_log_probs(cfg, out["params"])) - np.exp(star)).sum(-1)
    assert tv.max() < 1e-3
    objective_path = np.asarray(out["train"]["objective"])
    assert objective_path[-1] >= objective_path[0]
    assert out["exact"]["correctness"].shape == (1501, 1)


# ---- sampled mode: every registry method on the CaSP tree -------------------------------------


def test_every_method_runs_without_nan() -> None:
    """Three updates of every registry method the NumPy reference does not cover on the CaSP tree,
    compiled as one program (the covered ones: `test_sampled_mode_matches_numpy_reference`, whose
    values are finite and equal the reference's).

    One test (not one per method) so that pytest-xdist workers do not each compile the program.
    """
    configs = {
        name: T.TrainConfig(
            E.casp_env(), method=name, group_size=4, num_updates=3, num_epochs=2, learning_rate=0.3
        )
        for name in sorted(set(shaping.METHODS) - set(R.REFERENCE_METHODS))
    }
    trains = {name: T.make_train(cfg) for name, cfg in configs.items()}

    def run(settings: dict, key: jax.Array) -> dict:
        return {name: trains[name](settings[name], key) for name in trains}

    settings = {name: T.default_settings(cfg) for name, cfg in configs.items()}
    outs = jax.jit(run, compiler_options=T.FAST_COMPILE)(settings, jax.random.key(4))
    failures = []
    for name, out in outs.items():
        values = {**out["exact"], **out["train"]}
        failures += [f"{name}/{k}" for k, v in values.items() if not np.isfinite(v).all()]
        assert out["exact"]["correctness"].shape == (4, 1), name
        assert out["train"]["reward"].shape == (3,), name
    assert not failures, f"non-finite metrics: {failures}"
    # Same key and the same (base) behaviour policy: every method sees the same first batch.
    assert len({float(out["train"]["reward"][0]) for out in outs.values()}) == 1


# ---- vmap over settings x seeds, determinism --------------------------------------------------


@pytest.fixture(scope="module")
def grpo_kl() -> tuple[T.TrainConfig, object]:
    cfg = T.TrainConfig(
        E.casp_env(), method="grpo", group_size=4, num_updates=4, num_epochs=2,
        learning_rate=0.3, record_policy=True,
    )  # fmt: skip
    return cfg, T.jit_train(T.make_train(cfg), fast_compile=True)


def test_vmap_equals_per_run(grpo_kl: tuple) -> None:
    cfg, single = grpo_kl
    grid = T.settings_grid(cfg, lr=[0.3], kl_coef=[0.0, 0.2])
    keys = T.seed_keys(0, 2)
    batched = T.vmap_train(T.make_train(cfg), fast_compile=True)(grid, keys)
    assert batched["exact"]["correctness"].shape == (2, 2, 5, 1)
    for i in range(2):
        settings = jax.tree.map(lambda a, i=i: a[i], grid)
        for j in range(2):
            one = single(settings, keys[j])
            for key in one["exact"]:
                np.testing.assert_allclose(
                    batched["exact"][key][i, j], one["exact"][key], rtol=1e-5, atol=1e-6,
                    err_msg=key,
                )  # fmt: skip


def test_same_seed_bit_identical(grpo_kl: tuple) -> None:
    cfg, single = grpo_kl
    settings = T.default_settings(cfg)
    a = single(settings, jax.random.key(7))
    b = single(settings, jax.random.key(7))
    c = single(settings, jax.random.key(8))
    for key in a["exact"]:
        np.testing.assert_array_equal(np.asarray(a["exact"][key]), np.asarray(b["exact"][key]))
    assert not np.array_equal(
        np.asarray(a["exact"]["traj_logp"]), np.asarray(c["exact"]["traj_logp"])
    )


# ---- sampled mode against the NumPy reference (same uniforms, hence the same draws) -----------


def _reference_case(index: int, method: str) -> tuple[T.TrainConfig, dict]:
    """Cycle optimizer, sharing and KL over the methods so every combination is covered."""
    optimizer = ("adam", "sgd")[index % 2]
    env = E.multi_prompt_env(
        np.random.default_rng(0), num_prompts=3, num_heldout=1, num_actions=3, depth=2,
        correct_size=3, shared_size=1, sharing=E.SHARING[index % 3],
    )  # fmt: skip
    cfg = T.TrainConfig(
        env, method=method, optimizer=optimizer, group_size=4, num_updates=6, num_epochs=3,
        method_hyper={"k": 2} if method == "passk" else {},
    )  # fmt: skip
    values = {"lr": 0.3 if optimizer == "adam" else 3.0, "kl_coef": (0.0, 0.1, 0.05)[index % 3]}
    return cfg, T.default_settings(cfg, **values)


def test_sampled_mode_matches_numpy_reference() -> None:
    """JAX and NumPy runs of every method the reference covers, from the same uniforms.

    The JAX runs are compiled as one program, in one test (see `test_every_method_runs_without_nan`).
    """
    cases = {m: _reference_case(i, m) for i, m in enumerate(R.REFERENCE_METHODS)}
    trains = {m: T.make_train(cfg) for m, (cfg, _) in cases.items()}
    key = jax.random.key(1)

    def run(settings: dict) -> dict:
        return {m: trains[m](settings[m], key) for m in trains}

    outs = jax.jit(run, compiler_options=T.FAST_COMPILE)({m: s for m, (_, s) in cases.items()})
    clipped = 0
    for method, (cfg, settings) in cases.items():
        got = outs[method]
        values = {**got["exact"], **got["train"]}
        assert all(np.isfinite(v).all() for v in values.values()), method  # equal NaNs pass below
        want = R.reference_train(cfg, settings, np.asarray(T.sampling_uniforms(cfg, key)))
        np.testing.assert_array_equal(
            np.asarray(got["train"]["reward"]), want["train"]["reward"], err_msg=method
        )
        np.testing.assert_allclose(
            got["train"]["loss"], want["train"]["loss"], atol=1e-5, err_msg=method
        )
        for name in want["exact"]:
            np.testing.assert_allclose(
                got["exact"][name], want["exact"][name], rtol=1e-4, atol=1e-5,
                err_msg=f"{method}/{name}",
            )  # fmt: skip
        # The run must move, or the comparison proves little.
        moved = np.abs(want["exact"]["correctness"][-1] - want["exact"]["correctness"][0]).max()
        assert moved > 0.01, method
        clipped += bool(np.max(got["train"]["clip_frac"]) > 0)
    assert clipped >= len(cases) // 2  # the clipped branch of the gradient is exercised


def test_reference_rejects_uncovered_methods() -> None:
    cfg = T.TrainConfig(E.casp_env(), method="casp", num_updates=1)
    with pytest.raises(ValueError, match="method"):
        R.reference_train(cfg, T.default_settings(cfg), np.zeros((1, 1, 8)))


def test_population_objective_is_theory_objective() -> None:
    env = E.multi_prompt_env(np.random.default_rng(6), num_prompts=2, num_actions=2, depth=3)
    rng = np.random.default_rng(7)
    logits = env.base_logits + rng.normal(size=env.base_logits.shape)
    nodes, actions = pol.tree_index(2, 3)
    lp = trees.trajectory_log_probs(logits, 2, 3)
    lpb = env.base_log_probs()
    r = env.correct.astype(float)
    settings = {"beta": 0.3, "eta": 0.2, "gamma_p": 0.1, "gamma_n": 0.05}
    coefs = {
        "kl": 0.0,
        "entropy": 0.2,
        "ds": np.where(env.correct, 0.1, -0.05),
    }
    for objective, coef in coefs.items():
        for anchor in ("policy", "base"):
            got = T.population_objective(
                pol.node_log_probs(logits), lpb, r, env.correct, nodes, actions,
                settings, objective, anchor,
            )  # fmt: skip
            kwargs = {"coef_policy": coef} if anchor == "policy" else {"coef_base": coef}
            want = optimum.objective(lp, lpb, r, 0.3, **kwargs).mean()
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{objective}/{anchor}")


# ---- the off-policy regime: several optimizer steps per batch (issue 38 item 2) ---------------


def _regimes(cases: tuple[tuple[str, int], ...]) -> dict[tuple[str, int], dict]:
    """`(method, epochs)` -> that run's metrics, every run compiled into one program (one compile,
    not one per run; see `test_every_method_runs_without_nan`), with the options of the sweeps'
    programs (`toymdp.engine.COMPILE_OPTIONS`: two thirds of the compile time here)."""
    configs = {}
    for method, epochs in cases:
        configs[method, epochs] = T.TrainConfig(
            E.casp_env(), method=method, group_size=4, num_updates=4, num_epochs=epochs,
            learning_rate=0.3, record_policy=True,
        )  # fmt: skip
    trains = [T.make_train(configs[case]) for case in cases]

    def run(settings: list, key: jax.Array) -> list:
        return [train(s, key) for train, s in zip(trains, settings, strict=True)]

    settings = [T.default_settings(configs[case]) for case in cases]
    outs = jax.jit(run, compiler_options=engine.COMPILE_OPTIONS)(settings, jax.random.key(3))
    return {
        case: jax.tree.map(np.asarray, {"exact": out["exact"], "train": out["train"]})
        for case, out in zip(cases, outs, strict=True)
    }


def test_one_step_per_batch_is_on_policy_and_several_make_clipping_act() -> None:
    """One optimizer step per batch: every ratio is 1, nothing is clipped, and the methods that
    differ from GRPO only off-policy (`shaping.OFF_POLICY_ONLY`) train GRPO's policy bit for bit.
    Three steps per batch: the ratio moves, clipping acts, and they part from GRPO."""
    runs = _regimes((("grpo", 1), ("dual_clip", 1), ("cispo", 1), ("grpo", 3), ("cispo", 3)))
    on = {m: runs[m, 1] for m in ("grpo", "dual_clip", "cispo")}
    assert np.all(on["grpo"]["train"]["clip_frac"] == 0)
    for m in ("dual_clip", "cispo"):
        for key, value in on["grpo"]["exact"].items():
            np.testing.assert_array_equal(on[m]["exact"][key], value, err_msg=f"{m} {key}")
    off = {m: runs[m, 3] for m in ("grpo", "cispo")}
    assert np.any(off["grpo"]["train"]["clip_frac"] > 0)
    assert not np.array_equal(off["grpo"]["exact"]["traj_logp"], off["cispo"]["exact"]["traj_logp"])
