"""Degenerate inputs (issue 13 item 8) and the faithfulness options (issue 10 item 5).

Edges: a -inf log-prob on a response token, an empty batch (B = 0) and empty responses (T = 0)
give finite, documented results for every method. Options: Dr. GRPO's constant divisor,
unlikeliness's group skipping and PSR/NSR's subset normalization, each against a closed form
written here (the slow reference covers them too, in test_methods.py).
"""

from __future__ import annotations

import hashlib
import math
import re
import sys

import numpy as np
import pytest

import shaping

from .helpers import assert_close, check_every, evaluate

NAMES = tuple(sorted(shaping.METHODS))
#: Methods whose token selection reads the batch mean of the log-probs (`core.token_covariance`).
BATCH_LOGP_MEANS = frozenset({"clip_cov", "kl_cov"})


def _batch(name: str, B: int = 2, G: int = 4, T: int = 5, seed: int = 0) -> tuple[dict, dict]:
    method = shaping.get_method(name)
    over = {"form": "token"} if "form" in method.defaults else {}
    if "k" in method.defaults:
        over["k"] = 2
    return shaping.example_batch(method.needs_for(**over), B, G, T, 3, np, seed=seed), over


def test_minus_inf_log_prob_gives_finite_loss_and_gradient():
    check_every(((name,) for name in NAMES), _minus_inf_log_prob)


def _minus_inf_log_prob(name: str) -> None:
    # One unmasked token of the current policy has probability 0 (log-prob -inf): its ratio is 0,
    # and rho * log pi is read as its limit 0. The result equals a very negative finite log-prob.
    batch, over = _batch(name)
    batch["mask"][0, 0, :] = 1.0
    finite = {**batch, "logp": batch["logp"].copy()}
    finite["logp"][0, 0, 0] = -1e4  # exp(-1e4) == 0 in float64: the same ratio
    inf = {**batch, "logp": batch["logp"].copy()}
    inf["logp"][0, 0, 0] = -math.inf
    want = evaluate(shaping.get_method(name), finite, "torch.grad", over)
    got = evaluate(shaping.get_method(name), inf, "torch.grad", over)
    if name in BATCH_LOGP_MEANS:
        # The token selection reads the batch mean of the log-probs, which a finite -1e4 moves
        # and a -inf (left out of the means) does not: only finiteness is the property here.
        assert np.isfinite(got[0]) and all(np.all(np.isfinite(g)) for g in got[1].values())
        return
    assert_close(got[0], want[0], what=f"{name} loss")
    for key in want[1]:
        assert_close(got[1][key], want[1][key], what=f"{name} d loss / d {key}")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_minus_inf_in_both_terms_of_a_difference_is_named(backend):
    pairs = [("logp", "logp_old"), ("logp", "logp_ref")]
    check_every(
        ((name, pair, backend) for name in NAMES for pair in pairs), _minus_inf_in_both_terms
    )


def _minus_inf_in_both_terms(name: str, pair: tuple[str, str], backend: str) -> None:
    # Issue 54: -inf in logp and logp_old of a response token gave a NaN loss with no error
    # (exp(-inf - (-inf))); it is refused naming both keys and the token. At padding, finite.
    batch, over = _batch(name)
    a, b = pair
    over = {**over, "kl_coef": 0.1} if b == "logp_ref" else over
    if b not in batch:
        batch[b] = batch["logp_old"].copy()  # an unused key is checked all the same
    batch["mask"][0, 1, :] = 1.0
    batch["mask"][1, 2, -1] = 0.0
    bad = {k: v.copy() for k, v in batch.items()}
    padded = {k: v.copy() for k, v in batch.items()}
    for key in pair:
        bad[key][0, 1, 2] = -math.inf
        padded[key][1, 2, -1] = -math.inf
    if backend == "torch":
        torch = pytest.importorskip("torch")
        bad, padded = ({k: torch.from_numpy(v) for k, v in d.items()} for d in (bad, padded))
    method = shaping.get_method(name)
    want = f"{name}: batch['{a}'] and batch['{b}'] are both -inf at 1 response token(s) " + (
        "(first at index (0, 1, 2))"
    )
    with pytest.raises(ValueError, match=re.escape(want)):
        method.loss(bad, **over)
    assert np.isfinite(float(method.loss(padded, **over)[0]))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_empty_batch_gives_zero_loss_and_finite_metrics(backend):
    check_every(((name, backend) for name in NAMES), _empty_batch)


