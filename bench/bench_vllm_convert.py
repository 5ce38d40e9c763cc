"""Benchmark: converting vLLM's outputs into a `RolloutBatch`, the per-token Python loop against
the vectorized `llm.rollout.vllm_engine.rollout_batch_from_outputs` on vLLM's two log-prob formats (issue
12 item 6; goal <= 1 us/token).

The outputs are stand-ins shaped like vLLM 0.25.1's (`vllm/outputs.py`: `RequestOutput.outputs`,
`CompletionOutput.index/token_ids/logprobs`; `vllm/logprobs.py`: `Logprob(logprob, rank,
decoded_token)` and `FlatLogprobs`). Each completion comes twice with the same content:
- "dict": a dict per position built by vLLM's rules
  (`vllm/logprobs.py:append_logprobs_for_next_position`): the sampled token first with its
  vocabulary rank, then the top N with ranks 1..N, a sampled token inside the top N overwritten in
  place by its top-N entry (so N entries, or N + 1 when the sampled token is outside the top N),
  every position with its own dict and `Logprob` objects;
- "flat": one `FlatLogprobs` (`SamplingParams(flat_logprobs=True)`, what `VLLMBackend` asks for;
  the stand-in below has vLLM's field names) laid out as vLLM's `append_fast` writes it: N + 1
  entries a position, the sampled token repeated when inside the top N.
Default: 256 responses (32 prompts x G 8) of 2,000-4,000 tokens (about 3,000; one in eight runs to
the 4,096-token cap without EOS), with N = 3 candidates and with N = 0 (the sampled token only).

"old" is the reference loop on the dicts, "new-dict" and "new-flat" the vectorized conversion on
each format; all get the same tokenizer (the tiny word-level one; its `batch_decode` is part of
each and printed apart), are checked equal to "old", and are timed on the process CPU clock
(robust on a shared machine), the median of `--repeats` interleaved runs. The goal is checked on
"new-flat", the format the backend receives.

    python bench/bench_vllm_convert.py            # 256 x ~3,000 tokens, N = 3 and N = 0
    python bench/bench_vllm_convert.py --quick    # 32 x ~300 tokens, a smoke run
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm.model.tiny import build_tokenizer
from llm.rollout.vllm_engine import rollout_batch_from_outputs
from tests.llm.reference_convert import reference_rollout_batch_from_outputs

GOAL_US_PER_TOKEN = 1.0


@dataclass
class Logprob:
    """vllm/logprobs.py `Logprob`."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FlatLogprobs:
    """vllm/logprobs.py `FlatLogprobs` (`SamplingParams(flat_logprobs=True)`), its fields named as
    there: position t's entries are `token_ids/logprobs/ranks/decoded_tokens[start_indices[t]:
    end_indices[t]]`. `append_fast` is vLLM's (the sampled token first with its rank, then the top
    N with ranks 1..N, repeated ids kept); indexing a position gives the dict vLLM's does (a
    repeated id at its first place with its last value), which is what the reference reads."""

    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)
    decoded_tokens: list[str | None] = field(default_factory=list)

    def append(self, logprobs_one_position: dict[int, Logprob] | None) -> None:
        self.start_indices.append(len(self.logprobs))
        for token_id, logprob in (logprobs_one_position or {}).items():
            self.token_ids.append(token_id)
            self.logprobs.append(logprob.logprob)
            self.ranks.append(logprob.rank)
            self.decoded_tokens.append(logprob.decoded_token)
        self.end_indices.append(len(self.logprobs))

    def append_fast(self, token_ids, logprobs, ranks, decoded_tokens) -> None:
        self.start_indices.append(len(self.logprobs))
        entries = zip(token_ids, logprobs, ranks, decoded_tokens, strict=False)  # as vLLM's
        for token_id, logprob, rank, decoded in entries:
            self.token_ids.append(token_id)
            self.logprobs.append(logprob)
            self.ranks.append(rank)
            self.decoded_tokens.append(decoded)
        self.end_indices.append(len(self.logprobs))

    def __len__(self) -> int:
        return len(self.start_indices)

    def __getitem__(self, index: int) -> dict[int, Logprob]:
        if not isinstance(index, int):
            raise TypeError(f"the stand-in indexes positions only, got {type(index)}")
        return {
            self.token_ids[i]: Logprob(self.logprobs[i], self.ranks[i], self.decoded_tokens[i])
            for i in range(self.start_indices[index], self.end_indices[index])
        }

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


