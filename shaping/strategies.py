"""Hypothesis strategies for shaping batches: the public inputs of a property test of a method.

A batch is the dict of ``shaping/CONTRACT.md`` (`shaping.contract.BATCH_KEYS`), float64 NumPy
arrays with named axes ``B`` prompts, ``G`` responses per prompt, ``T`` response token positions,
``N`` top-N candidates, ``P`` prompt token positions; masks are float 0/1 and ``sampled_rank``
int64. Use them to test a method of your own (see ``docs/property_testing.md``)::

    from hypothesis import given
    from shaping.strategies import method_batches

    @given(batch=method_batches("grpo"))
    def test_mine(batch): ...

Sizes stay small (by default ``B <= 3, G <= 5, T <= 6, N <= 4, P <= 4``) so a loss with autograd
takes milliseconds. Floats are bounded and finite; values are drawn so that the degenerate cases
come up often: all-correct and all-wrong groups, ``G = 1``, padding (prefix masks) and fully
masked rows, ties in entropy and in length-normalized log-probs, and very negative log-probs.

Requires Hypothesis (the ``strategies`` extra: ``pip install -e '.[strategies]'`` in the checkout,
or ``pip install 'hypothesis>=6.100'``); importing `shaping` does not.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as exc:  # an optional dependency: the package itself never needs it
    raise ImportError(
        "shaping.strategies needs Hypothesis (the strategies extra): pip install 'hypothesis>=6.100'"
    ) from exc

from shaping.contract import BATCH_KEYS
from shaping.methods import Method, get_method

__all__ = ["batches", "masks", "method_batches", "reward_groups"]

#: Default largest sizes of a drawn batch.
MAX_B, MAX_G, MAX_T, MAX_N, MAX_P = 3, 5, 6, 4, 4

# Log-probs (nats): ordinary values, a few repeated ones (ties) and very negative ones.
_LOGP = st.one_of(
    st.floats(-8.0, 0.0, allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.5, -1.0, -30.0]),
    st.floats(-40.0, -20.0, allow_nan=False, allow_infinity=False),
)
# Mild log-probs only: confidences exp(mean log p) stay far above float noise (ProGRPO).
_MILD_LOGP = st.one_of(
    st.floats(-3.0, 0.0, allow_nan=False, allow_infinity=False), st.sampled_from([-0.5, -1.0])
)
# Ratio log-deltas: both sides of the clip range [log 0.8, log 1.2], and exactly on-policy.
_DELTA = st.one_of(st.just(0.0), st.floats(-0.6, 0.6, allow_nan=False, allow_infinity=False))
_ENTROPY = st.one_of(
    st.floats(0.0, 3.0, allow_nan=False, allow_infinity=False), st.sampled_from([0.0, 1.0])
)
_UNIT = st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False)


def _f64(draw: st.DrawFn, shape: tuple[int, ...], elements: st.SearchStrategy) -> np.ndarray:
    return draw(hnp.arrays(np.float64, shape, elements=elements))


def _size(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


@st.composite
def reward_groups(draw: st.DrawFn, n_b: int, n_g: int) -> np.ndarray:
    """Binary rewards, float64 0/1 of shape `(B, G)` = `(n_b, n_g)`.

    Each group is mixed (at least one correct and one wrong response when ``G > 1``), all
    correct or all wrong, each kind drawn equally often.

    Raises:
        ValueError: `n_b < 0` or `n_g < 1` (named).
    """
    n_b, n_g = _size("n_b", n_b, 0), _size("n_g", n_g, 1)
    rows = []
    for _ in range(n_b):
        kind = draw(st.sampled_from(["mixed", "all_correct", "all_wrong"]))
        if kind == "all_correct":
            rows.append([1.0] * n_g)
        elif kind == "all_wrong":
            rows.append([0.0] * n_g)
        else:
            bits = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n_g, max_size=n_g))
            if n_g > 1 and len(set(bits)) == 1:
                # Keep "mixed" mixed: Hypothesis would otherwise shrink it to a uniform group.
                bits[draw(st.integers(0, n_g - 1))] = 1.0 - bits[0]
            rows.append(bits)
    return np.array(rows, dtype=np.float64).reshape(n_b, n_g)


@st.composite
def masks(draw: st.DrawFn, n_b: int, n_g: int, n_t: int) -> np.ndarray:
    """Response masks, float64 0/1 of shape `(B, G, T)` = `(n_b, n_g, n_t)`.

    Half the draws are right-padded prefixes of random length in `[0, T]` (0: a fully masked
    response), half arbitrary bits (the contract allows any 0/1 pattern).

    Raises:
        ValueError: a negative size (named).
    """
    n_b, n_g, n_t = _size("n_b", n_b, 0), _size("n_g", n_g, 0), _size("n_t", n_t, 0)
    if draw(st.booleans()):
        lengths = draw(hnp.arrays(np.int64, (n_b, n_g), elements=st.integers(0, n_t)))
        return (np.arange(n_t)[None, None, :] < lengths[..., None]).astype(np.float64)
    return draw(hnp.arrays(np.float64, (n_b, n_g, n_t), elements=st.sampled_from([0.0, 1.0])))


@st.composite
def batches(
    draw: st.DrawFn,
    needs: Iterable[str] = frozenset(),
    min_g: int = 1,
    *,
    max_b: int = MAX_B,
    max_g: int = MAX_G,
    max_t: int = MAX_T,
    max_n: int = MAX_N,
    max_p: int = MAX_P,
    min_n: int = 1,
) -> dict[str, np.ndarray]:
    """A batch honouring `needs`: ``{key: array}`` with the shapes of `BATCH_KEYS`.

    Always holds ``rewards (B, G)`` (`reward_groups`), ``mask (B, G, T)`` (`masks`: padding
    and fully masked responses), ``logp_old``, ``logp`` and ``logp_ref`` ``(B, G, T)`` (nats,
    <= 0 before the ratio deltas; ``logp - logp_old`` and ``logp_ref - logp_old`` in
    ``[-0.6, 0.6]``, both sides of the usual clip range), and in half the draws the optional
    ``is_weight (B, G, T)`` in ``[0, 2]``. The keys of `needs` are added: ``entropy`` in
    ``[0, 3]`` nats; ``cand_logp``, ``cand_logp_old (B, G, T, N)`` with ``sampled_rank`` in
    ``[0, N]`` (``N``: outside the top-N) whenever any of the three is needed; ``diversity
    (B, G)`` in ``[0, 1]``; ``prompt_logp``, ``prompt_mask (B, P)`` whenever either is needed.
    Sizes: ``1 <= B <= max_b``, ``min_g <= G <= max_g``, ``1 <= T <= max_t``,
    ``min_n <= N <= max_n``, ``1 <= P <= max_p``. When ``G > 1`` the last response is, in half the
    draws, an exact copy of the first (a tie in every per-response score).

    Args:
        needs: batch keys beyond the base ones, e.g. ``get_method(name).needs_for(**hyper)``.
        min_g: smallest group size (``2`` for methods that need a baseline of others).
        min_n: smallest number of candidates (CaSP's ``top_n``).

    Raises:
        ValueError: an unknown key in `needs` (the known ones listed), or a size bound that is
            not an int, below 1 or with ``max_g < min_g`` or ``max_n < min_n`` (named).
    """
    needs = frozenset(needs)
    unknown = sorted(needs - set(BATCH_KEYS))
    if unknown:
        raise ValueError(f"needs: unknown batch key(s) {unknown}; known: {list(BATCH_KEYS)}")
    sizes = {"max_b": max_b, "min_g": min_g, "max_t": max_t, "min_n": min_n, "max_p": max_p}
    for name, value in sizes.items():
        _size(name, value, 1)
    _size("max_g", max_g, min_g)
    _size("max_n", max_n, min_n)
    n_b = draw(st.integers(1, max_b))
    n_g = draw(st.integers(min_g, max_g))
    n_t = draw(st.integers(1, max_t))
    logp_old = _f64(draw, (n_b, n_g, n_t), draw(st.sampled_from([_LOGP, _MILD_LOGP])))
    mask = draw(masks(n_b, n_g, n_t))
    tie = n_g > 1 and draw(st.booleans())
    if tie:
        # An exact copy of response 0 ties it with the last one in every per-response score.
        logp_old[:, -1], mask[:, -1] = logp_old[:, 0], mask[:, 0]
    batch = {
        "rewards": draw(reward_groups(n_b, n_g)),
        "mask": mask,
        "logp_old": logp_old,
        "logp": logp_old + _f64(draw, (n_b, n_g, n_t), _DELTA),
        "logp_ref": logp_old + _f64(draw, (n_b, n_g, n_t), _DELTA),
    }
    if draw(st.booleans()):
        # Optional rollout importance weight: truncated ratios in [0, 2].
        batch["is_weight"] = _f64(draw, (n_b, n_g, n_t), st.floats(0.0, 2.0))
    if "entropy" in needs:
        batch["entropy"] = _f64(draw, (n_b, n_g, n_t), _ENTROPY)
        if tie:
            batch["entropy"][:, -1] = batch["entropy"][:, 0]
    if needs & {"cand_logp", "cand_logp_old", "sampled_rank"}:
        n_c = draw(st.integers(min_n, max_n))
        cand_old = _f64(draw, (n_b, n_g, n_t, n_c), _LOGP)
        batch["cand_logp_old"] = cand_old
        batch["cand_logp"] = cand_old + _f64(draw, (n_b, n_g, n_t, n_c), _DELTA)
        batch["sampled_rank"] = draw(
            hnp.arrays(np.int64, (n_b, n_g, n_t), elements=st.integers(0, n_c))
        )
    if "diversity" in needs:
        batch["diversity"] = _f64(draw, (n_b, n_g), st.one_of(_UNIT, st.just(0.5)))
    if needs & {"prompt_logp", "prompt_mask"}:
        n_p = draw(st.integers(1, max_p))
        batch["prompt_logp"] = _f64(draw, (n_b, n_p), _LOGP)
        batch["prompt_mask"] = draw(
            hnp.arrays(np.float64, (n_b, n_p), elements=st.sampled_from([0.0, 1.0]))
        )
    return batch


def method_batches(
    method: str | Method, min_g: int = 1, **hyper: object
) -> st.SearchStrategy[dict[str, np.ndarray]]:
    """`batches` with the keys a registered method reads under `hyper` (`Method.needs_for`) and
    the sizes it accepts under them (`Method.min_sizes`: pass@k's ``G >= k``, CaSP's
    ``N >= top_n``; the largest sizes grow to fit).

    Args:
        method: a registered method or its name (`shaping.get_method`).
        min_g: smallest group size. hyper: the method's hyper-parameter overrides.

    Raises:
        ValueError: an unknown method name (the known ones listed, `get_method`) or an unknown
            hyper-parameter (named, `Method.needs_for`).
    """
    m = get_method(method) if isinstance(method, str) else method
    least = m.min_sizes(**hyper)
    g, n = max(min_g, least.get("G", 1)), least.get("N", 1)
    return batches(m.needs_for(**hyper), g, max_g=max(MAX_G, g), max_n=max(MAX_N, n), min_n=n)
