"""Trainer: a two-step smoke run of every registry method through the real loop, exact resume,
and the micro-batched update equal to the shaping core's full-batch loss and gradient."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import shaping
from llm.config import OLD_KEYS, config_from_dict
from llm.data import data_indices
from llm.model.forward import build_rows, policy_forward, sampled_rank
from llm.model.load import load_model_and_tokenizer, load_tokenizer
from llm.rollout.base import RolloutBatch, response_mask_from_eos
from llm.rollout.hf import HFGenerateBackend
from llm.run.checkpoint import latest_checkpoint
from llm.tasks import CountdownProblem, compact_completion, solve
from llm.train.behaviour import GRAD_KEYS, PRODUCERS, behaviour_batch, fixed_keys
from llm.train.trainer import train
from llm.train.update import accumulate_gradients
from shaping import methods
from tests.conftest import in_engine_process, node_of, run_in_own_process
from tests.tolerance import assert_close

MAX_NUMBER = 30


class PlantingBackend:
    """The real `HFGenerateBackend`, with the first response of every group replaced by a solver
    solution of the prompt's problem, so a random model's groups are mixed (nonzero advantages)."""

    def __init__(self, model, tokenizer):
        self.inner = HFGenerateBackend(model, tokenizer)
        self.tok = tokenizer

    def sync_weights(self, model):
        self.inner.sync_weights(model)

    def generate(self, prompts, group_size, **kw) -> RolloutBatch:
        roll = self.inner.generate(prompts, group_size, **kw)
        # Widen to max_new_tokens: the sampled responses may all be shorter than a solution.
        t = kw["sampling"].max_new_tokens
        extra = t - roll.response_ids.shape[-1]
        ids = torch.nn.functional.pad(roll.response_ids, (0, extra), value=self.tok.pad_token_id)
        logp = torch.nn.functional.pad(roll.logp, (0, extra))
        for b, prompt in enumerate(prompts):
            words = prompt.split()
            colon = words.index("target")
            problem = CountdownProblem(tuple(map(int, words[1:colon])), int(words[colon + 1]))
            text = compact_completion(solve(problem)[0])
            planted = [*self.tok(text, add_special_tokens=False).input_ids, self.tok.eos_token_id]
            planted = (planted + [self.tok.pad_token_id] * t)[:t]
            ids[b, 0] = torch.tensor(planted)
        mask = response_mask_from_eos(ids, self.tok.eos_token_id)
        ids = ids.masked_fill(~mask, self.tok.pad_token_id)
        flat = ids.reshape(-1, t)
        texts = self.tok.batch_decode(flat, skip_special_tokens=True)
        g = group_size
        roll.response_ids = ids
        roll.response_mask = mask.float()
        roll.logp = logp.masked_fill(~mask, 0.0)
        roll.texts = [texts[i * g : (i + 1) * g] for i in range(len(prompts))]
        return roll


def _config(model_path: str, method: str, **over):
    """A small run's config; `over` sets top-level keys, or a table's key by its name alone
    (``inner_epochs=2`` is ``optim.inner_epochs``, as `llm.config.OLD_KEYS` maps it)."""
    raw = {
        "model_path": model_path,
        "method": method,
        "steps": 2,
        "data": {"source": "generate", "n_problems": 8, "max_number": 9, "max_target": MAX_NUMBER},
        "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 12, "top_n": 2},
        "system": {"micro_batch_size": 3},
        "optim": {"lr": 1e-2},
        "run": {"tensorboard": False},
    }
    for key, value in over.items():
        table, _, name = OLD_KEYS.get(key, key).rpartition(".")
        (raw[table] if table else raw)[name] = value
    if method == "passk":
        raw.setdefault("hyper", {"k": 2})
    if method == "casp":
        raw.setdefault("hyper", {"top_n": 2})
    return config_from_dict(raw)


@pytest.mark.parametrize("method", sorted(shaping.METHODS))
def test_two_step_smoke_every_method(method, tiny_model_path, tmp_path):
    cfg = _config(
        tiny_model_path, method, inner_epochs=2, kl_coef=0.01 if method == "grpo" else 0.0
    )
    hist = train(
        cfg, tmp_path, backend_factory=lambda c, m, t: PlantingBackend(m, t), progress=False
    )
    assert [h["step"] for h in hist] == [1, 2]
    for h in hist:
        assert all(np.isfinite(v) for v in h.values()), h
        assert h["charts/pass_rate"] == 1.0  # every group holds the planted solution
        assert h["charts/grad_norm"] > 0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    assert latest_checkpoint(tmp_path).name == "step_000002"
    assert (tmp_path / "config.toml").is_file()


def test_resume_after_kill_matches_uninterrupted_run(tiny_model_path, tmp_path):
    factory = lambda c, m, t: PlantingBackend(m, t)  # noqa: E731
    cfg = _config(tiny_model_path, "ds_grpo", steps=4, save_every=2, schedule="cosine",
                  warmup_steps=1, inner_epochs=2)  # fmt: skip
    full = train(cfg, tmp_path / "full", backend_factory=factory, progress=False)
    # "Kill" after step 3: the checkpoint is at step 2 and step 3 was logged, then resume.
    train(cfg, tmp_path / "killed", backend_factory=factory, stop_after=3, progress=False)
    assert latest_checkpoint(tmp_path / "killed").name == "step_000002"
    train(cfg, tmp_path / "killed", resume=True, backend_factory=factory, progress=False)

    def rows(d):
        out = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in out]

    a, b = rows(tmp_path / "full"), rows(tmp_path / "killed")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            assert rb[k] == ra[k], k  # bit-identical: the same kernels in the same order
    assert full[-1]["charts/grad_norm"] > 0


def test_resume_rejects_a_changed_config(tiny_model_path, tmp_path):
    factory = lambda c, m, t: PlantingBackend(m, t)  # noqa: E731
    train(_config(tiny_model_path, "grpo", steps=1), tmp_path, backend_factory=factory,
          progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="lr"):
        train(_config(tiny_model_path, "grpo", steps=2, lr=0.5), tmp_path, resume=True,
              backend_factory=factory, progress=False)  # fmt: skip


@pytest.mark.usefixtures("registry_snapshot")
def test_resume_refuses_a_users_method_whose_file_changed(tiny_model_path, tmp_path):
    """A run of a method from the user's file (``--import``) records the file's code in its
    checkpoints (`shaping.method_code`); resuming after the file changed is refused, naming the
    method, while the same file resumes."""
    factory = lambda c, m, t: PlantingBackend(m, t)  # noqa: E731
    mine = tmp_path / "mine.py"

    def register(scale: float) -> None:  # as a new command would: the file imported afresh
        methods._REGISTRY.pop("resumed_test", None)
        methods._IMPORTED.clear()
        mine.write_text(
            "import shaping\n\n@shaping.register('resumed_test')\n"
            "def resumed_test(batch, *, c: float = 1.0):\n"
            '    """A test method.\n\n    Source: this test\n    """\n'
            f"    return {scale} * c * shaping.grpo_advantages(batch['rewards'])\n"
        )
        shaping.import_methods([str(mine)])

    register(1.0)
    cfg = _config(tiny_model_path, "resumed_test", steps=2, save_every=1)
    out = tmp_path / "run"
    train(cfg, out, backend_factory=factory, stop_after=1, progress=False)
    register(2.0)
    with pytest.raises(ValueError, match=r"--resume: method 'resumed_test': its code changed"):
        train(cfg, out, resume=True, backend_factory=factory, progress=False)
    register(1.0)
    hist = train(cfg, out, resume=True, backend_factory=factory, progress=False)
    assert [h["step"] for h in hist] == [2]


def _hand_batch(tokenizer):
    """B=2 prompts, G=3 responses of uneven length, binary rewards (one group all wrong)."""
    enc = tokenizer(["nums 1 2 3 target 6 :", "nums 4 5 target 9 :"], return_tensors="pt",
                    padding=True, padding_side="left")  # fmt: skip
    texts = [
        ["<answer> 1 + 2 + 3 </answer>", "<answer> 1 * 2 </answer>", "( ( +"],
        ["<answer> 4 + 5 </answer>", "<answer> 5 + 4 </answer>", "<answer> 4 </answer>"],
    ]
    t = 9
    ids = torch.full((2, 3, t), tokenizer.pad_token_id)
    for b in range(2):
        for g in range(3):
            seq = tokenizer(texts[b][g], add_special_tokens=False).input_ids
            seq = [*seq, tokenizer.eos_token_id][:t]
            ids[b, g, : len(seq)] = torch.tensor(seq)
    mask = response_mask_from_eos(ids, tokenizer.eos_token_id)
    ids = ids.masked_fill(~mask, tokenizer.pad_token_id)
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    return enc.input_ids, enc.attention_mask.float(), ids, mask.float(), rewards


@pytest.mark.parametrize("method", ["grpo", "dsdr", "casp", "diff_entropy", "progrpo"])
@pytest.mark.parametrize("micro", [1, 4, 6])
def test_micro_batched_update_equals_full_batch_loss(method, micro, tiny_model_path):
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    p_ids, p_mask, r_ids, r_mask, rewards = _hand_batch(tok)
    rows = build_rows(p_ids, p_mask, r_ids, r_mask)
    b, g, t = r_ids.shape
    hyper = {"kl_coef": 0.05, **({"top_n": 2} if method == "casp" else {})}
    # The behaviour policy: the same model with perturbed weights, so ratios are not 1.
    old_model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        for prm in old_model.parameters():
            prm.add_(0.05 * torch.randn(prm.shape, generator=torch.Generator().manual_seed(1)))
        old = policy_forward(old_model, rows, temperature=0.9, want_entropy=True, n_top=2,
                             want_prompt=True)  # fmt: skip
        cur = policy_forward(model, rows, temperature=0.9, want_entropy=True,
                             cand_ids=old.cand_ids)  # fmt: skip
    fixed = {
        "rewards": rewards,
        "mask": r_mask,
        "logp_old": old.logp.reshape(b, g, t),
        "logp_ref": old.logp.reshape(b, g, t) - 0.1,
        "sampled_rank": sampled_rank(old.cand_ids, rows.response_ids).reshape(b, g, t),
        "diversity": torch.tensor([[0.2, 0.9, 0.4], [0.1, 0.7, 0.3]]),
        "prompt_logp": old.prompt_logp[::g],
        "prompt_mask": p_mask[:, 1:] * p_mask[:, :-1],
    }
    needs = shaping.METHODS[method].needs_for(**hyper)
    fixed = {k: v for k, v in fixed.items() if k in {"rewards", "mask", "logp_old", *needs}}

    model.zero_grad()
    loss, _, _ = accumulate_gradients(model, rows, fixed, cur, method=method, hyper=hyper,
                                      temperature=0.9, micro_batch_size=micro)  # fmt: skip
    grads = [p.grad.clone() for p in model.parameters()]

    # Reference: one full-batch forward with grad, the shaping core's loss, plain backward.
    model.zero_grad()
    full = policy_forward(model, rows, temperature=0.9, want_entropy=True, cand_ids=old.cand_ids)
    batch = {**fixed, "logp": full.logp.reshape(b, g, t)}
    if "entropy" in needs:
        batch["entropy"] = full.entropy.reshape(b, g, t)
    if "cand_logp" in needs:
        batch["cand_logp"] = full.cand_logp.reshape(b, g, t, -1)
    ref_loss, _ = shaping.METHODS[method].loss(batch, **hyper)
    ref_loss.backward()
    # Micro-batching sums the same per-token terms in another order (tests/tolerance.py): the
    # chain of fp32 reductions is the tokens, the vocabulary, the hidden and MLP widths.
    cfg = model.config
    n = rows.input_ids.numel() + cfg.vocab_size + cfg.hidden_size + cfg.intermediate_size
    assert_close(loss, ref_loss, dtype="float32", n=n)
    assert float(ref_loss.detach()) != 0.0
    for got, want in zip(grads, (p.grad for p in model.parameters()), strict=True):
        assert_close(got, want, dtype="float32", n=n, elementwise=True)

    # And the NumPy evaluation of the same batch by the shaping core gives the same value: the
    # torch loss rounds its aggregation over the B x G x T tokens in float32.
    np_batch = {k: v.detach().double().numpy() for k, v in batch.items()}
    np_loss, _ = shaping.METHODS[method].loss(np_batch, **hyper)
    assert_close(loss, np_loss, dtype="float32", n=n)


def test_data_order_is_a_permutation_per_epoch():
    first = data_indices(0, 10, 10, seed=3)
    assert sorted(first) == list(range(10))
    assert data_indices(4, 8, 10, seed=3) == first[4:] + data_indices(10, 2, 10, seed=3)


def test_sampled_rank():
    cand = torch.tensor([[[5, 2, 7], [1, 2, 3]]])
    resp = torch.tensor([[2, 9]])
    assert sampled_rank(cand, resp).tolist() == [[1, 3]]


def test_rollout_is_weight_truncates_and_ignores_padding():
    from llm.train.behaviour import rollout_is_weight

    logp_old = torch.tensor([[[-1.0, -2.0, -3.0, 0.0]]])
    sampler = torch.tensor([[[-1.5, -1.0, -3.0, -9.0]]])
    mask = torch.tensor([[[1.0, 1.0, 1.0, 0.0]]])
    w = rollout_is_weight(logp_old, sampler, mask, cap=1.5)
    want = torch.tensor([[[1.5, np.exp(-1.0), 1.0, 1.0]]], dtype=w.dtype)  # e^0.5 > 1.5: capped
    torch.testing.assert_close(w, want)


def test_behaviour_keys_follow_the_method_needs():
    optional = set(shaping.BATCH_KEYS) - set(GRAD_KEYS) - set(shaping.contract.BASE_KEYS)
    assert set(PRODUCERS) == optional  # a new batch key needs its producer here
    for name, method in shaping.METHODS.items():
        needs = method.needs_for(**method.defaults)
        want = [k for k in shaping.BATCH_KEYS if k in optional and k in needs]
        assert fixed_keys(name, needs, is_weight=False) == want
        assert fixed_keys(name, needs, is_weight=True) == [*want, "is_weight"]
    with pytest.raises(ValueError, match="'made_up'"):
        fixed_keys("grpo", {"made_up"}, is_weight=False)


@pytest.mark.parametrize("method", ["grpo", "casp", "progrpo", "dsdr"])
def test_behaviour_batch_holds_what_the_method_needs(method, tiny_model_path):
    cfg = _config(tiny_model_path, method, kl_coef=0.01 if method == "grpo" else 0.0)
    needs = shaping.METHODS[method].needs_for(**cfg.loss_hyper)
    model, tok = load_model_and_tokenizer(tiny_model_path, "cpu")
    prompts = ["numbers 3 4 5 target 12", "numbers 2 7 target 9"]
    gen = torch.Generator().manual_seed(0)
    roll = HFGenerateBackend(model, tok).generate(prompts, 4, max_new_tokens=5, generator=gen)
    rewards = torch.zeros(2, 4)
    div = [[0.5] * 4] * 2 if method == "dsdr" else None
    ref = model if "logp_ref" in needs else None
    beh = behaviour_batch(model, ref, roll, rewards, cfg=cfg, needs=needs, diversity=div)
    extra = set(needs) - set(GRAD_KEYS) | {"is_weight"}  # HF gives sampler log-probs
    assert set(beh.fixed) == {"rewards", "mask", "logp_old"} | extra
    shaping.contract.check_batch(method, beh.fixed)
    if "logp_ref" in needs:  # the reference is the policy itself here
        torch.testing.assert_close(beh.fixed["logp_ref"], beh.fixed["logp_old"])
    with pytest.raises(ValueError, match="diversity"):
        behaviour_batch(model, None, roll, rewards, cfg=_config(tiny_model_path, "dsdr"),
                        needs=frozenset({"diversity"}))  # fmt: skip


def test_mini_batches_and_rollout_is_metrics(tiny_model_path, tmp_path):
    cfg = _config(
        tiny_model_path, "grpo", prompts_per_step=4, prompts_per_update=2, inner_epochs=2,
        steps=1, entropy_coef=0.01, top_p=0.9,
    )  # fmt: skip
    assert cfg.loss_hyper["entropy_coef"] == 0.01
    (h,) = train(
        cfg, tmp_path, backend_factory=lambda c, m, t: PlantingBackend(m, t), progress=False
    )
    assert h["charts/optimizer_steps"] == 4  # 2 epochs x 2 mini-batches
    # top-p renormalizes the sampler: its log-probs exceed the trainer's, weights drop below 1.
    assert 0 < h["charts/is_weight_mean"] < 1
    assert h["charts/sampler_logp_gap"] > 0 and h["charts/sampler_kl"] >= 0
    off = _config(tiny_model_path, "grpo", steps=1, rollout_is="none")
    (h_off,) = train(
        off, tmp_path / "off", backend_factory=lambda c, m, t: PlantingBackend(m, t),
        progress=False,
    )  # fmt: skip
    assert "charts/is_weight_mean" not in h_off


def test_max_prompt_tokens_drops_long_prompts(tiny_model_path, tmp_path):
    # Compact prompts are `<bos> nums a b c target t :` (8 tokens with 3 numbers, 9 with 4).
    cfg = _config(
        tiny_model_path, "grpo", steps=1, max_prompt_tokens=8,
        data={"source": "generate", "n_problems": 8, "num_numbers": [3, 4], "max_number": 9,
              "max_target": MAX_NUMBER},
    )  # fmt: skip
    with pytest.warns(UserWarning, match="dropped"):
        train(cfg, tmp_path, backend_factory=lambda c, m, t: PlantingBackend(m, t), progress=False)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_prompt_tokens=3))
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        train(cfg, tmp_path / "none", progress=False)


def test_math_task_runs_through_the_loop(tiny_model_path, tmp_path):
    cfg = config_from_dict(
        {
            "model_path": tiny_model_path,
            "task": "math",
            "template": "plain",
            "steps": 1,
            "data": {"source": "generate", "n_problems": 4},
            "eval": {"source": "generate", "n_problems": 2},
            "rollout": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 4},
            "run": {"tensorboard": False},
        }
    )
    (h,) = train(cfg, tmp_path, progress=False)
    assert h["charts/reward_mean"] == 0.0  # a random word-level model never boxes an answer
    assert latest_checkpoint(tmp_path) is not None


@pytest.mark.parametrize(
    ("precision", "checkpointing"), [("bf16-mixed", True), ("bf16", False), ("fp32", True)]
)
def test_precision_and_gradient_checkpointing(precision, checkpointing, tiny_model_path, tmp_path):
    cfg = _config(
        tiny_model_path, "grpo", steps=1, precision=precision,
        gradient_checkpointing=checkpointing,
    )  # fmt: skip
    (h,) = train(
        cfg, tmp_path, backend_factory=lambda c, m, t: PlantingBackend(m, t), progress=False
    )
    assert np.isfinite(h["losses/loss"]) and h["charts/grad_norm"] > 0


def test_checkpointing_keeps_the_gradient(tiny_model_path):
    """Activation checkpointing recomputes the forward: same gradient as without it."""
    from llm.model.load import enable_gradient_checkpointing

    grads = []
    for on in (False, True):
        model, tok = load_model_and_tokenizer(tiny_model_path, "cpu")
        if on:
            enable_gradient_checkpointing(model)
        prompt = tok(["nums 1 2 3 target 6 :"], return_tensors="pt")
        resp = torch.tensor([[[5, 6, 7, tok.eos_token_id]]])
        rows = build_rows(prompt["input_ids"], prompt["attention_mask"], resp, torch.ones(1, 1, 4))
        policy_forward(model, rows, temperature=1.0, want_entropy=True).logp.sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_one_step_on_cuda(backend, tiny_model_path, tmp_path, request):
    """The GPU path end to end on the tiny model (the transformers variant passed on an H100;
    the vLLM variant has not run). The vLLM variant builds an engine: it runs in its own process."""
    if backend == "vllm":
        pytest.importorskip("vllm")
        if not in_engine_process():
            run_in_own_process(node_of(request.node))
            return
    cfg = _config(
        tiny_model_path, "casp", steps=2, device="cuda", backend=backend,
        precision="bf16-mixed", gradient_checkpointing=True,
        vllm={"gpu_memory_utilization": 0.2, "enforce_eager": True, "dtype": "float32"},
    )  # fmt: skip
    hist = train(cfg, tmp_path, progress=False)
    for h in hist:
        assert all(np.isfinite(v) for v in h.values()), h
    if backend == "vllm":
        # float32 engine and trainer on the same weights: the mismatch is numerical noise.
        assert hist[-1]["charts/sampler_logp_gap"] < 1e-2


def test_sampler_is_behaviour_only_where_exact(tiny_model_path):
    from llm.train.behaviour import sampler_is_behaviour

    needs = frozenset()
    assert sampler_is_behaviour(_config(tiny_model_path, "grpo"), needs)
    for over in ({"precision": "bf16-mixed"}, {"top_p": 0.9}, {"inner_epochs": 2},
                 {"behaviour_pass": "always"}):  # fmt: skip
        assert not sampler_is_behaviour(_config(tiny_model_path, "grpo", **over), needs), over
    assert not sampler_is_behaviour(_config(tiny_model_path, "grpo"), {"prompt_logp"})


@pytest.mark.parametrize("method", ["entropy_bonus", "casp"])
def test_skipping_the_behaviour_pass_changes_nothing_but_rounding(
    method, tiny_model_path, tmp_path, monkeypatch
):
    """With the plain transformers sampler at fp32, its log-probs, entropies and top-N candidates
    are pi_old's: the auto mode skips the behaviour forward and trains the same step to ~1e-5."""
    import llm.train.behaviour

    calls = []
    real = llm.train.behaviour.forward_all
    monkeypatch.setattr(
        llm.train.behaviour, "forward_all", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    # Non-zero losses on a random model: the entropy bonus shapes by eta * log pi_old.
    hyper = {"alpha": 0.5, "top_n": 2} if method == "casp" else {"eta": 0.5}
    over = {"steps": 1, "hyper": hyper}
    (auto,) = train(_config(tiny_model_path, method, **over), tmp_path / "a", progress=False)
    assert calls == []
    (always,) = train(
        _config(tiny_model_path, method, behaviour_pass="always", **over), tmp_path / "b",
        progress=False,
    )  # fmt: skip
    assert calls == [1]
    # The sampler's log-probs (KV-cached decoding) and the behaviour forward pass reduce the same
    # terms in other orders: fp32 over the prompt + response positions (attention), the vocabulary
    # and the hidden and MLP widths, per layer (tests/tolerance.py), relative to each value.
    mc = json.loads((Path(tiny_model_path) / "config.json").read_text())
    positions = 20 + 12  # a compact Countdown prompt (< 20 tokens) + max_new_tokens
    n = mc["num_hidden_layers"] * (positions + mc["hidden_size"] + mc["intermediate_size"])
    n += mc["vocab_size"]
    for key in ("losses/loss", "charts/entropy", "charts/reward_mean", "charts/grad_norm"):
        assert key in auto
        assert_close(auto[key], always[key], dtype="float32", n=n, elementwise=True)
