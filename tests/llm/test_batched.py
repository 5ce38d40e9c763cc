"""Batched runs (issue 22): the stacked forward equals the transformers forward of each run, the
stacked sampler draws each run's tokens from its own generator, the stacked update equals each
run's own `update_policy`, and runs trained in a batch equal the same runs trained alone."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import shaping
from llm.eval.heldout import evaluate_models
from llm.model import stacked as stacked_model
from llm.model.forward import build_rows, policy_forward
from llm.model.load import load_tokenizer
from llm.model.stacked import StackedLM, check_stackable, stacked_policy_forward
from llm.model.tiny import build_tiny_model, build_tokenizer
from llm.orchestrate.jobs import _evaluate_stacked, eval_key, evaluate_model
from llm.rollout.base import stop_token_ids
from llm.rollout.hf import sequence_logp
from llm.rollout.stacked import VERSION as SAMPLER_VERSION
from llm.rollout.stacked import filter_logits, left_pad, sample_groups
from llm.run.checkpoint import latest_checkpoint, trainer_extra
from llm.run.distributed import DistInfo
from llm.tasks import generate_problems
from llm.train.batched import (
    _update_runs,
    batch_key,
    batchable,
    train_batch,
)
from llm.train.behaviour import behaviour_batch
from llm.train.update import make_optimizer, update_policy
from tests.llm.conftest import TEST_MAX_NUMBER
from tests.llm.test_trainer import _config as trainer_config
from tests.tolerance import assert_close

PROMPTS = ["3 5 7 = 15 :", "2 9 = 11 :", "1 2 3 4 = 10 :", "8 8 = 16 :"]


def _models(path, count):
    """`count` copies of the saved model, each perturbed with its own noise."""
    out = []
    for r in range(count):
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        gen = torch.Generator().manual_seed(r)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        out.append(m)
    return out


def _n(model, length):
    """The chained float32 reduction lengths of a forward: the positions, the hidden and MLP
    widths, the vocabulary (tests/tolerance.py)."""
    c = model.config
    return length + c.hidden_size + c.intermediate_size + c.vocab_size


def test_stacked_forward_equals_each_transformers_forward(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    models = _models(tiny_model_path, 3)
    ids, mask = left_pad(tok, PROMPTS)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    lm = StackedLM(models)
    rows = torch.cat([ids] * 3), torch.cat([mask] * 3), torch.cat([pos] * 3)
    with torch.no_grad():
        got = lm(*rows)
        for r, m in enumerate(models):
            want = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            sl = slice(r * len(PROMPTS), (r + 1) * len(PROMPTS))
            real = mask.bool()
            assert_close(got[sl][real], want[real], dtype="float32", n=_n(m, ids.shape[1]))
    # Gradients reach each run's own parameters, and only them.
    lm(*rows)[: len(PROMPTS)].sum().backward()
    assert float(models[0].model.norm.weight.grad.abs().sum()) > 0
    assert float(models[1].model.norm.weight.grad.abs().sum()) == 0


def test_check_stackable_names_the_difference(tiny_model_path):
    a, b = _models(tiny_model_path, 2)
    b.config.rms_norm_eps = 1e-5
    with pytest.raises(ValueError, match="rms_norm_eps"):
        check_stackable([a, b])
    with pytest.raises(ValueError, match="at least one"):
        check_stackable([])


def test_prompt_sharing_forward_equals_policy_forward(tiny_model_path):
    """`stacked_policy_forward` runs each prompt once for its group; its log-probs, entropies
    and candidate log-probs equal `policy_forward` on the flattened rows of each run."""
    tok = load_tokenizer(tiny_model_path)
    models = _models(tiny_model_path, 2)
    lm = StackedLM(models)
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    stops = stop_token_ids(tok, None)
    rolls = sample_groups(lm, tok, [PROMPTS[:2], PROMPTS[2:]], 3, generators=gens,
                          max_new_tokens=6, stop_token_ids=stops, top_n=2,
                          want_entropy=True)  # fmt: skip
    t = max(r.response_ids.shape[2] for r in rolls)

    def pad(x, v):
        extra = torch.full((*x.shape[:2], t - x.shape[2]), v, dtype=x.dtype)
        return torch.cat([x, extra], dim=2)

    p_ids = torch.cat([r.prompt_ids for r in rolls])
    p_mask = torch.cat([r.prompt_mask for r in rolls])
    r_ids = torch.cat([pad(r.response_ids, 0) for r in rolls])
    r_mask = torch.cat([pad(r.response_mask, 0.0) for r in rolls])
    with torch.no_grad():
        base = [policy_forward(m, build_rows(r.prompt_ids, r.prompt_mask, pad(r.response_ids, 0),
                                             pad(r.response_mask, 0.0)),
                               temperature=0.8, want_entropy=True, n_top=2, logit_chunk=0)
                for m, r in zip(models, rolls, strict=True)]  # fmt: skip
        cand = torch.cat([b.cand_ids for b in base])
        got = stacked_policy_forward(lm, p_ids, p_mask, r_ids, r_mask, temperature=0.8,
                                     want_entropy=True, cand_ids=cand)  # fmt: skip
    mask = r_mask.reshape(-1, t).bool()
    want_logp = torch.cat([b.logp for b in base])
    n = _n(models[0], p_ids.shape[1] + t)
    assert_close(got.logp[mask], want_logp[mask], dtype="float32", n=n)
    assert_close(got.entropy[mask], torch.cat([b.entropy for b in base])[mask],
                 dtype="float32", n=n)  # fmt: skip
    assert_close(got.cand_logp[mask], torch.cat([b.cand_logp for b in base])[mask],
                 dtype="float32", n=n)  # fmt: skip


def test_sampler_draws_each_run_from_its_own_generator(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    models = _models(tiny_model_path, 3)
    stops = stop_token_ids(tok, None)
    prompts = [PROMPTS[:2], PROMPTS[1:3], PROMPTS[2:]]
    kw = {"max_new_tokens": 8, "stop_token_ids": stops, "top_n": 2, "want_entropy": True,
          "temperature": 0.9}  # fmt: skip
    together = sample_groups(StackedLM(models), tok, prompts, 4,
                             generators=[torch.Generator().manual_seed(10 + r) for r in range(3)],
                             **kw)  # fmt: skip
    for r in range(3):
        alone = sample_groups(
            StackedLM([models[r]]),
            tok,
            [prompts[r]],
            4,
            generators=[torch.Generator().manual_seed(10 + r)],
            **kw,
        )[0]
        a, b = together[r], alone
        assert a.texts == b.texts
        assert torch.equal(a.response_ids, b.response_ids)
        assert_close(a.logp, b.logp, dtype="float32", n=_n(models[r], 16))
        # The sampler's log-probs are the model's (temperature 0.9, no top-p): recompute them.
        want = sequence_logp(models[r], a.prompt_ids, a.prompt_mask, a.response_ids,
                             a.response_mask, temperature=0.9)  # fmt: skip
        assert_close(a.logp, want, dtype="float32", n=_n(models[r], 16))
        assert a.response_mask.sum() > 0
        # Another generator, other tokens.
    other = sample_groups(
        StackedLM([models[0]]),
        tok,
        [prompts[0]],
        4,
        generators=[torch.Generator().manual_seed(99)],
        **kw,
    )[0]
    assert other.texts != together[0].texts


def _gqa_models(tok, count, dtype=torch.float32):
    """`count` random Llama models over `tok` with grouped-query attention (4 heads, 2 key-value
    heads, as SmolLM2's 9 and 3), in `dtype`."""
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    out = []
    for r in range(count):
        torch.manual_seed(100 + r)
        out.append(LlamaForCausalLM(cfg).to(dtype).eval())
    return out


@pytest.mark.parametrize("matmul", [False, True], ids=["cpu_decode", "gpu_decode"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_sampler_draws_from_the_models_distribution_under_grouped_query_attention(
    tiny_model_path, dtype, matmul, monkeypatch
):
    """Grouped-query attention (each key-value head read once per decoding step, not copied per
    query head) and bfloat16 weights: at every sampled position the sampler's
    log-prob is the transformers model's own, recomputed by a forward of the whole sequence.
    float32: within the chained reductions' bound. bfloat16, whose bound at these lengths exceeds
    the log-probs themselves: nearer the model's own than the same responses' log-probs after the
    other prompts of the batch (what a wrong prompt-to-row mapping would give). Both decoding
    paths: the CPU's broadcast products and the GPU's matrix products with the prompt's keys and
    values shared by its group (run here on the CPU)."""
    monkeypatch.setattr(stacked_model, "_DECODE_MATMUL", matmul)
    tok = load_tokenizer(tiny_model_path)
    torch_dtype = getattr(torch, dtype)
    models = _gqa_models(tok, 2, torch_dtype)
    with pytest.raises(ValueError, match="expected float32 or bfloat16, one for all models"):
        StackedLM([*_gqa_models(tok, 1, torch.float32), *_gqa_models(tok, 1, torch.bfloat16)])
    lm = StackedLM(models)
    gens = [torch.Generator().manual_seed(7 + r) for r in range(2)]
    rolls = sample_groups(lm, tok, [PROMPTS[:2], PROMPTS[2:]], 3, generators=gens,
                          max_new_tokens=6, stop_token_ids=stop_token_ids(tok, None),
                          temperature=0.9)  # fmt: skip
    for m, roll in zip(models, rolls, strict=True):
        want = sequence_logp(m, roll.prompt_ids, roll.prompt_mask, roll.response_ids,
                             roll.response_mask, temperature=0.9)  # fmt: skip
        real = roll.response_mask.bool()
        assert real.sum() > 0 and roll.logp.dtype == torch.float32
        if dtype == "float32":
            assert_close(roll.logp[real], want[real], dtype=dtype, n=_n(m, 16))
            continue
        other = sequence_logp(m, roll.prompt_ids.roll(1, 0), roll.prompt_mask.roll(1, 0),
                              roll.response_ids, roll.response_mask, temperature=0.9)  # fmt: skip
        own = (roll.logp - want.float())[real].abs().mean()
        assert own < (roll.logp - other.float())[real].abs().mean(), float(own)


def test_filter_logits_keeps_top_k_then_top_p():
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(scores, top_k=2)).tolist() == [[False, False, True, True]]
    # top-p 0.7: 0.5 + 0.3 reach it; the tail 0.15 + 0.05 = 0.2 <= 0.3 is dropped.
    assert torch.isinf(filter_logits(scores, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert not torch.isinf(filter_logits(scores)).any()


def _config(model_path, method, **over):
    """`tests.llm.test_trainer`'s small run, 3 steps, a checkpoint every 2."""
    return trainer_config(model_path, method, **{"steps": 3, "save_every": 2, **over})


def _runs(path):
    return [
        _config(path, "grpo", seed=0),
        _config(path, "ds_grpo", seed=1, kl_coef=0.05, hyper={"gamma_p": 0.3, "gamma_n": 0.1}),
        _config(
            path,
            "entropy_bonus",
            seed=2,
            **{"optim.lr": 3e-3, "optim.inner_epochs": 1},
            hyper={"eta": 0.1},
        ),
        _config(path, "casp", seed=3, hyper={"alpha": 0.5, "top_n": 2}),
    ]


def _metrics(folder):
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_batched_runs_equal_the_runs_alone(tiny_model_path, tmp_path):
    cfgs = _runs(tiny_model_path)
    train_batch(cfgs, [tmp_path / f"b{i}" for i in range(len(cfgs))])
    for i, cfg in enumerate(cfgs):
        train_batch([cfg], [tmp_path / f"a{i}"])
        batched, alone = _metrics(tmp_path / f"b{i}"), _metrics(tmp_path / f"a{i}")
        assert [r["step"] for r in batched] == [1, 2, 3]
        for rb, ra in zip(batched, alone, strict=True):
            # The same completions: equal rewards, lengths and pass rates.
            for key in ("charts/reward_mean", "charts/response_len", "charts/pass_rate"):
                assert rb[key] == ra[key], (i, key)
            for key in ra:  # the rest agrees to float32 rounding of the forward and the loss
                assert_close(rb[key], ra[key], dtype="float32", n=_n_cfg())
        wb = AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path / f"b{i}"))
        wa = AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path / f"a{i}"))
        for pb, pa in zip(wb.parameters(), wa.parameters(), strict=True):
            assert_close(pb, pa, dtype="float32", n=_n_cfg(), elementwise=True)
        assert latest_checkpoint(tmp_path / f"b{i}").name == "step_000003"


