"""`rollout_batch_from_outputs` on real vLLM 0.25.1 output objects (`vllm.outputs.RequestOutput`,
`CompletionOutput`, `vllm.logprobs.Logprob` dicts or `FlatLogprobs`), their log-probs recorded by
vLLM's own `LogprobsProcessor` from sampler rows (see `engine_stub.py`)."""

import math

import pytest

vllm = pytest.importorskip("vllm")

import torch  # noqa: E402
from vllm.logprobs import FlatLogprobs, Logprob  # noqa: E402

from llm.rollout import vllm_convert  # noqa: E402
from llm.rollout.vllm_engine import rollout_batch_from_outputs  # noqa: E402
from tests.llm.reference_convert import reference_rollout_batch_from_outputs  # noqa: E402
from tests.vllm_api.engine_stub import completion, processed_logprobs, request_output  # noqa: E402

VOCAB, N = 40, 3


def rows_for(tokens, seed, top_p=1.0):
    """Per position `(logprobs, token)`: random processed log-probs over VOCAB with `token` drawn
    by the caller (any id, also one outside the top N or one top-p removed)."""
    rng = torch.Generator().manual_seed(seed)
    return [
        (processed_logprobs(torch.randn(VOCAB, generator=rng) * 3, 1.0, top_p), t) for t in tokens
    ]


def build(tok, responses, top_n, flat=False, top_p=1.0):
    """Real RequestOutputs for `responses[b][g]` (token lists), completions in reverse index order
    (the conversion orders by `CompletionOutput.index`); returns (outputs, prompt ids, rows)."""
    prompts = ["nums 5 target 5 :", "nums 3 4 target 7 :"][: len(responses)]
    prompt_ids = [list(ids) for ids in tok(prompts)["input_ids"]]
    outputs, rows = [], {}
    for b, group in enumerate(responses):
        outs = []
        for g, tokens in enumerate(group):
            params = vllm.SamplingParams(
                n=1,
                max_tokens=len(tokens),
                logprobs=top_n,
                stop_token_ids=[tok.eos_token_id],
                detokenize=False,
                flat_logprobs=flat,
            )
            rows[b, g] = rows_for(tokens, 100 * b + g, top_p)
            out, _ = completion(f"{b}-{g}", g, prompt_ids[b], params, VOCAB, rows[b, g])
            assert isinstance(out.logprobs, FlatLogprobs if flat else list)
            outs.append(out)
        outputs.append(request_output(str(b), prompt_ids[b], outs[::-1]))
    return prompts, prompt_ids, outputs, rows


def convert(tok, prompts, prompt_ids, outputs, group_size, top_n):
    return rollout_batch_from_outputs(
        prompts, prompt_ids, outputs, group_size, top_n, tok.pad_token_id, tok.eos_token_id, tok
    )


@pytest.mark.parametrize("flat", [False, True])
def test_conversion_of_real_outputs(tok, flat):
    eos = tok.eos_token_id
    responses = [
        [[10, 11, 12, eos], [13, 14]],  # stopped at EOS / cut by max_tokens
        [[15, eos], [16, 17, 18, 19, 20]],
    ]
    prompts, prompt_ids, outputs, rows = build(tok, responses, N, flat)
    batch = convert(tok, prompts, prompt_ids, outputs, 2, N)

    T = max(len(r) for group in responses for r in group)
    assert batch.response_ids.shape == (2, 2, T) and batch.cand_ids.shape == (2, 2, T, N)
    P = max(len(p) for p in prompt_ids)
    for b, ids in enumerate(prompt_ids):  # left-padded prompts
        assert batch.prompt_ids[b, P - len(ids) :].tolist() == ids
        assert batch.prompt_mask[b].sum() == len(ids)
    for b, group in enumerate(responses):
        for g, tokens in enumerate(group):
            L = len(tokens)
            assert batch.response_ids[b, g, :L].tolist() == tokens
            assert (batch.response_ids[b, g, L:] == tok.pad_token_id).all()
            assert batch.response_mask[b, g].tolist() == [1.0] * L + [0.0] * (T - L)
            for t, (logprobs, token) in enumerate(rows[b, g]):
                assert math.isclose(batch.logp[b, g, t], logprobs[token], abs_tol=1e-6)
                top = torch.topk(logprobs, N)
                assert batch.cand_ids[b, g, t].tolist() == top.indices.tolist()
                assert torch.allclose(batch.cand_logp[b, g, t], top.values, atol=1e-6)
            assert (batch.logp[b, g, L:] == 0).all() and (batch.cand_logp[b, g, L:] == 0).all()
            assert batch.texts[b][g] == tok.decode(tokens, skip_special_tokens=True)
    assert batch.entropy is None


def single(tok, rows, top_n, flat=False):
    """One prompt, one real completion over `rows`; returns (prompts, prompt ids, outputs, out)."""
    prompts = ["nums 5 target 5 :"]
    prompt_ids = [list(tok(prompts)["input_ids"][0])]
    params = vllm.SamplingParams(
        n=1, max_tokens=len(rows), logprobs=top_n, detokenize=False, flat_logprobs=flat
    )
    out, _ = completion("0-0", 0, prompt_ids[0], params, VOCAB, rows)
    return prompts, prompt_ids, [request_output("0", prompt_ids[0], [out])], out


