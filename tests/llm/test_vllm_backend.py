"""The vLLM rollout backend: the pure output conversion and the engine glue on CPU (stand-ins for
vLLM's objects and a fake `vllm` module), and, on a CUDA machine with vLLM, the real engine
against a transformers forward pass (`pytest -m gpu`)."""

import copy
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import llm.rollout.vllm_engine as vb
from llm.model.tiny import TinyConfig, build_tiny_model, build_tokenizer, tiny_problems
from llm.rollout.base import RolloutBackend, RolloutBatch, response_mask_from_eos
from llm.rollout.hf import sequence_logp
from llm.rollout.vllm_engine import (
    PINNED_VLLM_VERSION,
    VLLMBackend,
    iter_full_parameters,
    request_seeds,
    rollout_batch_from_outputs,
    vllm_param_name,
)
from llm.tasks import make_prompt
from tests.conftest import own_process

B, G, MAX_NEW = 3, 4, 10


# --------------------------------------------------------------------------------------------------
# Stand-ins with the attributes of vllm.logprobs.Logprob, vllm.outputs.CompletionOutput and
# vllm.outputs.RequestOutput that the conversion reads.


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    text: str = ""
    finish_reason: str | None = "stop"


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


def vllm_position(logprobs: torch.Tensor, sampled: int, n: int) -> dict[int, Logprob]:
    """One position's dict built by vLLM's rules (vllm/logprobs.py:append_logprobs_for_next_position
    and vllm/v1/worker/gpu/sample/logprob.py:compute_topk_logprobs): the sampled token first with
    its vocabulary rank (#entries >= its value), then the top-n with ranks 1..n, a sampled token
    inside the top-n overwritten by its top-n entry."""
    rank = int((logprobs >= logprobs[sampled]).sum())
    d = {sampled: Logprob(float(logprobs[sampled]), rank)}
    if n:
        values, ids = torch.topk(logprobs, n)
        for r, (v, i) in enumerate(zip(values.tolist(), ids.tolist(), strict=True), start=1):
            d[i] = Logprob(v, r)
    return d


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(100)


def completion(index, tokens, n, vocab, seed):
    """A completion over random per-position distributions, with vLLM-style log-prob dicts."""
    g = torch.Generator().manual_seed(seed)
    table = torch.log_softmax(torch.randn(len(tokens), vocab, generator=g), dim=-1)
    lps = [vllm_position(table[t], tok_id, n) for t, tok_id in enumerate(tokens)]
    return CompletionOutput(index, list(tokens), lps), table


# --------------------------------------------------------------------------------------------------
# Pure conversion


