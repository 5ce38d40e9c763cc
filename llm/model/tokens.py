"""The vocabulary guard: prompts whose numbers the tokenizer cannot represent are refused with one
error type, `UnrepresentableNumberError` (a ``ValueError``), before the model is asked an
unreadable question (a word-level tokenizer such as the tiny model's, `llm.model.tiny.
build_tokenizer`, maps any number outside its words to ``<unk>``); and prompts too long for the
model's positions are refused with `PromptTooLongError`.

`check_prompts` guards one rollout call (the backends); `check_vocabulary` guards a whole problem
set when it is loaded (`llm.data`), naming where the problems come from.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tokenizers import models

__all__ = [
    "PromptTooLongError",
    "UnrepresentableNumberError",
    "check_prompts",
    "check_vocabulary",
    "representable_numbers",
]


class UnrepresentableNumberError(ValueError):
    """A prompt states a number that the word-level tokenizer has no word for (it would be `<unk>`)."""


class PromptTooLongError(ValueError):
    """A prompt (plus the tokens to generate) needs more positions than the model has."""


# A prompt word that is a number: the tiny vocabulary has one word per number 0..max_number.
_NUMBER = re.compile(r"\d+")


def representable_numbers(tokenizer: Any) -> tuple[int, int] | None:
    """`(lo, hi)`: the numbers a word-level tokenizer (`build_tokenizer`) holds as words.

    `None` for any other tokenizer (byte-level BPE never produces an unknown token). The tiny
    vocabulary holds every number `0..max_number`, so the range is all there is to know.
    """

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not isinstance(backend.model, models.WordLevel):
        return None
    numbers = [int(w) for w in tokenizer.get_vocab() if _NUMBER.fullmatch(w)]
    return (min(numbers), max(numbers)) if numbers else None


def check_prompts(
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    lengths: Sequence[int] | None = None,
    max_positions: int | None = None,
    max_new_tokens: int = 0,
) -> None:
    """Refuse prompts the model would silently misread: unrepresentable numbers, or too long.

    Args:
        tokenizer: a Hugging Face tokenizer; the number check applies to word-level ones only
            (`representable_numbers`), where any other number would become `<unk>`.
        prompts: B prompt texts.
        lengths: B prompt lengths in tokens (with `<bos>`), when already encoded; else encoded here.
        max_positions: the model's `max_position_embeddings`; `None` skips the length check.
        max_new_tokens: tokens to be generated after each prompt; they need positions too.

    Raises:
        UnrepresentableNumberError: names the prompt's index, the number and the range `lo..hi`.
        PromptTooLongError: names the prompt's index, its length, `max_new_tokens` and
            `max_positions`.
    """
    span = representable_numbers(tokenizer)
    if span is not None:
        split = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str
        for i, text in enumerate(prompts):
            for word, _ in split(text):
                if _NUMBER.fullmatch(word) and not span[0] <= int(word) <= span[1]:
                    raise UnrepresentableNumberError(
                        f"prompt {i}: the number {int(word)} has no word in the tokenizer's "
                        f"vocabulary, which represents the numbers {span[0]}..{span[1]}; it would "
                        f"be read as {tokenizer.unk_token!r} (prompt {text[:80]!r})"
                    )
    if max_positions is None:
        return
    if lengths is None:
        lengths = [len(ids) for ids in tokenizer(list(prompts)).input_ids]
    for i, n in enumerate(lengths):
        if n + max_new_tokens > max_positions:
            raise PromptTooLongError(
                f"prompt {i}: {n} tokens + max_new_tokens {max_new_tokens} exceed the model's "
                f"{max_positions} positions (max_position_embeddings); shorten the prompt or "
                f"lower max_new_tokens to at most {max_positions - n}"
                if n < max_positions
                else f"prompt {i}: {n} tokens exceed the model's {max_positions} positions "
                "(max_position_embeddings)"
            )


_NUMBER_WORD = re.compile(r"(?<!\S)\d+(?!\S)")


def check_vocabulary(prompts: Sequence[str], tokenizer: Any, where: str) -> None:
    """Refuse prompts that state a number the tokenizer would turn into its unknown token.

    A word-level tokenizer (the tiny model's, `llm.model.tiny.build_tokenizer`, knows 0..100) maps any
    other number to ``<unk>``, so the model would be asked an unreadable question and score 0 with
    no warning; byte-level tokenizers never produce an unknown token and always pass. Only the
    distinct number words are encoded, so the check is cheap on large sets.

    Args:
        prompts: the prompt texts, in problem order.
        tokenizer: a Hugging Face tokenizer (``__call__``, ``unk_token_id``).
        where: what the problems come from, for the message (e.g. a file or a config table).

    Raises:
        UnrepresentableNumberError: names `where`, the first prompt's index and the numbers it cannot encode.
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not prompts:
        return
    words = sorted({w for p in prompts for w in _NUMBER_WORD.findall(p)}, key=lambda w: (len(w), w))
    if not words:
        return
    ids = tokenizer(words, add_special_tokens=False)["input_ids"]
    unknown = {w for w, seq in zip(words, ids, strict=True) if unk in seq}
    if not unknown:
        return
    for i, p in enumerate(prompts):
        bad = [w for w in _NUMBER_WORD.findall(p) if w in unknown]
        if bad:
            raise UnrepresentableNumberError(
                f"{where}: problem {i}: the number(s) {sorted({int(w) for w in bad})} are not in the "
                f"model's vocabulary and would become {tokenizer.unk_token!r} (prompt {p[:80]!r}); "
                "keep numbers within the model's vocabulary (the tiny model knows 0..100: lower "
                "data.max_number / data.max_target) or use a model whose tokenizer covers them"
            )
