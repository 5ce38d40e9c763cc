"""`llm/rollout/vllm_engine.py`'s calls into vLLM against the real vLLM 0.25.1: engine arguments, sampling
parameters, prompts and the `LLM` methods it calls (see `conftest.py` and `engine_stub.py`)."""

import dataclasses
import os
import warnings

import pytest

vllm = pytest.importorskip("vllm")

import pydantic  # noqa: E402
import torch  # noqa: E402
import vllm.config as vllm_config  # noqa: E402
from vllm.logprobs import FlatLogprobs  # noqa: E402

from llm.rollout.vllm_engine import PINNED_VLLM_VERSION, VLLMBackend, engine_kwargs  # noqa: E402
from tests.vllm_api.engine_stub import RecordingLLM, bind  # noqa: E402

PROMPTS = ["nums 5 target 5 :", "nums 3 4 target 7 :", "nums 2 2 2 target 6 :"]
G, MAX_NEW = 3, 6

# The engine configs that EngineArgs.create_engine_config fills from its fields (same names).
CONFIGS = (
    vllm_config.ModelConfig,
    vllm_config.CacheConfig,
    vllm_config.ParallelConfig,
    vllm_config.SchedulerConfig,
)


def test_pinned_version_is_installed():
    assert vllm.__version__.split("+")[0] == PINNED_VLLM_VERSION