def _empty_batch(name: str, backend: str) -> None:
    batch, over = _batch(name, B=0)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    loss, metrics = shaping.get_method(name).loss(batch, **over)
    assert float(loss) == 0.0
    for key, value in metrics.items():
        assert np.isfinite(float(value)), (name, key)


def test_empty_responses_give_zero_loss():
    check_every(((name,) for name in NAMES), _empty_responses)


def _empty_responses(name: str) -> None:
    batch, over = _batch(name, T=0)
    loss, metrics = shaping.get_method(name).loss(batch, **over)
    assert float(loss) == 0.0, (name, loss)
    assert np.isfinite(float(loss))
    for key, value in metrics.items():
        assert np.isfinite(float(value)), (name, key)


# Dr. GRPO's constant divisor -------------------------------------------------------------------


def test_dr_grpo_divides_by_the_constant_not_the_longest_response():
    dr = shaping.get_method("dr_grpo")
    batch, _ = _batch("dr_grpo", T=6)
    batch["mask"][..., 4:] = 0.0  # the longest response has 4 tokens
    short = {k: (v[:, :, :4] if v.ndim == 3 else v) for k, v in batch.items()}
    # Dropping padding must not change the loss (it did when the divisor was the padded T).
    assert_close(
        dr.loss(batch, max_response_length=16)[0], dr.loss(short, max_response_length=16)[0]
    )
    # Closed form: sum over sequences of the token sums of -A*rho, / (B*G*L).
    adv = dr.advantages(batch)
    rho = np.exp(batch["logp"] - batch["logp_old"])
    tok = -np.minimum(rho * adv[..., None], np.clip(rho, 0.8, 1.2) * adv[..., None])
    want = np.sum(tok * batch["mask"]) / (2 * 4 * 16)
    assert_close(dr.loss(batch, max_response_length=16)[0], want)
    assert dr.defaults["max_response_length"] == 256


@pytest.mark.parametrize("bad", [0, -3, 2.5, None, True])
def test_dr_grpo_rejects_an_invalid_constant(bad):
    batch, _ = _batch("dr_grpo")
    with pytest.raises(ValueError, match="max_response_length"):
        shaping.get_method("dr_grpo").loss(batch, max_response_length=bad)


def test_dr_grpo_rejects_a_constant_below_the_padded_length():
    batch, _ = _batch("dr_grpo", T=5)
    with pytest.raises(ValueError, match=r"max_response_length = 4 .* T = 5"):
        shaping.get_method("dr_grpo").loss(batch, max_response_length=4)
    # Other aggregations do not use the constant.
    shaping.get_method("dr_grpo").loss(batch, max_response_length=4, loss_agg="token-mean")


# Unlikeliness: the authors' advantage_threshold -------------------------------------------------


def test_unlikeliness_skips_groups_without_mixed_outcomes_by_default():
    m = shaping.get_method("unlikeliness")
    assert m.defaults["skip_uniform_groups"] is True
    batch, _ = _batch("unlikeliness", B=3, G=4)
    batch["rewards"][1] = 1.0  # all correct: rank-shaped rewards differ, but the group is dropped
    batch["rewards"][2] = 0.0
    kept = m.advantages(batch)
    allowed = m.advantages(batch, skip_uniform_groups=False)
    assert np.all(kept[1:] == 0.0) and np.any(allowed[1] != 0.0)
    assert_close(kept[0], allowed[0])
    # The dropped groups leave the token-mean's denominator too: the loss is group 0's alone.
    only = {k: v[:1] for k, v in batch.items()}
    assert_close(m.loss(batch)[0], m.loss(only)[0])


# PSR / NSR: the authors' subset normalization --------------------------------------------------


