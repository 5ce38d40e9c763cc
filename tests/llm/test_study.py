"""`python -m llm study`: both stages end to end on a random one-layer model (seconds): the
confirmation trains only the reference and the picks, on fresh seeds and fresh problems; errors
name the key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiment import reread, two_stage
from experiment import study as S
from experiment import study_report as R
from llm.__main__ import main
from llm.orchestrate.spot_check import spot_check
from llm.orchestrate.study_spec import confirmation, confirmation_doc, load_study
from llm.orchestrate.sweep import run_sweep
from llm.orchestrate.sweep_spec import budgets
from numerics import emulate
from tests.llm.test_sweep import BASE, SWEEP
from tests.test_numerics import other_vendor_cpu

STUDY = """
[study]
name = "tiny study"
confirm_seeds = [5]
confirm_problems = 4
"""


def _write(folder: Path, model: str, study: str = STUDY) -> Path:
    (folder / "base.toml").write_text(BASE.format(model=model))
    path = folder / "study.toml"
    path.write_text(SWEEP.format(eta="0.1, 0.3") + study)
    return path


@pytest.mark.slow
def test_the_study_confirms_the_pick_on_fresh_seeds_and_problems(
    tmp_path, tiny_model_path, monkeypatch, capsys
):
    config = _write(tmp_path, tiny_model_path)
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path.parent)  # a relative --config, as users type it
    config = config.relative_to(tmp_path.parent)
    assert main(["study", "--config", str(config), "--out", str(out), "--workers", "1"]) == 0
    # stderr is no terminal here: a line per finished run instead of a bar, as in a log file
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("runs (train")]
    assert lines and all("elapsed, ~" in x and "\r" not in x for x in lines)
    doc = json.loads((out / "study.json").read_text())
    explore = json.loads((out / "explore" / "results.json").read_text())
    confirm = json.loads((out / "confirm" / "results.json").read_text())
    assert confirm["settings"]["seeds"] == [5] and explore["settings"]["seeds"] == [0]
    ev = confirm["settings"]["eval"]
    assert ev["offset"] == 3 and ev["problems"] == 4  # right after the 3 exploratory problems
    explored = {json.dumps(p, sort_keys=True) for p in explore["problems"]}
    assert not explored & {json.dumps(p, sort_keys=True) for p in confirm["problems"]}
    labels = [s["label"] for s in confirm["settings"]["settings"]]
    assert labels == ["grpo", *doc["picks"]["pass_at_k"]]  # the reference, one setting per pick
    if "entropy_bonus" in doc["picks"]["pass_at_k"]:
        pick = doc["picks"]["pass_at_k"]["entropy_bonus"]
        assert confirm["settings"]["settings"][1]["params"] == pick["params"]
    assert {r["claim"] for r in doc["claims"]} >= {"grpo_sharpens"}
    words = {"grpo_sharpens": S.SHARPENING_VERDICTS, "grpo_spread": ("",)}
    assert all(r["verdict"] in words.get(r["claim"], S.VERDICTS) for r in doc["claims"])
    assert "## Claims" in (out / "verdicts.md").read_text()
    assert doc["design"]["budget"] == "equal"  # GRPO and the method: one lr, kl_coef, checkpoints
    assert "Tuning budgets: equal" in (out / "verdicts.md").read_text()
    # The cost model of the power calculation, measured in the confirmation's runs.
    assert doc["costs"]["unit"] == "core-s" and doc["costs"]["run"] > 0
    assert doc["costs"]["problem"] > 0 and "designs_for_goal" in doc
    # The confirmation's other measures (maj@k, answer entropy) of the base, GRPO and each pick.
    rows = {(r["label"], r["step"]): r for r in doc["measures"]}
    base = rows[("grpo", 0)]
    first = confirm["models"][0]
    assert first["label"] == "base" and base["maj_at_k"] == first["maj_at_k"][str(max(
        int(k) for k in first["maj_at_k"]))]  # fmt: skip
    assert base["pass1"] == first["pass1"] and base["answer_entropy"] == first["answer_entropy"]
    assert all(0.0 <= r["maj_at_k"] <= 1.0 for r in doc["measures"])
    assert "## Other measures of the models read" in (out / "verdicts.md").read_text()
    # The study re-reads from its folder's lift inputs to the same study.json (experiment.reread).
    again = reread.reread(out, tmp_path / "reread")
    assert again.pop("reread")["from"] == doc["procedure"]
    assert json.loads(json.dumps(again)) == doc
    assert (tmp_path / "reread" / "explore_lifts.md").read_text() == (
        out / "explore" / "lifts.md"
    ).read_text()
    # Every run's fingerprint, and a spot check that re-trains a few here: the same bytes.
    assert set(doc["fingerprints"]) == {"explore", "confirm"}
    assert set(doc["fingerprints"]["confirm"]) == {"base", *(r["run"] for r in confirm["runs"])}
    spot = tmp_path / "spot"
    rep = spot_check(out / "study.json", runs=2, out=spot, workers=1, progress=False)
    n = min(3, 1 + len(confirm["runs"]))
    assert rep["of"] == rep["same"] == n and rep["runs"][0]["run"] == "base"
    assert rep["cpu_id"]["here"] == rep["cpu_id"]["study"] == R.cpu_id()
    assert json.loads((spot / "spot_check.json").read_text()) == rep
    # A fingerprint that differs is named, and the command fails (the runs are reused).
    doc["fingerprints"]["confirm"][rep["runs"][1]["run"]] = "0" * 64
    (tmp_path / "other.json").write_text(json.dumps(doc))
    argv = ["spot-check", str(tmp_path / "other.json"), "--runs", "2", "--out", str(spot)]
    assert main([*argv, "--workers", "1"]) == 1
    printed = capsys.readouterr().out
    assert f"DIFFERENT  {rep['runs'][1]['run']}" in printed
    assert f"{n - 1} of {n} runs identical" in printed
    # A batched study sampled by the stacked sampler's version 1 (no sampler_version) is refused.
    v1 = {**doc, "design": {**doc["design"], "engine": "batched"}}
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    with pytest.raises(ValueError, match="version 1 of the stacked sampler"):
        spot_check(tmp_path / "v1.json")
    # A study pinned to another version of numerics.PINS names the variable that reproduces it.
    v1 = {**doc, "provenance": {**doc["provenance"], "numerics": "pinned avx2 v1"}}
    (tmp_path / "pin_v1.json").write_text(json.dumps(v1))
    with pytest.raises(ValueError, match="SHARPENING_NUMERICS=pinned-v1 set before Python"):
        spot_check(tmp_path / "pin_v1.json")
    v0 = {**doc, "provenance": {**doc["provenance"], "numerics": "pinned avx2 v0"}}
    (tmp_path / "pin_v0.json").write_text(json.dumps(v0))
    with pytest.raises(ValueError, match=r"'pinned avx2 v0'.*check out the study's commit"):
        spot_check(tmp_path / "pin_v0.json")
    del doc["fingerprints"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="no fingerprints"):
        spot_check(tmp_path / "old.json")
    config.write_text(config.read_text().replace('name = "tiny study"', 'name = "renamed"'))
    with pytest.raises(ValueError, match="its content changed since the study"):
        spot_check(out / "study.json")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(emulate.QEMU) is None, reason="QEMU's user-mode emulator absent")
def test_a_spot_check_on_an_emulated_cpu_gives_the_same_bytes(
    tmp_path, tiny_model_path, monkeypatch
):
    """`spot-check --emulate CPU` re-runs itself under QEMU (AVX2 and FMA, no AVX-512), in one
    process: the base model's evaluation and one run re-trained there equal the study's, and the
    report names the emulator (its /proc/cpuinfo is the host's). The emulated CPU is of the other
    vendor (an Intel ``Haswell`` on an AMD host, else QEMU's AMD ``max``): MKL picks kernels by
    vendor, which numerics pin version 2 makes irrelevant (docs/numerics.md)."""
    cpu = other_vendor_cpu()
    config = _write(tmp_path, tiny_model_path, STUDY.replace("[5]", "[5, 6]"))
    monkeypatch.chdir(tmp_path.parent)
    config = config.relative_to(tmp_path.parent)
    out = tmp_path / "out"
    assert main(["study", "--config", str(config), "--out", str(out), "--workers", "1"]) == 0
    argv = ["spot-check", str(out / "study.json"), "--out", str(tmp_path / "emu")]
    assert main([*argv, "--emulate", cpu]) == 0
    rep = json.loads((tmp_path / "emu" / "spot_check.json").read_text())
    assert rep["emulated"] == f"{emulate.QEMU} -cpu {cpu}" and rep["of"] == 2
    assert rep["same"] == 2 and rep["cpu_id"]["here"].startswith(rep["emulated"])


def test_study_errors_name_the_key(tmp_path, tiny_model_path):
    config = _write(tmp_path, tiny_model_path, STUDY.replace("[5]", "[0, 5]"))
    with pytest.raises(ValueError, match=r"study\.confirm_seeds: \[0\] are exploratory seeds"):
        load_study(config)
    config = _write(tmp_path, tiny_model_path, STUDY + "confirm_offset = 1\n")
    with pytest.raises(ValueError, match=r"study\.confirm_offset: 1 overlaps"):
        load_study(config)
    config = _write(tmp_path, tiny_model_path, STUDY + "typo = 1\n")
    with pytest.raises(ValueError, match="typo"):
        load_study(config)
    config = _write(
        tmp_path, tiny_model_path, STUDY + 'confirm_train = { eval = { dtype = "fp8" } }\n'
    )
    with pytest.raises(ValueError, match=r"study\.confirm_train: .*dtype.*fp8"):
        load_study(config)


@pytest.mark.parametrize("engine", ["process", "batched"])
def test_confirm_train_sets_the_confirmation_alone_and_samples_in_bfloat16(
    tmp_path, tiny_model_path, engine
):
    over = 'confirm_train = { eval = { dtype = "bfloat16" } }\n'
    config = _write(tmp_path, tiny_model_path, STUDY + over)
    explore, spec = load_study(config)
    assert spec.confirm_train == {"eval": {"dtype": "bfloat16"}}
    conf = confirmation_doc(explore, spec, {})
    assert conf["train"]["eval"]["dtype"] == "bfloat16"
    assert "eval" not in explore.doc.get("train", {})  # the exploration samples in float32
    sweep = confirmation(explore, spec, {})
    assert sweep.source == f"{config} (confirmation)" and sweep.doc == conf
    res = run_sweep(sweep, tmp_path / "confirm", workers=1, progress=False, num_resamples=20,
                    engine=engine)  # fmt: skip
    assert res["settings"]["eval"]["dtype"] == "bfloat16"  # part of every evaluation's key
    assert [(m["label"], m["seed"]) for m in res["models"]][1:] == [("grpo", 5), ("grpo", 5)]
    assert all(0 <= m["pass1"] <= 1 and m["n"] == 4 for m in res["models"])


def _budget_study(folder: Path, model: str, top: str, grpo: str, study: str = STUDY) -> Path:
    """A study whose GRPO entry is `grpo` (lines of its table) with `top` (top-level keys)."""
    (folder / "base.toml").write_text(BASE.format(model=model))
    text = SWEEP.format(eta="0.1, 0.3").replace('reference = "grpo"', f'reference = "grpo"\n{top}')
    text = text.replace('method = "grpo"\n', f'method = "grpo"\n{grpo}\n')
    path = folder / "study.toml"
    path.write_text(text + study)
    return path


def test_unequal_tuning_budgets_are_refused_unless_the_study_says_so(tmp_path, tiny_model_path):
    """GRPO's reference with a kl_coef setting the methods lack is refused, naming the method,
    the axis and both values; ``unequal_budget = true`` lets it through and says so; a ``tune``
    table gives every method GRPO's tuning, and the confirmation keeps it for the reference."""
    kl = "points = [{}, { kl_coef = 0.1 }]"
    config = _budget_study(tmp_path, tiny_model_path, "", kl)
    with pytest.raises(ValueError) as err:
        load_study(config)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{config}: study: unequal tuning budgets: ")
    assert ("methods[entropy_bonus] (eta=0.1) is tuned over kl_coef [0], the reference (grpo) "
            "over [0, 0.1]") in text and "unequal_budget = true" in text  # fmt: skip

    config = _budget_study(tmp_path, tiny_model_path, "", kl, STUDY + "unequal_budget = true\n")
    sweep, spec = load_study(config)
    word, how = two_stage.study_budget(budgets(sweep), sweep.reference, spec)
    assert word == "unequal (explicit)" and how.startswith("methods[entropy_bonus] (eta=0.1)")

    tune = 'tune = { kl_coef = [0.0, 0.1], "optim.lr" = [1e-2, 2e-2] }'
    config = _budget_study(tmp_path, tiny_model_path, tune, "")
    sweep, spec = load_study(config)
    assert two_stage.study_budget(budgets(sweep), sweep.reference, spec) == ("equal", None)
    assert [len([s for s in sweep.settings if s.label == x]) for x in sweep.labels] == [4, 8]
    rows = budgets(sweep)
    assert {r.axes["checkpoints"] for r in rows} == {(1, 2)}  # every run read at every step
    assert {(r.label, r.coefficients) for r in rows} == {
        ("grpo", "default"),
        ("entropy_bonus", "eta=0.1"),
        ("entropy_bonus", "eta=0.3"),
    }
    pick = {"entropy_bonus": {"params": {"eta": 0.3, "kl_coef": 0.1, "optim.lr": 0.01}}}
    conf = confirmation_doc(sweep, spec, pick)
    assert "tune" not in conf
    csweep = confirmation(sweep, spec, pick)
    assert [s.params for s in csweep.settings] == [
        {"kl_coef": k, "optim.lr": lr} for k in (0.0, 0.1) for lr in (1e-2, 2e-2)
    ] + [pick["entropy_bonus"]["params"]]


@pytest.mark.parametrize(
    ("name", "budget"),
    [("study_countdown_strong.toml", "equal"), ("study_countdown_mild.toml", "equal"),
     ("study_countdown_smollm2.toml", "equal"), ("study_countdown_rule.toml", "equal")],
)  # fmt: skip
def test_the_committed_study_configs_state_their_budgets(name, budget):
    """Parse only: the committed LLM studies give every method GRPO's tuning."""
    path = Path(__file__).parents[2] / "configs" / name
    sweep, spec = load_study(path)
    assert two_stage.study_budget(budgets(sweep), sweep.reference, spec)[0] == budget
    assert not set(spec.confirm_seeds) & set(sweep.seeds)


def test_spot_check_names_a_toy_study_and_a_file_that_is_not_a_study(tmp_path):
    """A toy study.json (its problem unit 'Dataset draws') is named as the other leg's, not as a
    study written before fingerprints; a JSON file that is not an object is not a study.json."""
    toy = Path(__file__).parents[2] / "figures" / "toy_study_fig6" / "study.json"
    with pytest.raises(ValueError, match=r"a study of the toy leg \(its problem unit 'Dataset"):
        spot_check(toy)
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match=r"list.json: not a study.json"):
        spot_check(tmp_path / "list.json")