def engine_kwargs_cases():
    base = {
        "dtype": "bfloat16",
        "seed": 0,
        "gpu_memory_utilization": 0.3,
        "tensor_parallel_size": 1,
        "enforce_eager": False,
        "sleep_mode": True,
        "executor_backend": "uni",
        "max_logprobs": 20,
        "max_model_len": 0,
    }
    yield base
    yield base | {"dtype": "auto", "max_model_len": 4096, "sleep_mode": False}
    yield base | {"tensor_parallel_size": 2, "executor_backend": "external_launcher"}
    yield base | {"dtype": "float32", "enforce_eager": True, "max_logprobs": 0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An existing folder: with HF_HUB_OFFLINE, EngineArgs.__post_init__ resolves `model` as a local
    path or a Hugging Face cache entry (vllm/engine/arg_utils.py)."""
    return str(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("case", list(engine_kwargs_cases()))
def test_engine_kwargs_are_engine_args(case, model_dir):
    kwargs = engine_kwargs(model_dir, **case)
    # LLM.__init__ takes them (its named parameters, the rest as **kwargs for EngineArgs) ...
    bind("__init__", **kwargs)
    # ... and passes them all to EngineArgs, whose __init__ rejects an unknown or renamed name.
    args = vllm.EngineArgs(**kwargs)
    names = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    assert kwargs.keys() <= names
    for name, value in kwargs.items():
        assert getattr(args, name) == value, name


@pytest.mark.parametrize("case", list(engine_kwargs_cases()))
def test_engine_kwargs_values_validate_in_the_engine_configs(case, model_dir):
    """Each value is valid for the config field of the same name (pydantic, as the configs check
    when the engine is built; EngineArgs itself does not), and each name has such a field."""
    kwargs = engine_kwargs(model_dir, **case)
    allow = pydantic.ConfigDict(arbitrary_types_allowed=True)
    for name, value in kwargs.items():
        owners = [c for c in CONFIGS if name in c.__pydantic_fields__]
        assert owners, f"{name}: no engine config has this field"
        for config in owners:
            annotation = config.__pydantic_fields__[name].annotation
            pydantic.TypeAdapter(annotation, config=allow).validate_python(value)


def literal_values(config, name):
    annotation = config.__pydantic_fields__[name].annotation
    values = set()
    stack = [annotation]
    while stack:
        a = stack.pop()
        if getattr(a, "__origin__", None) is not None and str(a.__origin__) == "typing.Literal":
            values |= set(a.__args__)
        stack.extend(getattr(a, "__args__", ()))
    return values


def test_engine_kwargs_choices_are_vllm_choices():
    assert "processed_logprobs" in literal_values(vllm_config.ModelConfig, "logprobs_mode")
    assert {"uni", "external_launcher"} <= literal_values(
        vllm_config.ParallelConfig, "distributed_executor_backend"
    )
    assert {"auto", "bfloat16", "float16", "float32"} <= literal_values(
        vllm_config.ModelConfig, "dtype"
    )
    # Our constructor's default equals vLLM's (the largest top_n without asking for more).
    assert vllm_config.ModelConfig.__pydantic_fields__["max_logprobs"].default == 20


def test_multiprocessing_switch_exists():
    import vllm.envs as envs

    assert "VLLM_ENABLE_V1_MULTIPROCESSING" in envs.environment_variables


@pytest.fixture
def backend_factory(monkeypatch, tok, model_dir):
    """VLLMBackend on the real vllm module with only `vllm.LLM` replaced by `RecordingLLM`."""
    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)

    def make(**kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # e.g. the version-mismatch warning
            return VLLMBackend(model_dir, tok, **kwargs)

    return make


def test_constructor_builds_engine_args(backend_factory, model_dir):
    backend = backend_factory(dtype="float32", seed=3, max_model_len=128)
    llm = backend.llm
    assert isinstance(llm, RecordingLLM)
    assert llm.engine_args.model == model_dir and llm.engine_args.seed == 3
    assert llm.engine_args.logprobs_mode == "processed_logprobs"
    assert llm.engine_args.max_model_len == 128
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    # Asleep at level 1 right away: the executor's bookkeeping holds both tags.
    assert llm.calls == [("sleep", 1), ("rpc", "sleep", {"level": 1})]
    assert llm.executor.sleeping_tags == {"weights", "kv_cache"}


def test_sleep_and_wake_tags_are_the_executors(backend_factory, tok):
    """Every tag we wake is one the real executor put to sleep (otherwise vLLM only logs a warning
    and wakes nothing), and generate finds it fully awake."""
    backend = backend_factory()
    llm = backend.llm
    del llm.calls[:]
    backend.generate(PROMPTS, G, max_new_tokens=MAX_NEW)
    assert llm.calls == [
        ("wake_up", "weights"),
        ("rpc", "wake_up", {"tags": ["weights"]}),
        ("wake_up", "kv_cache"),
        ("rpc", "wake_up", {"tags": ["kv_cache"]}),
        ("generate",),
        ("sleep", 1),
        ("rpc", "sleep", {"level": 1}),
    ]
    del llm.calls[:]
    model = torch.nn.Linear(2, 2)
    backend.sync_weights(model)
    assert llm.calls == [
        ("wake_up", "weights"),
        ("rpc", "wake_up", {"tags": ["weights"]}),
        ("apply_model",),
        ("reset_prefix_cache",),
    ]
    assert llm.executor.sleeping_tags == {"kv_cache"}  # the KV cache waits for generate
    backend.generate(PROMPTS, G, max_new_tokens=MAX_NEW)
    assert llm.executor.sleeping_tags == {"weights", "kv_cache"}


@pytest.mark.parametrize("top_n", [0, 4])
def test_generate_builds_real_sampling_params(backend_factory, tok, top_n):
    backend = backend_factory(sleep_mode=False)
    gen = torch.Generator().manual_seed(0)
    batch = backend.generate(
        PROMPTS,
        G,
        max_new_tokens=MAX_NEW,
        temperature=0.7,
        top_p=0.9,
        top_n=top_n,
        generator=gen,
    )
    args = backend.llm.generate_arguments
    assert args["use_tqdm"] is False
    params = args["sampling_params"]
    for b, sp in enumerate(params):
        assert isinstance(sp, vllm.SamplingParams)
        assert (sp.n, sp.temperature, sp.top_p, sp.top_k) == (G, 0.7, 0.9, 0)
        assert (sp.max_tokens, sp.logprobs, sp.num_logprobs) == (MAX_NEW, top_n, top_n)
        assert sp.detokenize is False and sp.stop == []
        assert sp.flat_logprobs is True  # the outputs below are FlatLogprobs
        assert tok.eos_token_id in sp.all_stop_token_ids
        assert sp.seed == params[0].seed + b * G  # children get seed + g: all distinct
        # Sampling, not greedy (vLLM turns temperature < 1e-5 into greedy).
        assert sp.sampling_type != vllm.sampling_params.SamplingType.GREEDY
    seeds = [sp.seed + g for sp in params for g in range(G)]
    assert len(set(seeds)) == len(seeds)
    for p, ids in zip(args["prompts"], tok(PROMPTS)["input_ids"], strict=True):
        assert p == {"prompt_token_ids": list(ids)}
    outputs = backend.llm.last_outputs
    assert all(isinstance(c.logprobs, FlatLogprobs) for r in outputs for c in r.outputs)
    # The conversion of the real outputs: every sampled token and its log-prob.
    for b in range(len(PROMPTS)):
        for g in range(G):
            sampled = backend.llm.sampled[b, g]
            T = len(sampled.tokens)
            assert batch.response_ids[b, g, :T].tolist() == sampled.tokens
            assert batch.response_mask[b, g].sum() == T
            assert torch.allclose(batch.logp[b, g, :T], torch.tensor(sampled.logp), atol=1e-6)
            if top_n:
                assert batch.cand_ids[b, g, :T].tolist() == sampled.top_ids
    assert (batch.cand_ids is None) == (top_n == 0)


def test_generate_without_generator_leaves_seeds_to_vllm(backend_factory):
    backend = backend_factory(sleep_mode=False)
    backend.generate(PROMPTS[:1], G, max_new_tokens=MAX_NEW)
    (sp,) = backend.llm.generate_arguments["sampling_params"]
    assert sp.seed is None


def test_sampling_params_reject_a_renamed_argument(model_dir):
    """The guard the tests above rely on: an unknown keyword is a TypeError, not ignored."""
    with pytest.raises(TypeError):
        vllm.SamplingParams(n=1, max_new_tokens=4)
    with pytest.raises(TypeError):
        vllm.EngineArgs(model=model_dir, sleep_mode=True)


@pytest.mark.parametrize(
    ("method", "args", "kwargs"),
    [
        # The calls in llm/rollout/vllm_engine.py, as written there.
        ("sleep", (), {"level": 1}),
        ("wake_up", (), {"tags": ["weights"]}),
        ("wake_up", (), {"tags": ["kv_cache"]}),
        ("apply_model", (lambda model: None,), {}),
        ("reset_prefix_cache", (), {}),
        ("generate", ([{"prompt_token_ids": [1, 2]}],), {"sampling_params": [], "use_tqdm": False}),
    ],
)
def test_llm_methods_accept_our_arguments(method, args, kwargs):
    bind(method, *args, **kwargs)


def test_llm_method_binding_catches_a_wrong_argument():
    with pytest.raises(TypeError):
        bind("wake_up", tag="weights")
    with pytest.raises(TypeError):
        bind("generate", [], params=[])
