"""The paper-reproduction configs (configs/*.toml but the tiny CPU one): complete, consistent with
`shaping.METHODS`, and loadable by `llm.config.load_config`.

Sources of the values: docs/paper_setups.md; memory plan: docs/gpu_memory.md.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

import shaping

ROOT = Path(__file__).resolve().parents[2]
# The papers' GPU setups: every train config but the CPU ones (the tiny model, SmolLM2) and sweeps.
PAPER_CONFIGS = sorted(
    p
    for p in (ROOT / "configs").glob("*.toml")
    if p.name != "countdown_tiny.toml"
    and "smollm2" not in p.name
    and not p.name.startswith("sweep")
)

REQUIRED_TOP = (
    "task",
    "model_path",
    "template",
    "method",
    "seed",
    "group_size",
    "prompts_per_step",
    "steps",
    "inner_epochs",
    "micro_batch_size",
    "lr",
    "kl_coef",
    "temperature",
    "top_p",
    "max_new_tokens",
    "backend",
    "device",
    "precision",
    "gradient_checkpointing",
    "parallel",
    "rollout_is",
)
REQUIRED_TABLES = {
    "hyper": (),
    "vllm": (
        "gpu_memory_utilization",
        "sleep_mode",
        "tensor_parallel_size",
        "max_model_len",
        "enforce_eager",
        "dtype",
    ),
    "data": ("source", "path"),
    "eval": ("source", "paths", "n_samples", "temperature", "top_p"),
}


def _raw(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def test_there_are_paper_configs():
    assert len(PAPER_CONFIGS) >= 5, [p.name for p in PAPER_CONFIGS]


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=_ids(PAPER_CONFIGS))
def test_required_keys_present(path):
    raw = _raw(path)
    missing = [k for k in REQUIRED_TOP if k not in raw]
    for table, keys in REQUIRED_TABLES.items():
        if not isinstance(raw.get(table), dict):
            missing.append(f"[{table}]")
            continue
        missing += [f"{table}.{k}" for k in keys if k not in raw[table]]
    assert not missing, f"{path.name}: missing {missing}"
    assert raw["task"] in ("countdown", "math")
    assert raw["data"]["source"] == "file" and raw["data"]["path"]
    assert raw["eval"]["source"] == "file" and raw["eval"]["paths"]
    assert raw["backend"] == "vllm" and raw["device"].startswith("cuda")


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=_ids(PAPER_CONFIGS))
def test_method_and_hyper_names_exist_in_shaping(path):
    raw = _raw(path)
    method = raw["method"]
    assert method in shaping.METHODS, f"{path.name}: unknown method {method!r}"
    defaults = shaping.METHODS[method].defaults
    unknown = sorted(set(raw["hyper"]) - set(defaults))
    assert not unknown, f"{path.name}: [hyper] keys {unknown} not in {sorted(defaults)}"
    # kl_coef is top-level: it also decides whether the reference model is loaded.
    assert "kl_coef" not in raw["hyper"]


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=_ids(PAPER_CONFIGS))
def test_batch_sizes_and_lengths_are_consistent(path):
    raw = _raw(path)
    for key in ("group_size", "prompts_per_step", "steps", "inner_epochs", "micro_batch_size"):
        value = raw[key]
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 1, (key, value)
    # A mini-batch (verl ppo_mini_batch_size) must split the step's prompts evenly.
    per_update = raw.get("prompts_per_update", raw["prompts_per_step"])
    assert 1 <= per_update <= raw["prompts_per_step"]
    assert raw["prompts_per_step"] % per_update == 0, (raw["prompts_per_step"], per_update)
    # The engine must hold the longest prompt plus the longest response.
    needed = raw.get("max_prompt_tokens", 0) + raw["max_new_tokens"]
    assert raw["vllm"]["max_model_len"] >= needed, (raw["vllm"]["max_model_len"], needed)
    assert 0 < raw["vllm"]["gpu_memory_utilization"] < 1


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=_ids(PAPER_CONFIGS))
def test_load_config_accepts_it(path):
    from llm.config import load_config

    cfg = load_config(path)
    assert cfg.method == _raw(path)["method"]