def test_a_run_of_a_batch_is_the_run_alone_to_the_bit(tmp_path):
    """At the tiny base model's size (`llm.model.tiny.TinyConfig`: 4 layers, 128 wide), where a
    row's width shows in the sums of the weight gradients: each run of a batch of three is the
    same run trained alone, to the bit, weights and metrics, because responses are padded to
    ``max_new_tokens`` and not to the batch-mates' longest (`_batch_tensors`). So a run's bytes
    do not depend on its batch, and a spot check can re-train one run alone."""
    tok = build_tokenizer(TEST_MAX_NUMBER)
    path = tmp_path / "model"
    model = build_tiny_model(tok, seed=0)
    with torch.no_grad():  # a louder <eos> (tied embeddings): responses end at many lengths
        model.get_input_embeddings().weight[tok.eos_token_id] *= 4.0
    model.save_pretrained(path)
    tok.save_pretrained(path)
    over = {"steps": 4, "save_every": 2, "max_new_tokens": 16}
    cfgs = [
        trainer_config(str(path), "grpo", seed=0, **over),
        trainer_config(str(path), "grpo", seed=1, **over),
        trainer_config(str(path), "ds_grpo", seed=2, hyper={"gamma_p": 1.0, "gamma_n": 0.2},
                       **over),
    ]  # fmt: skip
    train_batch(cfgs, [tmp_path / f"b{i}" for i in range(3)])
    lengths = set()
    for i, cfg in enumerate(cfgs):
        train_batch([cfg], [tmp_path / f"a{i}"])
        batched, alone = _metrics(tmp_path / f"b{i}"), _metrics(tmp_path / f"a{i}")
        assert batched == alone, i
        lengths |= {r["charts/response_len"] for r in alone}
        wb = AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path / f"b{i}"))
        wa = AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path / f"a{i}"))
        assert all(torch.equal(p, q) for p, q in zip(wb.parameters(), wa.parameters(),
                                                     strict=True))  # fmt: skip
    assert min(lengths) < 12  # responses ended early, at lengths that differ between runs


