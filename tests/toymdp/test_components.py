"""Environment validation, the JAX tabular policy and the exact metrics against `theory/`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theory import measures, trees
from toymdp import env as E
from toymdp import metrics as M
from toymdp import policy as pol
from toymdp import reference as R
from toymdp import train as T


def _env(sharing: str = "factored") -> E.TreeEnv:
    return E.multi_prompt_env(
        np.random.default_rng(0), num_prompts=3, num_heldout=1, num_actions=3, depth=2,
        correct_size=3, shared_size=1, sharing=sharing,
    )  # fmt: skip


# ---- validation: every error names its field ------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"method": "nope"}, "method"),
        ({"group_size": 0}, "group_size"),
        ({"group_size": -3}, "group_size"),
        ({"num_updates": 0}, "num_updates"),
        ({"num_epochs": 0}, "num_epochs"),
        ({"mode": "offline"}, "mode"),
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"mode": "exact", "objective": "tsallis"}, "objective"),
        ({"anchor": "prompt"}, "anchor"),
        ({"num_candidates": 4}, "num_candidates"),
        ({"pass_k": (1, 0)}, "pass_k"),
        ({"distinct_k": ()}, "distinct_k"),
        ({"method_hyper": {"bogus": 1.0}}, "method_hyper"),
        ({"method": "casp", "method_hyper": {"alpha": 2.0}}, "alpha"),
        ({"method": "passk", "group_size": 2, "method_hyper": {"k": 4}}, "k"),
        ({"method": "grpo", "method_hyper": {"loss_agg": "sum"}}, "loss_agg"),
    ],
)
def test_invalid_train_config_names_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        T.TrainConfig(_env(), **kwargs)


def test_invalid_settings_name() -> None:
    cfg = T.TrainConfig(_env())
    with pytest.raises(ValueError, match="settings"):
        T.default_settings(cfg, gamma_p=0.1)  # grpo has no gamma_p


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: E.from_correct_sets(4, 3, [["ACD", "AXD"]]), "correct"),
        (lambda: E.from_correct_sets(2, 2, [[0, 4]]), "correct"),
        (lambda: E.from_correct_sets(2, 2, [[0], []]), "correct"),
        (lambda: E.from_correct_sets(2, 2, [[0]], sharing="global"), "sharing"),
        (lambda: E.from_correct_sets(2, 2, [[0], [1]], train_prompts=[False, False]), "train_prompts"),
        (lambda: E.from_correct_sets(2, 2, [[0]], base_logits=np.zeros((2, 2))), "base_logits"),
        (lambda: E.from_correct_sets(2, 2, [[0]], base_logits=np.full((3, 2), np.nan)), "base_logits"),
        (lambda: E.TreeEnv(1, 2, np.ones((1, 1), bool), np.zeros((1, 1)), np.ones(1, bool)), "num_actions"),
        (lambda: E.TreeEnv(2, 0, np.ones((1, 1), bool), np.zeros((1, 2)), np.ones(1, bool)), "depth"),
        (lambda: E.multi_prompt_env(np.random.default_rng(0), correct_size=100), "correct_size"),
    ],
)  # fmt: skip
def test_invalid_env_names_field(make, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make()


def test_casp_env_matches_theory() -> None:
    env = E.casp_env()
    tree = trees.casp_tree()
    assert env.correct.shape == (1, 64) and env.correct.sum() == 6
    np.testing.assert_array_equal(env.correct[0], tree.correct)
    np.testing.assert_allclose(env.base_log_probs()[0], tree.log_pb, atol=1e-12)
    named = E.from_correct_sets(4, 3, [trees.CASP_CORRECT])
    np.testing.assert_array_equal(named.correct, env.correct)


# ---- policy -----------------------------------------------------------------------------------


def test_trajectory_log_probs_match_theory() -> None:
    logits = np.random.default_rng(1).normal(size=(2, 13, 3))
    nodes, actions = pol.tree_index(3, 3)
    got = pol.trajectory_log_probs(pol.node_log_probs(jnp.asarray(logits)), nodes, actions)
    np.testing.assert_allclose(got, trees.trajectory_log_probs(logits, 3, 3), atol=1e-5)


def test_sampling_inverts_the_cdf() -> None:
    rng = np.random.default_rng(2)
    lp = trees.random_base_policy(rng, 2, 3)[None]
    u = rng.uniform(size=(1, 500))
    got = np.asarray(pol.sample_trajectories(jnp.asarray(lp), jnp.asarray(u)))
    want = np.searchsorted(np.cumsum(np.exp(lp[0])), u[0], side="right")
    assert (got[0] == np.minimum(want, 7)).mean() > 0.99  # float32 vs float64 boundaries
    counts = np.bincount(got[0], minlength=8) / 500
    assert np.abs(counts - np.exp(lp[0])).max() < 0.08


def test_candidates_and_sampled_rank() -> None:
    logp = jnp.log(jnp.asarray([[[0.2, 0.5, 0.3], [1 / 3, 1 / 3, 1 / 3]]]))  # (B=1, N_int=2, V=3)
    order, rank = pol.candidate_ranking(logp)
    np.testing.assert_array_equal(order[0], [[1, 2, 0], [0, 1, 2]])  # ties broken by index
    tok_nodes = jnp.asarray([[[0, 1]]])
    tok_actions = jnp.asarray([[[0, 2]]])
    np.testing.assert_array_equal(pol.sampled_rank(rank, tok_nodes, tok_actions), [[[2, 2]]])
    cand = pol.candidate_log_probs(logp, order, tok_nodes, 2)  # (1, 1, 2, 2)
    np.testing.assert_allclose(np.exp(cand[0, 0, 0]), [0.5, 0.3], rtol=1e-6)


def test_hamming_diversity() -> None:
    acts = jnp.asarray([[[0, 0], [0, 1], [0, 0]]])  # responses 0 and 2 identical
    s = np.asarray(pol.hamming_diversity(acts))[0]
    # s_sem = mean normalized Hamming distance to the others; u = 1 only for response 1.
    np.testing.assert_allclose(s, [0.5 * 0.25, 0.5 * (0.5 + 1.0), 0.5 * 0.25])


# ---- exact metrics against theory.measures ----------------------------------------------------


def test_exact_metrics_match_theory() -> None:
    env = _env()
    rng = np.random.default_rng(3)
    logits = env.base_logits + 2.0 * rng.normal(size=env.base_logits.shape)
    cfg = T.TrainConfig(env, pass_k=(1, 3, 50), distinct_k=(1, 10, 1000), num_candidates=3)
    nodes, actions = pol.tree_index(env.num_actions, env.depth)
    node_logp = pol.node_log_probs(jnp.asarray(logits, jnp.float32))
    base_lp = pol.trajectory_log_probs(
        pol.node_log_probs(jnp.asarray(env.base_logits, jnp.float32)), nodes, actions
    )
    kw = {"distinct_k": cfg.distinct_k, "pass_k": cfg.pass_k, "num_candidates": 3}
    correct = jnp.asarray(env.correct)
    got = jax.jit(lambda a, b: M.exact_metrics(a, b, correct, nodes, actions, **kw))(
        node_logp, base_lp
    )
    want = R.reference_metrics(np.asarray(jax.nn.log_softmax(logits, axis=-1)), cfg)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=2e-4, atol=2e-5, err_msg=key)
    # Spot checks straight against theory.measures, and the identities that define the metrics.
    lp = trees.trajectory_log_probs(logits, 3, 2)
    np.testing.assert_allclose(
        got["distinct_correct"][:, 2],
        [measures.expected_distinct(lp[p], 1000, env.correct[p]) for p in range(3)],
        rtol=1e-4,
    )
    np.testing.assert_allclose(got["distinct_correct"][:, 0], got["correctness"], rtol=1e-5)
    np.testing.assert_allclose(got["pass_at_k"][:, 0], got["correctness"], rtol=1e-6)
    np.testing.assert_allclose(got["topn_prob"].sum(-1), 1.0, rtol=1e-5)  # N = V


def test_prompt_means_split_train_and_heldout() -> None:
    env = _env()
    values = {"correctness": np.array([[0.1, 0.3, 0.9]]), "pass_at_k": np.ones((1, 3, 2))}
    out = M.prompt_means(values, env)
    np.testing.assert_allclose(out["train/correctness"], [0.2])
    np.testing.assert_allclose(out["heldout/correctness"], [0.9])
    assert out["train/pass_at_k"].shape == (1, 2)
