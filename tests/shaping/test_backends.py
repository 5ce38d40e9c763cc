"""Cross-backend equality: numpy, jax, jax.jit, torch and torch with ``requires_grad``.

Every method's loss gives the reference value on every backend, and ``jax.grad`` and torch
autograd give the reference gradients with respect to ``logp`` (and ``entropy`` / ``cand_logp``).
Seeded batches (not Hypothesis) keep ``jax.jit`` compilations to one per case.
"""

from __future__ import annotations

import numpy as np
import pytest

import shaping
from tests.tolerance import assert_close as derived_close

from . import reference as ref
from .helpers import BACKENDS, assert_close, call_block, convert, evaluate, requires
from .strategies import random_batch

# One non-default setting per method that switches on its optional branches.
NON_DEFAULT: dict[str, dict[str, object]] = {
    "grpo": {"std_correction": 0, "loss_agg": "seq-mean-token-mean", "kl_coef": 0.2},
    "dr_grpo": {"kl_coef": 0.1, "max_response_length": 9},
    "ds_grpo": {"gamma_p": 0.1, "gamma_n": 0.05, "logp_reduction": "mean"},
    "ds_grpo_pos": {"gamma_p": 0.1, "loss_agg": "seq-mean-token-sum-norm"},
    "ds_grpo_neg": {"gamma_n": 0.1},
    "entropy_bonus": {"form": "token", "eta": 0.1},
    "entropy_penalty": {"form": "token", "eta": 0.1, "loss_agg": "seq-mean-token-mean"},
    "diff_entropy": {"eta_pos": 0.2, "eta_neg": 0.1},
    "dsdr": {"lam_loc": 0.5, "tau": 0.3},
    "progrpo": {"confidence_ref": "group_mean", "alpha": 1.0},
    "casp": {"alpha": 0.6, "quantile": 0.5, "lam_top1": 1.5},
    "unlikeliness": {"beta_rank": 0.9, "skip_uniform_groups": False},
    "passk": {"k": 2},
    "w_reinforce": {"lam": 0.5},
    "psr": {"eps_high": 0.28, "subset_normalization": True},
    "nsr": {"eps_low": 0.1, "subset_normalization": True},
    "dual_clip": {"clip_ratio_c": 1.05, "kl_coef": 0.1, "kl_estimator": "k3+"},
    "gspo": {"eps_low": 0.2, "eps_high": 0.28, "loss_agg": "token-mean"},
    "cispo": {"eps_low": 0.2, "eps_high": 0.1},
    "clip_cov": {"clip_cov_ratio": 0.5, "clip_cov_lb": 0.0, "clip_cov_ub": 100.0},
    "kl_cov": {"kl_cov_ratio": 0.3, "ppo_kl_coef": 0.5},
    "entropy_adv": {"alpha": 1.0, "kappa": 1.0, "top_entropy_quantile": 0.2},
    "lite_ppo": {"std_correction": 0, "kl_coef": 0.1, "kl_estimator": "k1"},
    "grpo_passk": {"eps_high": 0.5, "kl_coef": 0.1, "kl_estimator": "k2"},
    "pkpo": {"k": 2, "eps_high": 0.28, "loss_agg": "seq-mean-token-mean"},
}
#: Methods whose default setting has no gradient on the seed-7 batch, legitimately: best-of-k
#: credits only group 0's response 0, and every one of its ratios is past 1 + eps_high (1.2).
#: Their custom setting (above) widens the clip, and there the gradient must be nonzero.
CLIPPED_AT_DEFAULT = frozenset({"grpo_passk"})
#: Every registered method (a new one without a NON_DEFAULT entry gets a common-only setting).
NAMES = tuple(sorted(shaping.METHODS))
SETTINGS = [(name, "default") for name in NAMES] + [(name, "custom") for name in NAMES]


def _hyper(name: str, which: str) -> dict[str, object]:
    if which == "default":
        return {}
    return dict(NON_DEFAULT.get(name, {"eps_high": 0.28, "loss_agg": "seq-mean-token-mean"}))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "which"), SETTINGS)
