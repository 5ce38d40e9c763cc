"""The offline tiny model of the CPU default: a word-level tokenizer, a ~1M-parameter causal LM of
Qwen2's architecture, and a supervised warm start on solver solutions of Countdown, cached on disk.

Nothing here downloads: the tokenizer is built from `llm.tasks.compact_words`, the model from a
config, the data by `llm.tasks.generate_problems` and `llm.tasks.solve`. Both are saved with
`save_pretrained`, so `AutoTokenizer.from_pretrained(path)` and
`AutoModelForCausalLM.from_pretrained(path)` (and any other loader of a Hugging Face folder) take
`path`.

Why a `LlamaForCausalLM` and not a `Qwen2ForCausalLM`: transformers 5 lists `qwen2` among the model
types whose Hub tokenizer class it distrusts (`MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS` in
`models/auto/tokenization_auto.py`), so `AutoTokenizer.from_pretrained` on any folder whose
`config.json` says `qwen2` rebuilds a byte-level BPE `Qwen2Tokenizer` from the vocabulary, which
splits numbers into digits and drops our words: the saved folder would no longer load. Llama with
`attention_bias=True` is the same network as Qwen2 (RMSNorm, rotary positions, SwiGLU MLP, biased
attention projections; Llama also biases the output projection), and its folder loads as saved.

The warm start plays the part of pre-training: on held-out problems the base policy solves some,
not all, with several different correct solutions per solved problem (seed 000 App. C.1 starts RL
from such a model). `TinyConfig` fixes the problem distribution small enough (3 numbers in 1..20,
targets in 1..100) for this to take about two minutes on two CPU cores.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

import numerics
from llm.model.tokens import check_prompts
from llm.tasks import (
    CountdownProblem,
    Expr,
    compact_completion,
    compact_words,
    generate_problems,
    make_prompt,
    solve,
)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)

# The json file in a base-model folder recording how it was built; `ensure_base_model` reuses the
# folder only when this matches the requested config.
BUILD_FILE = "tiny_build.json"
# Bumped when the build procedure changes in a way the config does not show, so old caches rebuild.
BUILD_VERSION = 2  # 2: the warm start's AdamW runs fused (the same step on every CPU)
# The held-out stream is reserved up to this many problems: the training set excludes all of them.
HELDOUT_RESERVED = 2000
# The train stream holds at most this many problems. The held-out stream goes on past its reserved
# prefix (a study's later confirmations need fresh problems) by skipping every one of them, so a
# problem of that extension is never trained on either.
TRAIN_LIMIT = 8000


@dataclass(frozen=True)
class TinyConfig:
    """Everything that determines the tiny base model; stored in `BUILD_FILE` next to it.

    The defaults are the CPU default of the project (about 0.9M parameters; warm start of two to three
    minutes on two cores). Problems and solutions are drawn from seeded generators, so equal configs
    give equal data; torch's CPU kernels make the weights reproducible on one machine.
    """

    # Problem distribution (shared by the warm start and the held-out problems).
    num_numbers: int = 3
    """numbers per problem"""
    min_operand: int = 1
    """smallest number in a problem"""
    max_operand: int = 20
    """largest number in a problem"""
    min_target: int = 1
    """smallest target"""
    max_target: int = 100
    """largest target; also the largest number in the vocabulary"""
    data_seed: int = 0
    """seed of the training and held-out problem streams"""
    sum_fraction: float = 0.0
    """share of problems whose target is replaced by the sum of their numbers (when <= max_target):
    the problems on which the "add every number" rule is right (the designed regime,
    configs/study_countdown_rule.toml; 0: the solver-only distribution, whose random expressions
    make the sum right for ~6%)"""
    rule_fraction: float = 0.0
    """share of the warm start's examples that are the "add every number" rule (the numbers in
    the prompt's order joined by +), right or wrong: the strategy a pretrained model brings
    (SmolLM2 collapses onto "add the numbers", docs/gpu.md); 0: solver solutions only"""

    # Model (Qwen2's architecture as a transformers Llama with attention biases; tied embeddings).
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 64
    """prompt + completion of a 3- or 4-number problem is at most ~30 tokens"""
    model_seed: int = 0
    """seed of the weight initialization and of the warm-start data order"""

    # Supervised warm start.
    num_train_problems: int = 4000
    """training problems (distinct, disjoint from the reserved held-out ones)"""
    solutions_per_problem: int = 4
    """distinct solver solutions drawn per problem and epoch (all of them when fewer)"""
    epochs: int = 3
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_fraction: float = 0.05
    """linear warm-up share of the steps; cosine decay to 10% of `lr` afterwards"""
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        positive = (
            "num_numbers",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "solutions_per_problem",
            "batch_size",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        for name in ("num_train_problems", "epochs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected >= 0, got {getattr(self, name)}")
        if not 0 <= self.min_operand <= self.max_operand <= self.max_target:
            raise ValueError(
                "min_operand, max_operand: expected 0 <= min_operand <= max_operand <= max_target, "
                f"got {self.min_operand}, {self.max_operand} (max_target {self.max_target})"
            )
        if not 0 <= self.min_target <= self.max_target:
            raise ValueError(
                f"min_target: expected 0 <= min_target <= max_target, got {self.min_target}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size: expected a multiple of num_attention_heads "
                f"({self.num_attention_heads}), got {self.hidden_size}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr: expected > 0, got {self.lr}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction: expected in [0, 1), got {self.warmup_fraction}")
        for name in ("sum_fraction", "rule_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name}: expected in [0, 1], got {getattr(self, name)}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TinyConfig:
        """The config of a `BUILD_FILE`'s `config` entry; unknown keys raise `ValueError`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TinyConfig fields: {unknown}")
        return cls(**d)