@pytest.mark.parametrize("name", ["psr", "nsr"])
def test_psr_nsr_subset_normalization_averages_over_the_kept_subset(name):
    m = shaping.get_method(name)
    assert m.defaults["subset_normalization"] is False
    batch, _ = _batch(name, B=2, G=4)
    correct = batch["rewards"] > 0.5
    kept = correct if name == "psr" else ~correct
    rho = np.exp(batch["logp"] - batch["logp_old"])
    sign = 1.0 if name == "psr" else -1.0
    tok = -np.minimum(rho * sign, np.clip(rho, 0.8, 1.2) * sign) * batch["mask"]
    sub = np.sum(tok * kept[..., None]) / np.sum(batch["mask"] * kept[..., None])
    full = np.sum(tok * kept[..., None]) / np.sum(batch["mask"])
    assert_close(m.loss(batch, subset_normalization=True)[0], sub)
    assert_close(m.loss(batch)[0], full)
    assert not np.isclose(sub, full)


# Registry ---------------------------------------------------------------------------------------


def test_registry_rejects_duplicates_and_lists_names_on_a_miss():
    with pytest.raises(ValueError, match="already registered"):

        @shaping.register("grpo")
        def grpo(batch):
            """X.

            Source: none; docs/formulas.md §2
            """

    with pytest.raises(ValueError, match=r"known: .*grpo"):
        shaping.get_method("no_such_method")


def test_register_requires_defaults_and_a_source():
    with pytest.raises(ValueError, match="keyword-only with a default"):

        @shaping.register("no_default")
        def no_default(batch, *, beta):
            """X.

            Source: none
            """

    with pytest.raises(ValueError, match="Source"):

        @shaping.register("no_source")
        def no_source(batch, *, beta: float = 0.1):
            """X."""

    with pytest.raises(ValueError, match="bounds for \\['beta'\\]"):

        @shaping.register("bad_bounds", bounds={"beta": ">= 0"})
        def bad_bounds(batch, *, scale: float = 0.1):
            """X.

            Source: none
            """

    with pytest.raises(ValueError, match="bounds: expected"):

        @shaping.register("bad_bound_text", bounds={"scale": "positive"})
        def bad_bound_text(batch, *, scale: float = 0.1):
            """X.

            Source: none
            """

    assert not {"no_default", "no_source", "bad_bounds", "bad_bound_text"} & set(shaping.METHODS)


def test_a_new_method_is_one_function():
    from shaping import methods

    @shaping.register("half_grpo_test", needs={"diversity"}, bounds={"scale": "in (0, 1]"})
    def half_grpo_test(batch, *, scale: float = 0.5, loss_agg: str = "seq-mean-token-mean"):
        """Half of GRPO's advantage times the diversity (a test method).

        Shapes: ``rewards``, ``diversity`` (B, G) -> advantages (B, G).

        Hyper-parameters: ``scale``; ``loss_agg`` default "seq-mean-token-mean".

        Source: this test; docs/formulas.md §2
        """
        return scale * batch["diversity"] * shaping.grpo_advantages(batch["rewards"])

    try:
        m = shaping.METHODS["half_grpo_test"]
        assert m.defaults == {
            **shaping.COMMON_DEFAULTS,
            "scale": 0.5,
            "loss_agg": "seq-mean-token-mean",
        }
        assert m.needs == {"diversity"} and m.source == "this test; docs/formulas.md §2"
        batch = shaping.example_batch(m.needs, 2, 4, 3, 1, np)
        want = 0.25 * batch["diversity"] * shaping.grpo_advantages(batch["rewards"])
        assert_close(m.advantages(batch, scale=0.25), want)
        assert np.isfinite(m.loss(batch)[0])
        # Its bound is checked with no second place to edit (nor are the drivers' checks).
        with pytest.raises(ValueError, match=r"half_grpo_test: scale must be in \(0, 1\], got 2"):
            m.advantages(batch, scale=2.0)
        assert "`half_grpo_test`" in shaping.methods_table()
    finally:
        methods._REGISTRY.pop("half_grpo_test")


