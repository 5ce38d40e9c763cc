"""Cross-backend equality: numpy, jax, jax.jit, torch and torch with ``requires_grad``.

Every registered method, at its default and at a custom setting, gives the reference loss and
advantages on every backend, and ``jax.grad`` (under ``jax.jit``) and torch autograd give the
reference gradients with respect to ``logp`` (and ``entropy`` / ``cand_logp``), with NaN and
infinities in the padding too; under ``jax.jit`` the numeric hyper-parameters are traced. Eager
JAX (``jax``) checks the values op by op, with the hyper-parameters as Python numbers: its
gradients would be the same autodiff trace run op by op, at a compilation per primitive and
shape (10 s of the suite), and the compiled trace is checked. One test per backend loops over
the methods (a failure names every failing method and setting): the reference is computed once
per setting and ``jax.jit`` compiles every setting into one program (`_jit_every_setting`).
Seeded batches (not Hypothesis).
"""

from __future__ import annotations

import numpy as np
import pytest

import shaping
from tests.tolerance import assert_close as derived_close

from . import reference as ref
from .helpers import (
    BACKENDS,
    JIT_OPTIONS,
    assert_close,
    call_block,
    check_every,
    convert,
    diff_keys,
    evaluate,
    jit_each,
    requires,
    to_numpy,
)
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


#: The custom settings: a KL term switched on wherever the method's own setting leaves it off,
#: so every setting reads ``logp_ref`` and garbage there must be masked out.
CUSTOM = {name: {"kl_coef": 0.1, **_hyper(name, "custom")} for name in NAMES}


def _setting(name: str, which: str) -> dict[str, object]:
    return {} if which == "default" else dict(CUSTOM[name])


def _garbage_padding(batch: dict) -> dict:
    """`batch` with NaN or infinities wherever the mask is 0 (drivers pad with whatever the model
    emitted there; CONTRACT says padding is ignored)."""
    dirty = dict(batch)
    pad = batch["mask"] == 0
    for key, value in (("logp", np.nan), ("logp_old", -np.inf), ("logp_ref", np.inf)):
        dirty[key] = np.where(pad, value, batch[key])
    dirty["entropy"] = np.where(pad, np.nan, batch["entropy"])
    for key in ("cand_logp", "cand_logp_old"):
        dirty[key] = np.where(pad[..., None], -np.inf, batch[key])
    return dirty


def _traced(method, hyper: dict[str, object]) -> dict[str, object]:
    """Every numeric hyper-parameter a driver may sweep as data: the floats and ``k`` (``top_n``
    and the other integers stay Python ints), at `hyper`'s values or the method's defaults."""
    full = {**method.defaults, **hyper}
    return {
        k: v
        for k, v in full.items()
        if (isinstance(v, float) or k == "k") and not isinstance(v, bool)
    }


def _evaluator(method, backend: str, hyper: dict[str, object]):
    """A function batch -> (loss, gradients or None, advantages), all as NumPy float64.

    On ``jax.jit`` the loss, its gradients and the advantages are one compiled function of the
    batch and of the traced numeric hyper-parameters (`_traced`), compiled once per setting
    (`_jit_every_setting` compiles every setting into one program instead); eager ``jax`` gives
    the loss and the advantages (module docstring)."""
    if backend == "jax":
        import jax

        def eager(batch):
            with jax.enable_x64(True):
                jb = convert(batch, "jax")
                value = method.loss(jb, **hyper)[0]
                return to_numpy(value), None, to_numpy(method.advantages(jb, **hyper))

        return eager
    if backend != "jax.jit":

        def run(batch):
            value, grads = evaluate(method, batch, backend, hyper)
            adv = method.advantages(convert(batch, backend), **hyper)
            return value, grads, to_numpy(adv)

        return run
    import jax

    both, traced = _jax_parts(method, hyper)
    both = jax.jit(both)

    def run(batch):
        with jax.enable_x64(True):
            diff, rest = _jax_batch(batch)
            h = {k: jax.numpy.asarray(v) for k, v in traced.items()}
            return _as_numpy(both(diff, rest, h))

    return run


