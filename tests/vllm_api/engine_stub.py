"""A stand-in for `vllm.LLM` (whose engine needs a GPU) that checks every call against the real vLLM
0.25.1, and real vLLM output objects built the way the engine builds them.

- `RecordingLLM` binds each call to the signature of the real `vllm.LLM` method
  (`vllm/entrypoints/llm.py`), builds the real `vllm.EngineArgs` from the constructor's keyword
  arguments (`LLM.__init__` passes every extra keyword to `EngineArgs`), keeps the executor's
  sleep bookkeeping with the real `Executor.sleep` / `Executor.wake_up`
  (`vllm/v1/executor/abstract.py`: a tag that is not asleep is only logged and nothing wakes), and
  answers `generate` with real `RequestOutput`s.
- `completion` samples one completion from seeded random logits and records its log-probs through
  vLLM's own `LogprobsProcessor` (`vllm/v1/engine/logprobs.py`), fed the rows the GPU sampler
  returns (`vllm/v1/worker/gpu/sample/logprob.py:compute_topk_logprobs`: column 0 the sampled token,
  then the top-k; the sampled token's rank is the number of entries >= its value). Children of a
  request with `n > 1` get their sampling parameters from the real `ParentRequest`
  (`vllm/v1/engine/parallel_sampling.py`).
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field

import numpy as np
import torch
import vllm
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest
from vllm.v1.engine.logprobs import LogprobsProcessor
from vllm.v1.engine.parallel_sampling import ParentRequest
from vllm.v1.executor.abstract import Executor
from vllm.v1.outputs import LogprobsLists

REAL_LLM = vllm.LLM


def bind(method, *args, **kwargs) -> inspect.BoundArguments:
    """`args`/`kwargs` bound to the real `vllm.LLM.<method>` (self included); TypeError if the real
    method does not accept them."""
    return inspect.signature(getattr(REAL_LLM, method)).bind(None, *args, **kwargs)


def core_request(request_id: str, prompt_ids: list[int], params) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=list(prompt_ids),
        mm_features=None,
        sampling_params=params,
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id=request_id,
    )


def processed_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-softmax after temperature and top-p (removed entries -inf): what the sampler reports with
    `logprobs_mode="processed_logprobs"`."""
    scaled = logits.float() / temperature
    if top_p < 1:
        sorted_logits, order = torch.sort(scaled, descending=True)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop_sorted = cum - torch.softmax(sorted_logits, -1) >= top_p  # keep the first over top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, -1)


@dataclass
class Sampled:
    """What the stand-in sampler drew for one completion (for checking the conversion)."""

    tokens: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logp: list[list[float]] = field(default_factory=list)


def completion(
    request_id: str,
    index: int,
    prompt_ids: list[int],
    params,
    vocab: int,
    rows: list[tuple[torch.Tensor, int]] | None = None,
) -> tuple[CompletionOutput, Sampled]:
    """One real `CompletionOutput` for the child sampling parameters `params` (n = 1).

    Samples from random logits seeded by `params.seed` (or from `rows`, given `(logprobs, token)`
    per position), stopping after a stop id or `max_tokens`; log-probs as vLLM records them.
    """
    proc = LogprobsProcessor.from_new_request(None, core_request(request_id, prompt_ids, params))
    num = params.num_logprobs
    seed = params.seed if params.seed is not None else int(torch.randint(0, 2**31, (1,)))
    rng = torch.Generator().manual_seed(seed % 2**63 + 7919 * prompt_ids[-1])
    sampled = Sampled()
    finish = "length"
    steps = len(rows) if rows is not None else params.max_tokens
    for t in range(steps):
        if rows is None:
            logits = torch.randn(vocab, generator=rng) * 3
            logprobs = processed_logprobs(logits, params.temperature, params.top_p)
            token = int(torch.multinomial(logprobs.exp(), 1, generator=rng))
        else:
            logprobs, token = rows[t]
        top = torch.topk(logprobs, num).indices.tolist() if num else []
        sampled.tokens.append(token)
        sampled.logp.append(float(logprobs[token]))
        sampled.top_ids.append(top)
        sampled.top_logp.append(logprobs[top].tolist())
        new_logprobs = None
        if num is not None:
            ids = [token, *top]
            rank = int((logprobs >= logprobs[token]).sum())
            new_logprobs = LogprobsLists(
                np.asarray([ids], dtype=np.int64),
                np.asarray([logprobs[ids].tolist()], dtype=np.float32),
                np.asarray([rank], dtype=np.int64),
            )
        proc.update_from_output(
            EngineCoreOutput(
                request_id=request_id, new_token_ids=[token], new_logprobs=new_logprobs
            )
        )
        if token in params.all_stop_token_ids:
            finish = "stop"
            break
    out = CompletionOutput(
        index=index,
        text="",
        token_ids=sampled.tokens,
        cumulative_logprob=proc.cumulative_logprob,
        logprobs=proc.logprobs,
        finish_reason=finish,
    )
    return out, sampled


