"""`python -m llm sweep`: a 2-run sweep end to end on a random one-layer model (seconds), its
resume (finished runs and evaluations reused, a changed setting retrained alone), the grid
expansion and key routing, config errors that name the key, and the frontier arrays against a
hand-computed layout."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

import numerics
import shaping
from experiment.spec import apply_sets
from llm.__main__ import main
from llm.config import config_from_dict, config_to_toml
from llm.eval.frontier import frontier_arrays
from llm.orchestrate.jobs import RUN_MARKER, Job, _prepare, same_eval, weights_sha
from llm.orchestrate.sweep import check_engine, rerun_runs, run_sweep
from llm.orchestrate.sweep_spec import (
    Setting,
    _base_doc,
    _run_raw,
    load_sweep,
    run_config,
    run_name,
    sweep_from_dict,
)
from llm.train.batched import VERSION as BATCHED_VERSION
from theory.measures import pass_at_k

BASE = """
model_path = "{model}"
method = "grpo"
steps = 2
[rollout]
group_size = 4
prompts_per_step = 2
max_new_tokens = 12
top_n = 2
[optim]
lr = 1e-2
[system]
micro_batch_size = 8
[data]
source = "generate"
n_problems = 8
max_number = 9
max_target = 30
[eval]
source = "generate"
"""

SWEEP = """
base = "base.toml"
seeds = [0]
checkpoints = [1, 2]
reference = "grpo"
[eval]
problems = 3
samples = 4
seed = 7
[[methods]]
method = "grpo"
[[methods]]
method = "entropy_bonus"
grid = {{ eta = [{eta}] }}
"""


def _write(folder: Path, model: str, eta: float | str = 0.1) -> Path:
    (folder / "base.toml").write_text(BASE.format(model=model))
    path = folder / "sweep.toml"
    path.write_text(SWEEP.format(eta=eta))
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory, tiny_model_path):
    root = tmp_path_factory.mktemp("sweep")
    config = _write(root, tiny_model_path)
    out = root / "out"
    assert main(["sweep", "--config", str(config), "--out", str(out), "--workers", "1"]) == 0
    return root, config, out


def test_two_run_sweep_writes_results_figure_and_lifts(swept):
    _, _, out = swept
    results = json.loads((out / "results.json").read_text())
    assert (out / "frontier.png").stat().st_size > 0
    models = results["models"]
    # the base model once, then 2 runs x 2 checkpoints
    assert [(m["label"], m["step"]) for m in models] == [
        ("base", 0), ("grpo", 1), ("grpo", 2), ("entropy_bonus", 1), ("entropy_bonus", 2),
    ]  # fmt: skip
    assert models[3]["params"] == {"eta": 0.1} and models[3]["seed"] == 0
    assert len(results["problems"]) == 3
    for m in models:
        assert len(m["correct"]) == len(m["distinct"]) == 3 and m["n"] == 4
        assert set(m["pass_at_k"]) == {"1", "2", "4"}
        want = {k: np.mean([pass_at_k(4, c, int(k)) for c in m["correct"]]) for k in ("1", "4")}
        assert m["pass_at_k"]["1"] == pytest.approx(want["1"]) == m["pass1"]
        assert m["pass_at_k"]["4"] == pytest.approx(want["4"])
        assert m["accuracy"] == pytest.approx(np.mean(m["correct"]) / 4)
    assert results["settings"]["eval"]["seed"] == 7
    assert results["settings"]["checkpoints"] == [1, 2]
    for measure in ("pass_at_k", "distinct_correct"):
        rows = results["frontier"][measure]["models"]
        assert [r["reference"] for r in rows] == [True, True, True, False, False]
        assert rows[0]["x"] == 0.0 and rows[0]["y"] == 0.0  # the base model is the origin
    lifts = (out / "lifts.md").read_text()
    assert lifts.count("| entropy_bonus | eta=0.1 |") == 4  # two measures x two checkpoints
    assert "| entropy_bonus | eta=0.1 | 1 |" in lifts
    # Finished runs keep only their last checkpoint; the evaluations live in the marker.
    run = out / "runs" / "grpo_seed0"
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000002"]
    marker = json.loads((run / RUN_MARKER).read_text())
    assert marker["finished"] and set(marker["evals"]) == {"1", "2"}


def test_resume_reuses_finished_runs_and_retrains_only_a_changed_setting(swept, tiny_model_path):
    root, config, out = swept
    weights = out / "runs" / "grpo_seed0" / "checkpoints" / "step_000002" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    spec = load_sweep(config, ["eval.ks=[1, 3]"])  # other ks: computed from the stored counts
    again = run_sweep(spec, out, workers=1, progress=False, num_resamples=20)
    assert again["reused"] == {"runs": 2, "of": 2, "evals": 5, "evals_of": 5}
    assert set(again["models"][1]["pass_at_k"]) == {"1", "3"}
    assert weights.stat().st_mtime_ns == before
    _write(root, tiny_model_path, eta=0.2)
    changed = run_sweep(load_sweep(config), out, workers=1, progress=False, num_resamples=20)
    assert changed["reused"]["runs"] == 1 and changed["reused"]["evals"] == 3  # base + grpo x 2
    assert weights.stat().st_mtime_ns == before
    assert (out / "runs" / "entropy_bonus_eta=0.2_seed0" / RUN_MARKER).is_file()
    # A finished run whose checkpoints were deleted for disk (bench/gpu/lease.py's pruner) is
    # still reused: every asked evaluation is in its marker.
    shutil.rmtree(out / "runs" / "grpo_seed0" / "checkpoints")
    pruned = run_sweep(load_sweep(config), out, workers=1, progress=False, num_resamples=20)
    assert pruned["reused"] == {"runs": 2, "of": 2, "evals": 5, "evals_of": 5}
    assert not (out / "runs" / "grpo_seed0" / "checkpoints").exists()


def _doc(tmp_path: Path, **over) -> dict:
    (tmp_path / "base.toml").write_text(BASE.format(model=tmp_path / "model"))
    doc = {
        "base": "base.toml",
        "seeds": [0, 1],
        "checkpoints": 2,
        "methods": [{"method": "grpo"}],
    }
    doc.update(over)
    return doc


def test_grid_expansion_and_key_routing(tmp_path):
    spec = sweep_from_dict(
        _doc(
            tmp_path,
            methods=[
                {"method": "grpo", "points": [{}, {"optim.lr": 5e-3}, {"kl_coef": 0.1}]},
                {"method": "ds_grpo", "zip": {"gamma_p": [0.1, 1.0], "gamma_n": [0.0, 0.2]}},
                {
                    "label": "eb",
                    "method": "entropy_bonus",
                    "fixed": {"form": "token"},
                    "grid": {"eta": [0.1, 0.3], "hyper.logp_reduction": ["sum", "mean"]},
                },
            ],
        ),
        root=tmp_path,
    )
    got = [(s.label, s.params) for s in spec.settings]
    assert got[:5] == [
        ("grpo", {}), ("grpo", {"optim.lr": 5e-3}), ("grpo", {"kl_coef": 0.1}),
        ("ds_grpo", {"gamma_p": 0.1, "gamma_n": 0.0}),
        ("ds_grpo", {"gamma_p": 1.0, "gamma_n": 0.2}),
    ]  # fmt: skip
    assert len(got) == 9 and got[5] == ("eb", {"form": "token", "eta": 0.1,
                                               "hyper.logp_reduction": "sum"})  # fmt: skip
    assert spec.checkpoints == [1, 2] and spec.reference == ["grpo"]
    assert spec.labels == ["grpo", "ds_grpo", "eb"]
    assert spec.eval["ks"] == [1, 2, 4, 8, 16]  # the base config's eval.samples = 16
    raw = _run_raw(_base(tmp_path), spec.settings[2], 1, [1, 2])
    assert raw["kl_coef"] == 0.1 and "kl_coef" not in raw.get("hyper", {})
    assert (raw["seed"], raw["system"]["num_threads"], raw["run"]["save_every"]) == (1, 1, 1)
    assert raw["optim"]["lr"] == 1e-2  # the base's
    raw = _run_raw(_base(tmp_path), spec.settings[1], 1, [1, 2])
    assert raw["optim"]["lr"] == 5e-3
    raw = _run_raw(_base(tmp_path), spec.settings[5], 0, [2, 4])
    assert raw["hyper"] == {"form": "token", "eta": 0.1, "logp_reduction": "sum"}
    assert raw["method"] == "entropy_bonus" and raw["run"]["save_every"] == 2
    assert run_name(spec.settings[3], 2) == "ds_grpo_gamma_p=0.1_gamma_n=0.0_seed2"
    # The configs resolved once (issue 42) are the ones the raw route gives, seed by seed.
    base = _base_doc(spec.base, spec.train)
    for setting in spec.settings:
        for seed in (0, 1, 2):
            want = config_from_dict(_run_raw(base, setting, seed, spec.checkpoints_of(setting)))
            assert run_config(spec, setting, seed) == want
    assert spec.base_config == config_from_dict(base)
    base_setting = Setting("base", spec.base_config.method, {})
    assert spec.base_run_config == config_from_dict(_run_raw(base, base_setting, 0, [1, 2]))
    with pytest.raises(ValueError, match="not one of the sweep's"):
        run_config(spec, Setting("x", "grpo", {"kl_coef": 9.0}))


def test_old_flat_keys_of_a_sweep_are_refused_naming_the_new_key(tmp_path):
    """A setting's or [train]'s flat key that moved into a table (``lr``) is refused in one line
    naming its table's key; the dotted key trains, and the run's name keeps it as written."""
    grid = {"methods": [{"method": "grpo", "grid": {"lr": [0.1]}}]}
    with pytest.raises(ValueError, match=r"lr: removed; write optim\.lr$"):
        sweep_from_dict(_doc(tmp_path, **grid), root=tmp_path)
    with pytest.raises(
        ValueError, match=r"max_new_tokens: removed; write rollout\.max_new_tokens$"
    ):
        sweep_from_dict(_doc(tmp_path, train={"max_new_tokens": 10}), root=tmp_path)
    over = {"train": {"rollout": {"max_new_tokens": 10}},
            "methods": [{"method": "grpo", "grid": {"optim.lr": [0.1]}}]}  # fmt: skip
    spec = sweep_from_dict(_doc(tmp_path, **over), root=tmp_path)
    raw = _run_raw(_base_doc(spec.base, spec.train), spec.settings[0], 0, spec.checkpoints)
    assert raw["optim"]["lr"] == 0.1 and raw["rollout"]["max_new_tokens"] == 10
    assert run_name(spec.settings[0], 0) == "grpo_optim.lr=0.1_seed0"
    with pytest.raises(ValueError, match="set by the sweep itself"):
        grid = {"run.save_every": [1]}
        sweep_from_dict(_doc(tmp_path, methods=[{"method": "grpo", "grid": grid}]), root=tmp_path)


def _base(tmp_path: Path) -> dict:
    import tomllib

    return tomllib.loads((tmp_path / "base.toml").read_text())


@pytest.mark.parametrize(
    ("over", "named"),
    [
        ({"sedes": [0]}, "sedes"),
        ({"seeds": [0, 0]}, "seeds"),
        ({"checkpoints": [3]}, "checkpoints"),
        ({"checkpoints": 5}, "checkpoints"),
        ({"eval": {"problems": -1}}, "eval.problems"),
        ({"eval": {"ks": [32]}}, "eval.ks"),
        ({"eval": {"n": 3}}, "eval: unknown key(s) ['n']"),
        ({"train": {"optim": {"lr": -1.0}}}, "train: optim.lr"),
        ({"reference": "casp"}, "reference"),
        ({"methods": [{"method": "grpoo"}]}, "methods[0].method"),
        ({"methods": [{"method": "grpo", "gird": {}}]}, "methods[0]: unknown key(s) ['gird']"),
        ({"methods": [{"method": "ds_grpo", "grid": {"gama_p": [1.0]}}]},
         "methods[ds_grpo].gama_p"),
        ({"methods": [{"method": "ds_grpo", "grid": {"gamma_p": [-1.0]}}]}, "gamma_p"),
        ({"methods": [{"method": "casp", "grid": {"alpha": [2.0]}}]}, "alpha"),
        ({"methods": [{"method": "grpo", "grid": {"seed": [1]}}]}, "methods[grpo].seed"),
        ({"methods": [{"method": "grpo", "grid": {"run.save_every": [1]}}]}, "run.save_every"),
        ({"methods": [{"method": "grpo", "grid": {"optim.lr": []}}]},
         "methods[grpo].grid.optim.lr"),
        ({"methods": [{"method": "grpo", "zip": {"optim.lr": [1.0], "kl_coef": [0, 1]}}]},
         "methods[grpo].zip"),
        ({"methods": [{"method": "grpo", "points": [{}, {}]}]}, "appears twice"),
        ({"methods": [{"method": "grpo", "points": [{"steps": 0}]}]}, "methods[grpo].steps"),
        ({"methods": [{"method": "grpo"}, {"method": "grpo"}]}, "used twice"),
    ],
)  # fmt: skip
def test_config_errors_name_the_key(tmp_path, over, named):
    with pytest.raises(ValueError) as err:
        sweep_from_dict(_doc(tmp_path, **over), root=tmp_path)
    assert named in str(err.value)


def test_a_setting_trains_its_own_steps_evaluated_at_the_continued_checkpoints(
    tmp_path, tiny_model_path
):
    """``steps`` in a point: that setting's runs train longer and are evaluated at the sweep's
    checkpoints continued at their spacing; the others as before; the frontier reads them all."""
    config = _write(tmp_path, tiny_model_path)
    text = config.read_text().replace(
        'method = "grpo"\n', 'method = "grpo"\npoints = [{}, { steps = 4 }]\n', 1
    )
    config.write_text(text)  # fmt: skip
    spec = load_sweep(config)
    longer = spec.settings[1]
    assert spec.checkpoints == [1, 2] and spec.checkpoints_of(longer) == [1, 2, 3, 4]
    assert spec.checkpoints_of(spec.settings[0]) == [1, 2]
    res = run_sweep(spec, tmp_path / "out", workers=1, progress=False, num_resamples=20)
    steps = {}
    for m in res["models"]:
        steps.setdefault((m["label"], json.dumps(m["params"])), []).append(m["step"])
    assert steps[("grpo", json.dumps({"steps": 4}))] == [1, 2, 3, 4]
    assert steps[("grpo", "{}")] == [1, 2] and steps[("entropy_bonus", '{"eta": 0.1}')] == [1, 2]
    lifted = [m for m in res["frontier"]["pass_at_k"]["models"] if m["label"] == "entropy_bonus"]
    assert len(lifted) == 2 and all(m["reference"] is False for m in lifted)
    assert res["runs"][1]["run"] == "grpo_steps=4_seed0"


def test_old_method_keys_are_refused_naming_the_new_one(tmp_path):
    old = {
        "method": "ds_grpo",
        "mode": "zip",
        "grid": {"gamma_p": [0.1, 1.0], "gamma_n": [0.0, 0.2]},
    }
    with pytest.raises(ValueError, match=r"methods\[0\]\.mode: removed; write methods\[0\]\.zip"):
        sweep_from_dict(_doc(tmp_path, methods=[old]), root=tmp_path)
    hyper = {"method": "ds_grpo", "hyper": {"gamma_p": 0.1}}
    with pytest.raises(
        ValueError, match=r"methods\[0\]\.hyper: removed; write methods\[0\]\.fixed$"
    ):
        sweep_from_dict(_doc(tmp_path, methods=[hyper]), root=tmp_path)
    new = {"method": "ds_grpo", "zip": {"gamma_p": [0.1, 1.0], "gamma_n": [0.0, 0.2]}}
    assert len(sweep_from_dict(_doc(tmp_path, methods=[new]), root=tmp_path).settings) == 2


def test_set_overrides_and_their_errors(tmp_path):
    keys = ("seeds", "train", "eval", "base")
    doc = apply_sets(_doc(tmp_path), ["seeds=[3]", "train.steps=4", "eval.problems=8"], keys)
    assert doc["seeds"] == [3] and doc["train"] == {"steps": 4} and doc["eval"]["problems"] == 8
    spec = sweep_from_dict(doc, root=tmp_path)
    assert spec.steps == 4 and spec.checkpoints == [2, 4]
    with pytest.raises(ValueError, match="unknown sweep key 'sed'"):
        apply_sets(doc, ["sed=[1]"], keys)
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        apply_sets(doc, ["seeds"], keys)
    with pytest.raises(FileNotFoundError, match="base"):
        sweep_from_dict({**doc, "base": "nope.toml"}, root=tmp_path)


def test_frontier_arrays_are_per_problem_gains_over_the_base():
    def model(label, seed, step, correct, distinct, params=None):
        return {"label": label, "params": params or {}, "seed": seed, "step": step,
                "n": 4, "correct": correct, "distinct": distinct}  # fmt: skip

    results = {
        "settings": {"seeds": [0, 1], "reference": ["grpo"], "eval": {"ks": [1, 2, 4]}},
        "models": [
            model("base", None, 0, [2, 0], [1, 0]),
            model("grpo", 0, 5, [4, 1], [1, 1]),
            model("grpo", 1, 5, [3, 0], [2, 0]),
            model("casp", 0, 5, [1, 4], [1, 3], {"alpha": 0.5}),
            model("casp", 1, 5, [2, 2], [2, 2], {"alpha": 0.5}),
        ],
    }
    x, y, models, rows = frontier_arrays(results, "pass_at_k")
    assert models.method == ("grpo", "grpo", "casp") and models.step == (0, 5, 5)
    assert [r["setting"] for r in rows] == ["base", "default", "alpha=0.5"]
    assert x.shape == y.shape == (3, 2, 2)
    np.testing.assert_allclose(x[0], 0.0)
    np.testing.assert_allclose(x[2], [[-1 / 4, 4 / 4], [0.0, 2 / 4]])
    # pass@4 of 4 samples: 1 when c > 0
    np.testing.assert_allclose(y[1], [[0.0, 1.0], [0.0, 0.0]])
    _, yd, _, _ = frontier_arrays(results, "distinct_correct")
    np.testing.assert_allclose(yd[2], [[0, 3], [1, 2]])
    with pytest.raises(ValueError, match="measure"):
        frontier_arrays(results, "bleu")
    results["models"].pop()
    with pytest.raises(ValueError, match=r"casp alpha=0\.5 step 5: no seed 1"):
        frontier_arrays(results, "pass_at_k")


def test_an_interrupted_run_resumes_from_its_checkpoint(swept):
    """A run killed after its first checkpoint continues from it (not from scratch) and ends
    with the weights of the uninterrupted run."""
    from llm.train.trainer import train

    root, config, out = swept
    spec = load_sweep(config, ['methods=[{method="grpo"}]'])
    fresh = root / "interrupted"
    run = fresh / "runs" / "grpo_seed0"
    cfg = run_config(spec, spec.settings[0], 0)
    train(cfg, run, stop_after=1, progress=False)  # saved step 1, then "killed"
    (run / RUN_MARKER).write_text(
        json.dumps({"base_sha": weights_sha(cfg.model_path), "finished": False, "evals": {}})
    )
    res = run_sweep(spec, fresh, workers=1, progress=False, num_resamples=20)
    assert res["reused"]["runs"] == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # step 1 was not trained again
    done = json.loads((out / "runs" / "grpo_seed0" / RUN_MARKER).read_text())
    again = json.loads((run / RUN_MARKER).read_text())
    for step in ("1", "2"):
        assert (
            again["evals"][step]["result"]["weights_sha256"]
            == (done["evals"][step]["result"]["weights_sha256"])
        )


@pytest.mark.slow
def test_batched_engine_packs_runs_records_the_engine_and_reuses(tmp_path, tiny_model_path):
    """`--engine batched`: the runs train as one batch (issue 22), results hold every model,
    markers and evaluation keys record the engine, and a second call reuses everything."""
    config = _write(tmp_path, tiny_model_path, "0.1, 0.3, 0.5")
    out = tmp_path / "out"
    args = ["sweep", "--config", str(config), "--out", str(out), "--workers", "1"]
    assert main([*args, "--engine", "batched"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["engine"] == "batched"
    # The base model alone, the four runs in one batch per worker.
    assert res["settings"]["batches"] == [1, 4]
    assert res["settings"]["eval"]["engine"] == "batched"
    assert [m["step"] for m in res["models"]] == [0] + [1, 2] * 4
    for run in res["runs"]:
        marker = json.loads((out / "runs" / run["run"] / RUN_MARKER).read_text())
        assert marker["engine"] == "batched" and marker["finished"]
    again = run_sweep(load_sweep(config), out, workers=1, progress=False, num_resamples=20,
                      engine="batched")  # fmt: skip
    assert again["reused"] == {"runs": 4, "of": 4, "evals": 9, "evals_of": 9}
    assert again["fingerprints"] == res["fingerprints"]
    # A run of another version of the batched trainer is trained again, not reused.
    path = out / "runs" / res["runs"][0]["run"] / RUN_MARKER
    marker = json.loads(path.read_text())
    assert (
        marker["batched_version"] == BATCHED_VERSION == res["settings"]["eval"]["batched_version"]
    )
    path.write_text(json.dumps({**marker, "batched_version": BATCHED_VERSION - 1}))
    third = run_sweep(load_sweep(config), out, workers=1, progress=False, num_resamples=20,
                      engine="batched")  # fmt: skip
    assert third["reused"]["runs"] == 3 and third["fingerprints"] == res["fingerprints"]
    # An evaluation by the stacked sampler's version 1 is sampled again; the checkpoint of
    # step 1 was pruned, so the run trains again: the same bytes.
    path = out / "runs" / res["runs"][1]["run"] / RUN_MARKER
    marker = json.loads(path.read_text())
    for ev in marker["evals"].values():
        ev["eval"] = {**ev["eval"], "sampler_version": 1}
    path.write_text(json.dumps(marker))
    fourth = run_sweep(load_sweep(config), out, workers=1, progress=False, num_resamples=20,
                       engine="batched")  # fmt: skip
    assert fourth["reused"]["runs"] == 3 and fourth["fingerprints"] == res["fingerprints"]
    # Two workers, another folder: other batches, the same bytes (a run trains and is evaluated
    # in a batch as alone). A spot re-run trains the run alone: the same bytes.
    two = run_sweep(load_sweep(config), tmp_path / "two", workers=2, progress=False,
                    num_resamples=20, engine="batched")  # fmt: skip
    assert two["settings"]["batches"] == [1, 2, 2]
    assert two["fingerprints"] == res["fingerprints"]
    last = res["runs"][-1]["run"]
    spot = rerun_runs(load_sweep(config), tmp_path / "spot", [last], engine="batched", workers=1,
                      progress=False)  # fmt: skip
    assert list(spot) == [last]
    assert all(res["fingerprints"][name] == fp for name, fp in spot.items())
    with pytest.raises(ValueError, match="not runs of the sweep"):
        rerun_runs(load_sweep(config), tmp_path / "spot", ["nope"], engine="batched")
    assert [m["pass1"] for m in again["models"]] == [m["pass1"] for m in res["models"]]
    # The other engine's runs are not reused: another random stream, another result.
    other = run_sweep(load_sweep(config), out, workers=1, progress=False, num_resamples=20)
    assert other["reused"]["runs"] == 0
    with pytest.raises(ValueError, match="engine"):
        run_sweep(load_sweep(config), out, workers=1, progress=False, engine="gpu")


def test_a_batched_sweep_trains_a_run_it_cannot_batch_alone(tmp_path, tiny_model_path):
    """`--engine batched` with a setting `llm.train.batched.batchable` refuses (``system.parallel
    = "ddp"``, which one process trains as "auto"): that run trains alone with the process
    engine, the others in a batch."""
    config = _write(tmp_path, tiny_model_path)
    config.write_text(config.read_text().replace(
        'grid = { eta = [0.1] }', 'grid = { eta = [0.1], "system.parallel" = ["ddp"] }'
    ))  # fmt: skip
    out = tmp_path / "out"
    res = run_sweep(load_sweep(config), out, workers=1, progress=False, num_resamples=20,
                    engine="batched")  # fmt: skip
    assert res["settings"]["batches"] == [1, 1, 1]
    engines = {r["run"]: json.loads((out / "runs" / r["run"] / RUN_MARKER).read_text())["engine"]
               for r in res["runs"]}  # fmt: skip
    assert sorted(engines.values()) == ["batched", "process"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_finished_run_of_another_pin_version_is_reused_only_off_the_cpu(tmp_path, device):
    # The third GPU lease (docs/gpu.md) retrained 7 finished runs because main's CPU pin moved
    # from version 1 to 2; on a GPU the CPU's pinned kernels take no part in the run's floats.
    raw = tomllib.loads(BASE.format(model=tmp_path / "model"))
    raw["system"]["device"] = device
    cfg = config_from_dict(raw)
    key = {"samples": 4, "numerics": numerics.tag(),
           **({"device": device, "tf32": False} if device != "cpu" else {})}  # fmt: skip
    old = {**key, "numerics": "pinned avx2 v0"}
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.toml").write_text(config_to_toml(cfg))
    marker = {"base_sha": "b", "numerics": "pinned avx2 v0", "engine": "process", "finished": True,
              "evals": {s: {"eval": old, "result": {}} for s in ("1", "2")}}  # fmt: skip
    (out / RUN_MARKER).write_text(json.dumps(marker))
    job = Job(name="grpo_seed0", setting=None, seed=0, cfg=cfg, out=str(out), base_sha="b",
              steps=[1, 2], problems=[], eval_key=key, progress=False)  # fmt: skip
    assert same_eval(old, key) == (device != "cpu")
    assert not same_eval({**old, "samples": 8}, key)  # any other setting still voids it
    _, finished, _ = _prepare(job, cfg, "process")
    assert finished == (device != "cpu")
    assert (out / RUN_MARKER).is_file() and (out / "config.toml").is_file() == (device != "cpu")


@pytest.mark.usefixtures("registry_snapshot")
def test_a_finished_run_of_an_edited_users_method_is_trained_again(tmp_path):
    """A run of a method from a user's file (``--import``) records the file's code
    (`shaping.method_code`) in its marker; a finished run is reused under the same code and
    trained again (its folder emptied) under another, or under none (a marker written before
    the code was recorded), and so is a run recorded under another task's code (a task of the
    user's own, `llm.tasks.Task.code`). The package's methods record nothing (their markers
    unchanged)."""
    mine = tmp_path / "mine.py"
    mine.write_text(
        "import shaping\n\n@shaping.register('edited_test')\n"
        "def edited_test(batch, *, c: float = 1.0):\n"
        '    """A test method.\n\n    Source: this test\n    """\n'
        "    return c * shaping.grpo_advantages(batch['rewards'])\n"
    )
    shaping.import_methods([str(mine)])
    code = shaping.method_code(["edited_test"])["edited_test"]
    raw = tomllib.loads(BASE.format(model=tmp_path / "model"))
    cfg = config_from_dict({**raw, "method": "edited_test"})
    key = {"samples": 4, "numerics": numerics.tag()}
    out = tmp_path / "run"
    job = Job(name="edited_test_seed0", setting=None, seed=0, cfg=cfg, out=str(out),
              base_sha="b", steps=[1], problems=[], eval_key=key, progress=False)  # fmt: skip
    # The last: the run of another task's code (a task of the user's own, since edited).
    for recorded, task, reused in [(code, None, True), ("0" * 16, None, False),
                                   (None, None, False), (code, "0" * 16, False)]:  # fmt: skip
        out.mkdir(exist_ok=True)
        (out / "config.toml").write_text(config_to_toml(cfg))
        marker = {"base_sha": "b", "numerics": numerics.tag(), "engine": "process",
                  "finished": True, "evals": {"1": {"eval": key, "result": {}}},
                  **({"method_code": recorded} if recorded else {}),
                  **({"task_code": task} if task else {})}  # fmt: skip
        (out / RUN_MARKER).write_text(json.dumps(marker))
        written, finished, _ = _prepare(job, cfg, "process")
        assert finished == reused, recorded
        assert (out / "config.toml").is_file() == reused
        assert written["method_code"] == code
    grpo = config_from_dict(raw)
    written, _, _ = _prepare(dataclasses.replace(job, cfg=grpo, out=str(tmp_path / "g")), grpo,
                             "process")  # fmt: skip
    assert "method_code" not in written


def test_the_batched_engine_refuses_a_model_it_cannot_stack_before_any_run(tmp_path):
    """A user's model folder that `llm.model.stacked` cannot stack (a GPT-2 here: its config
    alone, nothing loaded) is refused by the batched engine before any run, naming the folder and
    ``--engine process``; it failed in the base model's stacked evaluation, in a worker. The
    process engine takes it; a Llama folder passes."""
    from transformers import GPT2Config, LlamaConfig

    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path / "model")
    spec = sweep_from_dict(_doc(tmp_path), root=tmp_path)
    with pytest.raises(ValueError, match=r"engine batched: the model .*model cannot be stacked "
                       r"\(model_type 'gpt2' \(llama only\).*--engine process"):  # fmt: skip
        check_engine(spec, "batched")
    check_engine(spec, "process")
    LlamaConfig(hidden_size=8, num_attention_heads=2, num_hidden_layers=1,
                intermediate_size=16).save_pretrained(tmp_path / "model")  # fmt: skip
    check_engine(spec, "batched")