def test_conversion_shapes_padding_and_values(tok):
    V, N = len(tok), 3
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompts = ["nums 1 2 3 target 6 :", "nums 5 target 5 :"]
    prompt_ids = [tok(p)["input_ids"] for p in prompts]
    words = [tok.convert_tokens_to_ids(w) for w in ("(", "1", "+", "2", ")", "<answer>")]
    token_lists = [
        [[words[0], words[1], eos], [words[2], words[3], words[4], words[5], words[1]]],
        [[eos], [words[1], words[2], eos]],
    ]
    outputs, tables = [], {}
    for b, groups in enumerate(token_lists):
        outs = []
        for g, tokens in enumerate(groups):
            c, table = completion(g, tokens, N, V, seed=10 * b + g)
            outs.append(c)
            tables[b, g] = table
        outputs.append(RequestOutput(prompt_ids[b], outs))

    batch = rollout_batch_from_outputs(prompts, prompt_ids, outputs, 2, N, pad, eos, tok)
    assert isinstance(batch, RolloutBatch) and batch.group_size == 2
    T = 5
    assert batch.response_ids.shape == (2, 2, T) and batch.response_ids.dtype == torch.long
    assert batch.response_mask.shape == batch.logp.shape == (2, 2, T)
    assert batch.cand_ids.shape == batch.cand_logp.shape == (2, 2, T, N)
    assert batch.entropy is None
    # Prompts: left-padded, mask on the tokens.
    P = max(len(ids) for ids in prompt_ids)
    assert batch.prompt_ids.shape == batch.prompt_mask.shape == (2, P)
    for b, ids in enumerate(prompt_ids):
        assert batch.prompt_ids[b, P - len(ids) :].tolist() == ids
        assert batch.prompt_ids[b, : P - len(ids)].eq(pad).all()
        assert batch.prompt_mask[b].tolist() == [0.0] * (P - len(ids)) + [1.0] * len(ids)
    # Responses: right-padded; the mask includes EOS and equals the EOS rule of the contract.
    for b, groups in enumerate(token_lists):
        for g, tokens in enumerate(groups):
            L = len(tokens)
            assert batch.response_ids[b, g, :L].tolist() == tokens
            assert batch.response_ids[b, g, L:].eq(pad).all()
            assert batch.response_mask[b, g].tolist() == [1.0] * L + [0.0] * (T - L)
            table = tables[b, g]
            expected = table[torch.arange(L), torch.tensor(tokens)]
            torch.testing.assert_close(batch.logp[b, g, :L], expected)
            assert batch.logp[b, g, L:].eq(0).all()
            values, ids = torch.topk(table, N, dim=-1)  # rank 1 first
            assert batch.cand_ids[b, g, :L].tolist() == ids.tolist()
            torch.testing.assert_close(batch.cand_logp[b, g, :L], values)
            assert batch.cand_ids[b, g, L:].eq(pad).all() and batch.cand_logp[b, g, L:].eq(0).all()
    assert torch.equal(
        batch.response_mask.bool(),
        response_mask_from_eos(batch.response_ids, eos) & (batch.response_ids != pad),
    )
    # Texts: special tokens skipped, as HFGenerateBackend decodes.
    assert batch.texts[0][0] == "( 1"
    assert batch.texts[1][0] == ""
    assert batch.texts[0][1] == "+ 2 ) <answer> 1"


def test_conversion_sampled_token_outside_top_n(tok):
    V, N = len(tok), 2
    logprobs = torch.log_softmax(torch.linspace(3.0, -3.0, V), dim=-1)  # rank r is id r - 1
    sampled = 7  # rank 8, outside the top 2
    d = vllm_position(logprobs, sampled, N)
    assert len(d) == N + 1 and d[sampled].rank == 8
    assert next(iter(d)) == sampled  # vLLM inserts the sampled token first
    out = [RequestOutput([1], [CompletionOutput(0, [sampled], [d])])]
    batch = rollout_batch_from_outputs(["x"], [[1]], out, 1, N, 0, tok.eos_token_id, tok)
    assert batch.cand_ids[0, 0, 0].tolist() == [0, 1]
    torch.testing.assert_close(batch.cand_logp[0, 0, 0], logprobs[:2])
    torch.testing.assert_close(batch.logp[0, 0, 0], logprobs[sampled])


def test_conversion_sampled_token_inside_top_n_and_rank_order(tok):
    N = 3
    # Entries inserted out of rank order (as vLLM's dict may be): the sampled token (rank 2) first.
    d = {5: Logprob(-1.0, 2), 9: Logprob(-0.5, 1), 4: Logprob(-3.0, 3)}
    out = [RequestOutput([1], [CompletionOutput(0, [5], [d])])]
    batch = rollout_batch_from_outputs(["x"], [[1]], out, 1, N, 0, tok.eos_token_id, tok)
    assert batch.cand_ids[0, 0, 0].tolist() == [9, 5, 4]
    assert batch.cand_logp[0, 0, 0].tolist() == [-0.5, -1.0, -3.0]
    assert batch.logp[0, 0, 0].item() == -1.0


def test_conversion_keeps_minus_inf_candidates(tok):
    # Under top-p, vLLM's processed log-probs of removed tokens are -inf; candidates keep them.
    d = {5: Logprob(0.0, 1), 9: Logprob(float("-inf"), 2)}
    out = [RequestOutput([1], [CompletionOutput(0, [5], [d])])]
    batch = rollout_batch_from_outputs(["x"], [[1]], out, 1, 2, 0, tok.eos_token_id, tok)
    assert batch.cand_logp[0, 0, 0].tolist() == [0.0, float("-inf")]