@pytest.mark.parametrize("backend", ["numpy", "jax-jit", "torch"])
def test_a_method_whose_advantages_are_not_b_by_g_is_refused(backend):
    """A user's function that returns per-token (B, G, T) advantages, or (B, G) rows as (B,),
    broadcasts silently in the loss; the registry refuses it by name on every backend (under
    ``jit`` the shapes are static)."""
    import jax
    import torch

    from shaping import methods

    @shaping.register("per_token_test")
    def per_token_test(batch, *, c: float = 0.1, rows_1d: bool = False):
        """Per-token advantage ``A + c m`` (the wrong shape: a test method).

        Source: this test
        """
        a = shaping.grpo_advantages(batch["rewards"])
        if rows_1d:
            return shaping.Shaping(a, rows=batch["rewards"][:, 0] > 0)
        return a[..., None] + c * batch["mask"]

    try:
        m = shaping.METHODS["per_token_test"]
        xp = {"numpy": np, "jax-jit": jax.numpy, "torch": torch}[backend]
        batch = shaping.example_batch(m.needs, 2, 4, 3, 1, xp)

        def call(fn, **hyper):
            if backend == "jax-jit":
                return jax.jit(lambda b: fn(b, **hyper))(batch)
            return fn(batch, **hyper)

        for fn in (m.advantages, m.loss):
            with pytest.raises(ValueError, match=r"per_token_test returned advantages of "
                               r"shape \(2, 4, 3\); expected \(B, G\) = \(2, 4\)"):  # fmt: skip
                call(fn)
        with pytest.raises(ValueError, match=r"returned rows of shape \(2,\); expected"):
            call(m.loss, rows_1d=True)
    finally:
        methods._REGISTRY.pop("per_token_test")


@pytest.mark.usefixtures("registry_snapshot")
def test_a_method_written_with_numpy_is_named_on_jax_and_torch():
    """A user's function that turns a traced array into NumPy (or a Python float) runs on NumPy
    and torch but fails under ``jit`` (the toy simulator): the registry names the method and the
    way to write it, where JAX alone names a tracer."""
    import jax
    import torch

    @shaping.register("numpy_inside_test")
    def numpy_inside_test(batch, *, c: float = 1.0):
        """Centred rewards through NumPy (a test method).

        Source: this test
        """
        r = np.asarray(batch["rewards"])
        return c * (r - r.mean(axis=1, keepdims=True))

    m = shaping.METHODS["numpy_inside_test"]
    batch = shaping.example_batch(m.needs, 2, 4, 3, 1, jax.numpy)
    with pytest.raises(ValueError, match=r"method 'numpy_inside_test': numpy_inside_test turned a "
                                         r"traced JAX array into a concrete value \(Tracer"):  # fmt: skip
        jax.jit(lambda b: m.loss(b)[0])(batch)
    # On torch (the LLM leg) NumPy runs, and its advantages are refused by kind, by name.
    batch = shaping.example_batch(m.needs, 2, 4, 3, 1, torch)
    with pytest.raises(ValueError, match=r"numpy_inside_test returned advantages as NumPy arrays "
                                         r"for torch rewards; write it with array_namespace"):  # fmt: skip
        m.loss(batch)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("key", ["rewards", "logp", "logp_old", "logp_ref", "entropy"])
def test_nan_where_it_reaches_the_loss_is_named(key, backend):
    # Issue 40 item 9: a NaN input gave a NaN loss silently. On padding it stays allowed.
    batch, _ = _batch("grpo")
    batch = {**batch, "logp_ref": batch["logp"].copy(), "entropy": np.ones_like(batch["logp"])}
    batch["mask"][1, 2, :] = 0.0
    batch["mask"][0, 1, 3] = 1.0
    at = (0, 1) if key == "rewards" else (0, 1, 3)
    padded = {**batch, key: batch[key].copy()}
    if key != "rewards":
        padded[key][1, 2, 0] = np.nan  # padding: ignored
    bad = {**batch, key: batch[key].copy()}
    bad[key][at] = np.nan
    over = {"kl_coef": 0.1, "entropy_coef": 0.1}
    if backend == "torch":
        torch = pytest.importorskip("torch")
        padded = {k: torch.from_numpy(v) for k, v in padded.items()}
        bad = {k: torch.from_numpy(v) for k, v in bad.items()}
    loss, _ = shaping.get_method("grpo").loss(padded, **over)
    assert np.isfinite(float(loss))
    with pytest.raises(
        ValueError, match=rf"batch\['{key}'\] holds NaN at 1 .*index {re.escape(str(at))}"
    ):
        shaping.get_method("grpo").loss(bad, **over)


