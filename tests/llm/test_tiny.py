"""The offline tiny model: tokenizer, model, data, warm start and the cached base-model folder."""

import json
import os
import re
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import numerics
from llm.config import TrainConfig, config_from_dict
from llm.data import load_eval_sets, load_train_problems, tiny_config
from llm.model import tiny, tokens
from llm.model.tiny import (
    BUILD_FILE,
    SPECIAL_TOKENS,
    TinyConfig,
    build_tiny_model,
    build_tokenizer,
    collate_completions,
    count_parameters,
    ensure_base_model,
    load_base_model,
    read_build_config,
    tiny_problems,
    warm_start,
)
from llm.tasks import compact_completion, compact_words, make_prompt, solve

# A few-second build: a small model on a handful of problems.
SMALL = TinyConfig(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    num_train_problems=24,
    solutions_per_problem=2,
    epochs=2,
    batch_size=16,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(100)


def test_tokenizer_vocabulary_and_round_trip(tokenizer):
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == list(SPECIAL_TOKENS)
    assert len(tokenizer) == len(SPECIAL_TOKENS) + len(compact_words(100))
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.unk_token_id == 3
    text = (
        make_prompt(tiny_problems(TinyConfig(), "heldout", 1)[0], "compact")
        + " <answer> ( 3 + 5 ) * 2 </answer>"
    )
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert len(ids) == 1 + len(text.split())  # one word, one token
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer("nums 101 foo").input_ids[2:] == [3, 3]


def test_tokenizer_pads_left_and_loads_with_auto_tokenizer(tokenizer, tmp_path):
    batch = tokenizer(["nums 1 2 target 3 :", "nums 1 target 1 :"], padding=True)
    assert batch.input_ids[1][0] == tokenizer.pad_token_id
    assert batch.attention_mask[1] == [0, 1, 1, 1, 1, 1, 1]
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "nums 7 9 target 63 : <answer> 7 * 9 </answer>"
    assert loaded(text).input_ids == tokenizer(text).input_ids
    assert loaded.padding_side == "left"
    assert (loaded.pad_token, loaded.eos_token) == ("<pad>", "<eos>")


def test_default_model_size_and_save_round_trip(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer, seed=0)
    assert 0.7e6 < count_parameters(model) < 1.2e6
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    again = build_tiny_model(tokenizer, seed=0)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True)
    )
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tokenizer("nums 1 2 3 target 6 :").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits)
    assert loaded.generation_config.eos_token_id == tokenizer.eos_token_id


def test_problem_splits_are_deterministic_and_disjoint():
    cfg = TinyConfig()
    train = tiny_problems(cfg, "train", 300)
    assert train == tiny_problems(cfg, "train", 300)
    assert train[:100] == tiny_problems(cfg, "train", 100)  # a prefix does not depend on n
    heldout = tiny_problems(cfg, "heldout", tiny.HELDOUT_RESERVED)
    assert heldout[:10] == tiny_problems(cfg, "heldout", 10)
    keys = {(tuple(sorted(p.nums)), p.target) for p in heldout}
    assert len(keys) == len(heldout)
    assert not keys & {(tuple(sorted(p.nums)), p.target) for p in train}
    assert len({(tuple(sorted(p.nums)), p.target) for p in train}) == len(train)
    for p in train[:50]:
        assert len(p.nums) == 3 and all(1 <= x <= 20 for x in p.nums) and 1 <= p.target <= 100
        assert solve(p)
    assert tiny_problems(replace(cfg, data_seed=1), "train", 20) != train[:20]
    with pytest.raises(ValueError, match="split"):
        tiny_problems(cfg, "test", 3)
    with pytest.raises(ValueError, match="train split holds"):
        tiny_problems(cfg, "train", tiny.TRAIN_LIMIT + 1)


