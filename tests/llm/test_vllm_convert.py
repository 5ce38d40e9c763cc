"""The vectorized vLLM output conversion equals the per-token reference it replaced
(`tests/llm/reference_convert.py`) on random stand-in outputs, edge cases included, and the
benchmark runs (issue 12 item 6)."""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field

import pytest
import torch

from bench.bench_vllm_convert import FlatLogprobs
from llm.model.tiny import build_tokenizer
from llm.rollout import vllm_convert
from llm.rollout.base import RolloutBatch
from llm.rollout.vllm_engine import rollout_batch_from_outputs
from tests.llm.reference_convert import reference_rollout_batch_from_outputs


@dataclass
class Logprob:  # vllm/logprobs.py
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm/outputs.py
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None


@dataclass
class RequestOutput:  # vllm/outputs.py
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(30)


def random_position(rng: random.Random, token: int, vocab: int, n: int, odd: bool) -> dict:
    """vLLM's dict (sampled token first with its rank, top n with ranks 1..n, a sampled token in
    the top n overwritten in place), or with `odd` any order, tied or missing ranks and extra
    entries, which the conversion must order exactly like the reference's stable sort."""
    lp = lambda: -rng.expovariate(1.0) if rng.random() > 0.05 else -math.inf  # noqa: E731
    if not odd:
        rank = rng.choice([1, 1, 2, 3, n + 1, vocab // 2]) if n else rng.randint(1, vocab)
        d = {token: Logprob(lp(), rank)}
        others = rng.sample([i for i in range(vocab) if i != token], n)
        if 1 <= rank <= n:
            others[rank - 1] = token
        for r, c in enumerate(others, start=1):
            d[c] = Logprob(lp(), r)
        return d
    ids = rng.sample([i for i in range(vocab) if i != token], rng.randint(n, n + 3))
    ids.insert(rng.randint(0, len(ids)), token)
    return {i: Logprob(lp(), rng.choice([None, 1, 1, 2, 3, 7])) for i in ids}


def random_outputs(rng, B, G, n, vocab, eos, max_len, odd=False):
    prompt_ids, outputs = [], []
    for _ in range(B):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 6))]
        comps = []
        for g in range(G):
            kind = rng.choice(["empty", "full", "eos", "eos_mid", "short"])
            length = {"empty": 0, "full": max_len}.get(kind, rng.randint(1, max_len))
            tokens = [rng.choice([i for i in range(vocab) if i != eos]) for _ in range(length)]
            if kind == "eos" and tokens:
                tokens[-1] = eos
            if kind == "eos_mid" and len(tokens) > 2:
                tokens[len(tokens) // 2] = eos  # runs on past EOS: cut there
            lps = [random_position(rng, t, vocab, n, odd) for t in tokens]
            lps += [random_position(rng, 0, vocab, n, odd)] * rng.randint(0, 2)  # longer is fine
            comps.append(CompletionOutput(g, tokens, lps))
        rng.shuffle(comps)
        prompt_ids.append(ids)
        outputs.append(RequestOutput(ids, comps))
    return prompt_ids, outputs


def assert_batches_equal(a: RolloutBatch, b: RolloutBatch) -> None:
    assert a.prompts == b.prompts and a.texts == b.texts and a.entropy is b.entropy is None
    for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logp"):
        x, y = getattr(a, k), getattr(b, k)
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert torch.equal(x, y), k
    for k in ("cand_ids", "cand_logp"):
        x, y = getattr(a, k), getattr(b, k)
        assert (x is None) == (y is None), k
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), k


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [0, 1, 3])
def test_equals_reference_on_random_outputs(tok, seed, n):
    rng = random.Random(seed * 10 + n)
    V, eos, pad = len(tok), tok.eos_token_id, tok.pad_token_id
    B, G = rng.randint(1, 4), rng.randint(1, 4)
    prompt_ids, outputs = random_outputs(rng, B, G, n, V, eos, max_len=12, odd=seed % 2 == 1)
    args = ([f"p{b}" for b in range(B)], prompt_ids, outputs, G, n, pad, eos, tok)
    assert_batches_equal(
        rollout_batch_from_outputs(*args), reference_rollout_batch_from_outputs(*args)
    )


