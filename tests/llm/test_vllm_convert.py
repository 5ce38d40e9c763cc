"""The vectorized vLLM output conversion equals the per-token reference it replaced
(`tests/llm/reference_convert.py`) on random stand-in outputs, edge cases included, and the
benchmark runs (issue 12 item 6)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest
import torch

from llm.rollout import RolloutBatch
from llm.tiny import build_tokenizer
from llm.vllm_backend import rollout_batch_from_outputs
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
    assert "old" in out and "new" in out and "us/token" in out and "equal outputs" in out