def test_heldout_extension_is_fresh_and_never_trained_on():
    cfg = TinyConfig()
    reserved = tiny_problems(cfg, "heldout", tiny.HELDOUT_RESERVED)
    extended = tiny_problems(cfg, "heldout", tiny.HELDOUT_RESERVED + 500)
    assert extended[: tiny.HELDOUT_RESERVED] == reserved  # the reserved prefix is unchanged
    key = lambda p: (tuple(sorted(p.nums)), p.target)  # noqa: E731
    keys = [key(p) for p in extended]
    assert len(set(keys)) == len(keys)
    trained = {key(p) for p in tiny_problems(cfg, "train", tiny.TRAIN_LIMIT)}
    assert not set(keys) & trained
    # the extension is stream 1's continuation: the same problems as a plain distinct draw of
    # that stream, less the trained ones
    plain = tiny._distinct_stream(cfg, 1, tiny.HELDOUT_RESERVED + 2000, set())
    tail = [p for p in plain[tiny.HELDOUT_RESERVED :] if key(p) not in trained]
    assert extended[tiny.HELDOUT_RESERVED :] == tail[:500]


def test_collate_masks_the_prompt_out_of_the_loss():
    ids, mask, labels = collate_completions([([1, 5, 6], [7, 8, 2]), ([1, 5], [2])], 0)
    assert ids.tolist() == [[1, 5, 6, 7, 8, 2], [1, 5, 2, 0, 0, 0]]
    assert mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert labels.tolist() == [[-100, -100, -100, 7, 8, 2], [-100, -100, 2, -100, -100, -100]]


def test_warm_start_lowers_the_completion_loss_deterministically(tokenizer):
    cfg = replace(SMALL, epochs=4, lr=1e-2)
    problems = tiny_problems(cfg, "train", cfg.num_train_problems)
    models, runs = [], []
    for _ in range(2):
        model = build_tiny_model(
            tokenizer,
            seed=0,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
        )
        runs.append(
            warm_start(model, tokenizer, problems, config=cfg, num_threads=1, progress=False)
        )
        models.append(model)
    losses = runs[0]
    assert len(losses) == 4 * 3  # 24 problems x 2 solutions / 16 per batch, 4 epochs
    assert sum(losses[-3:]) < sum(losses[:3])
    assert not models[0].training
    assert runs[0] == runs[1]
    params = zip(models[0].parameters(), models[1].parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in params)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="hidden_size"):
        TinyConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="batch_size"):
        TinyConfig(batch_size=0)
    with pytest.raises(ValueError, match="max_operand"):
        TinyConfig(max_operand=200)
    with pytest.raises(ValueError, match="unknown"):
        TinyConfig.from_dict({"hidden": 3})


def test_ensure_base_model_builds_caches_and_rebuilds(tmp_path, monkeypatch, capsys):
    path = tmp_path / "base"
    assert ensure_base_model(path, config=SMALL, num_threads=1, progress=False) == path
    # Without a bar (a log file) a build says when it starts and ends; a reuse says nothing.
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith(str(path))]
    assert len(lines) == 2 and lines[0].startswith(f"{path}: building the tiny base model")
    assert re.fullmatch(rf"{re.escape(str(path))}: built in \d+ s", lines[1])
    build = json.loads((path / BUILD_FILE).read_text())
    assert read_build_config(path) == SMALL and build["parameters"] > 0
    assert sorted(os.listdir(tmp_path)) == ["base"]  # no temporary folder left behind
    model, tok = load_base_model(path)
    assert model.config.hidden_size == SMALL.hidden_size and not model.training
    # AutoTokenizer on the folder with the model's config.json: the same word-level tokenizer.
    prompt = (
        make_prompt(tiny_problems(SMALL, "train", 1)[0], "compact") + " <answer> 12 * 3 </answer>"
    )
    ids = tok(prompt).input_ids
    assert ids == build_tokenizer(SMALL.max_target)(prompt).input_ids
    assert tok.decode(ids, skip_special_tokens=True) == prompt

    calls = []
    real = tiny.warm_start
    monkeypatch.setattr(tiny, "warm_start", lambda *a, **k: calls.append(1) or real(*a, **k))
    capsys.readouterr()
    ensure_base_model(path, config=SMALL, num_threads=1, progress=False)
    assert calls == [] and capsys.readouterr().err == ""  # same config: reused, silently
    ensure_base_model(path, config=SMALL, rebuild=True, num_threads=1, progress=False)
    other = replace(SMALL, model_seed=1, epochs=1)
    ensure_base_model(path, config=other, num_threads=1, progress=False)
    assert calls == [1, 1]
    assert read_build_config(path) == other
    # The thread count is part of the key: under numerics pin 2 it changes the bytes.
    ensure_base_model(path, config=other, num_threads=2, progress=False)
    assert calls == [1, 1, 1]
    assert sorted(os.listdir(tmp_path)) == ["base"]