def _jax_parts(method, hyper: dict[str, object]):
    """``(both, traced)``: ``both(diff, rest, h)`` gives the loss, its gradients with respect to
    `diff` and the advantages; `traced` the hyper-parameters passed as data ``h`` (`_traced`),
    the others stay static Python values."""
    import jax

    traced = _traced(method, hyper)
    static = {k: v for k, v in hyper.items() if k not in traced}

    def both(diff, rest, h):
        def loss(d):
            return method.loss({**rest, **d}, **static, **h)[0]

        value, grads = jax.value_and_grad(loss)(diff)
        return value, grads, method.advantages({**rest, **diff}, **static, **h)

    return both, traced


def _jax_batch(batch: dict) -> tuple[dict, dict]:
    """`batch` as JAX arrays (call under ``jax.enable_x64``), split into (differentiable, rest)."""
    jb = convert(batch, "jax")
    keys = diff_keys(jb)
    return {k: jb[k] for k in keys}, {k: v for k, v in jb.items() if k not in keys}


def _as_numpy(out) -> tuple:
    value, grads, adv = out
    return to_numpy(value), {k: to_numpy(v) for k, v in grads.items()}, to_numpy(adv)


def _jit_every_setting(batches: dict[str, dict]) -> dict[tuple[str, str], object] | None:
    """Every setting's (loss, gradients, advantages) on each of `batches` under ``jax.jit``, as
    ``{(name, which): {label: result}}``, or None when tracing them together fails.

    One ``jax.jit`` of all the settings side by side (each with its numeric hyper-parameters
    traced, `_traced`), called once per batch. Each setting's computation is the one a
    per-setting ``jax.jit`` traces; compiling them as one program lets XLA share their common
    parts (the same inputs feed every method), a third of the compile time of one program per
    setting. On failure the caller falls back to one ``jax.jit`` per setting (`_evaluator`), so
    the error is reported against the setting(s) that raise.
    """
    import jax

    try:
        parts = {
            f"{name}/{which}": _jax_parts(shaping.get_method(name), _setting(name, which))
            for name, which in SETTINGS
        }

        def every(diff, rest, hs):
            return {key: both(diff, rest, hs[key]) for key, (both, _) in parts.items()}

        every = jax.jit(every, compiler_options=JIT_OPTIONS)
        out: dict[tuple[str, str], dict[str, tuple]] = {s: {} for s in SETTINGS}
        with jax.enable_x64(True):
            hs = {
                key: {k: jax.numpy.asarray(v) for k, v in traced.items()}
                for key, (_, traced) in parts.items()
            }
            for label, batch in batches.items():
                results = every(*_jax_batch(batch), hs)
                for name, which in SETTINGS:
                    out[name, which][label] = _as_numpy(results[f"{name}/{which}"])
    except Exception:  # one setting fails: name it through the per-setting path
        return None
    return out


def _check_setting(
    name: str, which: str, backend: str, batch: dict, dirty: dict, computed: dict | None = None
) -> None:
    """`computed`: this setting's results ``{"clean": ..., "dirty": ...}`` already evaluated on
    `backend` (`_jit_every_setting`); None evaluates them here."""
    hyper = _setting(name, which)
    want_loss, want_grads = _reference(name, which)
    want_adv = ref.advantages(name, batch, **hyper)
    # The test batch must exercise the gradient, or equal zeros would prove nothing.
    assert np.any(want_grads["logp"] != 0) or (which == "default" and name in CLIPPED_AT_DEFAULT)
    if name == "casp" and which == "custom":
        assert np.any(want_grads["cand_logp"] != 0)
    run = _evaluator(shaping.get_method(name), backend, hyper) if computed is None else None
    for label, key, b in (("", "clean", batch), (" (garbage in padding)", "dirty", dirty)):
        what = f"{name}/{which}/{backend}{label}"
        value, grads, adv = run(b) if computed is None else computed[key]
        assert_close(value, want_loss, what=f"{what} loss")
        assert_close(adv, want_adv, what=f"{what} advantages")
        if grads is None:
            continue
        assert set(grads) == set(want_grads), what
        for key, want in want_grads.items():
            assert_close(grads[key], want, what=f"{what} d loss / d {key}")