def test_conversion_prompt_major_order_by_index(tok):
    V = len(tok)
    outputs = []
    for b in range(B):
        outs = [completion(g, [10 + b * G + g], 0, V, seed=b * G + g)[0] for g in range(G)]
        outputs.append(RequestOutput([1], list(reversed(outs))))  # index order not list order
    batch = rollout_batch_from_outputs(
        ["p"] * B, [[1]] * B, outputs, G, 0, tok.pad_token_id, tok.eos_token_id, tok
    )
    assert batch.response_ids[:, :, 0].tolist() == [
        [10 + b * G + g for g in range(G)] for b in range(B)
    ]
    assert batch.cand_ids is None and batch.cand_logp is None


def test_conversion_cuts_after_first_eos(tok):
    eos, V = tok.eos_token_id, len(tok)
    c, table = completion(0, [11, eos, 12, 13], 0, V, seed=0)
    batch = rollout_batch_from_outputs(
        ["x"], [[1]], [RequestOutput([1], [c])], 1, 0, tok.pad_token_id, eos, tok
    )
    assert batch.response_ids[0, 0].tolist() == [11, eos]
    assert batch.response_mask[0, 0].tolist() == [1.0, 1.0]
    torch.testing.assert_close(batch.logp[0, 0], table[[0, 1], [11, eos]])


@pytest.mark.parametrize(
    "case",
    ["group_size", "no_logprobs", "short_logprobs", "sampled_missing", "few_candidates", "lengths"],
)
def test_conversion_errors(tok, case):
    good = {7: Logprob(-0.1, 1), 8: Logprob(-2.0, 2)}
    outputs = [RequestOutput([1], [CompletionOutput(0, [7], [good])])]
    group_size, top_n, prompts = 1, 2, ["x"]
    if case == "group_size":
        group_size = 2
    elif case == "no_logprobs":
        outputs[0].outputs[0].logprobs = None
    elif case == "short_logprobs":
        outputs[0].outputs[0].token_ids = [7, 8]
    elif case == "sampled_missing":
        outputs[0].outputs[0].token_ids = [9]
    elif case == "few_candidates":
        top_n = 3
    elif case == "lengths":
        prompts = ["x", "y"]
    with pytest.raises(ValueError):
        rollout_batch_from_outputs(
            prompts, [[1]], outputs, group_size, top_n, 0, tok.eos_token_id, tok
        )


# --------------------------------------------------------------------------------------------------
# Weights and seeds


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("module.model.norm.weight", "model.norm.weight"),
        ("_orig_mod.model.norm.weight", "model.norm.weight"),
        ("module._orig_mod.lm_head.weight", "lm_head.weight"),
        (
            "model.layers.1._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.up_proj.weight",
            "model.layers.1.mlp.up_proj.weight",
        ),
    ],
)
def test_vllm_param_name(name, expected):
    assert vllm_param_name(name) == expected


