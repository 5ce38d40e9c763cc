"""Train config: TOML loading, resolved round trip, and a ValueError naming every bad field."""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
import typing
import warnings
from pathlib import Path

import pytest

import shaping
from experiment import schema
from experiment.schema import parse_value
from llm.config import (
    OLD_KEYS,
    TrainConfig,
    apply_overrides,
    check_model_path,
    config_from_dict,
    config_to_toml,
    describe,
    load_config,
)

ROOT = Path(__file__).resolve().parents[2]


def test_default_config_loads_and_round_trips(tmp_path):
    cfg = load_config(ROOT / "configs" / "countdown_tiny.toml")
    assert cfg.method == "grpo" and cfg.rollout.group_size == 8
    text = config_to_toml(cfg)
    again = config_from_dict(tomllib.loads(text))
    assert config_to_toml(again) == text
    (tmp_path / "c.toml").write_text(text)
    assert load_config(tmp_path / "c.toml", steps=3).steps == 3


def test_describe_documents_every_key():
    text = describe()
    for key in (
        "rollout.group_size",
        "optim.inner_epochs",
        "data.source",
        "eval.samples",
        "kl_coef",
    ):
        assert key in text


@pytest.mark.parametrize(
    ("override", "name"),
    [
        ({"rollout": {"group_size": 0}}, "rollout.group_size"),
        ({"rollout": {"prompts_per_step": 1.5}}, "rollout.prompts_per_step"),
        ({"optim": {"lr": -1.0}}, "optim.lr"),
        ({"optim": {"schedule": "step"}}, "optim.schedule"),
        ({"rollout": {"top_p": 0.0}}, "rollout.top_p"),
        ({"rollout": {"temperature": 0}}, "rollout.temperature"),
        ({"template": "chat"}, "template"),
        ({"method": "ppo"}, "method"),
        ({"rollout": {"backend": "vllm"}}, "rollout.backend"),
        ({"optim": {"adam_betas": [0.9]}}, "optim.adam_betas"),
        ({"steps": True}, "steps"),
        ({"colour": "red"}, "colour"),
        ({"data": {"source": "web"}}, "data.source"),
        ({"data": {"source": "file"}}, "data.path"),
        ({"data": {"bogus": 1}}, "bogus"),
        ({"data": {"max_number": 0, "min_number": 3}}, "data.max_number"),
        ({"eval": {"samples": 0}}, "eval.samples"),
        ({"hyper": {"gamma": 1.0}, "method": "ds_grpo"}, "gamma"),
        ({"hyper": {"gamma_p": -1.0}, "method": "ds_grpo"}, "gamma_p"),
        ({"hyper": {"k": 16}, "method": "passk", "rollout": {"group_size": 8}}, "k"),
        ({"hyper": {"kl_coef": 0.1}}, "hyper.kl_coef"),
        ({"hyper": {"loss_agg": "sum"}}, "loss_agg"),
    ],
)
def test_invalid_fields_raise_naming_them(override, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        config_from_dict(override)


def test_casp_raises_candidates_to_its_top_n():
    cfg = config_from_dict({"method": "casp", "rollout": {"top_n": 0}, "hyper": {"top_n": 4}})
    assert cfg.n_candidates == 4
    assert config_from_dict({"method": "grpo", "rollout": {"top_n": 2}}).n_candidates == 2


# ---------------------------------------------------------------------------------------------
# Rules from field metadata (issue 10 item 3) and the named config errors of issue 13 item 7


@pytest.mark.parametrize(
    ("hyper", "value"),
    [
        ({"gamma_p": "0.1"}, "'0.1'"),  # was numpy's UFuncTypeError at validation
        ({"gamma_p": [0.1]}, r"\[0\.1\]"),  # passed validation, failed at the first step
        ({"gamma_p": math.inf}, "inf"),  # passed, then failed writing config.toml
        ({"gamma_p": math.nan}, "nan"),
        ({"gamma_p": True}, "True"),
        ({"logp_reduction": 3}, "3"),
    ],
)
def test_hyper_types_come_from_the_method_defaults(hyper, value):
    name = next(iter(hyper))
    with pytest.raises(ValueError, match=rf"hyper\.{name}: expected .*ds_grpo.*got {value}"):
        config_from_dict({"method": "ds_grpo", "hyper": hyper})


def test_integer_hyper_refuses_a_float():
    with pytest.raises(ValueError, match=r"hyper\.k: expected an integer .*got 2\.5"):
        config_from_dict({"method": "passk", "hyper": {"k": 2.5}})
    assert config_from_dict({"method": "ds_grpo", "hyper": {"gamma_p": 0}}).hyper == {"gamma_p": 0}


@pytest.mark.parametrize(
    ("override", "name"),
    [
        ({"seed": 2**63 - 1}, "seed"),  # passed validation, failed in np.random.seed at train time
        ({"data": {"seed": 2**32}}, r"data\.seed"),
        ({"eval": {"seed": -1}}, r"eval\.seed"),
        (
            {"rollout": {"group_size": 1}},
            "rollout.group_size",
        ),  # a group of one has advantage 0: loss always 0
        ({"optim": {"lr": math.inf}}, "optim.lr"),
        ({"rollout": {"temperature": math.nan}}, "rollout.temperature"),
        ({"system": {"device": "cudafoo"}}, "system.device"),
        ({"model_path": ""}, "model_path"),
        ({"data": {"num_numbers": []}}, r"data\.num_numbers"),
        ({"eval": {"paths": [""], "source": "file"}}, r"eval\.paths"),
    ],
)
def test_out_of_range_values_name_field_and_value(override, name):
    with pytest.raises(ValueError, match=rf"^{name}: expected .*, got "):
        config_from_dict(override)


def _violations(f: dataclasses.Field, hint: object) -> list[object]:
    """Values just outside the bounds declared in `f.metadata` (as the field's own type)."""
    if hint not in (int, float):
        return []
    step = 1 if hint is int else 1e-3
    m = f.metadata
    out = []
    if m.get("ge") is not None:
        out.append(hint(m["ge"] - step))
    if m.get("gt") is not None:
        out.append(hint(m["gt"]))
    if m.get("le") is not None:
        out.append(hint(m["le"] + step))
    if m.get("lt") is not None:
        out.append(hint(m["lt"]))
    return out


def test_every_declared_bound_is_enforced_and_documented():
    text = describe()
    checked = 0
    tables = (("", TrainConfig), *schema.tables(TrainConfig).items())
    for table, cls in tables:
        hints = typing.get_type_hints(cls)
        docs = schema.field_docs(cls)
        for f, _ in schema.options(cls):
            key = f"{table}.{f.name}" if table else f.name
            assert docs[f.name] and docs[f.name] in text, key
            for bad in _violations(f, hints[f.name]):
                raw = {table: {f.name: bad}} if table else {f.name: bad}
                with pytest.raises(ValueError, match=rf"^{re.escape(key)}: expected"):
                    config_from_dict(raw)
                checked += 1
    assert checked >= 30


def test_describe_shows_rules_and_method_defaults():
    text = describe()
    assert "rollout.group_size = 8  # G: " in text and "(an integer >= 2)" in text
    assert "top_p = 1.0" in text and "(a finite number in (0, 1])" in text
    assert "ds_grpo: " in text and "gamma_p = 0.02" in text


# ---------------------------------------------------------------------------------------------
# --set KEY=VALUE


def test_apply_overrides_parses_toml_literals_and_dotted_keys():
    raw = {"optim": {"lr": 1e-4}, "data": {"source": "tiny", "n_problems": 10}}
    pairs = [
        "optim.lr=3e-4",
        "method=ds_grpo",  # a bare word is a string
        'template="compact"',
        "data.seed=3",
        "hyper.gamma_p=0.05",
        "vllm.gpu_memory_utilization=0.5",
        "optim.adam_betas=[0.8, 0.9]",
        "run.tensorboard=false",
        "eval={samples = 4}",
        "model_path=runs/my model",
    ]
    out = apply_overrides(raw, pairs)
    assert raw == {"optim": {"lr": 1e-4}, "data": {"source": "tiny", "n_problems": 10}}  # kept
    assert out["optim"]["lr"] == 3e-4 and out["method"] == "ds_grpo"
    assert out["template"] == "compact"
    assert out["data"] == {"source": "tiny", "n_problems": 10, "seed": 3}
    assert out["hyper"] == {"gamma_p": 0.05} and out["vllm"] == {"gpu_memory_utilization": 0.5}
    assert out["optim"]["adam_betas"] == [0.8, 0.9] and out["run"] == {"tensorboard": False}
    assert out["eval"] == {"samples": 4} and out["model_path"] == "runs/my model"
    cfg = config_from_dict(out)
    assert cfg.data.seed == 3 and cfg.hyper == {"gamma_p": 0.05} and cfg.eval.samples == 4


def test_parse_value():
    assert parse_value("3e-4") == 3e-4 and parse_value("8") == 8 and parse_value("true") is True
    assert parse_value("[1, 8]") == [1, 8] and parse_value('"a b"') == "a b"
    assert math.isinf(parse_value("inf")) and parse_value("ds_grpo") == "ds_grpo"
    assert parse_value("1\nseed = 2") == "1\nseed = 2"  # never more than one value


@pytest.mark.parametrize(
    ("pair", "match"),
    [
        ("colour=red", "colour=red: unknown key 'colour'"),
        ("rollout.grup_size=4", "did you mean \\['group_size'\\]"),
        ("data.bogus=1", "data.bogus=1: unknown key 'data.bogus'; known: \\['source'"),
        ("a.b.c=1", "a.b.c=1: unknown key"),
        ("optim.lr", "'optim.lr': expected KEY=VALUE"),
        ("=3", "expected KEY=VALUE"),
    ],
)
def test_apply_overrides_names_a_bad_key(pair, match):
    with pytest.raises(ValueError, match=match):
        apply_overrides({}, [pair])


@pytest.mark.parametrize(
    ("pair", "match"),
    [
        ("optim.lr=abc", r"optim\.lr: expected a finite number in \(0, 1\], got 'abc'"),
        ("optim.lr=inf", r"optim\.lr: expected a finite number in \(0, 1\], got inf"),
        ("data.seed=-2", r"data\.seed: expected an integer in \[0, 4294967295\], got -2"),
        ("hyper.gamma=1", r"hyper\.gamma = 1: not a hyper-parameter of grpo"),
        ("method=ppo", "method: expected one of .*got 'ppo'"),
    ],
)
def test_load_config_with_a_bad_set_value_names_key_and_value(pair, match):
    with pytest.raises(ValueError, match=match):
        load_config(ROOT / "configs" / "countdown_tiny.toml", sets=[pair])


def test_load_config_sets_then_keyword_overrides():
    path = ROOT / "configs" / "countdown_tiny.toml"
    cfg = load_config(path, sets=["optim.lr=3e-4", "steps=2", "data.n_problems=7"])
    assert (cfg.optim.lr, cfg.steps, cfg.data.n_problems, cfg.data.source) == (3e-4, 2, 7, "tiny")
    assert load_config(path, sets=["steps=2"], steps=5).steps == 5  # --steps wins
    assert load_config(path, sets=["steps=2"], steps=None).steps == 2


def test_check_model_path(tmp_path):
    cfg = config_from_dict({"model_path": str(tmp_path / "missing")})
    with pytest.raises(FileNotFoundError, match=r"model_path: '.*missing' does not exist"):
        check_model_path(cfg)
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        check_model_path(dataclasses.replace(cfg, model_path=str(tmp_path / "file")))
    check_model_path(dataclasses.replace(cfg, model_path=str(tmp_path)))
    check_model_path(dataclasses.replace(cfg, build_base_model=True))  # the trainer builds it


# ---------------------------------------------------------------------------------------------
# Old flat keys (before [rollout], [optim], [system], [run]): accepted for one release


OLD_FLAT = """
model_path = "runs/base_tiny"
group_size = 4
lr = 3e-4
micro_batch_size = 4
save_every = 5
kl_coef = 0.01

[data]
n_problems = 10
"""
NEW = """
model_path = "runs/base_tiny"
kl_coef = 0.01

[rollout]
group_size = 4

[optim]
lr = 3e-4

[system]
micro_batch_size = 4

[run]
save_every = 5

[data]
n_problems = 10
"""


def test_every_old_key_names_a_current_key():
    """`OLD_KEYS` maps each removed spelling to a key that exists: a flat key to its own name in
    its table, ``eval.n_samples`` to ``eval.samples``; no current key is refused."""
    tables = schema.tables(TrainConfig)
    for old, new in OLD_KEYS.items():
        table, name = new.split(".")
        assert name in {f.name for f in dataclasses.fields(tables[table])}
        assert name == old or old == f"{table}.n_samples"
    assert not set(OLD_KEYS) & {f.name for f in dataclasses.fields(TrainConfig)}


@pytest.mark.parametrize("old", sorted(OLD_KEYS))
def test_an_old_key_is_refused_in_one_line_naming_the_new_key(tmp_path, old):
    """A removed spelling in a file, a --set pair, a keyword override (flat keys) or a parsed
    document (a run folder's saved config.toml, a sweep's [train]) is one ValueError line that
    names the key replacing it."""
    new = OLD_KEYS[old]
    table, _, name = old.rpartition(".")
    raw = {table: {name: 4}} if table else {name: 4}
    want = rf"^{re.escape(old)}: removed; write {re.escape(new)}$"
    with pytest.raises(ValueError, match=want):
        config_from_dict(raw)
    with pytest.raises(ValueError, match=want):
        apply_overrides({}, [f"{old}=4"])
    (tmp_path / "c.toml").write_text(f"[{table}]\n{name} = 4\n" if table else f"{name} = 4\n")
    line = 2 if table else 1
    with pytest.raises(ValueError, match=re.escape(f"c.toml, line {line}: {old}: removed; write")):
        load_config(tmp_path / "c.toml")
    if not table:
        (tmp_path / "d.toml").write_text("")
        with pytest.raises(ValueError, match=want):
            load_config(tmp_path / "d.toml", **{name: 4})


def test_an_old_flat_file_is_refused_and_its_new_layout_loads(tmp_path):
    (tmp_path / "old.toml").write_text(OLD_FLAT)
    (tmp_path / "new.toml").write_text(NEW)
    with pytest.raises(
        ValueError, match=r"old\.toml, line \d+: \w+: removed; write (rollout|optim)\."
    ):
        load_config(tmp_path / "old.toml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = load_config(
            tmp_path / "new.toml", sets=["rollout.group_size=8"], system={"precision": "bf16"}
        )
    assert new.optim.lr == 3e-4 and new.run.save_every == 5 and new.rollout.group_size == 8
    assert new.system.precision == "bf16"


def test_the_loss_coefficients_are_resolved_once_read_only():
    cfg = config_from_dict({"method": "dr_grpo", "kl_coef": 0.1, "rollout": {"max_new_tokens": 9}})
    hyper = cfg.loss_hyper
    assert hyper["kl_coef"] == 0.1 and hyper["entropy_coef"] == 0.0
    assert hyper["max_response_length"] == 9  # Dr. GRPO's divisor: the generation budget
    assert hyper["loss_agg"] == shaping.METHODS["dr_grpo"].defaults["loss_agg"]
    with pytest.raises(TypeError):
        hyper["kl_coef"] = 0.0  # type: ignore[index]
    cfg = config_from_dict({"method": "dr_grpo", "hyper": {"max_response_length": 32}})
    assert cfg.loss_hyper["max_response_length"] == 32


def test_gpu_evaluation_settings_key_the_evaluation_only_when_not_the_defaults():
    """``eval.prompts_per_batch`` changes the samples (one seed per generate call) and a GPU the
    bits, so both key an evaluation; at their defaults the key is as before (CPU caches stay)."""
    import torch

    from llm.config import config_from_dict
    from llm.orchestrate.jobs import eval_key
    from llm.run.distributed import set_matmul_precision

    ev = {"problems": 2, "samples": 2, "seed": 0}
    plain = eval_key(ev, config_from_dict({}), [], "heldout")
    assert "prompts_per_batch" not in plain and "device" not in plain
    gpu = config_from_dict({"eval": {"prompts_per_batch": 16}, "system": {"tf32": True}})
    # the key is computed without touching the device
    gpu = dataclasses.replace(gpu, system=dataclasses.replace(gpu.system, device="cuda"))
    key = eval_key(ev, gpu, [], "heldout")
    assert key["prompts_per_batch"] == 16 and key["device"] == "cuda" and key["tf32"] is True
    split = eval_key(ev, config_from_dict({"eval": {"max_responses_per_call": 512}}), [], "heldout")
    assert split["max_responses_per_call"] == 512 and "prompts_per_batch" not in split
    before = torch.get_float32_matmul_precision()
    set_matmul_precision("cpu", True)  # a CPU run is never changed
    assert torch.get_float32_matmul_precision() == before


def test_the_stacked_sampler_needs_the_transformers_backend():
    cfg = config_from_dict({"eval": {"sampler": "stacked"}})
    assert cfg.eval.sampler == "stacked"
    raw = {"eval": {"sampler": "stacked"}, "rollout": {"backend": "vllm"},
           "system": {"device": "cuda"}}  # fmt: skip
    with pytest.raises(
        ValueError, match=r"^eval\.sampler: expected generate with rollout\.backend"
    ):
        config_from_dict(raw)
    with pytest.raises(ValueError, match=r"eval\.sampler: expected one of"):
        config_from_dict({"eval": {"sampler": "vllm"}})


def test_every_train_config_is_valid_a_replace_included():
    """`TrainConfig.__post_init__` checks each construction: a `dataclasses.replace` that breaks a
    field's rule or a rule between fields raises, naming the key, as a file would."""
    cfg = config_from_dict({})
    with pytest.raises(ValueError, match=r"^template: expected one of"):
        dataclasses.replace(cfg, template="no-such-template")
    with pytest.raises(ValueError, match=r"^control\.adaptive_kl: expected false unless kl_coef"):
        dataclasses.replace(cfg, control=dataclasses.replace(cfg.control, adaptive_kl=True))
    with pytest.raises(ValueError, match=r"^steps: expected an integer >= 1, got 0$"):
        TrainConfig(steps=0)
    assert dataclasses.replace(cfg, steps=3).steps == 3
