"""The pure conversion of vLLM's outputs into a `RolloutBatch` (`rollout_batch_from_outputs`).

Imports no vLLM: it reads only the attributes named by the protocols below, so it runs on CPU with
stand-in objects (tests/llm/test_vllm_convert.py). What vLLM's log-prob dicts and `FlatLogprobs`
hold (sampled token first, then the top N; ranks; `processed_logprobs`) is documented with its
sources in `llm.rollout.vllm_engine`, the engine that produces them. Shapes: B prompts, G
responses per prompt (a group), P prompt tokens, T response tokens, N top candidates.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from itertools import islice
from operator import attrgetter
from typing import Any, Protocol

import numpy as np
import torch

from llm.rollout.base import RolloutBatch

# --------------------------------------------------------------------------------------------------
# The attributes of vLLM's output objects that the conversion reads (vllm/outputs.py,
# vllm/logprobs.py); anything with them works, e.g. the stand-in dataclasses of the tests.


class LogprobLike(Protocol):
    logprob: float
    rank: int | None


class CompletionOutputLike(Protocol):
    index: int
    token_ids: Sequence[int]
    logprobs: Sequence[dict[int, LogprobLike]] | FlatLogprobsLike | None


class FlatLogprobsLike(Protocol):
    """vLLM's `FlatLogprobs` (`vllm/logprobs.py`, `SamplingParams(flat_logprobs=True)`): position
    t's entries are `token_ids/logprobs/ranks[start_indices[t]:end_indices[t]]`."""

    start_indices: list[int]
    end_indices: list[int]
    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int | None]


class RequestOutputLike(Protocol):
    outputs: Sequence[CompletionOutputLike]


# --------------------------------------------------------------------------------------------------
# Pure conversion