class DDPLike(torch.nn.Module):
    """Registers the model as `module`, as DistributedDataParallel does."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def small_model(tok):
    return build_tiny_model(
        tok,
        seed=0,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    )


def test_iter_full_parameters_strips_wrappers_and_streams(tok):
    model = small_model(tok)
    plain = dict(model.named_parameters())
    assert "lm_head.weight" not in plain  # tied: named_parameters yields it once
    for wrapped in (model, DDPLike(model), torch.compile(model), DDPLike(torch.compile(model))):
        items = iter_full_parameters(wrapped)
        assert not isinstance(items, list | tuple)
        got = dict(items)
        assert got.keys() == plain.keys()
        for name, tensor in got.items():
            assert not tensor.requires_grad
            assert tensor.data_ptr() == plain[name].data_ptr()  # no copy


def test_iter_full_parameters_gathers_dtensors():
    class ShardLike:
        """What FSDP2 parameters answer: `detach()` keeps the DTensor, `full_tensor()` gathers."""

        def detach(self):
            return self

        def full_tensor(self):
            return torch.arange(4.0)

    class Sharded(torch.nn.Module):
        def named_parameters(self, *args, **kwargs):
            yield "module.model.norm.weight", ShardLike()

    ((name, tensor),) = list(iter_full_parameters(Sharded()))
    assert name == "model.norm.weight" and torch.equal(tensor, torch.arange(4.0))


def test_request_seeds():
    assert request_seeds(None, 3, G) == [None] * 3
    a = request_seeds(torch.Generator().manual_seed(1), 3, G)
    assert a == request_seeds(torch.Generator().manual_seed(1), 3, G)
    assert a != request_seeds(torch.Generator().manual_seed(2), 3, G)
    # vLLM gives child g of a request seed + g: per-prompt seeds G apart keep all B*G distinct.
    assert [s - a[0] for s in a] == [0, G, 2 * G]
    assert all(0 <= s < 2**63 for s in a)


# --------------------------------------------------------------------------------------------------
# Without vLLM


def test_module_imports_without_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    spec = importlib.util.spec_from_file_location("vllm_backend_probe", vb.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.VLLMBackend.__name__ == "VLLMBackend"


def test_constructor_without_vllm_raises_import_error(monkeypatch, tok):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"CUDA machine.*gpu extra"):
        VLLMBackend("unused", tok)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpu_memory_utilization": 0.0},
        {"gpu_memory_utilization": 1.5},
        {"tensor_parallel_size": 0},
        {"max_model_len": -1},
        {"max_logprobs": -1},
    ],
)
def test_constructor_validates_before_importing(monkeypatch, tok, kwargs):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ValueError):
        VLLMBackend("unused", tok, **kwargs)


def test_constructor_needs_pad_and_eos(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ValueError, match="pad_token_id"):
        VLLMBackend("unused", types.SimpleNamespace(pad_token_id=None, eos_token_id=2))


# --------------------------------------------------------------------------------------------------
# The engine glue against a fake `vllm` module (call order, engine arguments, sampling parameters)


class FakeEngineModel:
    """Records what `load_weights` receives, consuming the iterator lazily like vLLM's loader."""

    def __init__(self):
        self.loaded = {}

    def load_weights(self, weights):
        assert not isinstance(weights, list | tuple | dict)  # streamed
        for name, tensor in weights:
            self.loaded[name] = tensor
        return set(self.loaded)


