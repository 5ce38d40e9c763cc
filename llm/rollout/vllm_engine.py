"""Rollouts from an in-process vLLM engine colocated with the trainer on one GPU (see CONTRACT.md).

`VLLMBackend` implements the `RolloutBackend` protocol of `llm.rollout.base` with `vllm.LLM` running in
the trainer's process ("colocate" mode, as TRL's `VLLMGeneration`): the engine shares the GPU with
the trained model, takes the trainer's weights after every optimizer step (`sync_weights`), and,
with sleep mode, frees its KV cache and moves its weights to CPU while the trainer trains. The
conversion of vLLM's outputs into a `RolloutBatch` is the pure function
`llm.rollout.vllm_convert.rollout_batch_from_outputs`, testable on CPU with stand-in objects. Shapes: B prompts, G responses
per prompt (a group), P prompt tokens, T response tokens, N top candidates.

Pinned version: vLLM 0.25.1 (`PINNED_VLLM_VERSION`), the newest release that TRL's colocate mode
supports (huggingface/trl `pyproject.toml` extra `vllm>=0.17.0,<=0.25.1`, checked again in
`trl/import_utils.py:is_vllm_available`), so every call below has a working reference. Its
source was read from the PyPI wheel `vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl`; the calls
used here are unchanged in vLLM 0.33.0 (also read). Sources, vLLM 0.25.1 paths:
- `vllm/entrypoints/llm.py`: `LLM.__init__` (engine arguments go to `EngineArgs`), `LLM.generate`
  (a list of prompts paired one by one with a list of `SamplingParams`; outputs in prompt order),
  `LLM.apply_model` (runs a function on the model inside each worker), `LLM.reset_prefix_cache`,
  `LLM.sleep(level)` and `LLM.wake_up(tags)` with tags in `("weights", "kv_cache", "scheduling")`.
- `vllm/config/model.py`, `ModelConfig.logprobs_mode`: the default `"raw_logprobs"` are log-probs
  *before* temperature and top-k/top-p; `"processed_logprobs"` are after all processors, i.e. of
  the distribution actually sampled from (the behaviour policy). `ModelConfig.max_logprobs`
  (default 20) caps `SamplingParams.logprobs`.
- `vllm/v1/worker/gpu/sample/sampler.py`, `Sampler.__call__` / `Sampler.sample` (Model Runner V2,
  the default for dense models since 0.25.0): a float32 copy of the logits gets logit bias,
  penalties, bad words, temperature, min-p, then top-k/top-p (removed entries -inf); the token is
  drawn by Gumbel-max from a per-request seed and the position (`gumbel.py`), and with
  `processed_logprobs` the log-probs are log-softmax of exactly these processed logits.
  The V1 runner's `vllm/v1/sample/sampler.py` honours the same mode.
- `vllm/v1/worker/gpu/sample/logprob.py`, `compute_topk_logprobs`: column 0 is the sampled token,
  then `torch.topk`; the sampled token's rank is the number of entries with logit >= its logit.
- `vllm/logprobs.py`, `append_logprobs_for_next_position`: each position becomes a dict
  `{token_id: Logprob(logprob, rank, decoded_token)}` holding the sampled token with its vocabulary
  rank and the top-N with ranks 1..N; a sampled token inside the top-N is overwritten by its
  top-N entry, so a dict has N entries, or N + 1 when the sampled token is outside the top N.
  With `SamplingParams(flat_logprobs=True)` (`vllm/sampling_params.py`, read by
  `vllm/v1/engine/logprobs.py:LogprobsProcessor.from_new_request`) the positions go instead into
  one `FlatLogprobs` per completion (same file): flat lists `token_ids/logprobs/ranks/
  decoded_tokens` and per-position `start_indices/end_indices`, written by `append_fast` with the
  sampled token first and the top N after it (N + 1 entries, the sampled token repeated when
  inside the top N); `FlatLogprobs[t]` builds the dict above.
- `vllm/v1/engine/parallel_sampling.py`, `ParentRequest._get_child_sampling_params`: `n > 1` fans
  out into n child requests; child g gets `seed + g`, so per-prompt seeds are spaced G apart.
- `vllm/v1/core/sched/utils.py`, `check_stop`: the EOS (or stop) token is appended to the output
  token ids before the request stops, so responses include their EOS.
- `vllm/v1/engine/llm_engine.py`, `LLMEngine.__init__` / `from_engine_args`: with
  `VLLM_ENABLE_V1_MULTIPROCESSING=0` the engine core runs in this process (`InprocClient`), and
  `vllm/v1/executor/uniproc_executor.py`, `UniProcExecutor.collective_rpc`, calls functions directly
  (`vllm/v1/serial_utils.py:run_method`): nothing is pickled, tensors are passed by reference.
  `ExecutorWithExternalLauncher` (same file) is the torchrun variant for tensor parallelism, and
  `vllm/config/parallel.py:ParallelConfig.__post_init__` turns multiprocessing off for it.
- `vllm/v1/worker/worker_base.py`, `WorkerBase.apply_model`: `fn(self.get_model())`, the model
  unwrapped from its CUDA-graph wrapper (`vllm/v1/worker/gpu_model_runner.py:get_model`);
  `vllm/model_executor/models/llama.py`, `LlamaForCausalLM.load_weights`: Hugging Face names,
  q/k/v and gate/up stacked by the loader, `lm_head.` skipped when embeddings are tied.
- `vllm/v1/worker/gpu_worker.py`, `Worker.sleep` / `Worker.wake_up` (level 1: weights to CPU, KV
  cache discarded); `vllm/v1/engine/core.py`, `EngineCore.sleep` clears the prefix cache and
  `EngineCore.wake_up` resumes scheduling only once every tag is awake again.
- `vllm/v1/worker/utils.py`, `request_memory`: at start-up, free GPU memory must be at least
  `gpu_memory_utilization` x total memory (the trainer's share must fit in the rest).
TRL's colocate mode, huggingface/trl v1.9.0 `trl/generation/vllm_generation.py`:
`VLLMGeneration._init_vllm` (`distributed_executor_backend="external_launcher"`,
`max_num_batched_tokens=4096`, `logprobs_mode="processed_logprobs"`), `_push_param_to_vllm`
(`model.load_weights([(name, param)])` on the in-process model), `_sync_fsdp2_params_to_vllm`
(`.full_tensor()`), `_fix_param_name_to_vllm`, `sync_weights` (wake weights, load,
`reset_prefix_cache`) and `generate` (wake weights, wake KV cache, generate, sleep).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from llm.rollout.base import RolloutBatch, Sampling, check_sampling, stop_token_ids
from llm.rollout.vllm_convert import rollout_batch_from_outputs

PINNED_VLLM_VERSION = "0.25.1"

# Prefixes that wrappers add to parameter names: DDP (`module.`), torch.compile (`_orig_mod.`),
# FSDP1 (`_fsdp_wrapped_module.`) and activation checkpointing (`_checkpoint_wrapped_module.`,
# which TRL's `_fix_param_name_to_vllm` removes). The last two can sit inside a name.
_LEADING_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_INNER_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")

_INSTALL_HINT = (
    "VLLMBackend needs vLLM, which is not installed. On a CUDA machine install the gpu extra "
    f"(pip install -e '.[gpu]', vLLM {PINNED_VLLM_VERSION}), or use the transformers backend."
)


# --------------------------------------------------------------------------------------------------
# Weights and seeds


def vllm_param_name(name: str) -> str:
    """`name` with the prefixes of DDP, torch.compile, FSDP1 and activation checkpointing removed,
    i.e. the Hugging Face checkpoint name that vLLM's `load_weights` expects."""
    stripped = True
    while stripped:
        stripped = False
        for prefix in _LEADING_WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix) :], True
    for segment in _INNER_WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def iter_full_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """`(checkpoint name, full tensor)` for each parameter of `model`, one at a time.

    Streams: only one parameter is materialized at once (no state-dict copy). Tied parameters come
    once (`named_parameters` deduplicates). A sharded DTensor (FSDP2) is gathered with
    `full_tensor()`, a collective that every rank must reach in the same order. Tensors are
    detached and keep their device and dtype; vLLM's weight loaders copy (and cast) them in place.
    """
    for name, param in model.named_parameters():
        tensor = param.detach()
        # DTensor (torch.distributed.tensor) without importing torch.distributed.
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        yield vllm_param_name(name), tensor


