"""Measures of a problem's answer distribution: majority-vote accuracy ``maj@k`` and the entropy of
the answers (the effective number of answers).

One problem's n sampled responses reduce to their answer keys (``task.answer_key``: equal keys =
the same answer; None = no answer stated) and, per key, whether that answer is correct.

- ``maj@k`` (self-consistency, Wang et al. 2022, arXiv 2203.11171): draw k of the responses, take
  the answer stated most often; the draw scores 1 if it is correct. Responses without an answer
  (key None) do not vote; a draw of k of them scores 0. A tie among the most frequent answers is
  broken uniformly at random and scored by its expectation: (correct answers among the tied) /
  (tied answers), so the value depends on the counts only, never on the order of the responses.
  Reported is the exact expectation over the C(n, k) subsets of k of the n responses (no Monte
  Carlo), the analogue of Chen et al. 2021's unbiased pass@k: since a uniform k-subset of n i.i.d.
  samples is k i.i.d. samples, it is unbiased for the maj@k of k fresh samples. `maj_at_k`
  computes it in O(m n) passes of a dynamic program over the answers (m distinct answers);
  `maj_at_k_reference` enumerates the subsets.
- Answer entropy: ``H = -sum_a p_a ln p_a`` (nats) of the empirical distribution of the n keys,
  None counted as one more answer ("no answer" is an outcome of the policy, and so H is defined
  for every problem); ``exp(H)`` is the effective number of answers (1 for a collapsed policy, at
  most ``distinct_answers + 1``). The plug-in estimate, biased low for small n: compare models at
  equal n.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np

__all__ = ["answer_counts", "answer_entropy", "maj_at_k", "maj_at_k_reference"]


def answer_counts(
    keys: Sequence[Hashable | None], correct: Sequence[bool]
) -> tuple[list[int], list[bool], int]:
    """The votes of one problem's responses: ``(counts, key_correct, abstain)``.

    Args:
        keys: (n,) answer keys (None: no answer).
        correct: (n,) whether each response is correct.

    Returns:
        counts (m,) responses per distinct non-None key (in first-seen order); key_correct (m,)
        whether that answer is correct: some response stating it is (the `distinct_correct` rule of
        `llm.eval.heldout.measure`); abstain: responses with key None.

    Raises:
        ValueError: `keys` and `correct` of different lengths.
    """
    if len(keys) != len(correct):
        raise ValueError(
            f"keys, correct: expected equal lengths, got {len(keys)} and {len(correct)}"
        )
    counts: Counter[Hashable] = Counter()
    right: dict[Hashable, bool] = {}
    for key, ok in zip(keys, correct, strict=True):
        if key is not None:
            counts[key] += 1
            right[key] = right.get(key, False) or bool(ok)
    abstain = len(keys) - sum(counts.values())
    return list(counts.values()), [right[k] for k in counts], abstain


def answer_entropy(keys: Sequence[Hashable | None]) -> float:
    """Entropy in nats of the empirical distribution of `keys` (n,), None one more answer; 0 for
    no keys. ``exp`` of it is the effective number of answers."""
    n = len(keys)
    if n == 0:
        return 0.0
    p = np.asarray(list(Counter(keys).values()), dtype=np.float64) / n
    return float(-(p * np.log(p)).sum())


def _log_factorials(n: int) -> np.ndarray:
    """``ln m!`` for m = 0..n (n + 1,), float64."""
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])


def maj_at_k(
    counts: Sequence[int], key_correct: Sequence[bool], abstain: int, ks: Sequence[int]
) -> np.ndarray:
    """Exact expected maj@k over the k-subsets of one problem's n responses, for every k of `ks`.

    With ``x_a`` the votes for answer a in a uniformly random k-subset (multivariate
    hypergeometric), answer j wins with probability
    ``sum_v P(x_j = v) E[1{x_i <= v for all i} / (1 + #{i != j: x_i = v}) | x_j = v]``; the
    expectation is a dynamic program over the other answers (and the abstentions, which never
    win), kept as probabilities: state ``[d, t]`` = P(the others drawn so far are all <= v with t
    of them = v | d of them drawn), each answer added by its hypergeometric split of d. Answers of
    equal count win equally often, so the program runs once per (count of a correct answer, v):
    O(m n) passes over a (k_max + 1, ties) array at most, m distinct answers, n responses, and
    an (n + 1, n + 1) table of log-binomials (0.5 MB at n = 256).

    Args:
        counts: (m,) votes per distinct answer (each >= 1).
        key_correct: (m,) whether each answer is correct.
        abstain: responses without an answer (>= 0); n = sum(counts) + abstain.
        ks: subset sizes, each in [1, n].

    Returns:
        (len(ks),) maj@k in [0, 1], float64; equal to `maj_at_k_reference` to float rounding.

    Raises:
        ValueError: lengths differ, a count < 1, `abstain < 0`, or a k outside [1, n].
    """
    counts = [int(c) for c in counts]
    if len(counts) != len(key_correct):
        raise ValueError(
            f"counts, key_correct: expected equal lengths, got {len(counts)} and {len(key_correct)}"
        )
    if any(c < 1 for c in counts) or abstain < 0:
        raise ValueError(f"counts >= 1 and abstain >= 0 expected, got {counts} and {abstain}")
    n = sum(counts) + abstain
    if any(not 1 <= k <= n for k in ks):
        raise ValueError(f"ks: expected each in [1, {n}], got {list(ks)}")
    out = np.zeros(len(ks))
    if not any(key_correct):
        return out
    k_max = max(ks)
    lf = _log_factorials(n)
    a, b = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
    # ln C(a, b) for a, b in [0, n], -inf where b > a.
    log_binom = np.where(b <= a, lf[a] - lf[np.minimum(b, a)] - lf[np.maximum(a - b, 0)], -np.inf)

    d = np.arange(k_max + 1)
    wins = Counter(c for c, ok in zip(counts, key_correct, strict=True) if ok)
    for cj, n_correct in wins.items():
        others = list(counts)
        others.remove(cj)
        for v in range(1, min(cj, k_max) + 1):
            ties = min(sum(c >= v for c in others), k_max // v)
            state = np.zeros((k_max + 1, ties + 1))  # (d drawn from the pool, t ties)
            state[: abstain + 1, 0] = 1.0  # the abstentions alone: no vote, no tie
            pool = abstain
            for c in others:
                x = np.arange(min(c, v, k_max) + 1)[:, None]
                dx = d[None, :] - x
                ok = (dx >= 0) & (dx <= pool) & (d[None, :] <= pool + c)
                # P(x of the c | d drawn from pool + c) = C(c, x) C(pool, d - x) / C(pool + c, d)
                lw = log_binom[c, x] + log_binom[pool, np.clip(dx, 0, pool)]
                w = np.where(ok, np.exp(lw - log_binom[pool + c, np.minimum(d, pool + c)]), 0.0)
                new = np.zeros_like(state)
                for xi in range(w.shape[0]):
                    shifted = state[: k_max + 1 - xi] * w[xi, xi:, None]
                    if xi == v:
                        new[xi:, 1:] += shifted[:, :-1]
                    else:
                        new[xi:] += shifted
                state, pool = new, pool + c
            credit = state @ (1.0 / np.arange(1, ties + 2))  # (k_max + 1,)
            for i, k in enumerate(ks):
                if v <= k and k - v <= n - cj:
                    lp = log_binom[cj, v] + log_binom[n - cj, k - v] - log_binom[n, k]
                    out[i] += n_correct * math.exp(lp) * credit[k - v]
    return np.clip(out, 0.0, 1.0)


def maj_at_k_reference(
    keys: Sequence[Hashable | None], key_correct: dict[Hashable, bool], k: int
) -> float:
    """`maj_at_k` by enumeration of the C(n, k) subsets of `keys` (n,) (slow; the tests'
    reference): the mean over subsets of (correct answers among the most frequent) / (most
    frequent answers), None not voting, 0 for a subset without a vote. `key_correct` maps every
    non-None key to its correctness."""
    total, subsets = 0.0, 0
    for subset in itertools.combinations(range(len(keys)), k):
        votes = Counter(keys[i] for i in subset if keys[i] is not None)
        subsets += 1
        if votes:
            top = max(votes.values())
            tied = [a for a, c in votes.items() if c == top]
            total += sum(key_correct[a] for a in tied) / len(tied)
    return total / subsets
