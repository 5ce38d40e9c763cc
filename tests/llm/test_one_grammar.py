"""One ``[[methods]]`` block, both sweeps: the toy and the LLM read it with the same grammar
(`experiment.spec`) and their results.json files pass the same schema (`experiment.report`)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from experiment import report
from experiment.spec import parse_methods, parse_reference
from llm.__main__ import main as llm_main
from llm.config import load_config
from llm.orchestrate import study_spec as llm_study
from llm.orchestrate.sweep_spec import load_sweep
from toymdp import study_spec as toy_study
from toymdp import sweep_spec as toy_spec
from toymdp.__main__ import main as toy_main

from .test_sweep import BASE  # the base train config of the LLM sweep tests

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

METHODS = """
seeds = [0, 1]
checkpoints = [1, 2]
reference = ["grpo"]

[[methods]]
method = "grpo"
points = [{}, { kl_coef = 0.1 }]

[[methods]]
method = "entropy_bonus"
label = "bonus"
fixed = { form = "token" }
grid = { eta = [0.3] }
"""

TOY = """
[env]
kind = "dataset"
num_actions = 2
depth = 2
draws = [0]
base_correctness = 0.2
multiplicities = [1, 2]
per_size = 2

[train]
updates = 2
group_size = 4
pass_k = [1, 4]
distinct_k = 4
fast_compile = true

[frontier]
num_resamples = 50
"""

LLM = """
base = "base.toml"
[eval]
problems = 3
samples = 4
seed = 7
"""


def _split(text: str) -> tuple[str, str]:
    """The top-level keys of a TOML text, then its tables (TOML wants top-level keys first)."""
    head, _, tables = text.partition("\n[")
    return head, "[" + tables if tables else ""


@pytest.mark.slow
def test_one_methods_block_feeds_both_sweeps_and_one_schema(tmp_path, tiny_model_path):
    common, methods = _split(METHODS)
    toy_cfg = tmp_path / "toy.toml"
    toy_cfg.write_text(common + TOY + methods)
    assert toy_main(["sweep", "--config", str(toy_cfg), "--out", str(tmp_path / "toy")]) == 0

    (tmp_path / "base.toml").write_text(BASE.format(model=tiny_model_path))
    llm_head, llm_tables = _split(LLM)
    llm_cfg = tmp_path / "llm.toml"
    llm_cfg.write_text(llm_head + common + llm_tables + methods)
    out = tmp_path / "llm"
    assert llm_main(["sweep", "--config", str(llm_cfg), "--out", str(out), "--workers", "1"]) == 0

    docs = {
        leg: json.loads((tmp_path / leg / "results.json").read_text()) for leg in ("toy", "llm")
    }
    for leg, doc in docs.items():
        report.validate_results(doc)
        assert doc["leg"] == leg and doc["schema"] == report.RESULTS_SCHEMA
        assert doc["methods"] == {"grpo": "grpo", "bonus": "entropy_bonus"}
        assert doc["reference"] == ["grpo"] and doc["seeds"] == [0, 1]
        assert doc["checkpoints"] == [1, 2]
        for section in doc["frontier"].values():
            labels = [(m["label"], m["setting"]) for m in section["models"] if not m["reference"]]
            assert labels[-1][0] == "bonus" and "eta" in labels[-1][1]
    # The same grammar gives the same settings in both legs.
    toy_settings = [(r["label"], r["values"]) for r in docs["toy"]["runs"]]
    assert toy_settings == [("grpo", {}), ("grpo", {"kl_coef": 0.1}), ("bonus", {"eta": 0.3})]
    llm_settings = [(s["label"], s["params"]) for s in docs["llm"]["settings"]["settings"]]
    assert llm_settings == [
        ("grpo", {}), ("grpo", {"kl_coef": 0.1}), ("bonus", {"form": "token", "eta": 0.3}),
    ]  # fmt: skip


def test_the_schema_names_a_missing_or_mistyped_key():
    doc = report.results_header(
        "toy", numerics_tag="pinned", config={}, methods={"grpo": "grpo"}, reference=["grpo"],
        seeds=[0], checkpoints=[1],
    )  # fmt: skip
    model = {"label": "grpo", "setting": "default", "step": 1, "reference": True,
             "status": "reference", "x": 0.1, "y": None, "lift": None, "lift_lo": None,
             "lift_hi": None, "lift_se": None, "lift_df": None, "lift_p": None,
             "inside_fraction": 1.0}  # fmt: skip
    section = {"k": 4, "level": 0.95, "num_resamples": 10, "procedure": "lift v3",
               "hull": [[0.0, 0.0]], "models": [model]}  # fmt: skip
    doc["frontier"] = {m: dict(section) for m in report.MEASURES}
    report.validate_results(doc)
    with pytest.raises(ValueError, match="schema"):
        report.validate_results({**doc, "schema": "other/0"})
    with pytest.raises(ValueError, match=r"^seeds: missing"):
        report.validate_results({k: v for k, v in doc.items() if k != "seeds"})
    bad = {**model, "step": "1"}
    doc["frontier"]["pass_at_k"] = {**section, "models": [bad]}
    with pytest.raises(ValueError, match=r"frontier.pass_at_k.models\[0\].step"):
        report.validate_results(doc)


SWEEPS = sorted(CONFIGS.glob("sweep*.toml")) + sorted(
    p for p in CONFIGS.glob("toy/*.toml") if not p.name.startswith("study")
)
# Study files: a sweep plus a ``[study]`` table, read by their leg's `load_study`.
STUDIES = sorted(CONFIGS.glob("study*.toml")) + sorted(CONFIGS.glob("toy/study*.toml"))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_config_uses_the_grammar_without_old_keys(path):
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    entries = parse_methods(doc["methods"])  # a removed spelling raises
    assert parse_reference(doc.get("reference"), entries)


TRAIN_CONFIGS = sorted(
    p for p in CONFIGS.glob("*.toml") if not p.name.startswith(("sweep", "study"))
)


@pytest.mark.parametrize("path", TRAIN_CONFIGS + SWEEPS, ids=lambda p: p.name)
def test_every_config_validates_through_the_schema(path):
    """Train configs through `llm.config` (declared with `experiment.schema` options), sweep files
    through their driver (the shared grammar plus `experiment.schema`-declared tables), with no
    removed spelling (`experiment.schema.removed`)."""
    if path in TRAIN_CONFIGS:
        load_config(path)
    elif path.parent.name == "toy":
        toy_spec.load_config(path)
    else:
        load_sweep(path)


def test_both_sweep_commands_describe_every_key(capsys):
    assert toy_main(["sweep", "--describe"]) == 0
    toy = capsys.readouterr().out
    assert llm_main(["sweep", "--describe"]) == 0
    llm = capsys.readouterr().out
    for text in (toy, llm):
        assert "methods.zip  # " in text and "checkpoints  # " in text
    assert "env.num_actions = 4  # " in toy and "frontier.num_resamples" in toy
    assert "eval.samples = 0  # " in llm and "base  # " in llm


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_study_config_validates_through_its_leg(path):
    """Study files: the sweep part through the shared grammar and the leg's sweep schema, the
    ``[study]`` table through the leg's `StudySpec`, with no old spelling."""
    sweep, spec = (toy_study if path.parent.name == "toy" else llm_study).load_study(path)
    doc = sweep.doc  # the sweep document as written, either leg
    entries = parse_methods(doc["methods"])
    assert parse_reference(doc.get("reference"), entries)
    fresh = spec.confirm_draws if path.parent.name == "toy" else spec.confirm_seeds
    assert fresh  # load_study has checked them fresh (not exploratory)