def rollout_batch_from_outputs(
    prompts: Sequence[str],
    prompt_token_ids: Sequence[Sequence[int]],
    outputs: Sequence[RequestOutputLike],
    group_size: int,
    top_n: int,
    pad_token_id: int,
    eos_token_id: int | Sequence[int],
    tokenizer: Any,
    *,
    want_logprobs: bool = True,
) -> RolloutBatch:
    """The `RolloutBatch` of vLLM's `RequestOutput`s, one per prompt, each with G completions.

    Rows are prompt-major (row `b * G + g` is completion g of prompt b, ordered by
    `CompletionOutput.index`). A completion is cut after its first stop id (`eos_token_id`, one
    id or several: vLLM stops there already; this keeps the contract if a different stop token let
    it run on). Per position, `logprobs[t]` is vLLM's dict `token_id -> Logprob`: the sampled
    token's log-prob is read at its id, and the candidates are the `top_n` entries of smallest
    rank (rank 1 first, ties in dict order, a missing rank last), which drops the sampled token
    when it was added outside the top N.

    Vectorized, for vLLM's two log-prob formats. `FlatLogprobs` (what `VLLMBackend` asks for,
    `SamplingParams(flat_logprobs=True)`): the flat lists of all completions are read in a few
    C-level passes (`np.fromiter`), no per-position dict or `Logprob` object, and with vLLM's layout
    (N + 1 entries a position) processed as an (L, N + 1) grid (`_positions_of_flat`). A list of
    dicts: the dicts of all positions are read the same way (`itertools.chain` into `np.fromiter`)
    into flat entry arrays (id, log-prob, rank); the sampled token's entry is found by comparing
    ids, candidates by one stable sort on (position, rank) (`_positions_of_entries`). Everything is
    then scattered into the padded tensors at once. Both equal the per-token loop it replaced
    (`tests/llm/reference_convert.py`, which reads a `FlatLogprobs` position by position as dicts;
    tested on random stand-ins and on real vLLM objects). Measured on 2 shared CPU cores
    (`bench/bench_vllm_convert.py`, 256 responses x ~3,000 tokens), us/token with FlatLogprobs /
    dicts / the loop: 0.82 / 1.40 / 46.7 with N = 3 and 0.32 / 0.51 / 12.6 with N = 0; what remains
    is reading the Python ints and floats of the flat lists (~20 ns each, N + 1 ids, log-probs and
    ranks a token) and `batch_decode` (~0.27 us/token).

    Args:
        prompts: B prompt texts.
        prompt_token_ids: B unpadded prompt token-id lists (what was sent to the engine).
        outputs: B objects with `.outputs`, each G objects with `.index`, `.token_ids` and
            `.logprobs` (a `FlatLogprobs` or a list of per-position dicts, at least as long as
            `token_ids`).
        group_size: G.
        top_n: N, candidates per position (0: none; vLLM was asked for `logprobs=top_n`).
        pad_token_id: fills prompt padding (left) and response padding (right).
        eos_token_id: the stop id, or the stop ids (`llm.rollout.base.stop_token_ids`); the response
            mask includes the first one.
        tokenizer: anything with `batch_decode(rows, skip_special_tokens=True)`, rows a list of
            1-D int64 numpy arrays (a transformers tokenizer).
        want_logprobs: False when vLLM was asked for no log-probs (`logprobs=None`, texts only):
            `.logprobs` is not read (may be None), `logp` is NaN on the mask, `top_n` must be 0.

    Returns:
        A `RolloutBatch` on CPU: `prompt_ids`/`prompt_mask` (B, P), `response_ids`,
        `response_mask`, `logp` (B, G, T) with T the longest response, `cand_ids`/`cand_logp`
        (B, G, T, N) or None when `top_n == 0`, `entropy` None (vLLM does not report it), `texts`
        (B, G). Outside the mask: ids pad, log-probs 0, candidate ids pad, candidate log-probs 0.

    Raises:
        ValueError: lengths of `prompts`, `prompt_token_ids` and `outputs` differ, a request has
            not G completions, `logprobs` is missing or shorter than `token_ids`, the sampled
            token is missing from its position's dict, a position has fewer than `top_n`
            candidates, or `top_n > 0` without `want_logprobs`.
    """
    B, G, N = len(prompts), group_size, top_n
    if len(prompt_token_ids) != B or len(outputs) != B:
        raise ValueError(
            f"expected one prompt_token_ids list and one output per prompt ({B}), got "
            f"{len(prompt_token_ids)} and {len(outputs)}"
        )
    if N and not want_logprobs:
        raise ValueError(f"top_n: expected 0 without want_logprobs, got {N}")
    stops = [eos_token_id] if isinstance(eos_token_id, int) else [int(i) for i in eos_token_id]

    responses: list[list[int]] = []  # B*G token-id lists, cut after the first stop id
    kept_logprobs: list[tuple[Any, int]] = []  # (`.logprobs`, kept positions) per row
    for b, request in enumerate(outputs):
        completions = sorted(request.outputs, key=lambda c: c.index)
        if len(completions) != G:
            raise ValueError(f"prompt {b}: expected {G} completions, got {len(completions)}")
        for completion in completions:
            ids = completion.token_ids
            ids = _cut_after_first_stop(ids if type(ids) is list else list(ids), stops)
            responses.append(ids)
            if not want_logprobs:
                continue
            lps = completion.logprobs
            if lps is None or len(lps) < len(ids):
                raise ValueError(
                    f"prompt {b}, completion {completion.index}: expected a logprobs dict per "
                    f"token ({len(ids)}), got {None if lps is None else len(lps)}"
                )
            kept_logprobs.append((lps, len(ids)))

    R = B * G
    lengths = np.fromiter(map(len, responses), dtype=np.int64, count=R)
    T = int(lengths.max()) if R else 0
    L = int(lengths.sum())  # kept positions of the batch
    # The kept positions of the (R, T) grid, row-major like `positions` (boolean-mask assignment
    # fills them in this order).
    kept = np.arange(T) < lengths[:, None]  # (R, T)
    tokens = np.fromiter(itertools.chain.from_iterable(responses), dtype=np.int64, count=L)

    response_ids = np.full((R, T), pad_token_id, dtype=np.int64)
    response_ids[kept] = tokens
    response_mask = kept.astype(np.float32)
    logp = np.zeros((R, T), dtype=np.float32)
    cand_ids = np.full((R, T, N), pad_token_id, dtype=np.int64)
    cand_logp = np.zeros((R, T, N), dtype=np.float32)

    def where(p: int) -> str:  # "row r, position t" of kept position p
        row = int(np.searchsorted(np.cumsum(lengths), p, side="right"))
        return f"row {row}, position {p - int(lengths[:row].sum())}"

    if not want_logprobs:
        logp[kept] = np.nan
    elif L:
        if all(_is_flat(lps) for lps, _ in kept_logprobs):
            sampled, top_ids, top_logp = _positions_of_flat(kept_logprobs, tokens, N, where)
        else:  # dicts (vLLM's default), or a mix: every position as a dict
            positions: list[dict[int, LogprobLike]] = []  # all kept positions, row-major
            for lps, n in kept_logprobs:
                positions.extend(lps if type(lps) is list and len(lps) == n else islice(lps, n))
            entries = _flat_entries(positions, ranks=N > 0)
            sampled, top_ids, top_logp = _positions_of_entries(*entries, tokens, N, where)
        logp[kept] = sampled
        if N:
            cand_ids[kept] = top_ids
            cand_logp[kept] = top_logp

    P = max((len(ids) for ids in prompt_token_ids), default=0)
    prompt_ids = torch.full((B, P), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros(B, P)
    for b, ids in enumerate(prompt_token_ids):
        if ids:
            prompt_ids[b, P - len(ids) :] = torch.as_tensor(list(ids), dtype=torch.long)
            prompt_mask[b, P - len(ids) :] = 1.0

    # Rows as int64 arrays: transformers' `decode` turns an array into a list in C (`tolist`) but
    # checks a list's every element in Python (`to_py_obj`), twice the time for the same text.
    rows_ids = np.split(tokens, np.cumsum(lengths)[:-1]) if R else []
    texts = tokenizer.batch_decode(rows_ids, skip_special_tokens=True) if R else []

    def grouped(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).reshape(B, G, *x.shape[1:])

    return RolloutBatch(
        prompts=list(prompts),
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=grouped(response_ids),
        response_mask=grouped(response_mask),
        logp=grouped(logp),
        texts=[list(texts[b * G : (b + 1) * G]) for b in range(B)],
        cand_ids=grouped(cand_ids) if N else None,
        cand_logp=grouped(cand_logp) if N else None,
        entropy=None,
    )


def _positions_of_entries(
    entry_ids: np.ndarray,
    entry_logp: np.ndarray,
    entry_rank: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    tokens: np.ndarray,
    N: int,
    where: Callable[[int], str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sampled token's log-prob (L,) and the N candidates' ids and log-probs (L, N) of L
    positions given as dict entries (`_flat_entries`: unique ids per position, in dict order)."""
    L = len(tokens)
    # The sampled token's entry: dict keys are unique, so at most one per position.
    owner = np.repeat(np.arange(L), counts)  # position of each entry
    hit = np.flatnonzero(entry_ids == tokens[owner])
    if len(hit) != L:
        p = int(np.flatnonzero(np.bincount(owner[hit], minlength=L) == 0)[0])
        raise ValueError(f"{where(p)}: sampled token {int(tokens[p])} has no log-prob")
    if not N:
        return entry_logp[hit], np.empty((L, 0), np.int64), np.empty((L, 0))
    few = np.flatnonzero(counts < N)
    if len(few):
        p = int(few[0])
        raise ValueError(f"{where(p)}: expected {N} candidates, got {int(counts[p])}")
    # Stable sort on (position, rank): entries are position-major already, so sorting the rank
    # within each position keeps dict order among equal ranks, as `sorted` did.
    order = np.argsort(owner * (int(entry_rank.max()) + 1) + entry_rank, kind="stable")
    take = order[starts[:, None] + np.arange(N)]  # (L, N) the N smallest ranks
    return entry_logp[hit], entry_ids[take], entry_logp[take]


def _cut_after_first_stop(ids: list[int], stops: Sequence[int]) -> list[int]:
    """`ids` up to and including the first of `stops` (all of it when none occurs)."""
    cut = len(ids)
    for stop in stops:
        try:
            cut = ids.index(stop, 0, cut) + 1
        except ValueError:
            continue
    return ids if cut == len(ids) else ids[:cut]


def _flat_entries(
    positions: Sequence[dict[int, LogprobLike]], *, ranks: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The entries of L per-position dicts as flat arrays, position-major in dict order.

    Returns:
        `(ids, logp, rank, starts, counts)`: ids int64 (E,), log-probs float64 (E,), ranks int64
        (E,) with a missing rank (None) as a rank above every other (zeros when `ranks` is
        False), the first entry of each position (L,) and its number of entries (L,).
    """
    counts = np.fromiter(map(len, positions), dtype=np.int64, count=len(positions))
    E = int(counts.sum())
    ids = np.fromiter(itertools.chain.from_iterable(positions), dtype=np.int64, count=E)
    values = list(itertools.chain.from_iterable(map(dict.values, positions)))  # E Logprobs
    logp = np.fromiter(map(attrgetter("logprob"), values), dtype=np.float64, count=E)
    if ranks:
        try:
            rank = np.fromiter(map(attrgetter("rank"), values), dtype=np.int64, count=E)
        except TypeError:  # a None rank (never for vLLM's sampled-token log-probs): sorts last
            raw = [v.rank for v in values]
            top = max((r for r in raw if r is not None), default=0)
            rank = np.asarray([top + 1 if r is None else r for r in raw], dtype=np.int64)
    else:
        rank = np.zeros(E, dtype=np.int64)
    return ids, logp, rank, np.cumsum(counts) - counts, counts


def _is_flat(lps: Any) -> bool:
    """Whether `lps` is vLLM's `FlatLogprobs` (or anything with its flat lists)."""
    return all(hasattr(lps, a) for a in _FLAT_FIELDS)


_FLAT_FIELDS = ("start_indices", "end_indices", "token_ids", "logprobs", "ranks")


def _positions_of_flat(
    rows: Sequence[tuple[FlatLogprobsLike, int]],
    tokens: np.ndarray,
    N: int,
    where: Callable[[int], str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_positions_of_entries` for the first n positions of each `FlatLogprobs` in `rows`
    (`(flat, n)`), read from its lists in a few C-level passes, without a dict or a `Logprob`
    per position.

    Position t's entries are `token_ids/logprobs/ranks[start_indices[t]:end_indices[t]]`
    (`vllm/logprobs.py`, `FlatLogprobs`). Unlike a dict, the flat lists keep repeated ids: vLLM's
    `append_fast` writes the sampled token first and again among the top N when it is there.
    `FlatLogprobs[t]`, the dict the reference reads, keeps a repeated id at its first place with
    its last value; so does this. vLLM's layout has the same number of entries at every position
    (N + 1), read as an (L, N + 1) grid: repeats found by comparing columns, candidates by a stable
    sort of each row's ranks (a repeat's place ranked last). Other layouts go through
    `_dict_entries` and `_positions_of_entries`.
    """
    ids, logp, rank, counts = _read_flat_logprobs(rows, ranks=N > 0)
    L = len(counts)
    K = int(counts[0])
    if not 1 <= K <= _GRID_MAX_WIDTH or not (counts == K).all():
        entries = _dict_entries(ids, logp, rank, counts)
        return _positions_of_entries(*entries, tokens, N, where)

    ids, logp, rank = ids.reshape(L, K), logp.reshape(L, K), rank.reshape(L, K)
    repeat = np.zeros((L, K), dtype=bool)  # an id seen at an earlier column of its row
    if K > 1:
        logp, rank = logp.copy(), rank.copy()  # values of the last occurrence, at the first
        for j in range(K):
            for k in range(j + 1, K):
                same = ids[:, j] == ids[:, k]
                if same.any():
                    repeat[:, k] |= same
                    np.copyto(logp[:, j], logp[:, k], where=same)
                    np.copyto(rank[:, j], rank[:, k], where=same)
    hit = (ids == tokens[:, None]) & ~repeat  # at most one per row
    col = hit.argmax(axis=1)
    found = hit[np.arange(L), col]
    if not found.all():
        p = int(np.flatnonzero(~found)[0])
        raise ValueError(f"{where(p)}: sampled token {int(tokens[p])} has no log-prob")
    sampled = logp[np.arange(L), col]
    if not N:
        return sampled, np.empty((L, 0), np.int64), np.empty((L, 0))
    distinct = K - repeat.sum(axis=1)
    few = np.flatnonzero(distinct < N)
    if len(few):
        p = int(few[0])
        raise ValueError(f"{where(p)}: expected {N} candidates, got {int(distinct[p])}")
    rank[repeat] = np.iinfo(np.int64).max  # after every entry of the dict
    take = np.argsort(rank, axis=1, kind="stable")[:, :N]  # ties in column (dict) order
    take += np.arange(0, L * K, K)[:, None]  # flat indices
    return sampled, ids.ravel()[take], logp.ravel()[take]


# Widest rows read as a grid: its repeat search compares K (K - 1) / 2 column pairs (vLLM's
# `max_logprobs` is 20 by default, 21 entries a position; wider layouts are rare).
_GRID_MAX_WIDTH = 8


def _read_flat_logprobs(
    rows: Sequence[tuple[FlatLogprobsLike, int]], *, ranks: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The raw entries of the first n positions of each `FlatLogprobs` in `rows` (`(flat, n)`),
    position-major, repeated ids kept: ids int64 (E,), log-probs float64 (E,), ranks int64 (E,)
    (a None rank above every other; zeros when `ranks` is False) and each position's count (L,)."""
    R = len(rows)
    n = np.fromiter((k for _, k in rows), dtype=np.int64, count=R)
    sizes = np.fromiter((len(f.token_ids) for f, _ in rows), dtype=np.int64, count=R)
    L, total = int(n.sum()), int(sizes.sum())
    base = np.repeat(np.cumsum(sizes) - sizes, n)  # each position's row offset in the concatenation

    def positions(name: str) -> np.ndarray:  # the first n start (end) indices of every row, (L,)
        seqs = (islice(getattr(f, name), k) for f, k in rows)
        return np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=L) + base

    def values(name: str, dtype: type) -> np.ndarray:  # a list of every row, concatenated
        seqs = (getattr(f, name) for f, _ in rows)
        return np.fromiter(itertools.chain.from_iterable(seqs), dtype=dtype, count=total)

    starts, ends = positions("start_indices"), positions("end_indices")
    counts = ends - starts
    ids, logp = values("token_ids", np.int64), values("logprobs", np.float64)
    if ranks:
        try:
            rank = values("ranks", np.int64)
        except TypeError:  # a None rank (never for vLLM's sampled-token log-probs): sorts last
            raw = list(itertools.chain.from_iterable(f.ranks for f, _ in rows))
            top = max((r for r in raw if r is not None), default=0)
            rank = np.asarray([top + 1 if r is None else r for r in raw], dtype=np.int64)
    else:
        rank = np.zeros(total, dtype=np.int64)
    E = int(counts.sum())
    if not (E == total and starts[0] == 0 and np.array_equal(starts[1:], ends[:-1])):
        # Positions past a stop id, or lists with gaps: gather the kept entries.
        take = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(E)
        ids, logp, rank = ids[take], logp[take], rank[take]
    return ids, logp, rank, counts


def _dict_entries(
    ids: np.ndarray, logp: np.ndarray, rank: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`_flat_entries` of flat entries with repeated ids (`_read_flat_logprobs`): per position one
    entry per distinct id, at the id's first occurrence, with the log-prob and rank of its last,
    as `FlatLogprobs[t]` builds the position's dict."""
    L, E = len(counts), len(ids)
    if E and int(counts.max()) > 1:
        owner = np.repeat(np.arange(L), counts)
        low, span = int(ids.min()), int(ids.max()) - int(ids.min()) + 1
        if L * span < 1 << 62:
            order = np.argsort(owner * span + (ids - low), kind="stable")
        else:
            order = np.lexsort((ids, owner))  # stable too
        key_owner, key_id = owner[order], ids[order]
        first = np.ones(E, dtype=bool)  # first of a run of equal (position, id) in sorted order
        first[1:] = (key_owner[1:] != key_owner[:-1]) | (key_id[1:] != key_id[:-1])
        if not first.all():
            group_start = np.flatnonzero(first)
            group_end = np.append(group_start[1:], E) - 1
            source = np.empty(E, dtype=np.int64)
            source[order[group_start]] = order[group_end]  # first occurrence -> last occurrence
            keep = np.zeros(E, dtype=bool)
            keep[order[group_start]] = True
            kept = np.flatnonzero(keep)  # first occurrences in entry (dict) order
            ids, logp, rank = ids[kept], logp[source[kept]], rank[source[kept]]
            counts = np.bincount(owner[kept], minlength=L)
    return ids, logp, rank, np.cumsum(counts) - counts, counts
