"""The backend-specific helpers of `shaping/`: stop-gradient, a partial sort (`top_k`) and a
square root that is the same on every CPU (`sqrt`).

Everything else in the package is written against the array API through `array_api_compat`.
JAX and torch are imported lazily, only when an array of that kind is seen, so a NumPy-only
user (``theory/``) never imports either.
"""

from __future__ import annotations

import operator
import sys
from typing import Any

from array_api_compat import array_namespace, is_jax_array, is_numpy_array, is_torch_array

__all__ = ["concretizes_a_tracer", "sqrt", "stop_gradient", "top_k"]


def stop_gradient(x: Any) -> Any:
    """Return `x` with the same value and no gradient flowing back through it.

    Args:
        x: an array of any shape (NumPy, JAX, including tracers, or torch).

    Returns:
        `jax.lax.stop_gradient(x)` for JAX, `x.detach()` for torch, `x` itself for NumPy
        (and any other backend without autodiff).

    Source: standard; used wherever docs/formulas.md writes ``sg(.)`` (§0.1; e.g. seed 004, Eq. 4.1).
    """
    if is_jax_array(x):
        import jax

        return jax.lax.stop_gradient(x)
    if is_torch_array(x):
        return x.detach()
    return x


def concretizes_a_tracer(err: BaseException) -> bool:
    """Whether `err` is JAX's refusal to turn a traced array into a concrete value (``np.asarray``,
    ``float()``, ``if x > 0`` on a traced array under ``jit``, ``vmap`` or ``scan``): the error a
    method written with NumPy or Python control flow raises when the toy simulator runs it. False
    when JAX was never imported."""
    if "jax" not in sys.modules:
        return False
    import jax

    return isinstance(
        err, jax.errors.TracerArrayConversionError | jax.errors.ConcretizationTypeError
    )


def sqrt(x: Any) -> Any:
    """The correctly rounded square root of `x` (any shape), on every backend and CPU.

    torch's CPU ``sqrt`` is not correctly rounded (1 ulp off for ~17% of float32 inputs, measured
    with torch 2.13), and which inputs are off changes with the CPU: an AMD EPYC and QEMU's
    emulated AVX2 CPU disagree on the square roots of GRPO's group variances
    (`python -m numerics.emulate`, docs/numerics.md). For a torch tensor on the CPU the value is
    NumPy's square root (the hardware instruction, correctly rounded) and the gradient torch's:
    ``y + (exact - y).detach()`` with ``y = torch.sqrt(x)`` equals ``exact`` to the bit, as the
    two differ by a few ulp (Sterbenz). Elsewhere ``xp.sqrt`` (NumPy, JAX's XLA and CUDA round
    correctly).

    Args:
        x: a non-negative real array (NumPy, JAX, including tracers, or torch).

    Returns:
        an array of `x`'s shape, dtype and namespace.
    """
    if is_torch_array(x) and x.device.type == "cpu":
        import numpy as np
        import torch

        y = torch.sqrt(x)
        if x.dtype in (torch.float16, torch.float32, torch.float64):
            exact = torch.from_numpy(np.sqrt(x.detach().numpy()))
        else:  # bfloat16, which NumPy lacks: float32's root, rounded once more
            exact = torch.from_numpy(np.sqrt(x.detach().float().numpy())).to(x.dtype)
        if not y.requires_grad:
            return exact
        return y + torch.nan_to_num((exact - y).detach(), nan=0.0, posinf=0.0, neginf=0.0)  # inf
    return array_namespace(x).sqrt(x)


def top_k(x: Any, k: int, *, largest: bool) -> Any:
    """The `k` largest (or smallest) values along the last axis, sorted.

    This is the second backend-specific helper of `shaping/`. The array API has a
    full ``sort`` but no partial sort, and the masked quantile (CaSP, q = 0.8) and ProGRPO's
    low-probability confidence (lowest 20%) only need the top or bottom ~20% of each row. Measured
    on torch CPU, one thread, a (64, 1024) float32 row block: ``torch.sort`` ~2.1-3 ms against
    ~0.3-1 ms for ``torch.topk`` with k ~ 205, which is most of CaSP's and ProGRPO's cost over
    plain GRPO (loss + backward ~1.7 ms).

    Per backend:

    - torch: ``torch.topk(x, k, dim=-1, largest=largest, sorted=True).values``
      (https://docs.pytorch.org/docs/stable/generated/torch.topk.html);
    - JAX (also tracers, under ``jit`` / ``vmap``): ``jax.lax.top_k(x, k)``, which returns the
      largest entries sorted in descending order; the smallest are ``-top_k(-x, k)``
      (https://docs.jax.dev/en/latest/_autosummary/jax.lax.top_k.html);
    - NumPy: ``np.partition`` then ``np.sort`` of the k-slice (a full ``np.sort`` when `k` is at
      least half the row);
    - any other array-API namespace: ``xp.sort`` of the whole row, then the k-slice.

    Only values are returned (no indices): ties are therefore indistinguishable between backends.
    The selection is not meant to carry a gradient (shaping sorts detached data only).

    Args:
        x: (..., T) real array; ``+-inf`` are ordinary values (padding sentinels).
        k: number of values, a static Python int with ``0 <= k <= T``.
        largest: True for the k largest in descending order, False for the k smallest in
            ascending order.

    Returns:
        (..., k) array of `x`'s dtype and namespace.

    Raises:
        ValueError: `k` outside ``[0, T]`` (or `x` 0-d).
    """
    k = operator.index(k)
    if x.ndim == 0:
        raise ValueError("top_k needs an array with at least one axis")
    t = x.shape[-1]
    if not 0 <= k <= t:
        raise ValueError(f"top_k needs 0 <= k <= T = {t}, got k={k}")
    if is_torch_array(x):
        import torch

        return torch.topk(x, k, dim=-1, largest=largest, sorted=True).values
    if is_jax_array(x):
        import jax

        if largest:
            return jax.lax.top_k(x, k)[0]
        return -jax.lax.top_k(-x, k)[0]
    if is_numpy_array(x):
        import numpy as np

        if k == 0:
            return x[..., :0]
        if 2 * k >= t:
            s = np.sort(x, axis=-1)
        elif largest:
            s = np.sort(np.partition(x, t - k, axis=-1)[..., t - k :], axis=-1)
        else:
            s = np.sort(np.partition(x, k - 1, axis=-1)[..., :k], axis=-1)
        return s[..., ::-1][..., :k] if largest else s[..., :k]
    xp = array_namespace(x)
    return xp.sort(x, axis=-1, descending=largest)[..., :k]