@dataclass
class CompletionOutput:
    """The fields of vllm/outputs.py `CompletionOutput`."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | FlatLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """The fields of vllm/outputs.py `RequestOutput` that matter here."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


def make_outputs(
    prompts: int,
    group: int,
    min_tokens: int,
    max_tokens: int,
    top_n: int,
    vocab: int,
    eos: int,
    seed: int,
) -> tuple[list[list[int]], list[RequestOutput], list[RequestOutput]]:
    """Prompt token ids and `prompts` stand-in `RequestOutput`s of `group` completions each, with
    per-position dicts and, the same content, with one `FlatLogprobs` per completion."""
    rng = np.random.default_rng(seed)
    prompt_ids, outputs, flat_outputs = [], [], []
    for b in range(prompts):
        ids = rng.integers(0, vocab, rng.integers(8, 64)).tolist()
        completions, flat_completions = [], []
        for g in range(group):
            capped = rng.random() < 1 / 8
            length = max_tokens if capped else int(rng.integers(min_tokens, max_tokens))
            tokens = rng.integers(0, vocab, length)
            tokens[tokens == eos] = (eos + 1) % vocab
            if not capped:
                tokens[-1] = eos
            # Sampled ranks: mostly inside the top N, sometimes far outside (as at temperature 1).
            ranks = np.where(
                rng.random(length) < 0.85,
                rng.integers(1, 4, length),
                rng.integers(4, vocab, length),
            )
            logps = np.sort(-rng.exponential(2.0, (length, max(top_n, 1))), axis=1)[:, ::-1]
            sampled_lp = -rng.exponential(4.0, length)
            # Distinct candidates, none equal to the sampled token (offsets 1..vocab-1 mod vocab).
            start = rng.integers(1, vocab - top_n, (length, 1))
            cand = (tokens[:, None] + start + np.arange(top_n)) % vocab
            lps = []
            for t, (token, rank) in enumerate(zip(tokens.tolist(), ranks.tolist(), strict=True)):
                d = {token: Logprob(float(sampled_lp[t]), rank)}
                if top_n:
                    row = cand[t].tolist()
                    if rank <= top_n:
                        row[rank - 1] = token
                    for r, (c, lp) in enumerate(zip(row, logps[t].tolist(), strict=False), 1):
                        d[c] = Logprob(lp, r)
                lps.append(d)
            completions.append(CompletionOutput(g, "", tokens.tolist(), None, lps, "stop"))
            # The same positions as vLLM's FlatLogprobs lays them out (`append_fast`): sampled
            # token first, then the top N, the sampled token repeated there when inside it.
            inside = ranks <= top_n
            cand[inside, ranks[inside] - 1] = tokens[inside]
            width = top_n + 1
            starts = np.arange(length) * width
            entry_ranks = np.column_stack([ranks, np.broadcast_to(np.arange(1, width), cand.shape)])
            flat = FlatLogprobs(
                start_indices=starts.tolist(),
                end_indices=(starts + width).tolist(),
                token_ids=np.column_stack([tokens, cand]).ravel().tolist(),
                logprobs=np.column_stack([sampled_lp, logps[:, :top_n]]).ravel().tolist(),
                ranks=entry_ranks.ravel().tolist(),
                decoded_tokens=[None] * (length * width),
            )
            flat_completions.append(CompletionOutput(g, "", tokens.tolist(), None, flat, "stop"))
        prompt_ids.append(ids)
        outputs.append(RequestOutput(str(b), None, ids, None, completions[::-1]))
        flat_outputs.append(RequestOutput(str(b), None, ids, None, flat_completions[::-1]))
    return prompt_ids, outputs, flat_outputs