def test_a_build_under_another_version_of_the_same_pins_is_reused(tmp_path, monkeypatch):
    """Numerics versions 2 and 3 differ in the package's own arithmetic only (`EXACT_CENTRING`),
    which the warm start does not use: a base built under one is reused under the other, so an
    extension following a committed study's version does not rebuild it; another version's
    pins, or an unpinned build, is rebuilt."""
    path = tmp_path / "base"
    monkeypatch.setattr(numerics, "_state", dict(numerics._state))
    monkeypatch.delenv(numerics.OPT_OUT_ENV, raising=False)
    numerics._state.update(pinned=True, version=3, tag="pinned avx2 v3")
    ensure_base_model(path, config=SMALL, num_threads=1, progress=False)
    calls = []
    real = tiny.warm_start
    monkeypatch.setattr(tiny, "warm_start", lambda *a, **k: calls.append(1) or real(*a, **k))
    with numerics.following("pinned avx2 v2"):  # an extension of a version-2 study
        assert numerics.tag() == "pinned avx2 v2"
        assert read_build_config(path) == SMALL
        ensure_base_model(path, config=SMALL, num_threads=1, progress=False)
    assert calls == []
    build = json.loads((path / BUILD_FILE).read_text())
    for other in ("pinned avx2 v1", "native (opted out): not byte-comparable"):
        (path / BUILD_FILE).write_text(json.dumps({**build, "numerics": other}))
        assert read_build_config(path) is None, other
    numerics._state.update(pinned=False, tag="native (opted out): not byte-comparable")
    (path / BUILD_FILE).write_text(json.dumps(build))  # built pinned, read unpinned
    assert read_build_config(path) is None


def test_warm_start_data_is_the_compact_format(tokenizer):
    p = tiny_problems(TinyConfig(), "train", 1)[0]
    ((prompt, sols, rule),) = tiny._encode_problems(tokenizer, [p])
    assert tokenizer.decode(prompt, skip_special_tokens=True) == make_prompt(p, "compact")
    assert len(sols) == len(solve(p))
    assert all(s[-1] == tokenizer.eos_token_id for s in [*sols, rule])
    texts = {tokenizer.decode(s, skip_special_tokens=True) for s in sols}
    assert texts == {compact_completion(e) for e in solve(p)}
    added = " + ".join(str(x) for x in p.nums)
    assert tokenizer.decode(rule, skip_special_tokens=True) == f"<answer> {added} </answer>"


def test_rule_regime_sums_targets_and_mixes_the_rule_into_the_warm_start(tokenizer):
    # Issue 38's designed regime: a share of targets are the numbers' sum, and a share of the
    # warm start's examples are the "add every number" rule, right or wrong.
    base = TinyConfig()
    designed = TinyConfig(sum_fraction=0.5, rule_fraction=0.3)
    assert tiny_problems(TinyConfig(sum_fraction=0.0), "heldout", 50) == tiny_problems(
        base, "heldout", 50
    )
    summed = tiny_problems(designed, "heldout", 400)
    share = np.mean([p.target == sum(p.nums) for p in summed])
    assert 0.4 < share < 0.65  # 0.5 drawn, plus the ~6% the random expressions give anyway
    assert all(p.target <= designed.max_target for p in summed)
    encoded = tiny._encode_problems(tokenizer, tiny_problems(designed, "train", 300))
    rules = {tuple(r) for _, _, r in encoded}
    ex = tiny._epoch_examples(encoded, 4, np.random.default_rng(0), 0.3)
    share = np.mean([tuple(c) in rules for _, c in ex])
    assert 0.25 < share < 0.4  # 0.3 drawn, plus solver solutions that are the rule itself
    ex0 = tiny._epoch_examples(encoded, 4, np.random.default_rng(0))
    assert ex0 == tiny._epoch_examples(encoded, 4, np.random.default_rng(0), 0.0)
    with pytest.raises(ValueError, match="rule_fraction"):
        TinyConfig(rule_fraction=1.5)


