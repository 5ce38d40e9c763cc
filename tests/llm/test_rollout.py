"""The transformers `generate` rollout backend against a one-pass forward reference."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from llm.model.tiny import TinyConfig, build_tiny_model, build_tokenizer, tiny_problems
from llm.rollout.base import RolloutBackend, RolloutBatch, response_mask_from_eos
from llm.rollout.hf import HFGenerateBackend, sequence_logp
from llm.tasks import make_prompt
from tests.tolerance import assert_close

B, G, MAX_NEW = 3, 4, 10


@pytest.fixture(scope="module")
def backend():
    tok = build_tokenizer(100)
    model = build_tiny_model(
        tok,
        seed=0,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    )
    # Raise EOS so that some responses end early and others run to max_new_tokens.
    with torch.no_grad():
        model.model.embed_tokens.weight[tok.eos_token_id] *= 30.0
    return HFGenerateBackend(model.eval(), tok)


@pytest.fixture(scope="module")
def prompts():
    # Different lengths, so that left padding is exercised.
    problems = tiny_problems(TinyConfig(), "heldout", 2)
    return [
        make_prompt(problems[0], "compact"),
        "nums 5 target 5 :",
        make_prompt(problems[1], "compact"),
    ]


def sample(backend, prompts, seed=0, **kw):
    kw.setdefault("max_new_tokens", MAX_NEW)
    return backend.generate(prompts, G, generator=torch.Generator().manual_seed(seed), **kw)


def test_shapes_masks_and_texts(backend, prompts):
    assert isinstance(backend, RolloutBackend)
    batch = sample(backend, prompts, top_n=5, want_entropy=True)
    assert isinstance(batch, RolloutBatch) and batch.group_size == G
    P = batch.prompt_ids.shape[1]
    T = batch.response_ids.shape[2]
    assert batch.prompt_mask.shape == (B, P) and T <= MAX_NEW
    for x in (batch.response_ids, batch.response_mask, batch.logp, batch.entropy):
        assert x.shape == (B, G, T)
    assert batch.cand_ids.shape == batch.cand_logp.shape == (B, G, T, 5)
    assert batch.prompt_mask[1, 0] == 0 and batch.prompt_mask[:, -1].all()  # left padded
    tok = backend.tokenizer
    eos, pad = tok.eos_token_id, tok.pad_token_id
    lengths = batch.response_mask.sum(-1).long()
    assert (lengths > 0).all()
    ended = truncated = 0
    for b in range(B):
        for g in range(G):
            n = int(lengths[b, g])
            ids, mask = batch.response_ids[b, g], batch.response_mask[b, g]
            assert mask[:n].all() and not mask[n:].any()  # ones, then zeros
            assert (ids[n:] == pad).all() and eos not in ids[: n - 1].tolist()
            ended += int(ids[n - 1] == eos)
            truncated += int(n == MAX_NEW and ids[n - 1] != eos)
            assert batch.texts[b][g] == tok.decode(ids[:n], skip_special_tokens=True)
            assert (batch.logp[b, g, :n] < 0).all() and (batch.logp[b, g, n:] == 0).all()
    assert ended and truncated  # both ways of ending are covered
    assert (batch.entropy * (1 - batch.response_mask) == 0).all()
    assert (batch.cand_logp[..., :-1] >= batch.cand_logp[..., 1:]).all()  # rank 1 first
    # The sampled token is never more likely than the top candidate.
    assert (batch.logp <= batch.cand_logp[..., 0] + 1e-6).all()


def _tol(model, batch) -> dict:
    """KV-cached decoding vs one forward pass: fp32 reductions over the positions (attention),
    the hidden and MLP widths per layer, then the vocabulary (tests/tolerance.py)."""
    c = model.config
    positions = batch.prompt_ids.shape[-1] + batch.response_ids.shape[-1]
    n = c.num_hidden_layers * (positions + c.hidden_size + c.intermediate_size) + c.vocab_size
    return {"dtype": "float32", "n": n}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logp_equals_a_forward_pass(backend, prompts, temperature):
    batch = sample(backend, prompts, top_n=3, want_entropy=True, temperature=temperature)
    with torch.no_grad():
        ref = sequence_logp(
            backend.model,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.response_ids,
            batch.response_mask,
            temperature=temperature,
        )
        logprobs = _forward_logprobs(backend.model, batch, temperature)  # (B, G, T, V)
    tol = _tol(backend.model, batch)
    assert_close(batch.logp, ref, **tol)
    mask = batch.response_mask.bool()
    top = logprobs.topk(3, dim=-1)
    assert_close(batch.cand_logp[mask], top.values[mask], **tol)
    ent = -(logprobs.exp() * logprobs).sum(-1)
    assert_close(batch.entropy[mask], ent[mask], **tol)


def test_top_p_logp_is_the_renormalized_nucleus(backend, prompts):
    top_p = 0.6
    batch = sample(backend, prompts, top_p=top_p, top_n=8, want_entropy=True)
    with torch.no_grad():
        logprobs = _forward_logprobs(backend.model, batch, 1.0)
    mask = batch.response_mask.bool()
    for b, g, t in mask.nonzero().tolist():  # slow per-token reference of transformers' TopP
        lp = logprobs[b, g, t]
        order = lp.argsort()  # ascending, as TopPLogitsWarper sorts
        removed = lp[order].exp().cumsum(0) <= 1 - top_p
        removed[-1] = False
        keep = torch.ones_like(lp, dtype=torch.bool)
        keep[order[removed]] = False
        nucleus = torch.where(keep, lp, -torch.inf).log_softmax(0)
        tok = batch.response_ids[b, g, t]
        assert keep[tok]
        assert_close(batch.logp[b, g, t], nucleus[tok], **_tol(backend.model, batch))
        p = nucleus.exp()
        ent = -(p[keep] * nucleus[keep]).sum()
        assert_close(batch.entropy[b, g, t], ent, **_tol(backend.model, batch))
        n_keep = int(keep.sum())
        assert torch.isfinite(batch.cand_logp[b, g, t, : min(n_keep, 8)]).all()
        assert (batch.cand_logp[b, g, t, n_keep:] == -torch.inf).all()


def test_seeded_sampling_is_deterministic_and_leaves_the_global_rng(backend, prompts):
    state = torch.get_rng_state()
    a = sample(backend, prompts, seed=7, top_n=2)
    assert torch.equal(torch.get_rng_state(), state)
    b = sample(backend, prompts, seed=7, top_n=2)
    c = sample(backend, prompts, seed=8, top_n=2)
    assert a.texts == b.texts and torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.logp, b.logp) and torch.equal(a.cand_ids, b.cand_ids)
    assert a.texts != c.texts
    assert a.cand_ids is not None and a.entropy is None
    plain = backend.generate(prompts, 1, max_new_tokens=4)
    assert (
        plain.cand_ids is None
        and plain.cand_logp is None
        and plain.response_ids.shape[:2] == (B, 1)
    )


def test_generate_keeps_training_mode_and_validates(backend, prompts):
    backend.model.train()
    sample(backend, prompts[:1])
    assert backend.model.training
    backend.model.eval()
    backend.sync_weights(backend.model)
    for kw, name in [
        ({"temperature": 0.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_n": 10_000}, "top_n"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ]:
        with pytest.raises(ValueError, match=name):
            sample(backend, prompts, **kw)
    with pytest.raises(ValueError, match="group_size"):
        backend.generate(prompts, 0, max_new_tokens=3)


def test_response_mask_from_eos_includes_the_first_eos():
    ids = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 2, 2, 2], [5, 2, 6, 2]])
    expected = [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    assert response_mask_from_eos(ids, 2).long().tolist() == expected


def _forward_logprobs(model, batch, temperature):
    """(B, G, T, V) temperature-scaled log-softmax of one forward pass on prompt + response."""
    Bn, Gn, T = batch.response_ids.shape
    p_ids = batch.prompt_ids.repeat_interleave(Gn, dim=0)
    p_mask = batch.prompt_mask.long().repeat_interleave(Gn, dim=0)
    ids = torch.cat([p_ids, batch.response_ids.reshape(Bn * Gn, T)], dim=1)
    attn = torch.cat([p_mask, torch.ones(Bn * Gn, T, dtype=torch.long)], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    P = p_ids.shape[1]
    return (logits[:, P - 1 : -1] / temperature).log_softmax(-1).reshape(Bn, Gn, T, -1)


def test_texts_only_skips_the_scores(backend, prompts):
    full = sample(backend, prompts, seed=4)
    texts = sample(backend, prompts, seed=4, want_logprobs=False)
    assert texts.texts == full.texts and torch.equal(texts.response_ids, full.response_ids)
    assert torch.equal(texts.response_mask, full.response_mask)
    assert texts.logp[texts.response_mask.bool()].isnan().all()
    assert texts.logp[~texts.response_mask.bool()].eq(0).all()
    with pytest.raises(ValueError, match="want_logprobs"):
        sample(backend, prompts, top_n=2, want_logprobs=False)


def test_response_mask_from_several_stop_ids():
    ids = torch.tensor([[5, 7, 2, 9], [7, 5, 5, 5], [1, 1, 1, 1]])
    assert response_mask_from_eos(ids, [2, 7]).tolist() == [
        [True, True, False, False],
        [True, False, False, False],
        [True] * 4,
    ]
    assert torch.equal(response_mask_from_eos(ids, 2), response_mask_from_eos(ids, [2]))


def test_stop_ids_from_the_generation_config(tmp_path, prompts):
    """Both backends stop on the tokenizer's EOS and generation_config.json's EOS ids: a response
    sampled with the extra id ends at its first occurrence, exactly where the same draw cut by
    `response_mask_from_eos` ends."""
    from transformers import GenerationConfig

    from llm.model.load import load_model_and_tokenizer
    from llm.rollout.base import stop_token_ids
    from tests.llm.conftest import save_random_tiny_model

    path = save_random_tiny_model(tmp_path / "tiny", max_number=100)
    model, tok = load_model_and_tokenizer(path, "cpu")
    eos = tok.eos_token_id
    assert stop_token_ids(tok, path) == [eos]  # save_pretrained wrote the tokenizer's EOS
    plain = HFGenerateBackend(model, tok)
    assert plain.stop_token_ids == [eos]
    ref = sample(plain, prompts, seed=1)
    # An id the plain draw samples before its end: a stop id now.
    ids, mask = ref.response_ids.flatten(0, 1), ref.response_mask.flatten(0, 1).bool()
    inner = ids[:, :-1][mask[:, 1:]]
    extra = int(inner[inner != eos].mode().values)
    GenerationConfig(eos_token_id=[eos, extra], pad_token_id=tok.pad_token_id).save_pretrained(path)
    assert stop_token_ids(tok, path) == [eos, extra]
    GenerationConfig(eos_token_id=extra).save_pretrained(path)  # an int works too
    assert stop_token_ids(tok, path) == [eos, extra]

    model, tok = load_model_and_tokenizer(path, "cpu")
    stopping = HFGenerateBackend(model, tok)
    assert stopping.stop_token_ids == [eos, extra]
    got = sample(stopping, prompts, seed=1)
    # The same draws (one multinomial per step for every row), cut at the first stop id.
    cut = response_mask_from_eos(ref.response_ids, [eos, extra]) & ref.response_mask.bool()
    T = got.response_ids.shape[-1]
    assert not cut[..., T:].any()
    assert torch.equal(got.response_mask.bool(), cut[..., :T])
    assert torch.equal(got.response_ids, ref.response_ids[..., :T].masked_fill(~cut[..., :T], 0))
    ended = got.response_ids[got.response_mask.bool()]
    assert (ended == extra).any()