_CONTROLS = {
    "entropy_mask_explore": {"control": {"adaptive_entropy": True, "entropy_gate": "trl"},
                             "explore": {"ucb_coef": 0.2, "batch_coef": 0.1},
                             "rollout.mask_truncated": True},
    "kl_in_reward_reset": {"kl_coef": 0.01, "control": {"kl_in_reward": True, "adaptive_kl": True,
                                                        "reference_reset_every": 2}},
}  # fmt: skip


def _with_tables(model_path, over):
    """`tests.llm.test_trainer`'s config with whole ``control`` and ``explore`` tables set."""
    tables = {k: over.pop(k) for k in ("control", "explore") if k in over}
    cfg = trainer_config(model_path, **over)
    return dataclasses.replace(
        cfg, **{t: dataclasses.replace(getattr(cfg, t), **kv) for t, kv in tables.items()}
    )


@pytest.mark.parametrize("controls", sorted(_CONTROLS))
def test_controls_of_a_batch_run_as_alone_to_the_bit(controls, tiny_model_path, tmp_path):
    """The loop's controls (`llm.train.loop`: exploration bonuses, overlong masking, the adaptive
    entropy and KL coefficients, the KL penalty in the reward, the reference reset) act on each
    run of a batch as on the run alone: metrics, weights, control state and reset reference equal
    to the bit; and a killed batch resumes as if uninterrupted."""
    over = {"steps": 3, "save_every": 2, "max_new_tokens": 8}
    cfgs = [
        _with_tables(tiny_model_path, {"method": "grpo", "seed": 0, **over,
                                       **copy.deepcopy(_CONTROLS[controls])}),
        _with_tables(tiny_model_path, {"method": "ds_grpo", "seed": 1, **over,
                                       **copy.deepcopy(_CONTROLS[controls])}),
    ]  # fmt: skip
    assert all(batchable(c) is None for c in cfgs)
    train_batch(cfgs, [tmp_path / "b0", tmp_path / "b1"])
    for i, cfg in enumerate(cfgs):
        train_batch([cfg], [tmp_path / f"a{i}"])
        _assert_same_run(tmp_path / f"b{i}", tmp_path / f"a{i}")
    assert any(k.startswith("control/") for k in _metrics(tmp_path / "b0")[-1])
    killed = [tmp_path / "k0", tmp_path / "k1"]
    train_batch(cfgs, killed, stop_after=2)
    train_batch(cfgs, killed, resume=True)
    for i in range(2):
        _assert_same_run(tmp_path / f"b{i}", killed[i])