def request_seeds(
    generator: torch.Generator | None, num_prompts: int, group_size: int
) -> list[int | None]:
    """One vLLM seed per prompt, or `None`s without `generator`.

    One base seed is drawn from `generator` (as `HFGenerateBackend` draws one), and prompt b gets
    `base + b * G`: vLLM gives completion g of a request `seed + g`, so all B*G completions have
    distinct seeds and the batch depends only on `generator`'s state.
    """
    if generator is None:
        return [None] * num_prompts
    base = int(torch.randint(0, 2**62, (1,), generator=generator))
    return [base + b * group_size for b in range(num_prompts)]


def engine_seed(seed: int, rank: int, tensor_parallel_size: int) -> int:
    """The global seed of the engine of torchrun rank `rank`: ``seed`` plus the engine's index
    (``rank // tensor_parallel_size``), so that the engines of data-parallel ranks draw apart
    (one engine per rank: ``seed + rank``) while the ranks of one tensor-parallel group, which
    form one engine, agree (TRL's colocate mode seeds each rank's engine ``seed + rank`` too)."""
    return seed + rank // tensor_parallel_size


def check_alloc_conf(conf: str | None, sleep_mode: bool) -> None:
    """Refuse ``PYTORCH_CUDA_ALLOC_CONF`` with ``expandable_segments:True`` where a sleep-mode
    engine is built: vLLM's sleep-mode allocator (its CuMem memory pool) does not work with
    expandable segments and fails at start-up (vllm/device_allocator/cumem.py).

    Raises:
        ValueError: ``PYTORCH_CUDA_ALLOC_CONF: ...`` naming the value and the way out.
    """
    if sleep_mode and conf and "expandable_segments:true" in conf.replace(" ", "").lower():
        raise ValueError(
            f"PYTORCH_CUDA_ALLOC_CONF: {conf!r} asks for expandable segments, which vLLM's "
            "sleep-mode allocator refuses; unset it (or vllm.sleep_mode = false)"
        )