def test_sampled_token_outside_and_inside_top_n(tok):
    """vLLM's dict holds N + 1 entries when the sampled token is outside the top N (its own rank
    first), N when inside; the candidates are the top N either way."""
    ((logprobs, _),) = rows_for([0], seed=1)
    order = torch.argsort(logprobs, descending=True).tolist()
    inside, outside = order[1], order[-1]
    prompts, prompt_ids, outputs, out = single(tok, [(logprobs, inside), (logprobs, outside)], N)
    assert [len(d) for d in out.logprobs] == [N, N + 1]
    assert all(isinstance(lp, Logprob) for d in out.logprobs for lp in d.values())
    assert out.logprobs[1][outside].rank == VOCAB  # the last of the vocabulary
    assert out.logprobs[0][inside].rank == 2
    batch = convert(tok, prompts, prompt_ids, outputs, 1, N)
    assert batch.response_ids[0, 0].tolist() == [inside, outside]
    assert batch.cand_ids[0, 0, 0].tolist() == order[:N] == batch.cand_ids[0, 0, 1].tolist()
    assert math.isclose(batch.logp[0, 0, 1], logprobs[outside], abs_tol=1e-6)


def test_top_p_removed_candidates_are_minus_inf(tok):
    # With top-p 0.05 only the top token survives (probability 1): it is the sampled one.
    rows = [(lp, int(lp.argmax())) for lp, _ in rows_for([0, 0, 0], seed=2, top_p=0.05)]
    prompts, prompt_ids, outputs, _ = single(tok, rows, N)
    batch = convert(tok, prompts, prompt_ids, outputs, 1, N)
    assert batch.logp[0, 0].abs().max() < 1e-6
    assert torch.isinf(batch.cand_logp[0, 0, :, 1:]).all()


def test_no_candidates(tok):
    """`logprobs=0`: each position's dict holds the sampled token only."""
    prompts, prompt_ids, outputs, rows = build(tok, [[[3, 4], [5]]], 0)
    assert all(len(d) == 1 for out in outputs[0].outputs for d in out.logprobs)
    batch = convert(tok, prompts, prompt_ids, outputs, 2, 0)
    assert batch.cand_ids is None and batch.cand_logp is None
    assert batch.response_ids[0, :, :2].tolist() == [[3, 4], [5, tok.pad_token_id]]
    for g in range(2):
        for t, (logprobs, token) in enumerate(rows[0, g]):
            assert math.isclose(batch.logp[0, g, t], logprobs[token], abs_tol=1e-6)


def test_sampled_token_repeated_in_flat_logprobs(tok):
    """`FlatLogprobs` keeps the sampled token twice when it is inside the top N (vLLM's
    `append_fast`: sampled first, then the top N), N + 1 entries at every position; the flat
    fast path reads it like the position's dict."""
    ((logprobs, _),) = rows_for([0], seed=1)
    order = torch.argsort(logprobs, descending=True).tolist()
    inside, outside = order[1], order[-1]
    rows = [(logprobs, inside), (logprobs, outside)]
    prompts, prompt_ids, outputs, out = single(tok, rows, N, flat=True)
    assert isinstance(out.logprobs, FlatLogprobs)
    assert out.logprobs.token_ids[: N + 1] == [inside, *order[:N]]  # inside: twice
    assert out.logprobs.ranks[: N + 1] == [2, *range(1, N + 1)]
    assert out.logprobs.end_indices == [N + 1, 2 * (N + 1)]
    assert out.logprobs.ranks[N + 1] == VOCAB
    batch = convert(tok, prompts, prompt_ids, outputs, 1, N)
    assert batch.response_ids[0, 0].tolist() == [inside, outside]
    assert batch.cand_ids[0, 0, 0].tolist() == order[:N] == batch.cand_ids[0, 0, 1].tolist()
    assert math.isclose(batch.logp[0, 0, 0], logprobs[inside], abs_tol=1e-6)
    assert math.isclose(batch.logp[0, 0, 1], logprobs[outside], abs_tol=1e-6)


@pytest.mark.parametrize("top_n", [0, 1, N])
def test_flat_fast_path_equals_the_reference(tok, top_n, monkeypatch):
    """Real `FlatLogprobs` (vLLM's `LogprobsProcessor`), sampled tokens inside and outside the top
    N and top-p removed candidates: the fast path, which reads the flat lists only (no position
    dict, no dict-entry pass), equals the per-token reference reading `flat[t]` dicts."""
    eos = tok.eos_token_id
    responses = [[[10, 11, 12, eos], [13, 14]], [[15, eos], [16, 17, 18, 19, 20]]]
    prompts, prompt_ids, outputs, rows = build(tok, responses, top_n, flat=True, top_p=0.9)
    # Sampled tokens drawn among the 6 most likely (inside and outside the top N).
    for b, group in enumerate(responses):
        for g, tokens in enumerate(group):
            for t in range(len(tokens) - (tokens[-1] == eos)):
                lp = rows[b, g][t][0]
                tokens[t] = int(torch.argsort(lp, descending=True)[(b + g + t) % 6])
    prompts, prompt_ids, outputs, rows = build(tok, responses, top_n, flat=True, top_p=0.9)
    ref = reference_rollout_batch_from_outputs(
        prompts, prompt_ids, outputs, 2, top_n, tok.pad_token_id, eos, tok
    )

    def fail(*_, **__):
        raise AssertionError("read a position as a dict")

    monkeypatch.setattr(FlatLogprobs, "__getitem__", fail)
    monkeypatch.setattr(FlatLogprobs, "__iter__", fail)
    monkeypatch.setattr(vllm_convert, "_flat_entries", fail)
    batch = convert(tok, prompts, prompt_ids, outputs, 2, top_n)
    for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logp"):
        assert torch.equal(getattr(batch, k), getattr(ref, k)), k
    for k in ("cand_ids", "cand_logp"):
        x, y = getattr(batch, k), getattr(ref, k)
        assert (x is None and y is None) if top_n == 0 else torch.equal(x, y), k
    assert batch.texts == ref.texts