@pytest.mark.parametrize("method", ["dsdr", "progrpo"])
def test_methods_with_their_own_batch_keys_run_in_a_batch_as_alone(method, tiny_model_path,
                                                                   tmp_path):  # fmt: skip
    """DSDR (sentence-embedding diversity) and ProGRPO (prompt log-probs: its behaviour pass is
    a forward, its batch-mate's the sampler's statistics) in a batch with GRPO: each run equals
    itself alone, to the bit."""
    over = {"steps": 3, "save_every": 2, "max_new_tokens": 8}
    cfgs = [trainer_config(tiny_model_path, method, seed=0, **over),
            trainer_config(tiny_model_path, "grpo", seed=1, **over)]  # fmt: skip
    train_batch(cfgs, [tmp_path / "b0", tmp_path / "b1"])
    for i, cfg in enumerate(cfgs):
        train_batch([cfg], [tmp_path / f"a{i}"])
        _assert_same_run(tmp_path / f"b{i}", tmp_path / f"a{i}")


def _assert_same_run(batched, alone):
    assert _metrics(batched) == _metrics(alone)
    cb, ca = latest_checkpoint(batched), latest_checkpoint(alone)
    assert cb.name == ca.name
    wb, wa = (AutoModelForCausalLM.from_pretrained(c) for c in (cb, ca))
    assert all(torch.equal(p, q) for p, q in zip(wb.parameters(), wa.parameters(), strict=True))
    assert trainer_extra(cb) == trainer_extra(ca)
    if (cb / "reference").is_dir():
        rb, ra = (AutoModelForCausalLM.from_pretrained(c / "reference") for c in (cb, ca))
        assert all(torch.equal(p, q) for p, q in zip(rb.parameters(), ra.parameters(),
                                                     strict=True))  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_stacked_evaluation_samples_each_model_as_alone(dtype, tmp_path):
    """Three models evaluated in one stack, over several chunks of prompts, give each model's
    records of its evaluation alone, to the bit, in float32 and in bfloat16 (``eval.dtype``): a
    model's generator draws only while one of its rows decodes (`llm.rollout.stacked.VERSION` 2),
    so the next chunk starts from the state it would have alone. Under version 1 (a draw at every
    step of the stack) this fails."""
    tok = build_tokenizer(TEST_MAX_NUMBER)
    base = build_tiny_model(tok, seed=0)
    models = []
    for louder in [12.0, 6.0, 1.0]:  # a louder <eos>: a model's rows all end sooner
        m = copy.deepcopy(base).eval()
        with torch.no_grad():
            m.get_input_embeddings().weight[tok.eos_token_id] *= louder
        models.append(m.to(getattr(torch, dtype)))
    problems = generate_problems(9, seed=3, num_numbers=3, max_number=9,
                                 max_target=TEST_MAX_NUMBER)  # fmt: skip
    kw = {"template": "compact", "stop_token_ids": stop_token_ids(tok, None), "samples": 4,
          "max_new_tokens": 16, "seed": 7, "prompts_per_batch": 2, "bleu": False}  # fmt: skip
    together = evaluate_models(models, tok, "countdown", problems, **kw)
    for r, m in enumerate(models):
        alone = evaluate_models([m], tok, "countdown", problems, **kw)[0]
        assert together[r] == alone, r
    assert len({json.dumps(t["distinct_n"]) for t in together}) == 3  # three samplings