class FakeLLM:
    """`vllm.LLM` with the calls VLLMBackend makes; samples from seeded random distributions."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []
        self.engine_model = FakeEngineModel()
        self.llm_engine = types.SimpleNamespace(model_executor=object())

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", *tags))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))
        return True

    def apply_model(self, func):
        self.calls.append(("apply_model",))
        return [func(self.engine_model)]

    def generate(self, prompts, sampling_params, *, use_tqdm):
        self.calls.append(("generate",))
        self.last_params = sampling_params
        assert len(prompts) == len(sampling_params) and not use_tqdm
        return [self._request(p, sp) for p, sp in zip(prompts, sampling_params, strict=True)]

    def _request(self, prompt, sp, vocab=40):
        outs = []
        for g in range(sp.n):
            seed = sp.seed + g if sp.seed is not None else int(torch.randint(0, 2**31, (1,)))
            rng = torch.Generator().manual_seed(seed + 1000 * prompt["prompt_token_ids"][-1])
            tokens, lps = [], []
            for _ in range(sp.max_tokens):
                logprobs = torch.log_softmax(torch.randn(vocab, generator=rng) / sp.temperature, -1)
                token = int(torch.multinomial(logprobs.exp(), 1, generator=rng))
                tokens.append(token)
                lps.append(vllm_position(logprobs, token, sp.logprobs or 0))
                if token in sp.stop_token_ids:
                    break
            # logprobs=None (texts only): vLLM builds no per-token dicts.
            outs.append(CompletionOutput(g, tokens, None if sp.logprobs is None else lps))
        return RequestOutput(prompt["prompt_token_ids"], outs[::-1])


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.__version__ = PINNED_VLLM_VERSION
    module.LLM = FakeLLM
    module.SamplingParams = types.SimpleNamespace
    module.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", module)
    # The constructor sets it; monkeypatch restores the environment afterwards.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    return module


@pytest.fixture
def prompts():
    problems = tiny_problems(TinyConfig(), "heldout", 2)
    return [
        make_prompt(problems[0], "compact"),
        "nums 5 target 5 :",
        make_prompt(problems[1], "compact"),
    ]


def test_engine_arguments(fake_vllm, tok):
    backend = VLLMBackend("/models/tiny", tok, dtype="float32", seed=3)
    kw = backend.llm.kwargs
    assert kw["model"] == "/models/tiny" and kw["dtype"] == "float32" and kw["seed"] == 3
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert kw["enable_sleep_mode"] is True and kw["gpu_memory_utilization"] == 0.3
    assert kw["distributed_executor_backend"] == "uni" and kw["tensor_parallel_size"] == 1
    assert kw["max_logprobs"] == 20 and "max_model_len" not in kw
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert backend.llm.calls == [("sleep", 1)]  # asleep until the first rollout
    assert isinstance(backend, RolloutBackend)
    backend = VLLMBackend("/models/tiny", tok, max_model_len=64, sleep_mode=False)
    assert backend.llm.kwargs["max_model_len"] == 64 and backend.llm.calls == []


def test_tensor_parallel_needs_torchrun(fake_vllm, tok, monkeypatch):
    with pytest.raises(ValueError, match="torchrun"):
        VLLMBackend("/models/tiny", tok, tensor_parallel_size=2)
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    for k, v in {**env, "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    backend = VLLMBackend("/models/tiny", tok, tensor_parallel_size=2)
    assert backend.llm.kwargs["distributed_executor_backend"] == "external_launcher"


def test_version_mismatch_warns(fake_vllm, tok):
    fake_vllm.__version__ = "0.0.1"
    with pytest.warns(UserWarning, match=PINNED_VLLM_VERSION):
        VLLMBackend("/models/tiny", tok)


def test_sleep_wake_order(fake_vllm, tok, prompts):
    backend = VLLMBackend("/models/tiny", tok)
    calls = backend.llm.calls
    backend.generate(prompts, G, max_new_tokens=MAX_NEW)
    assert calls[1:] == [
        ("wake_up", "weights"),
        ("wake_up", "kv_cache"),
        ("generate",),
        ("sleep", 1),
    ]
    del calls[:]
    backend.sync_weights(small_model(tok))
    # Only the weights wake for loading; the prefix cache is reset after the load.
    assert calls == [("wake_up", "weights"), ("apply_model",), ("reset_prefix_cache",)]
    del calls[:]
    backend.generate(prompts, G, max_new_tokens=MAX_NEW)
    assert calls == [("wake_up", "kv_cache"), ("generate",), ("sleep", 1)]


def test_no_sleep_mode_never_sleeps(fake_vllm, tok, prompts):
    backend = VLLMBackend("/models/tiny", tok, sleep_mode=False)
    backend.generate(prompts, G, max_new_tokens=MAX_NEW)
    backend.sync_weights(small_model(tok))
    assert [c[0] for c in backend.llm.calls] == ["generate", "apply_model", "reset_prefix_cache"]


def test_sync_weights_streams_named_parameters(fake_vllm, tok):
    backend = VLLMBackend("/models/tiny", tok)
    model = small_model(tok)
    backend.sync_weights(DDPLike(torch.compile(model)))
    loaded = backend.llm.engine_model.loaded
    assert loaded.keys() == dict(model.named_parameters()).keys()
    assert all(loaded[n].data_ptr() == p.data_ptr() for n, p in model.named_parameters())


def test_generate_sampling_params_and_reproducibility(fake_vllm, tok, prompts):
    backend = VLLMBackend("/models/tiny", tok, sleep_mode=False)

    def sample(seed, **kw):
        gen = torch.Generator().manual_seed(seed)
        return backend.generate(prompts, G, max_new_tokens=MAX_NEW, generator=gen, **kw)

    batch = sample(0, temperature=0.7, top_p=0.9, top_n=4)
    params = backend.llm.last_params
    assert len(params) == len(prompts)
    for b, sp in enumerate(params):
        assert (sp.n, sp.temperature, sp.top_p, sp.top_k) == (G, 0.7, 0.9, 0)
        assert (sp.max_tokens, sp.logprobs, sp.detokenize) == (MAX_NEW, 4, False)
        assert sp.flat_logprobs is True  # FlatLogprobs: no Logprob object per token
        assert sp.stop_token_ids == [tok.eos_token_id]
        assert sp.seed == params[0].seed + b * G
    assert batch.prompt_ids.shape[0] == len(prompts) and batch.group_size == G
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt")
    assert torch.equal(batch.prompt_ids, enc.input_ids)  # as HFGenerateBackend tokenizes
    assert torch.equal(batch.prompt_mask, enc.attention_mask.float())
    assert batch.cand_ids.shape == (*batch.logp.shape, 4)

    again = sample(0, temperature=0.7, top_p=0.9, top_n=4)
    assert torch.equal(batch.response_ids, again.response_ids)
    assert torch.equal(batch.logp, again.logp)
    other = sample(1, temperature=0.7, top_p=0.9, top_n=4)
    assert not torch.equal(batch.response_ids, other.response_ids)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"group_size": 0},
        {"max_new_tokens": 0},
        {"temperature": 0.0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_n": -1},
        {"top_n": 21},
    ],
)
def test_generate_validates(fake_vllm, tok, prompts, kwargs):
    backend = VLLMBackend("/models/tiny", tok)
    args = {"group_size": G, "max_new_tokens": MAX_NEW, **kwargs}
    group_size = args.pop("group_size")
    with pytest.raises(ValueError):
        backend.generate(prompts, group_size, **args)
    with pytest.raises(ValueError):
        backend.generate([], G, max_new_tokens=MAX_NEW)


# --------------------------------------------------------------------------------------------------
# GPU: the real engine (vLLM 0.25.1) against transformers. One engine per process (vLLM's CuMem
# allocator serves one sleep-mode engine, and its executor initializes torch.distributed): each
# engine test runs in a fresh process of its own (`own_process`) and builds its own engine there.


def _vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and _vllm_importable()), reason="needs CUDA and vLLM"
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A randomly initialized tiny model with a boosted EOS: at temperature 0.7 and 10 new tokens,
    transformers' sampler gives response lengths spread over 1..10 (checked with seeds 0-2)."""
    tok = build_tokenizer(100)
    model = build_tiny_model(tok, seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight[tok.eos_token_id] *= 5.0
    path = tmp_path_factory.mktemp("tiny_vllm")
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).cuda().eval()