def test_loss_and_gradients_agree_across_backends(name, which, backend):
    pytest.importorskip("torch")  # the reference gradients come from torch autograd
    batch = random_batch(seed=7)
    hyper = _hyper(name, which)
    want_loss, want_grads = ref.loss(name, batch, **hyper)
    value, grads = evaluate(shaping.get_method(name), batch, backend, hyper)
    assert_close(value, want_loss, what=f"{name}/{backend} loss")
    if grads is None:
        return
    assert set(grads) == set(want_grads)
    for key, want in want_grads.items():
        assert_close(grads[key], want, what=f"{name}/{backend} d loss / d {key}")
    # The test batch must exercise the gradient, or equal zeros would prove nothing.
    assert np.any(want_grads["logp"] != 0) or (which, name) in {
        ("default", n) for n in CLIPPED_AT_DEFAULT
    }
    if name == "casp" and which == "custom":
        assert np.any(want_grads["cand_logp"] != 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_advantages_agree_across_backends(name, backend):
    batch = random_batch(seed=11)
    want = ref.advantages(name, batch)
    requires(backend)
    method = shaping.get_method(name)
    if backend.startswith("jax"):
        import jax

        with jax.enable_x64(True):
            jb = convert(batch, backend)
            fn = method.advantages
            got = jax.jit(lambda b: fn(b))(jb) if backend == "jax.jit" else fn(jb)
            assert_close(got, want, what=f"{name}/{backend} advantages")
        return
    assert_close(method.advantages(convert(batch, backend)), want, what=f"{name}/{backend}")


# Building blocks -------------------------------------------------------------------------------


def _block_cases():
    rng = np.random.default_rng(5)
    batch = random_batch(seed=5, n_b=2, n_g=3, n_t=6)
    mask, lp, lp_old = batch["mask"], batch["logp"], batch["logp_old"]
    adv = rng.normal(size=(2, 3))
    ratio = np.exp(lp - lp_old)
    loss_tok = rng.normal(size=lp.shape)
    logits = rng.normal(size=(2, 3, 4, 5)) * 3.0

    def surrogate_ref():
        return np.array(
            [
                [[ref.clipped_surrogate(lp[b, g, t], lp_old[b, g, t], adv[b, g]) for t in range(6)]]
                for b in range(2)
                for g in range(3)
            ]
        ).reshape(2, 3, 6)

    def agg_ref(mode):
        return ref.aggregate(loss_tok.tolist(), mask, mode)

    cases = {
        "grpo_advantages": (
            shaping.grpo_advantages,
            (batch["rewards"],),
            {"std_correction": 1, "eps": 1e-6},
            lambda: ref.group_advantages(batch["rewards"], 1, 1e-6),
        ),
        "dr_grpo_advantages": (
            shaping.dr_grpo_advantages,
            (batch["rewards"],),
            {},
            lambda: ref.dr_grpo_advantages(batch["rewards"]),
        ),
        "clipped_surrogate": (shaping.clipped_surrogate, (ratio, adv), {}, surrogate_ref),
        "kl_k3": (
            shaping.kl_k3,
            (lp, batch["logp_ref"], np.ones_like(mask)),
            {},
            lambda: np.vectorize(ref.k3)(lp, batch["logp_ref"]),
        ),
        "token_entropy": (shaping.token_entropy, (logits,), {}, lambda: ref.token_entropy(logits)),
        "sequence_logp_sum": (
            shaping.sequence_logp,
            (lp, mask),
            {"reduction": "sum"},
            lambda: ref.seq_logp(lp, mask, "sum"),
        ),
        "sequence_logp_mean": (
            shaping.sequence_logp,
            (lp, mask),
            {"reduction": "mean"},
            lambda: ref.seq_logp(lp, mask, "mean"),
        ),
        "masked_quantile": (
            shaping.masked_quantile,
            (batch["entropy"], mask),
            {"q": 0.8},
            lambda: ref.masked_quantile(batch["entropy"], mask, 0.8),
        ),
    }
    for mode in shaping.AGG_MODES:
        cases[f"agg_loss[{mode}]"] = (
            shaping.agg_loss,
            (loss_tok, mask),
            {"mode": mode},
            lambda mode=mode: agg_ref(mode),
        )
    return cases


BLOCKS = _block_cases()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_building_blocks_agree_across_backends(block, backend):
    fn, args, kwargs, want = BLOCKS[block]
    if backend == "torch.grad":
        backend = "torch"  # value only; gradients are covered through the method losses
    assert_close(call_block(fn, backend, *args, **kwargs), want(), what=f"{block}/{backend}")


# Driver-facing inputs: float32, bool masks, integer rewards, traced hyper-parameters ----------


def _driver_batch(batch: dict) -> dict:
    out = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in batch.items()}
    out["mask"] = batch["mask"] > 0
    out["rewards"] = batch["rewards"].astype(np.int32)
    return out