def cpu_seconds(fn, *args, **kwargs) -> tuple[float, object]:
    gc.collect()
    start = time.process_time()
    out = fn(*args, **kwargs)
    return time.process_time() - start, out


def equal(a, b) -> bool:
    tensors = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logp")
    same = all(torch.equal(getattr(a, k), getattr(b, k)) for k in tensors)
    for k in ("cand_ids", "cand_logp"):
        x, y = getattr(a, k), getattr(b, k)
        same &= (x is None and y is None) or torch.equal(x, y)
    return same and a.texts == b.texts and a.prompts == b.prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=32, help="B prompts")
    parser.add_argument("--group", type=int, default=8, help="G responses per prompt")
    parser.add_argument("--min-tokens", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=4096, help="the response cap")
    parser.add_argument("--top-n", type=int, nargs="+", default=[3, 0], help="N values to time")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs (median)")
    parser.add_argument("--quick", action="store_true", help="32 x ~300 tokens, 1 repeat")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.group, args.min_tokens, args.max_tokens = 8, 4, 200, 400
        args.repeats = 1
    torch.set_num_threads(1)
    tok = build_tokenizer(100)
    vocab, eos, pad = len(tok), tok.eos_token_id, tok.pad_token_id

    worst = 0.0
    for top_n in args.top_n:
        prompt_ids, outputs, flat_outputs = make_outputs(
            args.prompts, args.group, args.min_tokens, args.max_tokens, top_n, vocab, eos, args.seed
        )
        prompts = [f"prompt {b}" for b in range(args.prompts)]
        call = (prompts, prompt_ids, outputs, args.group, top_n, pad, eos, tok)
        tokens = sum(
            min(len(c.token_ids), c.token_ids.index(eos) + 1 if eos in c.token_ids else 1 << 30)
            for r in outputs
            for c in r.outputs
        )
        seqs = [c.token_ids for r in outputs for c in r.outputs]
        decode_s, _ = cpu_seconds(tok.batch_decode, seqs, skip_special_tokens=True)
        flat_call = (prompts, prompt_ids, flat_outputs, *call[3:])
        times: dict[str, list[float]] = {"old": [], "new-dict": [], "new-flat": []}
        for _ in range(args.repeats):
            s_old, ref = cpu_seconds(reference_rollout_batch_from_outputs, *call)
            s_dict, fast = cpu_seconds(rollout_batch_from_outputs, *call)
            s_flat, fast_flat = cpu_seconds(rollout_batch_from_outputs, *flat_call)
            for name, batch in (("new-dict", fast), ("new-flat", fast_flat)):
                if not equal(ref, batch):
                    print(f"N={top_n}: the {name} conversion differs from the reference")
                    return 1
            for name, sec in (("old", s_old), ("new-dict", s_dict), ("new-flat", s_flat)):
                times[name].append(sec)
        us = {name: 1e6 * statistics.median(t) / tokens for name, t in times.items()}
        worst = max(worst, us["new-flat"])
        print(
            f"N={top_n}: {args.prompts * args.group} responses, {tokens:,} tokens: "
            f"old {us['old']:.2f} us/token, new-dict {us['new-dict']:.3f} us/token, "
            f"new-flat {us['new-flat']:.3f} us/token; ratio old/new-flat "
            f"{us['old'] / us['new-flat']:.1f}x (batch_decode of the token lists alone "
            f"{1e6 * decode_s / tokens:.3f} us/token; equal outputs)"
        )
    verdict = "met" if worst <= GOAL_US_PER_TOKEN else "NOT met"
    print(f"goal <= {GOAL_US_PER_TOKEN} us/token (flat log-probs): {verdict} (worst {worst:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