def engine_kwargs(
    model_path: str,
    *,
    dtype: str,
    seed: int,
    gpu_memory_utilization: float,
    tensor_parallel_size: int,
    enforce_eager: bool,
    sleep_mode: bool,
    executor_backend: str,
    max_logprobs: int,
    max_model_len: int,
) -> dict[str, Any]:
    """The keyword arguments of `vllm.LLM(...)` in `VLLMBackend.__init__` (all of them engine
    arguments, `vllm.EngineArgs` fields); pure, so `tests/vllm_api` can check each name and value
    against the real vLLM. `max_model_len = 0` leaves it out (the model's context length)."""
    kwargs: dict[str, Any] = {
        "model": str(model_path),
        "dtype": dtype,
        "seed": seed,
        "gpu_memory_utilization": gpu_memory_utilization,
        "tensor_parallel_size": tensor_parallel_size,
        "enforce_eager": enforce_eager,
        "enable_sleep_mode": sleep_mode,
        "distributed_executor_backend": executor_backend,
        # Log-probs of the distribution sampled from (after temperature and top-p).
        "logprobs_mode": "processed_logprobs",
        "max_logprobs": max_logprobs,
        # As TRL's _init_vllm: at the default of 32768 batched tokens vLLM's memory profiler
        # finds too little memory for a colocated engine; prefills are chunked instead.
        "max_num_batched_tokens": 4096,
    }
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    return kwargs