@pytest.fixture
def engine(tiny_dir):
    """A fresh engine on `tiny_dir` for one test (in that test's own process: `own_process`)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(tiny_dir)
    backend = VLLMBackend(
        str(tiny_dir),
        tok,
        gpu_memory_utilization=0.2,
        sleep_mode=True,
        max_model_len=TinyConfig.max_position_embeddings,
        enforce_eager=True,
        dtype="float32",  # compared with a float32 transformers forward
        seed=0,
    )
    yield backend
    del backend
    torch.cuda.empty_cache()


def gpu_prompts():
    problems = tiny_problems(TinyConfig(), "heldout", 3)
    return [make_prompt(p, "compact") for p in problems]


def gpu_sample(engine, seed=0, **kw):
    kw.setdefault("max_new_tokens", MAX_NEW)
    gen = torch.Generator().manual_seed(seed)
    return engine.generate(gpu_prompts(), G, generator=gen, **kw)


def reference_logp(model, batch, temperature):
    with torch.no_grad():
        return sequence_logp(
            model,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.response_ids,
            batch.response_mask,
            temperature=temperature,
        ).cpu()


@pytest.mark.gpu
@gpu
@own_process
def test_gpu_logp_matches_transformers(engine, hf_model):
    # temperature != 1 checks that the log-probs are the processed (sampling) distribution's.
    batch = gpu_sample(engine, temperature=0.7, top_n=5)
    mask = batch.response_mask.bool()
    assert mask.any() and batch.entropy is None
    ends = batch.response_mask.sum(-1)
    assert (ends < batch.response_ids.shape[-1]).any()  # some responses end with EOS
    ref = reference_logp(hf_model, batch, 0.7)
    torch.testing.assert_close(batch.logp[mask], ref[mask], atol=2e-3, rtol=0)
    # Candidates: rank 1 first, the sampled token's log-prob at most the best one.
    assert (batch.cand_logp[..., :-1] >= batch.cand_logp[..., 1:]).all()
    assert (batch.cand_logp[..., 0][mask] >= batch.logp[mask] - 1e-5).all()


@pytest.mark.gpu
@gpu
@own_process
def test_gpu_top_p_renormalizes(engine, hf_model):
    batch = gpu_sample(engine, seed=1, temperature=1.0, top_p=0.8, top_n=5)
    mask = batch.response_mask.bool()
    ref = reference_logp(hf_model, batch, 1.0)
    # Top-p keeps a subset and renormalizes: kept tokens gain probability.
    assert (batch.logp[mask] >= ref[mask] - 2e-3).all()


@pytest.mark.gpu
@gpu
@own_process
def test_gpu_reproducible_across_sleep_cycles(engine):
    a = gpu_sample(engine, seed=2, top_n=3)
    assert engine.llm.llm_engine.is_sleeping()  # slept after the rollout
    b = gpu_sample(engine, seed=2, top_n=3)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.logp, b.logp, atol=1e-5, rtol=0)
    c = gpu_sample(engine, seed=3, top_n=3)
    assert not torch.equal(a.response_ids, c.response_ids)


@pytest.mark.gpu
@gpu
@own_process
def test_gpu_sync_weights_follows_the_trainer(engine, hf_model):
    perturbed = copy.deepcopy(hf_model)
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.5 * p.std() * torch.randn(p.shape, generator=gen, device=p.device))
    engine.sync_weights(DDPLike(perturbed))  # names with the DDP prefix
    batch = gpu_sample(engine, seed=4, temperature=0.8)
    mask = batch.response_mask.bool()
    new_ref = reference_logp(perturbed, batch, 0.8)
    old_ref = reference_logp(hf_model, batch, 0.8)
    torch.testing.assert_close(batch.logp[mask], new_ref[mask], atol=2e-3, rtol=0)
    assert (batch.logp[mask] - old_ref[mask]).abs().max() > 0.1

    # Back to the original weights (through a torch.compile wrapper): every parameter overwritten.
    engine.sync_weights(torch.compile(hf_model))
    batch = gpu_sample(engine, seed=4, temperature=0.8)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(
        batch.logp[mask], reference_logp(hf_model, batch, 0.8)[mask], atol=2e-3, rtol=0
    )


def test_generate_texts_only(fake_vllm, tok, prompts):
    backend = VLLMBackend("/models/tiny", tok, sleep_mode=False)
    gen = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    full = backend.generate(prompts, G, max_new_tokens=MAX_NEW, generator=gen())
    texts = backend.generate(
        prompts, G, max_new_tokens=MAX_NEW, generator=gen(), want_logprobs=False
    )
    assert all(sp.logprobs is None and not sp.flat_logprobs for sp in backend.llm.last_params)
    assert texts.texts == full.texts and torch.equal(texts.response_ids, full.response_ids)
    assert texts.logp[texts.response_mask.bool()].isnan().all()
    with pytest.raises(ValueError, match="want_logprobs"):
        backend.generate(prompts, G, max_new_tokens=MAX_NEW, top_n=2, want_logprobs=False)


def test_stop_ids_include_the_generation_config(fake_vllm, tok, prompts, tmp_path):
    extra = tok.convert_tokens_to_ids("+")
    (tmp_path / "generation_config.json").write_text(
        f'{{"eos_token_id": [{tok.eos_token_id}, {extra}]}}'
    )
    backend = VLLMBackend(str(tmp_path), tok, sleep_mode=False)
    assert backend.stop_token_ids == [tok.eos_token_id, extra]
    batch = backend.generate(prompts, G, max_new_tokens=MAX_NEW, top_n=2)
    assert all(sp.stop_token_ids == [tok.eos_token_id, extra] for sp in backend.llm.last_params)
    ids, mask = batch.response_ids, batch.response_mask.bool()
    assert torch.equal(mask, response_mask_from_eos(ids, [tok.eos_token_id, extra]) & mask)
    # Nothing after the first stop id is kept.
    stops = torch.isin(ids, torch.tensor([tok.eos_token_id, extra])) & mask
    assert (stops.sum(-1) <= 1).all() and stops.any()


def test_evaluate_through_the_engine_texts_only_in_chunks(fake_vllm, tok):
    from llm.eval.heldout import evaluate

    backend = VLLMBackend("/models/tiny", tok, sleep_mode=False)
    calls = []
    real = backend.llm.generate

    def recording(requests, sampling_params, *, use_tqdm):
        calls.append([(sp.n, sp.logprobs) for sp in sampling_params])
        return real(requests, sampling_params, use_tqdm=use_tqdm)

    backend.llm.generate = recording
    problems = tiny_problems(TinyConfig(), "heldout", 5)
    res = evaluate(
        backend, "countdown", problems, template="compact", samples=4, max_new_tokens=6,
        prompts_per_batch=10**9, max_responses_per_call=8, bleu=False,
    )  # fmt: skip
    assert res["n_problems"] == 5
    # 2 prompts x 4 responses per call, no log-probs requested.
    assert calls == [[(4, None)] * 2, [(4, None)] * 2, [(4, None)]]


@pytest.mark.parametrize(
    ("conf", "refused"),
    [
        (None, False),
        ("max_split_size_mb:128", False),
        ("expandable_segments:False", False),
        ("expandable_segments:True", True),
        ("garbage_collection_threshold:0.6, expandable_segments: True", True),
    ],
)
def test_expandable_segments_are_refused_before_a_sleep_mode_engine(
    fake_vllm, tok, monkeypatch, conf, refused
):
    """vLLM's sleep-mode allocator fails at start-up under expandable segments: the backend
    refuses them first, naming the variable; without sleep mode they are allowed."""
    if conf is None:
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    else:
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", conf)
    if refused:
        with pytest.raises(ValueError, match=r"^PYTORCH_CUDA_ALLOC_CONF: .*expandable segments"):
            VLLMBackend("/models/tiny", tok)
    else:
        assert VLLMBackend("/models/tiny", tok).llm.calls == [("sleep", 1)]
    assert (
        VLLMBackend("/models/tiny", tok, sleep_mode=False).llm.kwargs["enable_sleep_mode"] is False
    )


@pytest.mark.parametrize(("tp", "world"), [(1, 4), (2, 4), (4, 4)])
def test_each_torchrun_engine_gets_its_own_seed(fake_vllm, tok, monkeypatch, tp, world):
    """Under torchrun every engine is seeded apart (seed + rank at tensor_parallel_size 1), the
    ranks of one tensor-parallel group alike."""
    for k, v in {"LOCAL_RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29500"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(vb, "_distributed_initialized", lambda: True)
    seeds = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        seeds.append(
            VLLMBackend("/models/tiny", tok, seed=7, tensor_parallel_size=tp).llm.kwargs["seed"]
        )
    assert seeds == [7 + r // tp for r in range(world)]
    assert len(set(seeds)) == world // tp
    assert [vb.engine_seed(7, r, tp) for r in range(world)] == seeds


def test_nccl_cumem_is_off_before_the_process_group_when_vllm_rolls_out(monkeypatch):
    """`init_distributed(..., vllm=True)` sets NCCL_CUMEM_ENABLE=0 before it initialises the
    group (recorded at the call of `init_process_group`); without vLLM the variable is left."""
    from llm.run import distributed

    seen = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda backend: seen.append((backend, os.environ.get("NCCL_CUMEM_ENABLE"))))  # fmt: skip
    for k, v in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")
    info = distributed.init_distributed("cpu")
    assert seen == [("gloo", "1")] and info.rank == 1
    info = distributed.init_distributed("cpu", vllm=True)
    assert seen[-1] == ("gloo", "0") and os.environ["NCCL_CUMEM_ENABLE"] == "0"
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")
    distributed.init_distributed("cpu", vllm=True)  # one process: set as well (vLLM's own NCCL)
    assert os.environ["NCCL_CUMEM_ENABLE"] == "0" and len(seen) == 2


def test_the_trainer_asks_for_the_vllm_guard_by_its_backend(tmp_path, monkeypatch):
    """`llm.train.trainer.train` passes ``rollout.backend == "vllm"`` to `init_distributed`."""
    import llm.train.trainer as trainer
    from llm.config import config_from_dict

    asked = []

    def stop(device, *, vllm=False):
        asked.append(vllm)
        raise RuntimeError("stop")

    monkeypatch.setattr(trainer, "init_distributed", stop)
    for backend in ("transformers", "vllm"):
        cfg = config_from_dict(
            {"method": "grpo", "rollout": {"backend": backend}, "system": {"device": "cuda"}}
        )
        with pytest.raises(RuntimeError, match="stop"):
            trainer.train(cfg, tmp_path / backend, progress=False)
    assert asked == [False, True]