def _n_cfg():
    # tests/llm/conftest.py's model: hidden 16, MLP 32, vocabulary ~40; rows of <= 20 tokens,
    # 3 steps of AdamW whose update divides by sqrt(v) (a relative error of the gradient moves
    # a parameter by at most lr per step): generous, the comparison is usually exact.
    return 16 + 32 + 64 + 20 + 32 * 3


def test_stacked_update_equals_each_runs_update_policy(tiny_model_path):
    """One step's update from a fixed rollout: the batched gradient pass gives each run the
    parameters `update_policy` gives it alone (two inner epochs: the second recomputes)."""
    cfgs = [dataclasses.replace(c, optim=dataclasses.replace(c.optim, inner_epochs=2))
            for c in _runs(tiny_model_path)]  # fmt: skip
    tok = load_tokenizer(tiny_model_path)
    models = _models(tiny_model_path, len(cfgs))
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    stops = stop_token_ids(tok, None)
    gens = [torch.Generator().manual_seed(5 + r) for r in range(len(cfgs))]
    rolls = sample_groups(StackedLM(models), tok, [PROMPTS[:2]] * len(cfgs), 4, generators=gens,
                          max_new_tokens=8, stop_token_ids=stops, top_n=2,
                          want_entropy=True)  # fmt: skip
    rewards = torch.tensor([[1.0, 0.0, 0.1, 0.0], [0.0, 1.0, 1.0, 0.1]])
    alone = [copy.deepcopy(m) for m in models]
    behaviours, behaviours_alone, opts, scheds, opts_alone, scheds_alone = [], [], [], [], [], []
    for cfg, m, a, roll in zip(cfgs, models, alone, rolls, strict=True):
        needs = shaping.METHODS[cfg.method].needs_for(**cfg.loss_hyper)
        ref_m = ref if cfg.kl_coef > 0 else None
        behaviours.append(behaviour_batch(m, ref_m, roll, rewards, cfg=cfg, needs=needs))
        behaviours_alone.append(behaviour_batch(a, ref_m, roll, rewards, cfg=cfg, needs=needs))
        o, s = make_optimizer(cfg, m)
        opts.append(o)
        scheds.append(s)
        o, s = make_optimizer(cfg, a)
        opts_alone.append(o)
        scheds_alone.append(s)
    _update_runs(StackedLM(models), opts, scheds, behaviours, cfgs, step=1)
    for i, cfg in enumerate(cfgs):
        update_policy(alone[i], opts_alone[i], scheds_alone[i], behaviours_alone[i], cfg=cfg,
                      info=DistInfo(), step=1)  # fmt: skip
        for pb, pa in zip(models[i].parameters(), alone[i].parameters(), strict=True):
            assert_close(pb, pa, dtype="float32", n=_n_cfg(), elementwise=True)
        moved = sum(float((p - q).detach().abs().sum()) for p, q in
                    zip(models[i].parameters(), _models(tiny_model_path, len(cfgs))[i].parameters(),
                        strict=True))  # fmt: skip
        assert moved > 0