# --- prompts the tiny model cannot read (issue 13 item 6) ----------------------------------------


def _backend(tokenizer):
    from llm.rollout.hf import HFGenerateBackend

    model = build_tiny_model(
        tokenizer, seed=0, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32,
    )  # fmt: skip
    return HFGenerateBackend(model.eval(), tokenizer)


def test_representable_numbers(tokenizer):
    assert tokens.representable_numbers(tokenizer) == (0, 100)
    assert tokens.representable_numbers(build_tokenizer(30)) == (0, 30)


def test_encoding_a_prompt_refuses_a_number_outside_the_vocabulary(tokenizer):
    ok = "nums 3 5 100 target 0 :"
    assert tiny.encode_prompt(tokenizer, ok) == tokenizer(ok).input_ids
    with pytest.raises(tokens.UnrepresentableNumberError, match=r"number 150 .* 0\.\.100"):
        tiny.encode_prompt(tokenizer, "nums 3 150 target 7 :")
    with pytest.raises(ValueError, match=r"number 101 .* 0\.\.30"):
        tiny.encode_prompt(build_tokenizer(30), "nums 101 2 target 7 :")


def test_rollout_refuses_a_number_the_tokenizer_cannot_represent(tokenizer):
    # Before: 150 became <unk> and the model was sampled on an unreadable prompt.
    backend = _backend(tokenizer)
    with pytest.raises(
        tokens.UnrepresentableNumberError, match=r"prompt 1: the number 150 .*0\.\.100"
    ):
        backend.generate(["nums 1 2 target 3 :", "nums 150 2 target 7 :"], 2, max_new_tokens=2)


def test_rollout_refuses_a_prompt_longer_than_the_model(tokenizer):
    backend = _backend(tokenizer)
    positions = backend.model.config.max_position_embeddings
    assert positions == TinyConfig.max_position_embeddings == 64
    fits = "nums " + "1 " * (positions - 1 - 3 - 4) + "target 3 :"  # <bos> + 60 words = 61 tokens
    assert len(tokenizer(fits).input_ids) == positions - 3
    backend.generate([fits], 1, max_new_tokens=3)
    with pytest.raises(
        tokens.PromptTooLongError,
        match=r"prompt 0: 61 tokens .*max_new_tokens 4.*64 positions.*at most 3",
    ):
        backend.generate([fits], 1, max_new_tokens=4)
    too_long = "nums " + "1 " * 70 + "target 3 :"
    with pytest.raises(
        tokens.PromptTooLongError, match=r"prompt 1: 75 tokens exceed the model's 64 positions"
    ):
        backend.generate(["nums 1 target 1 :", too_long], 1, max_new_tokens=1)


def test_warm_start_refuses_problems_outside_the_vocabulary():
    from llm.tasks import CountdownProblem

    tok = build_tokenizer(20)
    model = build_tiny_model(tok, seed=0, hidden_size=16, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=32)  # fmt: skip
    with pytest.raises(tokens.UnrepresentableNumberError, match=r"number 21 .* 0\.\.20"):
        warm_start(model, tok, [CountdownProblem(nums=(3, 7), target=21)], progress=False)


def test_a_configs_tiny_data_seed_draws_the_problems_and_names_the_base_model():
    """`tiny_data_seed` reaches the training and held-out streams of the `tiny` sources and the
    TinyConfig the base model is built from; 0 is the package's default."""
    default = TrainConfig()
    seeded = config_from_dict({"tiny_data_seed": 1, "data": {"n_problems": 20},
                               "eval": {"n_problems": 20}})  # fmt: skip
    assert tiny_config(default) == TinyConfig()
    assert tiny_config(seeded) == replace(TinyConfig(), data_seed=1)
    assert load_train_problems(seeded) == tiny_problems(tiny_config(seeded), "train", 20)
    assert load_eval_sets(seeded)["heldout"] == tiny_problems(tiny_config(seeded), "heldout", 20)
    assert load_eval_sets(seeded)["heldout"] != tiny_problems(TinyConfig(), "heldout", 20)
    with pytest.raises(ValueError, match="tiny_data_seed"):
        config_from_dict({"tiny_data_seed": -1})
