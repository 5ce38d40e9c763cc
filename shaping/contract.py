"""The batch contract of `shaping/`: every batch key, its shape, dtype and meaning, in one table.

`BATCH_KEYS` is the single source: the shape checks of every method (`check_batch`), the example
batches (`example_batch`) and the key table of ``shaping/CONTRACT.md`` (`contract_table`, checked
equal by a test) all read it. Adding a batch key is one `BatchKey` entry here plus the drivers that
produce it (``llm/``, ``toymdp/``).

Named axes: ``B`` prompts, ``G`` responses per prompt, ``T`` response token positions, ``N``
top-N candidates, ``P`` prompt token positions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from array_api_compat import array_namespace

__all__ = [
    "BASE_KEYS",
    "BATCH_KEYS",
    "BatchKey",
    "check_batch",
    "check_values",
    "contract_table",
    "example_batch",
]


@dataclass(frozen=True)
class BatchKey:
    """One batch key.

    Attributes:
        axes: named axes of the array, e.g. ``("B", "G", "T")``.
        dtype: ``"float"`` (real floating), ``"mask"`` (bool or float 0/1) or ``"int"``.
        meaning: one line for the contract table (units, range, who produces it).
    """

    axes: tuple[str, ...]
    dtype: str
    meaning: str


_KEYS: dict[str, BatchKey] = {
    "rewards": BatchKey(
        ("B", "G"), "float", "verifier reward of each response (binary 0/1 for most methods)"
    ),
    "mask": BatchKey(("B", "G", "T"), "mask", "1 on response tokens, 0 on padding"),
    "logp": BatchKey(
        ("B", "G", "T"),
        "float",
        "log-prob (nats, <= 0) of the sampled token under the current policy pi_theta "
        "(differentiable)",
    ),
    "logp_old": BatchKey(
        ("B", "G", "T"), "float", "same under the behaviour policy pi_old (no gradient)"
    ),
    "logp_ref": BatchKey(
        ("B", "G", "T"), "float", "same under the reference / base policy (needed when kl_coef > 0)"
    ),
    "entropy": BatchKey(
        ("B", "G", "T"),
        "float",
        "token entropy (nats) of pi_theta at each position (differentiable; `token_entropy`)",
    ),
    "cand_logp": BatchKey(
        ("B", "G", "T", "N"),
        "float",
        "current-policy log-probs of pi_old's top-N candidates, rank 1 first",
    ),
    "cand_logp_old": BatchKey(
        ("B", "G", "T", "N"), "float", "behaviour-policy log-probs of the same candidates"
    ),
    "sampled_rank": BatchKey(
        ("B", "G", "T"),
        "int",
        "0-based rank of the sampled token among pi_old's candidates (>= N: outside the top-N)",
    ),
    "diversity": BatchKey(
        ("B", "G"), "float", "DSDR per-response diversity score s_i in [0, 1] (drivers compute it)"
    ),
    "prompt_logp": BatchKey(
        ("B", "P"), "float", "log-probs of the prompt tokens under pi_old (ProGRPO confidence)"
    ),
    "prompt_mask": BatchKey(("B", "P"), "mask", "1 on prompt tokens, 0 on padding"),
    "is_weight": BatchKey(
        ("B", "G", "T"),
        "float",
        "optional, every method: rollout importance weight on the per-token clipped surrogate, "
        "min(exp(logp_old - logp_sampler), cap) when sampler and trainer disagree; absent = 1",
    ),
}
BATCH_KEYS: Mapping[str, BatchKey] = MappingProxyType(_KEYS)
"""Every batch key a method may read, ``name -> BatchKey`` (read-only)."""

BASE_KEYS: tuple[str, ...] = ("rewards", "mask", "logp", "logp_old")
"""Keys every method reads; `Method.needs` lists the others."""


def contract_table() -> str:
    """The Markdown key table of ``shaping/CONTRACT.md`` (``key | shape | dtype | meaning``)."""
    rows = ["| key | shape | dtype | meaning |", "|---|---|---|---|"]
    for name, key in _KEYS.items():
        rows.append(f"| `{name}` | ({', '.join(key.axes)}) | {key.dtype} | {key.meaning} |")
    return "\n".join(rows)


def check_batch(name: str, batch: Mapping[str, Any]) -> None:
    """Check that every present key has its contract shape with consistent axis sizes.

    Axis sizes are bound by the first key that carries them (``rewards`` binds ``B`` and ``G``).
    Python branching on shapes only, never on values, so this runs under ``jax.jit``.

    Args:
        name: the method's name, for the error message.
        batch: the batch mapping.

    Raises:
        ValueError: ``rewards`` missing, or a key of the wrong rank or with an axis size that
            disagrees with the other keys (the message names the key, its shape and the sizes).
    """
    if "rewards" not in batch:
        raise ValueError(f"{name}: batch is missing key 'rewards'")
    sizes: dict[str, int] = {}
    for key, spec in _KEYS.items():
        if key not in batch:
            continue
        shape = tuple(batch[key].shape)
        ok = len(shape) == len(spec.axes)
        if ok:
            for axis, size in zip(spec.axes, shape, strict=True):
                if sizes.setdefault(axis, size) != size:
                    ok = False
        if not ok:
            want = ", ".join(f"{a}={sizes[a]}" if a in sizes else a for a in spec.axes)
            raise ValueError(
                f"{name}: batch[{key!r}] has shape {shape}, expected ({want}) as the other keys"
            )


def check_values(name: str, batch: Mapping[str, Any]) -> None:
    """Refuse NaN where it would reach the loss: in ``rewards`` and the (B, G) float keys anywhere,
    in the (B, G, T) float keys on response tokens (padding may hold anything, CONTRACT.md).

    Only concrete host arrays are read (NumPy, torch on the CPU): a JAX array may be a tracer and
    a GPU tensor would cost a device sync, so those are left to the trainer's non-finite stop.
    A ``-inf`` log-prob is allowed (a token of probability 0 has a documented limit), but not in
    both terms of a difference the loss takes on a response token: ``logp`` and ``logp_old``
    (the ratio ``exp(logp - logp_old)``) or ``logp`` and ``logp_ref`` (the KL estimators), where
    ``-inf - (-inf)`` is NaN.

    Raises:
        ValueError: naming the key, how many entries are NaN and the first one's index; or both
            keys of a pair that are ``-inf`` together, how many times and the first index.
    """
    mask = batch.get("mask")
    _check_infinite_pairs(name, batch, mask)
    for key, spec in _KEYS.items():
        x = batch.get(key)
        if x is None or spec.dtype != "float" or not _host(x):
            continue
        if spec.axes not in (("B", "G"), ("B", "G", "T")):
            continue  # candidates and prompt keys: their padding has no mask of its own here
        xp = array_namespace(x)
        bad = xp.isnan(x)
        if spec.axes == ("B", "G", "T") and mask is not None and _host(mask):
            bad = bad & (xp.astype(mask, xp.bool) if mask.dtype != xp.bool else mask)
        count = int(xp.sum(xp.astype(bad, xp.int64)))
        if count:
            first = tuple(int(i) for i in np.argwhere(np.asarray(_to_numpy(bad)))[0])
            where = "response token(s)" if spec.axes == ("B", "G", "T") else "entries"
            raise ValueError(
                f"{name}: batch[{key!r}] holds NaN at {count} {where} (first at index {first})"
            )


_DIFFERENCES = (("logp", "logp_old", "the ratio exp(logp - logp_old)"),
                ("logp", "logp_ref", "the KL estimator of logp_ref - logp"))  # fmt: skip
"""The (B, G, T) log-prob pairs whose difference reaches the loss, and what it is."""


def _check_infinite_pairs(name: str, batch: Mapping[str, Any], mask: Any) -> None:
    # -inf in both terms of a difference: NaN in the loss.
    for a, b, what in _DIFFERENCES:
        x, y = batch.get(a), batch.get(b)
        if x is None or y is None or not (_host(x) and _host(y)):
            continue
        xp = array_namespace(x)
        both = (x == -math.inf) & (y == -math.inf)
        if mask is not None and _host(mask):
            both = both & (xp.astype(mask, xp.bool) if mask.dtype != xp.bool else mask)
        count = int(xp.sum(xp.astype(both, xp.int64)))
        if count:
            first = tuple(int(i) for i in np.argwhere(np.asarray(_to_numpy(both)))[0])
            raise ValueError(
                f"{name}: batch[{a!r}] and batch[{b!r}] are both -inf at {count} response "
                f"token(s) (first at index {first}): {what} is undefined there"
            )


def _host(x: Any) -> bool:
    # A concrete array whose values are free to read: NumPy, or torch on the CPU.
    if isinstance(x, np.ndarray):
        return True
    return type(x).__module__.startswith("torch") and getattr(x.device, "type", "") == "cpu"


def _to_numpy(x: Any) -> Any:
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()


def _float_dtype(ns: Any) -> Any:
    return ns.__array_namespace_info__().default_dtypes()["real floating"]


def example_batch(
    needs: Iterable[str],
    B: int,
    G: int,
    T: int,
    N: int,
    xp: Any,
    *,
    seed: int = 0,
    P: int | None = None,
    dtype: Any = None,
) -> dict[str, Any]:
    """A valid, seeded batch with the base keys plus `needs`, as arrays of `xp`.

    Values obey the contract, so any method whose `needs` are included runs on it: rewards are
    0/1 with every group of ``G >= 2`` mixed (one correct and one wrong response at least); masks
    are prefixes of length 1..T (one response of each group has the full length T); the sampled
    token, its top-N candidates and the residual mass outside them come from one distribution per
    position, so log-probs are <= 0, ``cand_logp_old`` is sorted descending, ``logp_old`` equals
    ``cand_logp_old[..., sampled_rank]`` when ``sampled_rank < N`` and is at most the N-th
    candidate otherwise, and the current policy (``logp``, ``cand_logp``) is a perturbation of
    that distribution with the same identities; entropies lie in [0, log(N + 1)]; diversity in
    [0, 1]; ``is_weight`` in [0, 2]; every prompt has at least one prompt token.

    Args:
        needs: batch keys beyond `BASE_KEYS` (e.g. ``Method.needs_for(**hyper)``).
        B, G, T, N: batch sizes (``B, T >= 0``; ``G, N >= 1``).
        xp: the array namespace or module: ``numpy``, ``jax.numpy``, ``torch`` (anything with
            ``asarray``).
        seed: NumPy seed of the draws (the same seed gives the same values on every backend).
        P: prompt length for ``prompt_logp`` / ``prompt_mask`` (default ``max(T, 1)``).
        dtype: float dtype of `xp` (default: `xp`'s default real floating dtype). Masks are
            float 0/1 of that dtype, ``sampled_rank`` `xp`'s default integer dtype.

    Returns:
        ``{key: array}`` with the shapes of `BATCH_KEYS`.

    Raises:
        ValueError: an unknown key in `needs` (the message lists the known ones) or a size out
            of range (named).
    """
    needs = frozenset(needs)
    unknown = sorted(needs - set(_KEYS))
    if unknown:
        raise ValueError(f"needs: unknown batch key(s) {unknown}; known: {list(_KEYS)}")
    P = max(T, 1) if P is None else P
    for axis, value, low in (("B", B, 0), ("G", G, 1), ("T", T, 0), ("N", N, 1), ("P", P, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{axis} must be an int >= {low}, got {value!r}")
    rng = np.random.default_rng(seed)
    rewards = (rng.uniform(size=(B, G)) < 0.5).astype(np.float64)
    if G >= 2:
        rewards[:, 0], rewards[:, 1] = 1.0, 0.0
    lengths = rng.integers(1, T + 1, size=(B, G)) if T > 0 else np.zeros((B, G), np.int64)
    lengths[:, G - 1] = T
    mask = (np.arange(T)[None, None, :] < lengths[..., None]).astype(np.float64)
    # One distribution over N candidates and an "elsewhere" bucket per position, sorted by pi_old.
    old_logits = rng.normal(0.0, 1.5, size=(B, G, T, N + 1))
    old = np.sort(_log_softmax(old_logits), axis=-1)[..., ::-1]
    new = _log_softmax(old + rng.normal(0.0, 0.3, size=old.shape))
    rank = rng.integers(0, N + 1, size=(B, G, T))
    pick = rank[..., None]
    values: dict[str, np.ndarray] = {
        "rewards": rewards,
        "mask": mask,
        "logp": np.take_along_axis(new, pick, axis=-1)[..., 0],
        "logp_old": np.take_along_axis(old, pick, axis=-1)[..., 0],
        "logp_ref": np.minimum(
            np.take_along_axis(old, pick, axis=-1)[..., 0] + rng.normal(0, 0.2, (B, G, T)), 0.0
        ),
        "entropy": -np.sum(np.exp(new) * new, axis=-1),
        "cand_logp": np.ascontiguousarray(new[..., :N]),
        "cand_logp_old": np.ascontiguousarray(old[..., :N]),
        "sampled_rank": rank,
        "diversity": rng.uniform(0.0, 1.0, size=(B, G)),
        "prompt_logp": -rng.exponential(1.5, size=(B, P)),
        "prompt_mask": (np.arange(P)[None, :] < rng.integers(1, P + 1, size=(B, 1))).astype(
            np.float64
        ),
        "is_weight": rng.uniform(0.0, 2.0, size=(B, G, T)),
    }
    ns = array_namespace(xp.asarray(0.0))
    dtype = _float_dtype(ns) if dtype is None else dtype
    out = {}
    for key in (*BASE_KEYS, *(k for k in _KEYS if k in needs and k not in BASE_KEYS)):
        arr = values[key]
        out[key] = ns.asarray(arr) if _KEYS[key].dtype == "int" else ns.asarray(arr, dtype=dtype)
    return out


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - np.max(z, axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))
