"""Train config: TOML loading, resolved round trip, and a ValueError naming every bad field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from llm.config import config_from_dict, config_to_toml, describe, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_default_config_loads_and_round_trips(tmp_path):
    cfg = load_config(ROOT / "configs" / "countdown_tiny.toml")
    assert cfg.method == "grpo" and cfg.group_size == 8
    text = config_to_toml(cfg)
    again = config_from_dict(tomllib.loads(text))
    assert config_to_toml(again) == text
    (tmp_path / "c.toml").write_text(text)
    assert load_config(tmp_path / "c.toml", steps=3).steps == 3


def test_describe_documents_every_key():
    text = describe()
    for key in ("group_size", "inner_epochs", "data.source", "eval.n_samples", "kl_coef"):
        assert key in text


@pytest.mark.parametrize(
    ("override", "name"),
    [
        ({"group_size": 0}, "group_size"),
        ({"prompts_per_step": 1.5}, "prompts_per_step"),
        ({"lr": -1.0}, "lr"),
        ({"schedule": "step"}, "schedule"),
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": 0}, "temperature"),
        ({"template": "chat"}, "template"),
        ({"method": "ppo"}, "method"),
        ({"backend": "vllm"}, "backend"),
        ({"adam_betas": [0.9]}, "adam_betas"),
        ({"steps": True}, "steps"),
        ({"colour": "red"}, "colour"),
        ({"data": {"source": "web"}}, "data.source"),
        ({"data": {"source": "file"}}, "data.path"),
        ({"data": {"bogus": 1}}, "bogus"),
        ({"data": {"max_number": 0, "min_number": 3}}, "data.max_number"),
        ({"eval": {"n_samples": 0}}, "eval.n_samples"),
        ({"hyper": {"gamma": 1.0}, "method": "ds_grpo"}, "gamma"),
        ({"hyper": {"gamma_p": -1.0}, "method": "ds_grpo"}, "gamma_p"),
        ({"hyper": {"k": 16}, "method": "passk", "group_size": 8}, "k"),
        ({"hyper": {"kl_coef": 0.1}}, "hyper.kl_coef"),
        ({"hyper": {"loss_agg": "sum"}}, "loss_agg"),
    ],
)
def test_invalid_fields_raise_naming_them(override, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        config_from_dict(override)


def test_casp_raises_candidates_to_its_top_n():
    cfg = config_from_dict({"method": "casp", "top_n": 0, "hyper": {"top_n": 4}})
    assert cfg.n_candidates == 4
    assert config_from_dict({"method": "grpo", "top_n": 2}).n_candidates == 2
