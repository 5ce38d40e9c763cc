"""Backends and one ``assert_close`` helper for the shaping tests.

A backend turns a NumPy float64 batch into arrays of one library and evaluates a method's loss
there, returning the value and, where the backend has autodiff, the gradients with respect to the
differentiable keys. JAX runs under ``jax.enable_x64(True)`` (a context manager, so other test
modules keep JAX's float32 default); torch uses float64 CPU tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pytest

from toymdp.train import FAST_COMPILE

#: Batch keys a loss may be differentiated with respect to (CONTRACT.md).
DIFFERENTIABLE_KEYS = ("logp", "entropy", "cand_logp")

#: Parameter ids of the cross-backend tests (SciPy array-API style).
BACKENDS = ("numpy", "jax", "jax.jit", "torch", "torch.grad")

#: The options the tests' programs of every method compile with: XLA's fast-compile level, as
#: `toymdp.train.make_train`'s programs (an eighth less compile time). Not the toy engine's
#: `toymdp.engine.COMPILE_OPTIONS`: there XLA fuses GRPO's `r - mean` with `* (1 / G)` into a
#: multiply-add, and the float32 check fails (a constant group of 5 gets advantages -0.015).
JIT_OPTIONS = FAST_COMPILE


def to_numpy(x: Any) -> np.ndarray:
    """Any backend's array (or a Python number) as a float64 NumPy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def assert_close(actual: Any, expected: Any, *, rtol: float = 1e-8, atol: float = 1e-10, what=""):
    """Assert two arrays (any backend) have equal shapes and values within tolerance.

    NaN never passes: every quantity of the shaping core must be finite on finite inputs.
    """
    a, e = to_numpy(actual), to_numpy(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    assert np.all(np.isfinite(a)), f"{what}: non-finite values {a}"
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=what)


def requires(backend: str) -> Any:
    """Import the backend's library or skip the test cleanly."""
    if backend.startswith("jax"):
        return pytest.importorskip("jax")
    if backend.startswith("torch"):
        return pytest.importorskip("torch")
    return np


def convert(batch: Mapping[str, np.ndarray], backend: str) -> dict[str, Any]:
    """The batch as arrays of `backend` (float64; ``sampled_rank`` stays integer)."""
    if backend == "numpy":
        return dict(batch)
    if backend.startswith("jax"):
        import jax.numpy as jnp

        return {k: jnp.asarray(v) for k, v in batch.items()}
    import torch

    return {k: torch.from_numpy(np.array(v)) for k, v in batch.items()}


def diff_keys(batch: Mapping[str, Any]) -> list[str]:
    """The differentiable keys present in `batch`."""
    return [k for k in DIFFERENTIABLE_KEYS if k in batch]


def evaluate(
    method: Any, batch: Mapping[str, np.ndarray], backend: str, hyper: Mapping[str, object]
) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
    """Loss value and gradients (None for backends without autodiff) of `method` on `backend`."""
    requires(backend)
    if backend in ("numpy", "torch"):
        value, _ = method.loss(convert(batch, backend), **hyper)
        return to_numpy(value), None
    if backend == "torch.grad":
        tb = convert(batch, backend)
        keys = diff_keys(tb)
        for k in keys:
            tb[k].requires_grad_(True)
        value, _ = method.loss(tb, **hyper)
        value.backward()
        grads = {
            k: np.zeros(tb[k].shape) if tb[k].grad is None else to_numpy(tb[k].grad) for k in keys
        }
        return to_numpy(value), grads
    import jax

    with jax.enable_x64(True):
        jb = convert(batch, backend)
        keys = diff_keys(jb)

        def f(diff):
            return method.loss({**jb, **diff}, **hyper)[0]

        if backend == "jax.jit":
            f = jax.jit(f)
        value, grads = jax.value_and_grad(f)({k: jb[k] for k in keys})
        return to_numpy(value), {k: to_numpy(v) for k, v in grads.items()}


def call_block(fn: Any, backend: str, *args: Any, **kwargs: Any) -> np.ndarray:
    """Evaluate a building block on `backend` with NumPy positional arrays converted."""
    requires(backend)
    if backend.startswith("jax"):
        import jax

        with jax.enable_x64(True):
            conv = [convert({"x": a}, backend)["x"] for a in args]
            if backend == "jax.jit":
                return to_numpy(jax.jit(lambda *xs: fn(*xs, **kwargs))(*conv))
            return to_numpy(fn(*conv, **kwargs))
    conv = [convert({"x": a}, backend)["x"] for a in args]
    return to_numpy(fn(*conv, **kwargs))


def check_every(cases: Iterable[tuple], check: Callable[..., None]) -> None:
    """Run ``check(*case)`` for every case (e.g. every registered method) and fail once, naming
    every case that raised (an error in one method does not hide the others)."""
    cases = list(cases)
    failed = []
    for case in cases:
        try:
            check(*case)
        except (Exception, pytest.fail.Exception) as err:  # pytest.raises's DID NOT RAISE too
            label = "/".join(map(str, case))
            failed.append(f"{label}: {type(err).__name__}: {str(err).strip()[:600]}")
    assert not failed, f"{len(failed)} of {len(cases)} cases fail:\n" + "\n".join(failed)


def jit_each(fn: Callable[[str, Any], Any], inputs: Mapping[str, Any]) -> Callable[[str], Any]:
    """``name -> fn(name, inputs[name])`` under ``jax.jit``: every name traced into one program,
    called once (XLA shares the common parts: a fraction of one program per name, and of eager
    JAX, which compiles each primitive per shape and dtype). When tracing them together fails,
    each name runs under its own ``jax.jit`` when asked, so the failure names it (`check_every`)."""
    import jax

    try:
        every = jax.jit(
            lambda xs: {name: fn(name, x) for name, x in xs.items()}, compiler_options=JIT_OPTIONS
        )
        done = every(dict(inputs))
    except Exception:  # one name fails under tracing: its own jit below raises for it
        done = {}

    def run(name: str) -> Any:
        return done[name] if name in done else jax.jit(functools.partial(fn, name))(inputs[name])

    return run
