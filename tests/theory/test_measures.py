"""Measures (`theory.measures`) against direct formulas, and their input errors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.special import logsumexp

from theory import measures
from theory._validate import correct_mask


def _normalized(x: np.ndarray) -> np.ndarray:
    return x - logsumexp(x, axis=-1, keepdims=True)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


def test_correctness(rng: np.random.Generator) -> None:
    lp = _normalized(rng.standard_normal(10))
    c = rng.random(10) < 0.4
    assert measures.correctness(lp, c) == pytest.approx(np.exp(lp)[c].sum(), abs=1e-15)
    assert measures.correctness(lp, np.zeros(10, dtype=bool)) == 0.0
    assert measures.correctness(lp, np.ones(10, dtype=bool)) == pytest.approx(1.0)


def test_correctness_batch(rng: np.random.Generator) -> None:
    lp = _normalized(rng.standard_normal((4, 6)))
    c = np.array([1, 0, 1, 0, 0, 1], dtype=bool)
    np.testing.assert_allclose(measures.correctness(lp, c), np.exp(lp)[:, c].sum(-1), atol=1e-15)


def test_normalized_variance_is_zero_iff_uniform_on_the_correct_set(
    rng: np.random.Generator,
) -> None:
    c = np.array([1, 1, 1, 0, 0, 1, 0], dtype=bool)
    # Uniform on C, with any mass and any shape off C.
    p = np.where(c, 0.1, 0.0)
    p[~c] = rng.random(3) * 0.6 / 3
    lp = np.log(p / p.sum())
    assert measures.normalized_variance(lp, c) == pytest.approx(0.0, abs=1e-14)
    # Any non-uniform shape on C gives a positive value.
    q = p.copy()
    q[0] *= 1.001
    assert measures.normalized_variance(np.log(q / q.sum()), c) > 1e-8


def test_normalized_variance_is_the_squared_coefficient_of_variation(
    rng: np.random.Generator,
) -> None:
    for _ in range(20):
        lp = _normalized(2.0 * rng.standard_normal(12))
        c = rng.random(12) < 0.5
        c[0] = True
        q = np.exp(lp[c]) / np.exp(lp[c]).sum()
        direct = np.var(q) / np.mean(q) ** 2
        assert measures.normalized_variance(lp, c) == pytest.approx(direct, rel=1e-10, abs=1e-14)
        assert measures.normalized_variance(lp, c) <= c.sum() - 1 + 1e-12


def test_normalized_variance_of_a_point_mass_is_maximal() -> None:
    c = np.array([1, 1, 1, 1, 0], dtype=bool)
    lp = np.log(
        np.array([1.0, 0, 0, 0, 0]), where=np.array([1, 0, 0, 0, 0], bool), out=np.full(5, -np.inf)
    )
    assert measures.normalized_variance(lp, c) == pytest.approx(3.0)


def test_normalized_variance_handles_tiny_probabilities() -> None:
    # Correct mass of 1e-300 relative: still exactly uniform on C.
    lp = np.array([-700.0, -700.0, 0.0])
    lp = _normalized(lp)
    c = np.array([1, 1, 0], dtype=bool)
    assert measures.normalized_variance(lp, c) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("kind", ["kl", "chi2"])
def test_divergence_matches_the_direct_formula(rng: np.random.Generator, kind: str) -> None:
    for _ in range(10):
        lp = _normalized(rng.standard_normal(8))
        lq = _normalized(rng.standard_normal(8))
        p, q = np.exp(lp), np.exp(lq)
        direct = np.sum(p * np.log(p / q)) if kind == "kl" else np.sum(p**2 / q) - 1.0
        assert measures.divergence(lp, lq, kind) == pytest.approx(direct, rel=1e-10, abs=1e-14)
        reverse = np.sum(q * np.log(q / p)) if kind == "kl" else np.sum(q**2 / p) - 1.0
        assert measures.divergence(lq, lp, kind) == pytest.approx(reverse, rel=1e-10, abs=1e-14)
        assert measures.divergence(lp, lp, kind) == pytest.approx(0.0, abs=1e-14)


def test_divergence_with_zero_probabilities() -> None:
    lp = np.log([0.5, 0.5, 0.0], where=np.array([1, 1, 0], bool), out=np.full(3, -np.inf))
    lq = np.log([0.25, 0.25, 0.5])
    assert measures.divergence(lp, lq, "kl") == pytest.approx(np.log(2.0))
    assert measures.divergence(lq, lp, "kl") == np.inf
    assert measures.divergence(lp, lq, "chi2") == pytest.approx(2 * 0.25 / 0.25 - 1.0)


def test_entropy(rng: np.random.Generator) -> None:
    lp = _normalized(rng.standard_normal(7))
    assert measures.entropy(lp) == pytest.approx(-np.sum(np.exp(lp) * lp))
    assert measures.entropy(np.full(8, -np.log(8))) == pytest.approx(np.log(8))


def test_pass_at_k_matches_the_binomial_formula() -> None:
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                direct = 1.0 - math.comb(n - c, k) / math.comb(n, k)
                assert measures.pass_at_k(n, c, k) == pytest.approx(direct, abs=1e-13)


def test_pass_at_k_fast_equals_the_reference() -> None:
    """The calibration's vectorized pass@k against `pass_at_k`, every count, at its sizes (n up
    to 64 samples): float64 binomials of at most C(64, 32) ~ 1.8e18, relative error ~1e-15."""
    for n in (1, 2, 8, 16, 32, 64):
        c = np.arange(n + 1)
        for k in sorted({1, min(2, n), n // 2 or 1, n}):
            fast = measures.pass_at_k_fast(n, c.reshape(-1, 1), k)
            assert fast.shape == (n + 1, 1)
            np.testing.assert_allclose(fast[:, 0], measures.pass_at_k(n, c, k), rtol=0, atol=1e-12)


def test_pass_at_k_broadcasts_and_is_stable() -> None:
    out = measures.pass_at_k(np.array([10, 20]), np.array([[0], [5]]), 4)
    assert out.shape == (2, 2)
    assert out[0, 0] == 0.0
    # n large: 1 − C(n−c, k)/C(n, k) without overflow.
    n, c, k = 5000, 1, 1
    assert measures.pass_at_k(n, c, k) == pytest.approx(1 / n, rel=1e-12)


def test_expected_distinct_by_enumeration() -> None:
    p = np.array([0.5, 0.3, 0.15, 0.05])
    lp = np.log(p)
    for k in (1, 2, 3):
        exact = sum(
            np.prod(p[list(seq)]) * len(set(seq)) for seq in itertools.product(range(4), repeat=k)
        )
        assert measures.expected_distinct(lp, k) == pytest.approx(exact, rel=1e-12)
        mask = np.array([1, 0, 1, 0], bool)
        exact_c = sum(
            np.prod(p[list(seq)]) * len({s for s in seq if mask[s]})
            for seq in itertools.product(range(4), repeat=k)
        )
        assert measures.expected_distinct(lp, k, mask) == pytest.approx(exact_c, rel=1e-12)


def test_expected_distinct_direct_formula_and_tiny_probabilities() -> None:
    lp = _normalized(np.array([0.0, -60.0, -1.0]))
    p = np.exp(lp)
    # 1 − (1 − 1e-26)^k would round to 0 in the naive form; the stable form keeps it.
    assert measures.expected_distinct(lp, 5) == pytest.approx(np.sum(-np.expm1(5 * np.log1p(-p))))
    only_tiny = measures.expected_distinct(lp, 5, np.array([0, 1, 0], bool))
    assert only_tiny == pytest.approx(5 * p[1], rel=1e-12, abs=0.0)
    assert only_tiny > 0.0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: measures.correctness(np.log([0.5, 0.6]), [True, False]), "log_p"),
        (lambda: measures.correctness([np.nan, 0.0], [True, False]), "log_p"),
        (lambda: measures.correctness(np.log([0.5, 0.5]), [True]), "correct"),
        (lambda: measures.correctness(np.log([0.5, 0.5]), [2, 0]), "correct"),
        (lambda: measures.normalized_variance(np.log([0.5, 0.5]), [False, False]), "correct"),
        (lambda: measures.normalized_variance([0.0, -np.inf], [False, True]), "log_p"),
        (lambda: measures.divergence(np.log([0.5, 0.5]), np.log([0.5, 0.5]), "tv"), "kind"),
        (lambda: measures.divergence(np.log([0.5, 0.5]), [0.0, 0.0], "kl"), "log_q"),
        (lambda: measures.divergence([np.nan, 0.0], np.log([0.5, 0.5])), "log_p"),
        (lambda: measures.entropy([0.0, 0.0]), "log_p"),
        (lambda: measures.expected_distinct(np.log([0.5, 0.5]), 0), "k"),
        (lambda: measures.expected_distinct(np.log([0.5, 0.5]), 2, [1]), "mask"),
        (lambda: measures.pass_at_k(5, 6, 1), "c"),
        (lambda: measures.pass_at_k(5, -1, 1), "c"),
        (lambda: measures.pass_at_k(5, 2, 6), "k"),
        (lambda: measures.pass_at_k(5, 2, 0), "k"),
        (lambda: measures.pass_at_k(5.5, 2, 1), "n"),
    ],
)
def test_errors_name_the_argument(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(("mask", "match"), [([False, False, False], "empty"), ([1, 1, 1], "full")])
def test_a_quantity_needing_both_kinds_rejects_an_empty_or_full_correct_set(
    mask: list, match: str
) -> None:
    with pytest.raises(ValueError, match=f"correct is {match}"):
        correct_mask(mask, 3, need_both=True)
    assert correct_mask(mask, 3).shape == (3,)  # fine where one kind suffices


@pytest.mark.parametrize(("args", "name"), [(("5", 1, 1), "n"), ((5, "1", 1), "c"),
                                            ((5, 1, None), "k")])  # fmt: skip
def test_pass_at_k_names_an_argument_that_is_not_a_number(args, name) -> None:
    """Issue 40: a string or None is named, not a ufunc error from inside numpy."""
    with pytest.raises(TypeError, match=f"pass_at_k: {name} must be an integer"):
        measures.pass_at_k(*args)