# --------------------------------------------------------------------------------------------------
# Backend


class VLLMBackend:
    """`RolloutBackend` on an in-process `vllm.LLM` that shares the GPU with the trainer.

    Sampling: `SamplingParams(n=G, temperature, top_p, top_k=0, max_tokens, logprobs=top_n (None
    for texts only), flat_logprobs=True (False for texts only), seed, stop_token_ids,
    detokenize=False)` on token-id prompts (`TokensPrompt`),
    the stop ids those of `llm.rollout.base.stop_token_ids` (the tokenizer's EOS and the model folder's
    generation-config EOS ids, as `HFGenerateBackend` stops), so
    tokenization and decoding are the trainer's tokenizer's. The engine is built with
    `logprobs_mode="processed_logprobs"`: `logp` and `cand_logp` are of the distribution sampled
    from (after temperature and top-p, -inf for candidates top-p removed), the behaviour policy, as
    `HFGenerateBackend` reports. vLLM does not report the entropy: `entropy` is None even with
    `want_entropy=True` (the trainer computes it from its own forward pass).

    Log-probs differ from the trainer's: vLLM's kernels, its dtype (`dtype`, bfloat16 by default,
    while the trainer may hold float32 weights) and batching give slightly different numbers for
    the same weights. The trainer corrects with a truncated importance weight on
    `exp(logp_trainer - logp_sampler)`, as TRL and verl do.

    Weight sync: `sync_weights(model)` streams the trainer's parameters (names stripped of wrapper
    prefixes, FSDP2 DTensors gathered) into the engine's model with its `load_weights`, through
    `LLM.apply_model` (in-process, no copies beyond vLLM's in-place loads), then resets the
    prefix cache, whose KV entries were computed with the old weights.

    Sleep mode (`sleep_mode=True`): after each `generate` the engine sleeps at level 1 (weights
    copied to CPU, KV cache freed), so the training step has the GPU; `sync_weights` wakes the
    weights only, and `generate` wakes the weights, then the KV cache. vLLM's CuMem allocator
    allows one sleep-mode engine per process.

    Tensor parallelism (`tensor_parallel_size > 1`) uses vLLM's `external_launcher`: launch the
    trainer with torchrun, one process per GPU of the group, each calling `generate` with the
    same prompts and generator state and `sync_weights` with the full model.
    """

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        *,
        gpu_memory_utilization: float = 0.3,
        sleep_mode: bool = True,
        tensor_parallel_size: int = 1,
        max_model_len: int = 0,
        enforce_eager: bool = False,
        dtype: str = "bfloat16",
        seed: int = 0,
        max_logprobs: int = 20,
    ) -> None:
        """Build the engine from the Hugging Face folder `model_path`.

        Args:
            model_path: local folder with `config.json`, weights and tokenizer files.
            tokenizer: the trainer's tokenizer (prompt encoding, padding ids, EOS, decoding).
            gpu_memory_utilization: fraction of the GPU's total memory the engine may use
                (weights, activations, KV cache); at start-up that much must be free.
            sleep_mode: free the engine's GPU memory between rollouts (see the class docstring).
            tensor_parallel_size: GPUs per engine; > 1 needs torchrun (see the class docstring).
            max_model_len: context length (prompt + response); 0 lets vLLM take the model's.
            enforce_eager: no CUDA graphs (slower decoding, faster start, less memory).
            dtype: weights and activations dtype of the engine ("bfloat16", "float16",
                "float32", "auto").
            seed: the engine's global seed (requests carry their own seeds, see `generate`);
                under torchrun each engine's own, `engine_seed` (``seed + rank`` at
                ``tensor_parallel_size`` 1).
            max_logprobs: the largest `top_n` that `generate` accepts (vLLM's default 20).

        Raises:
            ImportError: vLLM is not installed.
            ValueError: invalid arguments, a tokenizer without pad or EOS id,
                `tensor_parallel_size > 1` outside torchrun, or expandable segments in
                ``PYTORCH_CUDA_ALLOC_CONF`` with `sleep_mode` (`check_alloc_conf`).
        """
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization: expected in (0, 1], got {gpu_memory_utilization}"
            )
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size: expected >= 1, got {tensor_parallel_size}")
        if max_model_len < 0:
            raise ValueError(f"max_model_len: expected >= 0 (0: the model's), got {max_model_len}")
        if max_logprobs < 0:
            raise ValueError(f"max_logprobs: expected >= 0, got {max_logprobs}")
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("tokenizer: expected pad_token_id and eos_token_id to be set")
        check_alloc_conf(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), sleep_mode)
        try:
            import vllm
        except ImportError as err:
            raise ImportError(_INSTALL_HINT) from err
        if vllm.__version__.split("+")[0] != PINNED_VLLM_VERSION:
            warnings.warn(
                f"VLLMBackend is written against vLLM {PINNED_VLLM_VERSION}; found "
                f"{vllm.__version__}",
                stacklevel=2,
            )

        if tensor_parallel_size > 1 or _distributed_initialized():
            # One engine per torchrun process, ranks taken from the environment
            # (ExecutorWithExternalLauncher._distributed_args reads RANK and LOCAL_RANK, and
            # torch.distributed's env:// init MASTER_ADDR and MASTER_PORT).
            missing = [
                v
                for v in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                if v not in os.environ
            ]
            if missing:
                raise ValueError(
                    f"tensor_parallel_size={tensor_parallel_size} (or an initialized "
                    f"torch.distributed) needs a torchrun launch; missing environment {missing}"
                )
            executor_backend = "external_launcher"
            seed = engine_seed(seed, int(os.environ["RANK"]), tensor_parallel_size)
        else:
            executor_backend = "uni"
        # The engine core must run in this process: `apply_model` then calls our function on the
        # model directly (tensors by reference) instead of pickling it to a worker process. Read
        # when the engine is built (vllm/envs.py, cached afterwards by EngineCore.__init__).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

        kwargs = engine_kwargs(
            model_path,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager,
            sleep_mode=sleep_mode,
            executor_backend=executor_backend,
            max_logprobs=max_logprobs,
            max_model_len=max_model_len,
        )

        self.tokenizer = tokenizer
        # The same stop ids as HFGenerateBackend: the tokenizer's EOS and generation_config.json's.
        self.stop_token_ids = stop_token_ids(tokenizer, model_path)
        self.sleep_mode = sleep_mode
        self.max_logprobs = max_logprobs
        self.llm = vllm.LLM(**kwargs)
        self._sampling_params = vllm.SamplingParams
        self._tokens_prompt = vllm.TokensPrompt
        if not hasattr(self.llm.llm_engine, "model_executor"):
            raise RuntimeError(
                "vLLM runs its engine in another process; VLLMBackend needs it in-process "
                "(VLLM_ENABLE_V1_MULTIPROCESSING=0 was not honoured)"
            )
        self._asleep: set[str] = set()
        if sleep_mode:
            self._sleep()

    # ------------------------------------------------------------------ sleep mode

    def _sleep(self) -> None:
        self.llm.sleep(level=1)
        self._asleep = {"weights", "kv_cache"}

    def _wake(self, tag: str) -> None:
        if tag in self._asleep:
            # vLLM allocates with its own CuMem pool: memory cached by torch's allocator for the
            # trainer is invisible to it (TRL empties the cache here too).
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.llm.wake_up(tags=[tag])
            self._asleep.discard(tag)

    # ------------------------------------------------------------------ protocol

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load `model`'s parameters into the engine, one at a time, and reset its prefix cache.

        `model` is the trained module, possibly wrapped (DDP, torch.compile, FSDP1 names, FSDP2
        DTensors; see `iter_full_parameters`). PEFT adapters are not merged: pass a plain model.
        With sleep mode only the weights are woken; the KV cache stays freed until `generate`.

        Raises:
            ValueError: from vLLM's loader, for a parameter name the engine's model lacks.
        """
        self._wake("weights")

        def load(engine_model: torch.nn.Module) -> None:
            engine_model.load_weights(iter_full_parameters(model))

        with torch.no_grad():
            self.llm.apply_model(load)
        self.llm.reset_prefix_cache()

    def generate(
        self,
        prompts: list[str],
        group_size: int,
        sampling: Sampling | None = None,
        *,
        generator: torch.Generator | None = None,
        **fields: Any,
    ) -> RolloutBatch:
        """Sample `group_size` responses per prompt with the engine, with `sampling` (or its
        `fields` as keywords, `Sampling.of`).

        Randomness: with `generator`, one seed is drawn from it and each prompt's request gets a
        seed derived from it (`request_seeds`), so equal generator states give equal batches (up
        to vLLM's numerical nondeterminism across batch shapes); without it, vLLM draws seeds.
        `top_k = 0` disables top-k. `want_entropy` is accepted for the protocol; vLLM does not
        report entropies, so `entropy` is None. `want_logprobs=False` (texts only, for
        evaluation) asks vLLM for no log-probs (`logprobs=None`: no per-token dicts are built);
        `logp` is then NaN on the mask. Responses end at the first of `self.stop_token_ids`
        (`llm.rollout.base.stop_token_ids`, as `HFGenerateBackend`).

        Returns:
            A `RolloutBatch` (see `rollout_batch_from_outputs`); candidates `(B, G, T, top_n)`.

        Raises:
            ValueError: empty `prompts`, `group_size < 1`, `max_new_tokens < 1`,
                `temperature <= 0`, `top_p` not in (0, 1], `top_n` not in [0, max_logprobs],
                or `top_n > 0` without `want_logprobs`.
        """
        sampling = Sampling.of(sampling, **fields)
        max_new_tokens, temperature, top_p, top_k = (
            sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k,
        )  # fmt: skip
        top_n, want_logprobs = sampling.top_n, sampling.want_logprobs
        if not prompts:
            raise ValueError("prompts: expected at least one prompt")
        check_sampling(group_size, sampling, max_top_n=self.max_logprobs)
        if top_n and not want_logprobs:
            raise ValueError(f"top_n: expected 0 without want_logprobs, got {top_n}")

        tok = self.tokenizer
        prompt_token_ids = [list(ids) for ids in tok(list(prompts))["input_ids"]]
        seeds = request_seeds(generator, len(prompts), group_size)
        params = [
            self._sampling_params(
                n=group_size,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,  # 0 disables top-k in the pinned version (SamplingParams docs)
                max_tokens=max_new_tokens,
                # None: no log-probs at all; 0: the sampled token's only (vllm/sampling_params.py).
                logprobs=top_n if want_logprobs else None,
                # Log-probs as one `FlatLogprobs` per completion (a few flat lists) instead of a
                # dict of `Logprob` objects per token: `vllm/sampling_params.py`,
                # `SamplingParams.flat_logprobs` (default False), read by
                # `vllm/v1/engine/logprobs.py:LogprobsProcessor.from_new_request`
                # (`create_sample_logprobs`); the container is `vllm/logprobs.py:FlatLogprobs`,
                # read without per-token objects by `_entries_of_flat_logprobs`.
                flat_logprobs=want_logprobs,
                seed=seed,
                stop_token_ids=list(self.stop_token_ids),
                detokenize=False,
            )
            for seed in seeds
        ]
        requests = [self._tokens_prompt(prompt_token_ids=ids) for ids in prompt_token_ids]

        # Weights before the KV cache: the weights may be loaded while the cache is still freed.
        self._wake("weights")
        self._wake("kv_cache")
        try:
            outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        finally:
            if self.sleep_mode:
                self._sleep()

        return rollout_batch_from_outputs(
            prompts,
            prompt_token_ids,
            outputs,
            group_size,
            top_n,
            tok.pad_token_id,
            self.stop_token_ids,
            tok,
            want_logprobs=want_logprobs,
        )


def _distributed_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()
