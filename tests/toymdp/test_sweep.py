"""`python -m toymdp sweep`: a 2-run smoke test, the cache, the config errors, the dataset."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import shaping
from experiment.spec import parse_methods
from shaping import methods as shaping_methods
from toymdp import environments as E
from toymdp import study_spec as TSS
from toymdp import sweep as S
from toymdp import sweep_spec as D
from toymdp.__main__ import main
from toymdp.experiments import passk

# No `fast_compile = true`: a sweep's default compile options (`toymdp.engine.COMPILE_OPTIONS`:
# the same optimization level plus the classic CPU code generator) compile it about twice as fast.
TINY = """
seeds = [0, 1]
checkpoints = [1]

[env]
kind = "dataset"
num_actions = 2
depth = 2
draws = [0]
base_correctness = 0.2
multiplicities = [1, 2]
per_size = 2

[train]
updates = 3
group_size = 4
pass_k = [1, 4]
distinct_k = 4

[frontier]
num_resamples = 50

[[methods]]
method = "grpo"

[[methods]]
method = "entropy_bonus"
grid = { eta = [0.3] }
"""


def _write(tmp_path: Path, text: str, name: str = "tiny.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_two_run_sweep_writes_results_frontier_and_lifts(tmp_path, capsys):
    cfg, out = _write(tmp_path, TINY), tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "2 runs trained" in printed.out
    # stderr is not a terminal here (as in a log): a line per compiled program, not a bar.
    assert [line.split(",")[0] for line in printed.err.splitlines()] == [
        "toy sweep: 1/2 (grpo (1 setting))",
        "toy sweep: 2/2 (entropy_bonus (1 setting))",
    ]
    doc = json.loads((out / "results.json").read_text())
    assert doc["axes"]["eval_steps"] == [0, 1, 3]
    assert [r["label"] for r in doc["runs"]] == ["grpo", "entropy_bonus"]
    assert doc["runs"][1]["setting"] == "eta=0.3"
    grpo, bonus = (np.asarray(r["metrics"]["heldout/pass_at_k"]) for r in doc["runs"])
    assert grpo.shape == (1, 2, 3, 2)  # (draws, seeds, eval steps, pass_k)
    # Step 0 is the base policy for every run and seed; training moves the training prompts.
    np.testing.assert_allclose(grpo[:, :, 0], bonus[:, :, 0], rtol=1e-6)
    train = np.asarray(doc["runs"][0]["metrics"]["train/correctness"])
    assert not np.allclose(train[:, :, -1], train[:, :, 0])
    lifts = doc["frontier"]["pass_at_k"]["models"]
    assert sum(m["reference"] for m in lifts) == 3  # GRPO's three checkpoints
    # A method is read at every checkpoint too (each run a path, as GRPO's).
    others = [(m["label"], m["step"]) for m in lifts if not m["reference"]]
    assert others == [("entropy_bonus", 1), ("entropy_bonus", 3)]
    assert (out / "frontier.png").stat().st_size > 0
    assert "| entropy_bonus | eta=0.3 | 3 |" in (out / "lifts.md").read_text()

    # The second run reads the cache and writes the same results.
    first = (out / "results.json").read_bytes()
    assert main(["sweep", "--config", str(cfg), "--out", str(out)]) == 0
    assert "loaded from cache" in capsys.readouterr().out
    assert (out / "results.json").read_bytes() == first


def test_set_overrides_the_file_and_names_its_own_errors(tmp_path, capsys):
    """``sweep --set KEY=VALUE`` as ``llm sweep --set``: the run uses (and results.json records)
    the overridden document; a bad value is named as ``--set KEY``, an unknown key by its pair."""
    cfg, out = _write(tmp_path, TINY), tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--out", str(out), "--set", "seeds=[3]",
                 "train.lr=0.05"]) == 0  # fmt: skip
    capsys.readouterr()  # the run's output and its progress lines
    doc = json.loads((out / "results.json").read_text())
    assert doc["axes"]["seeds"] == [3] and doc["config"]["seeds"] == [3]
    assert doc["config"]["train"]["lr"] == 0.05 and "seeds = [0, 1]" in cfg.read_text()
    for pair, message in [
        ("train.lr=nan", "error: --set train.lr: expected a finite number"),
        ("nosuch=1", "error: --set 'nosuch=1': unknown sweep key 'nosuch'"),
    ]:
        assert main(["sweep", "--config", str(cfg), "--out", str(tmp_path / "x"),
                     "--set", pair]) == 2  # fmt: skip
        assert capsys.readouterr().err.startswith(message)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ('kind = "dataset"', 'kind = "forest"'),
            r"env.kind: expected one of \['dataset', 'single'\]",
        ),
        (("updates = 3", "updates = 0"), "train.updates: expected an integer >= 1"),
        (
            ("checkpoints = [1]", "checkpoints = [9]"),
            r"checkpoints: expected steps in \[0, steps = 3\]",
        ),
        (
            ("eta = [0.3]", "etta = [0.3]"),
            r"methods\[entropy_bonus\].etta: unknown hyper-parameter",
        ),
        (('method = "grpo"', 'method = "grpoo"'), r"methods\[0\].method: expected one of"),
        (("checkpoints = [1]", 'checkpoints = [1]\nreference = ["ppo"]'), "reference"),
        (("[train]", "[training]"), r"unknown key\(s\) \['training'\]"),
        (("per_size = 2", "per_size = 2\nfoo = 1"), r"env: unknown key\(s\) \['foo'\]"),
        (("base_correctness = 0.2", "base_correctness = [0.1]"), "env.base_correctness"),
    ],
)
def test_bad_config_names_the_key(tmp_path, edit, message):
    path = _write(tmp_path, TINY.replace(*edit))
    with pytest.raises(ValueError, match=message):
        D.load_config(path)


def test_cli_reports_config_errors(tmp_path, capsys):
    path = _write(tmp_path, TINY.replace("updates = 3", "updates = -1"))
    try:  # argparse's error exits; main's error wrapping (if any) returns the status instead
        status = main(["sweep", "--config", str(path), "--out", str(tmp_path / "o")])
    except SystemExit as err:
        status = err.code
    assert status == 2 and "train.updates" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("pass_k", "seeds = 2\npass_k"), r"train\.seeds: removed; write seeds"),
        (("pass_k", "eval_steps = [1]\npass_k"), r"train\.eval_steps: removed; write checkpoints"),
        (("num_resamples = 50", 'num_resamples = 50\nreference = ["grpo"]'),
         r"frontier\.reference: removed; write reference"),
    ],
)  # fmt: skip
def test_old_keys_are_refused_naming_the_new_key(tmp_path, edit, message):
    with pytest.raises(ValueError, match=message):
        D.load_config(_write(tmp_path, TINY.replace(*edit)))
    D.load_config(_write(tmp_path, TINY, "new.toml"))


def test_expand_grid_zip_and_static_values():
    entries = parse_methods(
        [
            {
                "method": "casp",
                "grid": {"top_n": [2, 3], "alpha": [0.1, 1.0]},
                "zip": {"quantile": [0.5, 0.8], "lam_top1": [1.0, 1.1]},
            }
        ]
    )
    cfg = D.SweepConfig(None, None, entries, ("casp",))
    rows = S.all_rows(cfg)
    assert len(rows) == 2 * 2 * 2
    assert rows[0].values == {"top_n": 2, "alpha": 0.1, "quantile": 0.5, "lam_top1": 1.0}
    assert rows[0].static == {"top_n": 2}  # an integer changes the program; floats are data
    assert rows[0].setting() == "top_n=2, alpha=0.1, quantile=0.5, lam_top1=1"


def test_popularity_dataset_is_figure_6s_with_its_constants():
    spec = D.EnvSpec(
        num_actions=passk.NUM_ACTIONS, depth=passk.DEPTH, multiplicities=passk.MULTIPLICITIES,
        per_size=2, zipf=passk.ZIPF, skew=passk.SKEW, base_correctness=passk.BASE_CORRECTNESS,
    )  # fmt: skip
    ours = E.popularity_dataset(np.random.default_rng(5), spec)
    theirs = passk.toy_dataset(np.random.default_rng(5), 2)
    np.testing.assert_array_equal(ours.correct, theirs.correct)
    np.testing.assert_allclose(ours.base_logits, theirs.base_logits)
    np.testing.assert_array_equal(ours.train_prompts, theirs.train_prompts)


def test_single_prompt_tilts_to_the_base_correctness():
    spec = D.EnvSpec(kind="single", num_actions=3, depth=2, skew=0.0, correct=("AB", "CC"),
                     base_correctness=0.05)  # fmt: skip
    env = E.single_prompt(np.random.default_rng(0), spec)
    p = np.exp(env.base_log_probs()[0])
    assert p[env.correct[0]].sum() == pytest.approx(0.05)
    assert env.correct[0].sum() == 2


def test_a_sweep_or_study_error_names_the_file_and_the_keys_line(tmp_path):
    """A bad value of a toy sweep or study file is named with the file, the line that sets it and
    the key (`experiment.schema.config_error`)."""
    path = _write(tmp_path, TINY.replace("per_size = 2", "per_size = 0"))
    line = 1 + path.read_text().splitlines().index("per_size = 0")
    with pytest.raises(ValueError, match=rf"^{path}, line {line}: env\.per_size: expected"):
        D.load_config(path)
    study = _write(tmp_path, TINY + "\n[study]\nalpha = 2.0\n", "study.toml")
    line = 1 + study.read_text().splitlines().index("alpha = 2.0")
    with pytest.raises(ValueError, match=rf"^{study}, line {line}: study\.alpha: expected"):
        TSS.load_study(study)


@pytest.mark.usefixtures("registry_snapshot")
def test_an_edited_users_method_is_not_read_from_the_cache(tmp_path):
    """A sweep of a method from a user's file (``--import``) is cached under that file's code
    (`shaping.method_code`): the same file reads the same cache entry, an edited one (imported
    again, as by the next command) another, so the edit trains again; a sweep of the package's
    methods alone keeps its name (code hash, config hash)."""

    def imported(scale: float) -> D.SweepConfig:
        shaping_methods._REGISTRY.pop("edit_test", None)  # a new command: nothing imported yet
        shaping_methods._IMPORTED.clear()
        path.write_text(
            "import shaping\n\n@shaping.register('edit_test')\n"
            "def edit_test(batch, *, c: float = 1.0):\n"
            '    """A test method.\n\n    Source: this test\n    """\n'
            f"    return {scale} * c * shaping.grpo_advantages(batch['rewards'])\n"
        )
        shaping.import_methods([str(path)])
        return D.load_config(_write(tmp_path, TINY.replace('"entropy_bonus"', '"edit_test"')
                                    .replace("eta", "c"), "mine.toml"))  # fmt: skip

    path, out = tmp_path / "mine.py", tmp_path / "out"
    first = S.cache_file(imported(1.0), out)
    assert first == S.cache_file(imported(1.0), out)
    edited = S.cache_file(imported(2.0), out)
    assert edited != first and edited.parent == first.parent
    package = S.cache_file(D.load_config(_write(tmp_path, TINY)), out)
    assert re.fullmatch(r"sweep-[0-9a-f]{12}-[0-9a-f]{12}\.npz", package.name)
    assert re.fullmatch(r"sweep-[0-9a-f]{12}-[0-9a-f]{12}-[0-9a-f]{12}\.npz", first.name)
