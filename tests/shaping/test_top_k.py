"""`shaping.backend.top_k` on every backend, and the partial-sort fast paths that use it.

`top_k` must equal a slice of ``np.sort`` (ties and +-inf padding included, up to k = T) on NumPy,
JAX (eager and under ``jax.jit``) and torch. `masked_quantile` and `low_prob_confidence` take the
`top_k` path for a concrete quantile / fraction and the full-sort path for a traced or 0-d array
one; both paths must agree on rows of every length 0..T (which also checks the static bound K).
"""

from __future__ import annotations

import numpy as np
import pytest

import shaping
from shaping.backend import top_k

from .helpers import assert_close, requires

_TOPK_BACKENDS = ("numpy", "jax", "jax.jit", "torch")


def _rows(seed: int, t: int, dtype=np.float64) -> np.ndarray:
    # Few distinct values (many ties), +-inf sentinels, and a row of one repeated value.
    rng = np.random.default_rng(seed)
    x = rng.choice(np.array([-1.5, -0.25, 0.0, 0.5, 2.0]), size=(2, 3, t))
    x[0, 0] = rng.normal(size=t)
    x[0, 1] = 0.5
    pad = rng.random((2, 3, t)) < 0.3
    x = np.where(pad & (rng.random((2, 3, t)) < 0.5), np.inf, x)
    x = np.where(pad, -np.inf, x) if t > 1 else x
    return x.astype(dtype)


def _top_k_on(backend: str, x: np.ndarray, ks: list[int], largest: bool) -> list[np.ndarray]:
    """``top_k(x, k)`` for each k of `ks` on `backend` (under ``jax.jit``: one compiled function
    returning every k's result, each a static ``k`` as in a call of its own)."""
    requires(backend)
    if backend.startswith("jax"):
        import jax

        with jax.enable_x64(True):
            xj = jax.numpy.asarray(x)
            if backend == "jax.jit":
                out = jax.jit(lambda a: [top_k(a, k, largest=largest) for k in ks])(xj)
            else:
                out = [top_k(xj, k, largest=largest) for k in ks]
            return [np.asarray(o) for o in out]
    if backend == "torch":
        import torch

        return [top_k(torch.from_numpy(x), k, largest=largest).numpy() for k in ks]
    return [np.asarray(top_k(x, k, largest=largest)) for k in ks]


@pytest.mark.parametrize("backend", _TOPK_BACKENDS)
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("t", [1, 2, 7, 64])
def test_top_k_equals_a_slice_of_np_sort(backend, largest, t):
    x = _rows(seed=t, t=t)
    want_all = np.sort(x, axis=-1)
    if largest:
        want_all = want_all[..., ::-1]
    ks = sorted({0, 1, t // 5 + 2, t // 2, t - 1, t} & set(range(t + 1)))
    for k, got in zip(ks, _top_k_on(backend, x, ks, largest), strict=True):
        assert got.shape == (*x.shape[:-1], k), (backend, k, got.shape)
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, want_all[..., :k], err_msg=f"{backend} k={k}")


@pytest.mark.parametrize("backend", _TOPK_BACKENDS)
def test_top_k_float32_and_other_namespace_fallback(backend):
    x = _rows(seed=3, t=16, dtype=np.float32)
    (got,) = _top_k_on(backend, x, [5], largest=True)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.sort(x, axis=-1)[..., ::-1][..., :5])


def test_top_k_fallback_sorts_in_any_other_namespace(monkeypatch):
    # Any namespace other than NumPy / JAX / torch takes ``xp.sort``: route NumPy arrays there.
    import shaping.backend as backend

    monkeypatch.setattr(backend, "is_numpy_array", lambda _: False)
    x = _rows(seed=5, t=9)
    for k in (0, 4, 9):
        np.testing.assert_array_equal(top_k(x, k, largest=False), np.sort(x, axis=-1)[..., :k])
        want = np.sort(x, axis=-1)[..., ::-1][..., :k]
        np.testing.assert_array_equal(top_k(x, k, largest=True), want)


def test_concrete_parameters_take_the_top_k_path(monkeypatch):
    import shaping.core as core

    calls = []

    def counting(x, k, *, largest):
        calls.append((x.shape[-1], k, largest))
        return top_k(x, k, largest=largest)

    monkeypatch.setattr(core, "top_k", counting)
    x, mask = _masked_rows(seed=0, t=50, dtype=np.float64)
    shaping.masked_quantile(x, mask, 0.8)
    shaping.low_prob_confidence(x, mask, low_frac=0.2)
    assert calls == [(50, 12, True), (50, 11, False)]  # ceil(0.2*49)+2, ceil(0.2*50)+1
    shaping.masked_quantile(x, mask, np.asarray(0.8))
    assert len(calls) == 2  # a 0-d array parameter sorts the whole row