_REFERENCE: dict[tuple[str, str], tuple] = {}


def _reference(name: str, which: str) -> tuple:
    """The slow reference's loss and gradients on the seed-7 batch, computed once per setting
    (every backend compares with it)."""
    if (name, which) not in _REFERENCE:
        _REFERENCE[name, which] = ref.loss(name, random_batch(seed=7), **_setting(name, which))
    return _REFERENCE[name, which]


def _every_setting(check) -> None:
    """Run `check(name, which)` for every registered method and both settings; fail once,
    naming every setting that failed (not only the first)."""
    check_every(SETTINGS, check)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_method_agrees_with_the_reference_on_every_backend(backend):
    """Every method, at its default and at a custom setting (`CUSTOM`): the loss, its gradients
    (autodiff backends) and the advantages equal the slow reference, and stay equal when the
    padding holds NaN and infinities; on ``jax.jit`` the numeric hyper-parameters are traced."""
    pytest.importorskip("torch")  # the reference gradients come from torch autograd
    requires(backend)
    batch = random_batch(seed=7)
    dirty = _garbage_padding(batch)
    jitted = _jit_every_setting({"clean": batch, "dirty": dirty}) if backend == "jax.jit" else None

    def check(name: str, which: str) -> None:
        computed = None if jitted is None else jitted[name, which]
        _check_setting(name, which, backend, batch, dirty, computed)

    _every_setting(check)


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


@pytest.mark.parametrize("backend", ["numpy", "jax", "jax.jit", "torch"])
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_building_blocks_agree_across_backends(block, backend):
    # Values only; gradients are covered through the method losses.
    fn, args, kwargs, want = BLOCKS[block]
    assert_close(call_block(fn, backend, *args, **kwargs), want(), what=f"{block}/{backend}")


# Driver-facing inputs: float32, bool masks, integer rewards ------------------------------------


def _driver_batch(batch: dict) -> dict:
    out = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in batch.items()}
    out["mask"] = batch["mask"] > 0
    out["rewards"] = batch["rewards"].astype(np.int32)
    return out


@pytest.mark.parametrize("backend", ["numpy", "jax.jit", "torch"])
def test_every_method_takes_float32_bool_mask_int_rewards(backend):
    """The drivers' dtypes: every method's default loss is float32 and equals the reference.

    JAX runs every method under one ``jax.jit`` (the toy leg's path; one eager pass costs a
    compilation per primitive and dtype, 6x longer); when tracing them together fails, each
    method's own ``jax.jit`` names the one that fails."""
    pytest.importorskip("torch")
    requires(backend)
    batch = random_batch(seed=7)
    b32 = convert(_driver_batch(batch), backend)

    def loss(name: str, b: dict) -> object:
        return shaping.get_method(name).loss(b)[0]

    if backend == "jax.jit":
        run = jit_each(loss, dict.fromkeys(NAMES, b32))
    else:
        run = lambda name: loss(name, b32)  # noqa: E731

    def check(name: str, which: str) -> None:
        if which != "default":
            return
        value = run(name)
        assert str(value.dtype).endswith("float32"), value.dtype
        # float32 against the float64 reference: the aggregation over the B x G x T tokens plus
        # a chain of per-token operations (ratio, clip, shaping: < 32 roundings),
        # tests/tolerance.py.
        assert np.all(np.isfinite(np.asarray(value))), f"{name}/{backend}: non-finite"
        derived_close(
            value, _reference(name, "default")[0], dtype="float32", n=batch["mask"].size + 32
        )

    _every_setting(check)