def test_batched_resume_after_kill_matches_uninterrupted(tiny_model_path, tmp_path):
    cfgs = _runs(tiny_model_path)[:2]
    full = [tmp_path / "f0", tmp_path / "f1"]
    killed = [tmp_path / "k0", tmp_path / "k1"]
    train_batch(cfgs, full)
    train_batch(cfgs, killed, stop_after=2)
    train_batch(cfgs, killed, resume=True)
    for f, k in zip(full, killed, strict=True):
        assert _metrics(f) == _metrics(k)  # bit-identical: same kernels, same order


def test_activation_checkpointing_trains_in_a_batch_as_alone(tiny_model_path, tmp_path,
                                                             monkeypatch):  # fmt: skip
    """``system.gradient_checkpointing`` in the batched engine (`StackedLM(checkpointing=True)`:
    each decoder layer of the update runs again in the backward pass): each run of a batch is the
    run alone to the bit, and without checkpointing the same run samples the same completions and
    ends at the same weights up to float32 rounding."""
    calls = []
    real = stacked_model.checkpoint
    monkeypatch.setattr(stacked_model, "checkpoint",
                        lambda *a, **k: calls.append(1) or real(*a, **k))  # fmt: skip
    over = {"steps": 3, "save_every": 2, "max_new_tokens": 8, "gradient_checkpointing": True}
    cfgs = [trainer_config(tiny_model_path, "grpo", seed=0, **over),
            trainer_config(tiny_model_path, "ds_grpo", seed=1, **over)]  # fmt: skip
    assert all(batchable(c) is None for c in cfgs)
    train_batch(cfgs, [tmp_path / "b0", tmp_path / "b1"])
    assert calls  # the update's layers were checkpointed
    train_batch(cfgs[1:], [tmp_path / "a1"])
    _assert_same_run(tmp_path / "b1", tmp_path / "a1")
    plain = [dataclasses.replace(c, system=dataclasses.replace(c.system,
                                                               gradient_checkpointing=False))
             for c in cfgs]  # fmt: skip
    train_batch(plain, [tmp_path / "p0", tmp_path / "p1"])
    for i in range(2):
        on, off = _metrics(tmp_path / f"b{i}"), _metrics(tmp_path / f"p{i}")
        for rb, rp in zip(on, off, strict=True):
            for key in ("charts/reward_mean", "charts/response_len", "charts/pass_rate"):
                assert rb[key] == rp[key], (i, key)
        wb, wp = (AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path / f"{x}{i}"))
                  for x in ("b", "p"))  # fmt: skip
        for pb, pp in zip(wb.parameters(), wp.parameters(), strict=True):
            assert_close(pb, pp, dtype="float32", n=_n_cfg(), elementwise=True)


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed"])
def test_a_run_of_a_batch_is_the_run_alone_in_every_precision(precision, tiny_model_path,
                                                               tmp_path):  # fmt: skip
    """``system.precision`` in the batched engine: ``bf16`` trains bfloat16 weights (the KL
    reference bfloat16 too), ``bf16-mixed`` float32 weights with the gradient passes under
    bfloat16 autocast. Each run of a batch is the run alone to the bit, and the weights move
    away from the float32 run's by more than float32 rounding (the precision acts)."""
    over = {"steps": 2, "save_every": 2, "max_new_tokens": 8, "precision": precision}
    cfgs = [trainer_config(tiny_model_path, "grpo", seed=0, **over),
            trainer_config(tiny_model_path, "ds_grpo", seed=1, kl_coef=0.05,
                           hyper={"gamma_p": 0.3, "gamma_n": 0.1}, **over)]  # fmt: skip
    assert all(batchable(c) is None for c in cfgs)
    train_batch(cfgs, [tmp_path / "b0", tmp_path / "b1"])
    for i, cfg in enumerate(cfgs):
        train_batch([cfg], [tmp_path / f"a{i}"])
        _assert_same_run(tmp_path / f"b{i}", tmp_path / f"a{i}")
    fp32 = dataclasses.replace(
        cfgs[0], system=dataclasses.replace(cfgs[0].system, precision="fp32")
    )
    train_batch([fp32], [tmp_path / "f0"])
    got, want = (AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path / x))
                 for x in ("b0", "f0"))  # fmt: skip
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    assert next(got.parameters()).dtype == dtype
    gap = max((p.float() - q).abs().max().item()
              for p, q in zip(got.parameters(), want.parameters(), strict=True))  # fmt: skip
    assert gap > 1e-4, gap


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_batch_trains_on_cuda(tiny_model_path, tmp_path):
    """The batched engine on a GPU (``system.device = "cuda"``: the models, the generators, the
    rewards and the gradient passes on the device): a batch of two runs in bf16-mixed with a KL
    reference and candidates (CaSP) trains, checkpoints and resumes; every metric is finite."""
    over = {"steps": 3, "save_every": 2, "max_new_tokens": 8, "device": "cuda",
            "precision": "bf16-mixed"}  # fmt: skip
    cfgs = [trainer_config(tiny_model_path, "grpo", seed=0, kl_coef=0.05, **over),
            trainer_config(tiny_model_path, "casp", seed=1, hyper={"alpha": 0.5, "top_n": 2},
                           **over)]  # fmt: skip
    assert all(batchable(c) is None for c in cfgs)
    outs = [tmp_path / "b0", tmp_path / "b1"]
    train_batch(cfgs, outs, stop_after=2)
    hist = train_batch(cfgs, outs, resume=True)
    assert [[h["step"] for h in run] for run in hist] == [[3], [3]]
    for out in outs:
        rows = _metrics(out)
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert all(math.isfinite(v) for r in rows for v in r.values()), rows
        assert latest_checkpoint(out).name == "step_000003"