def test_all_empty_and_all_at_max_length(tok):
    V, eos, pad = len(tok), tok.eos_token_id, tok.pad_token_id
    rng = random.Random(0)
    empty = [RequestOutput([1], [CompletionOutput(g, [], []) for g in range(3)]) for _ in range(2)]
    args = (["a", "b"], [[1], [1]], empty, 3, 2, pad, eos, tok)
    fast = rollout_batch_from_outputs(*args)
    assert fast.response_ids.shape == (2, 3, 0) and fast.cand_ids.shape == (2, 3, 0, 2)
    assert_batches_equal(fast, reference_rollout_batch_from_outputs(*args))
    full = []
    for _ in range(2):
        comps = []
        for g in range(3):
            tokens = [rng.choice([i for i in range(V) if i != eos]) for _ in range(8)]
            comps.append(
                CompletionOutput(g, tokens, [random_position(rng, t, V, 2, False) for t in tokens])
            )
        full.append(RequestOutput([1], comps))
    args = (["a", "b"], [[1], [1]], full, 3, 2, pad, eos, tok)
    fast = rollout_batch_from_outputs(*args)
    assert fast.response_mask.eq(1).all() and fast.response_ids.shape == (2, 3, 8)
    assert_batches_equal(fast, reference_rollout_batch_from_outputs(*args))


@pytest.mark.parametrize("case", ["few_candidates", "sampled_missing", "no_logprobs", "short"])
def test_errors_like_the_reference(tok, case):
    eos = tok.eos_token_id
    d = {7: Logprob(-0.1, 1), 8: Logprob(-2.0, 2)}
    comp = CompletionOutput(0, [7, 8], [d, {8: Logprob(-0.3, 1), 7: Logprob(-1.5, 2)}])
    top_n = 2
    if case == "few_candidates":  # a position with fewer than top_n entries
        comp.logprobs[1] = {8: Logprob(-0.3, 1)}
    elif case == "sampled_missing":
        comp.token_ids = [7, 9]
    elif case == "no_logprobs":
        comp.logprobs = None
    elif case == "short":
        comp.logprobs = comp.logprobs[:1]
    args = (["x"], [[1]], [RequestOutput([1], [comp])], 1, top_n, 0, eos, tok)
    with pytest.raises(ValueError) as ref_err:
        reference_rollout_batch_from_outputs(*args)
    with pytest.raises(ValueError) as err:
        rollout_batch_from_outputs(*args)
    assert str(err.value) == str(ref_err.value)


def test_several_stop_ids_cut_at_the_first(tok):
    eos, pad = tok.eos_token_id, tok.pad_token_id
    other = tok.convert_tokens_to_ids("+")
    tokens = [5, 6, other, 7, eos, 8]
    lps = [{t: Logprob(-0.5 * i, 1)} for i, t in enumerate(tokens)]
    outputs = [RequestOutput([1], [CompletionOutput(0, tokens, lps)])]
    one = rollout_batch_from_outputs(["x"], [[1]], outputs, 1, 0, pad, eos, tok)
    assert one.response_mask[0, 0].tolist() == [1.0] * 5
    both = rollout_batch_from_outputs(["x"], [[1]], outputs, 1, 0, pad, [eos, other], tok)
    assert both.response_ids[0, 0].tolist() == [5, 6, other]
    assert both.logp[0, 0].tolist() == [0.0, -0.5, -1.0]