@pytest.mark.parametrize("k", [-1, 5])
def test_top_k_rejects_k_outside_the_row(k):
    with pytest.raises(ValueError, match="k"):
        top_k(np.zeros((2, 4)), k, largest=True)


# Fast (concrete q / low_frac) path == full-sort (traced, or 0-d array) path ------------------


def _masked_rows(seed: int, t: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    # One row per length n = 0..T (prefix masks) plus random masks; values with many ties.
    rng = np.random.default_rng(seed)
    rows = t + 1 + 8
    x = rng.choice(np.array([0.0, 0.25, 1.0, 1.5, 3.0]), size=(rows, t))
    x[::3] = rng.uniform(0.0, 3.0, size=x[::3].shape)
    mask = np.arange(t)[None, :] < np.arange(rows)[:, None]
    mask[t + 1 :] = rng.random((8, t)) < 0.6
    x = np.where(mask, x, np.nan)  # padding garbage must not matter on either path
    return x.astype(dtype), mask


def _both_paths(fn, backend: str, x: np.ndarray, mask: np.ndarray, ps: tuple[float, ...]):
    """For each p of `ps`: (fast path with a Python float, full-sort path with a traced / 0-d
    array parameter).

    Under JAX every fast path is traced with its own Python-float p, all of them in one
    ``jax.jit`` (one compile, not one per p); the full-sort path is one ``jax.jit`` with p traced,
    compiled once and called with each p."""
    requires(backend)
    if backend.startswith("jax"):
        import jax

        with jax.enable_x64(True):
            xj, mj = jax.numpy.asarray(x), jax.numpy.asarray(mask)
            fast = jax.jit(lambda a, m: [fn(a, m, p) for p in ps])(xj, mj)
            full = [
                jax.jit(fn)(xj, mj, jax.numpy.asarray(p, dtype=xj.dtype))  # p a tracer: full sort
                for p in ps
            ]
            return [(np.asarray(a), np.asarray(b)) for a, b in zip(fast, full, strict=True)]
    if backend == "torch":
        import torch

        xt, mt = torch.from_numpy(x), torch.from_numpy(mask)
        return [
            # a 0-d tensor is not a static number: full sort
            (fn(xt, mt, p).numpy(), fn(xt, mt, torch.tensor(p, dtype=xt.dtype)).numpy())
            for p in ps
        ]
    return [
        (np.asarray(fn(x, mask, p)), np.asarray(fn(x, mask, np.asarray(p, dtype=x.dtype))))
        for p in ps
    ]


def _quantile(x, mask, q):
    return shaping.masked_quantile(x, mask, q)


def _confidence(x, mask, low_frac):
    return shaping.low_prob_confidence(-x, mask, low_frac=low_frac)


@pytest.mark.parametrize("backend", ["numpy", "jax", "torch"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", [3, 12, 50])
def test_masked_quantile_fast_path_equals_full_sort(backend, dtype, t):
    x, mask = _masked_rows(seed=t, t=t, dtype=dtype)
    qs = (0.0, 0.05, 0.2, 1 / 3, 0.5, 0.7, 0.8, 0.8 + 1e-9, 0.9, 0.97, 1.0)
    for q, (fast, full) in zip(qs, _both_paths(_quantile, backend, x, mask, qs), strict=True):
        assert np.all(np.isfinite(fast)), (q, fast)
        # The same two sorted values and the same interpolation: bit-for-bit equal.
        np.testing.assert_array_equal(fast, full, err_msg=f"{backend} T={t} q={q}")


@pytest.mark.parametrize("backend", ["numpy", "jax", "torch"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", [3, 16, 50])
def test_low_prob_confidence_fast_path_equals_full_sort(backend, dtype, t):
    x, mask = _masked_rows(seed=t + 100, t=t, dtype=dtype)
    tol = 1e-12 if dtype == np.float64 else 1e-6  # the same values, summed over K or T slots
    fracs = (0.0, 0.05, 0.2, 0.25, 1 / 3, 0.5, 0.9, 1.0)
    paths = _both_paths(_confidence, backend, x, mask, fracs)
    for low_frac, (fast, full) in zip(fracs, paths, strict=True):
        assert_close(fast, full, rtol=tol, atol=0.0, what=f"{backend} T={t} low_frac={low_frac}")