def test_dynamic_sampling_rounds_of_a_batch_are_each_runs_alone(tiny_model_path, tmp_path):
    """DAPO dynamic sampling in a batch (`llm.train.rollout_step.DynamicRounds`): each round
    samples the runs still short of B mixed groups, so the runs draw different numbers of rounds,
    and each run of the batch is the run alone to the bit (metrics, with ``dynamic/rounds``,
    weights, data position)."""
    over = {"steps": 3, "save_every": 3, "max_new_tokens": 8, "dynamic_sampling": True,
            "max_resample_rounds": 3}  # fmt: skip
    cfgs = [trainer_config(tiny_model_path, "grpo", seed=s, **over) for s in (0, 1, 2)]
    assert all(batchable(c) is None for c in cfgs)
    train_batch(cfgs, [tmp_path / f"b{i}" for i in range(3)])
    rounds = []
    for i, cfg in enumerate(cfgs):
        train_batch([cfg], [tmp_path / f"a{i}"])
        _assert_same_run(tmp_path / f"b{i}", tmp_path / f"a{i}")
        rows = _metrics(tmp_path / f"a{i}")
        assert all(r["charts/prompts_seen"] >= 2 * r["step"] for r in rows)
        rounds.append([r["dynamic/rounds"] for r in rows])
    assert any(len({r[s] for r in rounds}) > 1 for s in range(3)), rounds  # rounds differed