def test_texts_only(tok):
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rng = random.Random(3)
    prompt_ids, outputs = random_outputs(rng, 2, 3, 0, len(tok), eos, max_len=6)
    ref = reference_rollout_batch_from_outputs(["a", "b"], prompt_ids, outputs, 3, 0, pad, eos, tok)
    for r in outputs:
        for c in r.outputs:
            c.logprobs = None  # vLLM with logprobs=None
    fast = rollout_batch_from_outputs(
        ["a", "b"], prompt_ids, outputs, 3, 0, pad, eos, tok, want_logprobs=False
    )
    assert fast.texts == ref.texts and torch.equal(fast.response_ids, ref.response_ids)
    assert torch.equal(fast.response_mask, ref.response_mask)
    assert fast.logp[fast.response_mask.bool()].isnan().all()
    assert fast.logp[~fast.response_mask.bool()].eq(0).all()
    with pytest.raises(ValueError, match="top_n"):
        rollout_batch_from_outputs(
            ["a", "b"], prompt_ids, outputs, 3, 2, pad, eos, tok, want_logprobs=False
        )


def test_bench_runs_and_prints_the_ratio(capsys):
    from bench.bench_vllm_convert import main

    assert main(["--prompts", "2", "--group", "2", "--min-tokens", "5", "--max-tokens", "20",
                 "--repeats", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "old" in out and "new-dict" in out and "new-flat" in out and "us/token" in out
    assert "equal outputs" in out


# --------------------------------------------------------------------------------------------------
# vLLM's FlatLogprobs (`SamplingParams(flat_logprobs=True)`): the stand-in of the benchmark, with
# vLLM 0.25.1's field names; the reference reads it through `flat[t]`, the position's dict.


def flat_position(rng: random.Random, token: int, d: dict, vocab: int, n: int, layout: str):
    """One position's flat entries `(ids, logprobs, ranks)` in `layout`: "dicts" (the dict `d` as
    `FlatLogprobs.append` writes it), "vllm" (`append_fast`: the sampled token first with its rank,
    then the top n with ranks 1..n, the sampled token repeated there when inside), "grid" (n + 2
    entries with one repeated id, tied and missing ranks) or "odd" (`d` with repeats inserted)."""
    lp = lambda: -rng.expovariate(1.0) if rng.random() > 0.05 else -math.inf  # noqa: E731
    if layout == "dicts":
        return list(d), [v.logprob for v in d.values()], [v.rank for v in d.values()]
    if layout == "vllm":
        rank = rng.choice([1, 1, 2, 3, n + 1, vocab // 2]) if n else rng.randint(1, vocab)
        others = rng.sample([i for i in range(vocab) if i != token], n)
        if 1 <= rank <= n:
            others[rank - 1] = token
        return [token, *others], [lp() for _ in range(n + 1)], [rank, *range(1, n + 1)]
    if layout == "grid":
        ids = [token, *rng.sample([i for i in range(vocab) if i != token], n)]
        rng.shuffle(ids)
        ids.insert(rng.randint(0, len(ids)), rng.choice(ids))
        return ids, [lp() for _ in ids], [rng.choice([None, 1, 1, 2, 3, 7]) for _ in ids]
    entries = [(i, v.logprob, v.rank) for i, v in d.items()]
    for _ in range(rng.randint(0, 3)):
        i = rng.choice(entries)[0]
        entries.insert(rng.randint(0, len(entries)), (i, lp(), rng.choice([None, 1, 2, 9])))
    return [e[0] for e in entries], [e[1] for e in entries], [e[2] for e in entries]


def to_flat(rng: random.Random, outputs, vocab: int, n: int, layout: str, gaps: bool = False):
    """`outputs` (dict log-probs) with each completion's log-probs as a `FlatLogprobs` of as many
    positions; with `gaps`, unread entries between positions and before the first."""
    for request in outputs:
        for c in request.outputs:
            flat = FlatLogprobs()
            for t, d in enumerate(c.logprobs):
                token = c.token_ids[t] if t < len(c.token_ids) else next(iter(d))
                ids, lps, ranks = flat_position(rng, token, d, vocab, n, layout)
                if gaps and rng.random() < 0.3:  # entries no position points at
                    flat.append_fast([1, 2], [-1.0, -2.0], [1, 2], [None, None])
                    flat.start_indices.pop(), flat.end_indices.pop()
                flat.append_fast(ids, lps, ranks, [None] * len(ids))
            c.logprobs = flat
    return outputs


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [0, 1, 3])
@pytest.mark.parametrize("layout", ["vllm", "dicts", "grid", "odd"])
def test_flat_equals_reference_on_random_outputs(tok, seed, n, layout):
    rng = random.Random(seed * 100 + n * 10 + len(layout))
    V, eos, pad = len(tok), tok.eos_token_id, tok.pad_token_id
    B, G = rng.randint(1, 4), rng.randint(1, 4)
    prompt_ids, outputs = random_outputs(rng, B, G, n, V, eos, max_len=12, odd=layout == "odd")
    to_flat(rng, outputs, V, n, layout, gaps=seed % 2 == 1)
    assert all(isinstance(c.logprobs, FlatLogprobs) for r in outputs for c in r.outputs)
    args = ([f"p{b}" for b in range(B)], prompt_ids, outputs, G, n, pad, eos, tok)
    assert_batches_equal(
        rollout_batch_from_outputs(*args), reference_rollout_batch_from_outputs(*args)
    )


def test_flat_reads_no_position_dicts(tok, monkeypatch):
    """The fast path reads the flat lists only: no `flat[t]` (dict) and no dict-entry pass."""
    rng = random.Random(5)
    V, eos, pad = len(tok), tok.eos_token_id, tok.pad_token_id
    prompt_ids, outputs = random_outputs(rng, 3, 4, 3, V, eos, max_len=12)
    to_flat(rng, outputs, V, 3, "vllm")
    args = (["a", "b", "c"], prompt_ids, outputs, 4, 3, pad, eos, tok)
    ref = reference_rollout_batch_from_outputs(*args)

    def fail(*_, **__):
        raise AssertionError("read a position as a dict")

    monkeypatch.setattr(FlatLogprobs, "__getitem__", fail)
    monkeypatch.setattr(FlatLogprobs, "__iter__", fail)
    monkeypatch.setattr(vllm_convert, "_flat_entries", fail)
    assert_batches_equal(rollout_batch_from_outputs(*args), ref)


def test_flat_and_dicts_mixed(tok):
    rng = random.Random(6)
    V, eos, pad = len(tok), tok.eos_token_id, tok.pad_token_id
    prompt_ids, outputs = random_outputs(rng, 2, 3, 2, V, eos, max_len=10)
    flat = to_flat(random.Random(7), copy.deepcopy(outputs), V, 2, "dicts")
    outputs[1] = flat[1]  # prompt 0 with dicts, prompt 1 with FlatLogprobs
    args = (["a", "b"], prompt_ids, outputs, 3, 2, pad, eos, tok)
    assert_batches_equal(
        rollout_batch_from_outputs(*args), reference_rollout_batch_from_outputs(*args)
    )


@pytest.mark.parametrize("layout", ["vllm", "odd"])
@pytest.mark.parametrize("case", ["few_candidates", "sampled_missing"])
def test_flat_errors_like_the_reference(tok, layout, case):
    eos, top_n = tok.eos_token_id, 2
    flat = FlatLogprobs()
    for token, others in [(7, [7, 8]), (8, [8, 7]), (9, [3, 9])]:  # vLLM's layout, width 3
        flat.append_fast([token, *others], [-0.5, -0.1, -2.0], [1, 1, 2], [None] * 3)
    tokens = [7, 8, 9]
    if case == "sampled_missing":
        tokens[1] = 5
    elif layout == "vllm":  # width 3 everywhere, two distinct ids at position 2
        flat.token_ids[-3:] = [9, 9, 9]
    else:  # fewer entries at position 2
        flat.end_indices[-1] -= 2
    if layout == "odd":
        flat.start_indices[0] += 1  # a gap before the first position: no longer a grid
        flat.token_ids[0] = flat.token_ids[1]
    comp = CompletionOutput(0, tokens, flat)
    args = (["x"], [[1]], [RequestOutput([1], [comp])], 1, top_n, 0, eos, tok)
    with pytest.raises(ValueError) as ref_err:
        reference_rollout_batch_from_outputs(*args)
    with pytest.raises(ValueError) as err:
        rollout_batch_from_outputs(*args)
    assert str(err.value) == str(ref_err.value)
