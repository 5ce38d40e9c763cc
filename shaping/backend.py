"""The one backend-specific helper of `shaping/`: stop-gradient.

Everything else in the package is written against the array API through `array_api_compat`.
JAX and torch are imported lazily, only when an array of that kind is seen, so a NumPy-only
user (``theory/``) never imports either.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import is_jax_array, is_torch_array

__all__ = ["stop_gradient"]


def stop_gradient(x: Any) -> Any:
    """Return `x` with the same value and no gradient flowing back through it.

    Args:
        x: an array of any shape (NumPy, JAX, including tracers, or torch).

    Returns:
        `jax.lax.stop_gradient(x)` for JAX, `x.detach()` for torch, `x` itself for NumPy
        (and any other backend without autodiff).

    Source: standard; used wherever FORMULAS.md writes ``sg(.)`` (e.g. seed 004, Eq. 4.1).
    """
    if is_jax_array(x):
        import jax

        return jax.lax.stop_gradient(x)
    if is_torch_array(x):
        return x.detach()
    return x