def test_batch_errors_name_the_field(tiny_model_path, tmp_path):
    a = _config(tiny_model_path, "grpo")
    b = _config(tiny_model_path, "grpo", **{"rollout.group_size": 2})
    assert batch_key(a) != batch_key(b)
    assert batch_key(a) == batch_key(_config(tiny_model_path, "ds_grpo", seed=4))
    with pytest.raises(ValueError, match="cfgs\\[1\\]: differs"):
        train_batch([a, b], [tmp_path / "x", tmp_path / "y"])
    ddp = _config(tiny_model_path, "grpo", **{"system.parallel": "ddp"})
    assert "system.parallel" in batchable(ddp)
    with pytest.raises(ValueError, match="cannot train in a batch"):
        train_batch([ddp], [tmp_path / "z"])
    with pytest.raises(ValueError, match="own folder"):
        train_batch([a, a], [tmp_path / "w", tmp_path / "w"])
    if not torch.cuda.is_available():  # a device the batched engine takes, but not this machine's
        cuda = _config(tiny_model_path, "grpo", device="cuda")
        assert batchable(cuda) is None
        with pytest.raises(ValueError, match=r"system\.device: 'cuda' cannot run here"):
            train_batch([cuda], [tmp_path / "c"])
        assert not (tmp_path / "c").exists()


def test_a_process_evaluation_with_the_stacked_sampler_is_the_batched_engines(tiny_model_path):
    """``eval.sampler = "stacked"`` routes a process engine's evaluation through the batched
    engine's sampler: the same record, to the bit; its key names the sampler and its version,
    and the default sampler's key stays as it was."""
    cfg = trainer_config(tiny_model_path, "grpo")
    stacked = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, sampler="stacked"))
    problems = generate_problems(6, seed=3, num_numbers=3, max_number=9,
                                 max_target=TEST_MAX_NUMBER)  # fmt: skip
    ev = {"problems": 6, "samples": 4, "seed": 3, "semantic": False}
    alone = evaluate_model(stacked, Path(tiny_model_path), problems, ev)
    batched = _evaluate_stacked(cfg, [Path(tiny_model_path)], problems, ev)[0]
    for record in (alone, batched):
        del record["eval_seconds"]
    assert alone == batched and len(alone["correct"]) == 6
    key, plain = eval_key(ev, stacked, problems, "x"), eval_key(ev, cfg, problems, "x")
    assert key["sampler"] == "stacked" and key["sampler_version"] == SAMPLER_VERSION
    assert "sampler" not in plain and "sampler_version" not in plain
    assert {k: v for k, v in key.items() if not k.startswith("sampler")} == plain