@pytest.mark.usefixtures("registry_snapshot")
def test_a_user_module_that_fails_to_import_is_named_and_leaves_nothing(tmp_path):
    """`--import` of a user's file: a syntax error, or an error after it registered a method, is
    one ValueError naming the spec and the error's type, chained to the original; the failed
    module is neither in `sys.modules` nor its method in the registry, and a fixed file imports."""
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(ValueError, match=r"--import .*broken\.py: SyntaxError: ") as info:
        shaping.import_methods([str(broken)])
    assert isinstance(info.value.__cause__, SyntaxError)
    half = tmp_path / "half.py"
    half.write_text(
        "import shaping\n\n"
        "@shaping.register('half_test')\n"
        "def half_test(batch, *, c: float = 1.0):\n"
        '    """A test method.\n\n    Source: this test\n    """\n'
        "    return batch['rewards']\n\n"
        "raise RuntimeError('after registering')\n"
    )
    with pytest.raises(ValueError, match=r"half\.py: RuntimeError: after registering"):
        shaping.import_methods([str(half)])
    assert "half_test" not in shaping.METHODS
    assert not [m for m in sys.modules if m.startswith("sharpening_user_half")]
    with pytest.raises(ValueError, match=r"--import no_such_module_xyz: No module named"):
        shaping.import_methods(["no_such_module_xyz"])
    half.write_text(half.read_text().replace("raise RuntimeError('after registering')\n", ""))
    assert shaping.import_methods([str(half)]) == ["half_test"]


def _user_method(path, name: str, scale: float) -> None:
    path.write_text(
        "import shaping\n\n"
        f"@shaping.register({name!r})\n"
        f"def {name}(batch, *, c: float = 1.0):\n"
        '    """A test method.\n\n    Source: this test\n    """\n'
        f"    return {scale} * c * batch['rewards']\n"
    )


@pytest.mark.usefixtures("registry_snapshot")
def test_a_users_method_is_keyed_by_its_code_as_it_registered(tmp_path):
    """`shaping.method_code`: a method registered from a user's file carries the SHA-256 of that
    file as it was imported (what caches of its results are keyed by); another version of the file
    gives another digest; the package's methods carry none; a function without a file (typed at
    a prompt) is keyed by its compiled code; an unknown name is an error."""
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    _user_method(first, "code_test_a", 1.0)
    _user_method(second, "code_test_b", 2.0)
    assert shaping.import_methods([str(first), str(second)]) == ["code_test_a", "code_test_b"]
    codes = shaping.method_code(["grpo", "code_test_b", "code_test_a", "code_test_a"])
    assert codes == {name: hashlib.sha256(path.read_bytes()).hexdigest()[:16]
                     for name, path in (("code_test_a", first), ("code_test_b", second))}  # fmt: skip
    assert codes["code_test_a"] != codes["code_test_b"]
    assert all(m.code is None for name, m in shaping.METHODS.items() if not name.startswith("code"))
    first.write_text("# edited after the import\n")  # the code that runs is the imported one
    assert shaping.method_code(["code_test_a"]) == {"code_test_a": codes["code_test_a"]}
    namespace: dict = {}
    exec(compile(first.read_text() + second.read_text().replace("code_test_b", "code_test_c"),
                 "<prompt>", "exec"), namespace)  # fmt: skip
    assert len(shaping.method_code(["code_test_c"])["code_test_c"]) == 16
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        shaping.method_code(["nope"])