# --------------------------------------------------------------------------------------------------
# Tokenizer and model


def build_tokenizer(max_number: int = TinyConfig.max_target) -> PreTrainedTokenizerFast:
    """A word-level tokenizer for the compact template with the numbers `0..max_number`.

    Vocabulary: ids 0-3 are `<pad> <bos> <eos> <unk>`, then `llm.tasks.compact_words(max_number)`
    (`nums target : <answer> </answer> ( ) + - * /` and the numbers). Words are split on whitespace
    (`tokenizers` WordLevel + WhitespaceSplit); an unknown word maps to `<unk>`. Encoding prepends
    `<bos>` (a post-processor), decoding joins words with single spaces, so
    `decode(encode(text), skip_special_tokens=True) == " ".join(text.split())` for in-vocabulary
    text. Padding is on the left, as generation needs; the trainer pads responses on the right itself.

    Raises:
        ValueError: `max_number < 0`.
    """

    if max_number < 0:
        raise ValueError(f"max_number: expected >= 0, got {max_number}")
    words = [*SPECIAL_TOKENS, *compact_words(max_number)]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    # No word carries the "##" prefix, so this decoder only joins words with spaces.
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=TinyConfig.max_position_embeddings,
    )


def encode_prompt(
    tokenizer: PreTrainedTokenizerFast,
    text: str,
    *,
    max_positions: int = TinyConfig.max_position_embeddings,
    max_new_tokens: int = 0,
) -> list[int]:
    """The ids of one prompt (with `<bos>`), checked by `check_prompts`.

    Raises:
        UnrepresentableNumberError, PromptTooLongError: as `check_prompts`.
    """
    ids = tokenizer(text).input_ids
    check_prompts(
        tokenizer, [text], lengths=[len(ids)], max_positions=max_positions,
        max_new_tokens=max_new_tokens,
    )  # fmt: skip
    return ids


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    seed: int,
    hidden_size: int = TinyConfig.hidden_size,
    num_hidden_layers: int = TinyConfig.num_hidden_layers,
    num_attention_heads: int = TinyConfig.num_attention_heads,
    intermediate_size: int = TinyConfig.intermediate_size,
    max_position_embeddings: int = TinyConfig.max_position_embeddings,
) -> LlamaForCausalLM:
    """A randomly initialized causal LM over `tokenizer`'s vocabulary, in float32 on CPU.

    Qwen2's architecture as a `LlamaForCausalLM` with `attention_bias=True` (see the module
    docstring for why not `Qwen2ForCausalLM`). Tied input and output embeddings, full multi-head
    attention (as many key-value heads as heads); the special-token ids of `tokenizer` go into the config and the generation
    config. The defaults have about 0.87M parameters. Deterministic given `seed` (the global torch
    RNG is left as it was).
    """
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_attention_heads,
        max_position_embeddings=max_position_embeddings,
        attention_bias=True,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    gen = model.generation_config
    gen.pad_token_id = tokenizer.pad_token_id
    gen.bos_token_id = tokenizer.bos_token_id
    gen.eos_token_id = tokenizer.eos_token_id
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct trainable parameters (tied weights once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------------------
# Data


def tiny_problems(
    config: TinyConfig, split: Literal["train", "heldout"], n: int
) -> list[CountdownProblem]:
    """The first `n` problems of the `split` stream of `config`'s distribution, deterministic.

    Both streams hold distinct problems (same multiset of numbers and same target counts as the
    same problem). `heldout` is drawn with seed `(data_seed, 1)`. Its first `HELDOUT_RESERVED`
    problems are reserved: `train` (seed `(data_seed, 0)`, at most `TRAIN_LIMIT` problems) skips
    them, so they are never trained on. Past that prefix the held-out stream goes on and skips
    every problem of the train stream's first `TRAIN_LIMIT`, so no held-out problem is ever
    trained on (the extension, for later confirmations, is drawn the same way but leaves out
    the problems seen before, which are the more frequent ones). A stream's prefix does not
    depend on `n`.

    Raises:
        ValueError: `n < 0`, unknown `split`, or `n > TRAIN_LIMIT` for `train`.
    """
    if n < 0:
        raise ValueError(f"n: expected >= 0, got {n}")
    if split == "heldout":
        if n <= HELDOUT_RESERVED:
            return list(_reserved(config)[:n])
        return list(_heldout_extended(config, n))
    if split != "train":
        raise ValueError(f"split: expected 'train' or 'heldout', got {split!r}")
    if n > TRAIN_LIMIT:
        raise ValueError(f"n: the train split holds {TRAIN_LIMIT} problems, got {n}")
    return list(_train(config, n))


@functools.lru_cache(maxsize=8)
def _train(config: TinyConfig, n: int) -> tuple[CountdownProblem, ...]:
    # cached: the held-out extension reads the whole train stream (3 s) each time it is drawn
    return tuple(_distinct_stream(config, 0, n, {_problem_key(p) for p in _reserved(config)}))


@functools.lru_cache(maxsize=4)
def _reserved(config: TinyConfig) -> tuple[CountdownProblem, ...]:
    return tuple(_distinct_stream(config, 1, HELDOUT_RESERVED, set()))


@functools.lru_cache(maxsize=4)
def _heldout_extended(config: TinyConfig, n: int) -> tuple[CountdownProblem, ...]:
    trained = {_problem_key(p) for p in tiny_problems(config, "train", TRAIN_LIMIT)}
    return tuple(_distinct_stream(config, 1, n, set(), skip_after=(HELDOUT_RESERVED, trained)))


def _distinct_stream(
    config: TinyConfig,
    stream: int,
    n: int,
    exclude: set[tuple[tuple[int, ...], int]],
    skip_after: tuple[int, set[tuple[tuple[int, ...], int]]] = (0, set()),
) -> list[CountdownProblem]:
    """The first `n` distinct problems of `stream`, leaving out `exclude` and, once `skip_after`'s
    count is reached, its set too."""
    rng = np.random.default_rng([config.data_seed, stream])
    seen = set(exclude)
    after, skip = skip_after
    out: list[CountdownProblem] = []
    while len(out) < n:
        # Each problem consumes the generator in order, so chunking never changes the stream.
        for p in _draw(config, rng, max(256, n - len(out))):
            key = _problem_key(p)
            if key not in seen and not (len(out) >= after and key in skip):
                seen.add(key)
                out.append(p)
                if len(out) == n:
                    break
    return out


def _draw(config: TinyConfig, rng: np.random.Generator, n: int) -> list[CountdownProblem]:
    problems = generate_problems(
        n,
        seed=rng,
        num_numbers=config.num_numbers,
        min_number=config.min_operand,
        max_number=config.max_operand,
        min_target=config.min_target,
        max_target=config.max_target,
    )
    if config.sum_fraction == 0:
        # the stream of every base model before the designed regime was added, draw for draw
        return problems
    summed = rng.random(len(problems)) < config.sum_fraction
    return [
        CountdownProblem(p.nums, sum(p.nums)) if s and sum(p.nums) <= config.max_target else p
        for p, s in zip(problems, summed, strict=True)
    ]


def rule_expression(problem: CountdownProblem) -> Expr:
    """The "add every number" rule: ``((a + b) + c) ...`` in the prompt's order (right iff the
    target is their sum)."""
    expr: Expr = problem.nums[0]
    for x in problem.nums[1:]:
        expr = ("+", expr, x)
    return expr


def _problem_key(p: CountdownProblem) -> tuple[tuple[int, ...], int]:
    return tuple(sorted(p.nums)), p.target


def _encode_problems(
    tokenizer: PreTrainedTokenizerFast,
    problems: Sequence[CountdownProblem],
    max_positions: int = TinyConfig.max_position_embeddings,
) -> list[tuple[list[int], list[list[int]], list[int]]]:
    """Per problem: the prompt ids (with `<bos>`), the ids of every solver solution + `<eos>`, and
    the ids of the "add every number" rule (`rule_expression`) + `<eos>`."""
    encoded = []
    eos = tokenizer.eos_token_id
    for p in problems:
        prompt = encode_prompt(tokenizer, make_prompt(p, "compact"), max_positions=max_positions)
        completions = [compact_completion(e) for e in solve(p)]
        ids = tokenizer(completions, add_special_tokens=False).input_ids if completions else []
        rule = tokenizer(compact_completion(rule_expression(p)), add_special_tokens=False)
        encoded.append((prompt, [[*c, eos] for c in ids], [*rule.input_ids, eos]))
    return encoded


def _epoch_examples(
    encoded: list[tuple[list[int], list[list[int]], list[int]]],
    k: int,
    rng: np.random.Generator,
    rule_fraction: float = 0.0,
) -> list[tuple[list[int], list[int]]]:
    """Up to `k` distinct solutions per problem, drawn afresh each epoch, in shuffled order; with
    `rule_fraction` > 0, each of them is the rule's completion instead with that probability."""
    examples = []
    for prompt, sols, rule in encoded:
        picks = rng.permutation(len(sols))[:k]
        if rule_fraction > 0:  # draws only then: the default's stream is unchanged
            swap = rng.random(len(picks)) < rule_fraction
            examples += [
                (prompt, rule if w else sols[int(j)]) for j, w in zip(picks, swap, strict=True)
            ]
        else:
            examples += [(prompt, sols[int(j)]) for j in picks]
    return [examples[int(i)] for i in rng.permutation(len(examples))]


def collate_completions(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `(input_ids, attention_mask, labels)`, each `(N, L)`.

    `labels` is -100 on prompt and padding tokens, so the loss is on completion tokens only.
    """
    length = max(len(p) + len(c) for p, c in examples)
    ids = torch.full((len(examples), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    labels = torch.full((len(examples), length), -100, dtype=torch.long)
    for i, (p, c) in enumerate(examples):
        n = len(p) + len(c)
        ids[i, :n] = torch.tensor([*p, *c])
        mask[i, :n] = 1
        labels[i, len(p) : n] = torch.tensor(c)
    return ids, mask, labels


# --------------------------------------------------------------------------------------------------
# Warm start


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def warm_start(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: Sequence[CountdownProblem],
    *,
    config: TinyConfig = TinyConfig(),
    num_threads: int = 2,
    progress: bool = True,
) -> list[float]:
    """Supervised fine-tuning of `model` in place on solver solutions of `problems`.

    Each epoch draws up to `config.solutions_per_problem` distinct solutions per problem (all
    distinct solutions from `llm.tasks.solve`, a new draw every epoch, so the model sees several
    modes), in the compact format: prompt `make_prompt(p, "compact")` (with `<bos>`), completion
    `compact_completion(expr)` + `<eos>`; the loss is the mean token cross-entropy on completion
    tokens only. AdamW (`config.lr`, `config.weight_decay`), linear warm-up then cosine decay to
    10%, gradient clipping at `config.grad_clip`, `num_threads` torch CPU threads (restored after).
    Deterministic given `config.model_seed` on one machine and thread count. Problems without a
    solution are skipped.

    Returns:
        The training loss of every step.

    Raises:
        UnrepresentableNumberError, PromptTooLongError: a problem's prompt states a number outside
            `tokenizer`'s vocabulary or does not fit the model's positions (`check_prompts`).
    """
    encoded = _encode_problems(tokenizer, problems, model.config.max_position_embeddings)
    rng = np.random.default_rng([config.model_seed, 1])
    n_examples = sum(min(len(s), config.solutions_per_problem) for _, s, _ in encoded)
    steps_per_epoch = math.ceil(n_examples / config.batch_size)
    total = steps_per_epoch * config.epochs
    warmup = max(1, int(config.warmup_fraction * total))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress_ = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress_))

    # fused: its step is the same on every CPU (torch's default one is not: `llm.train.update`).
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        weight_decay=config.weight_decay,
        betas=(0.9, 0.98),
        fused=True,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    losses: list[float] = []
    model.train()
    with _torch_threads(num_threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.model_seed)  # dropout is off; this only pins any stray draw
        bar = tqdm(total=total, desc="warm start", disable=not progress, unit="step")
        for _ in range(config.epochs):
            examples = _epoch_examples(
                encoded, config.solutions_per_problem, rng, config.rule_fraction
            )
            for start in range(0, len(examples), config.batch_size):
                ids, mask, labels = collate_completions(
                    examples[start : start + config.batch_size], tokenizer.pad_token_id
                )
                logits = model(input_ids=ids, attention_mask=mask).logits  # (N, L, V)
                # Position t predicts token t + 1.
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                optimizer.step()
                scheduler.step()
                losses.append(loss.item())
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        bar.close()
    model.eval()
    return losses


# --------------------------------------------------------------------------------------------------
# Cached base model


def ensure_base_model(
    path: str | os.PathLike[str],
    *,
    rebuild: bool = False,
    config: TinyConfig | None = None,
    num_threads: int = 2,
    progress: bool = True,
) -> Path:
    """The folder of the warm-started tiny base model for `config`, built when missing or stale.

    A folder is reused when its `BUILD_FILE` records the same `config` and `BUILD_VERSION`;
    otherwise (or with `rebuild=True`) the tokenizer and model are built, warm-started on
    `tiny_problems(config, "train", config.num_train_problems)`, saved with `save_pretrained` into
    a temporary sibling folder, and moved into place with `os.replace`, so a crash never leaves a
    half-written model at `path`. The warm start runs on `num_threads` torch threads, part of
    the cache key with the numeric settings (`numerics.tag()`; a build under another version of
    the same library pins is the same model, `numerics.same_pins`): under numerics pin 2 the
    thread count changes the bytes (1 and 2 threads built other bases), so every caller keeps the
    default.
    `BUILD_FILE` also records the parameter count, the final training loss and the warm-start
    seconds. `progress`: the warm start's tqdm bar; without it (a log file), one line on stderr
    when a build starts and one when it ends.

    Returns:
        `Path(path)`: load it with `load_base_model` or any Hugging Face loader.
    """
    config = TinyConfig() if config is None else config
    path = Path(path)
    built = _fresh_build(path)
    if not rebuild and built == (config, num_threads):
        return path
    tokenizer = build_tokenizer(config.max_target)
    model = build_tiny_model(
        tokenizer,
        seed=config.model_seed,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
    )
    problems = tiny_problems(config, "train", config.num_train_problems)
    if not progress:  # a log, not a terminal: a build takes minutes, say so before it starts
        print(f"{path}: building the tiny base model (a warm start on {len(problems)} problems, "
              f"{num_threads} threads; minutes)", file=sys.stderr, flush=True)  # fmt: skip
    start = time.perf_counter()
    losses = warm_start(
        model, tokenizer, problems, config=config, num_threads=num_threads, progress=progress
    )
    seconds = time.perf_counter() - start
    if not progress:
        print(f"{path}: built in {seconds:.0f} s", file=sys.stderr, flush=True)
    build = {
        "version": BUILD_VERSION,
        "config": asdict(config),
        "parameters": count_parameters(model),
        "final_loss": losses[-1] if losses else None,
        "warm_start_seconds": round(seconds, 1),
        "num_threads": num_threads,
        "numerics": numerics.tag(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    model.save_pretrained(tmp)
    (tmp / BUILD_FILE).write_text(json.dumps(build, indent=2) + "\n", encoding="utf-8")
    # os.replace cannot overwrite a non-empty folder: move the stale one aside first.
    old = path.parent / f".{path.name}.old-{os.getpid()}"
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def _fresh_build(path: str | os.PathLike[str]) -> tuple[TinyConfig, Any] | None:
    """``(config, num_threads)`` a base-model folder was built with (`BUILD_FILE`); `None` when
    absent, stale (another `BUILD_VERSION`, or numeric settings whose library pins are not this
    process's: `numerics.same_pins`) or unreadable."""
    try:
        build = json.loads((Path(path) / BUILD_FILE).read_text(encoding="utf-8"))
        recorded = build.get("numerics")
        if build.get("version") != BUILD_VERSION or not (
            isinstance(recorded, str) and numerics.same_pins(recorded)
        ):
            return None
        return TinyConfig.from_dict(build["config"]), build.get("num_threads")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def read_build_config(path: str | os.PathLike[str]) -> TinyConfig | None:
    """The `TinyConfig` a base-model folder was built with; `None` when absent, stale (another
    `BUILD_VERSION` or other library pins, `numerics.same_pins`) or unreadable."""
    built = _fresh_build(path)
    return None if built is None else built[0]


def load_base_model(
    path: str | os.PathLike[str],
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """`(model, tokenizer)` from a folder written by `ensure_base_model`, model in eval mode."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    return model, tokenizer