@pytest.mark.parametrize("backend", ["numpy", "jax", "torch"])
@pytest.mark.parametrize("name", NAMES)
def test_float32_bool_mask_int_rewards(name, backend):
    pytest.importorskip("torch")
    batch = random_batch(seed=7)
    want, _ = ref.loss(name, batch)
    b32 = _driver_batch(batch)
    method = shaping.get_method(name)
    if backend == "jax":
        jnp = pytest.importorskip("jax.numpy")
        value = method.loss({k: jnp.asarray(v) for k, v in b32.items()})[0]
    elif backend == "torch":
        import torch

        value = method.loss({k: torch.from_numpy(v) for k, v in b32.items()})[0]
    else:
        value = method.loss(b32)[0]
    assert str(value.dtype).endswith("float32"), value.dtype
    # float32 against the float64 reference: the aggregation over the B x G x T tokens plus a
    # chain of per-token operations (ratio, clip, shaping: < 32 roundings), tests/tolerance.py.
    assert np.all(np.isfinite(np.asarray(value))), f"{name}/{backend}: non-finite"
    derived_close(value, want, dtype="float32", n=batch["mask"].size + 32)


def _traceable(name: str) -> dict[str, object]:
    # Every numeric hyper-parameter a driver may sweep as data (top_n must stay a Python int).
    out = {k: v for k, v in ref.DEFAULTS[name].items() if isinstance(v, float)}
    out["kl_coef"] = 0.1
    if "k" in ref.DEFAULTS[name]:
        out["k"] = 2
    return out


@pytest.mark.parametrize("name", NAMES)
def test_numeric_hyper_parameters_can_be_traced_under_jit(name):
    jax = pytest.importorskip("jax")
    pytest.importorskip("torch")
    batch = random_batch(seed=7)
    hyper = _traceable(name)
    want, _ = ref.loss(name, batch, **hyper)
    method = shaping.get_method(name)
    with jax.enable_x64(True):
        jb = convert(batch, "jax")
        traced = {k: jax.numpy.asarray(v) for k, v in hyper.items()}
        value = jax.jit(lambda b, h: method.loss(b, **h)[0])(jb, traced)
    assert_close(value, want, what=f"{name} traced {sorted(hyper)}")


@pytest.mark.parametrize("backend", ["jax", "torch.grad"])
@pytest.mark.parametrize("name", NAMES)
def test_garbage_in_padding_reaches_neither_value_nor_gradient(name, backend):
    # Drivers pad with whatever the model emitted there; CONTRACT says padding is ignored.
    batch = random_batch(seed=7)
    clean = evaluate(shaping.get_method(name), batch, backend, {"kl_coef": 0.1})
    dirty = dict(batch)
    pad = batch["mask"] == 0
    for key, value in (("logp", np.nan), ("logp_old", -np.inf), ("logp_ref", np.inf)):
        dirty[key] = np.where(pad, value, batch[key])
    dirty["entropy"] = np.where(pad, np.nan, batch["entropy"])
    for key in ("cand_logp", "cand_logp_old"):
        dirty[key] = np.where(pad[..., None], -np.inf, batch[key])
    got = evaluate(shaping.get_method(name), dirty, backend, {"kl_coef": 0.1})
    assert_close(got[0], clean[0], what=f"{name}/{backend} loss")
    for key in clean[1]:
        assert_close(got[1][key], clean[1][key], what=f"{name}/{backend} d loss / d {key}")