def request_output(request_id: str, prompt_ids: list[int], outputs) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        prompt=None,
        prompt_token_ids=list(prompt_ids),
        prompt_logprobs=None,
        outputs=list(outputs),
        finished=True,
    )


class RecordingLLM:
    """`vllm.LLM` for `VLLMBackend` on CPU; see the module docstring."""

    vocab = 100

    def __init__(self, *args, **kwargs):
        bind("__init__", *args, **kwargs)
        self.kwargs = kwargs
        self.engine_args = vllm.EngineArgs(*args, **kwargs)
        self.calls: list[tuple] = []
        self.sampled: dict[tuple[int, int], Sampled] = {}
        self.executor = types.SimpleNamespace(
            is_sleeping=False, sleeping_tags=set(), collective_rpc=self._rpc
        )
        self.llm_engine = types.SimpleNamespace(model_executor=self.executor)

    def _rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(("rpc", method, dict(kwargs or {})))

    def sleep(self, *args, **kwargs):
        b = bind("sleep", *args, **kwargs)
        b.apply_defaults()
        self.calls.append(("sleep", b.arguments["level"]))
        Executor.sleep(self.executor, level=b.arguments["level"])

    def wake_up(self, *args, **kwargs):
        b = bind("wake_up", *args, **kwargs)
        b.apply_defaults()
        tags = b.arguments["tags"]
        self.calls.append(("wake_up", *(tags or ())))
        Executor.wake_up(self.executor, tags)

    def reset_prefix_cache(self, *args, **kwargs):
        bind("reset_prefix_cache", *args, **kwargs)
        self.calls.append(("reset_prefix_cache",))
        return True

    def apply_model(self, *args, **kwargs):
        b = bind("apply_model", *args, **kwargs)
        self.calls.append(("apply_model",))
        func = b.arguments["func"]
        return [func(types.SimpleNamespace(load_weights=lambda weights: {n for n, _ in weights}))]

    def generate(self, *args, **kwargs):
        b = bind("generate", *args, **kwargs)
        b.apply_defaults()
        prompts, params = b.arguments["prompts"], b.arguments["sampling_params"]
        self.calls.append(("generate",))
        self.generate_arguments = b.arguments
        assert not self.executor.is_sleeping, (
            f"generate while asleep: {self.executor.sleeping_tags}"
        )
        assert isinstance(params, list) and len(params) == len(prompts)
        outputs = []
        for b_idx, (prompt, sp) in enumerate(zip(prompts, params, strict=True)):
            assert isinstance(sp, vllm.SamplingParams)
            assert prompt.keys() <= vllm.TokensPrompt.__annotations__.keys() | {"prompt"}
            assert vllm.TokensPrompt.__required_keys__ <= prompt.keys()
            request_id = str(b_idx)
            parent = ParentRequest(core_request(request_id, prompt["prompt_token_ids"], sp))
            outs = []
            for g in range(sp.n):
                child_id, child = parent.get_child_info(g)
                if child.seed is not None:  # the GPU sampler keeps seeds in an int64 tensor
                    np.int64(child.seed)
                out, sampled = completion(
                    child_id, g, prompt["prompt_token_ids"], child, self.vocab
                )
                outs.append(out)
                self.sampled[b_idx, g] = sampled
            outputs.append(request_output(request_id, prompt["prompt_token_ids"], outs[::-1]))
        self.last_outputs = outputs
        return outputs
