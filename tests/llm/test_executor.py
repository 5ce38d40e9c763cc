"""`llm.orchestrate.executor`: a 2-run sweep on Ray (a local instance of 2 CPUs) gives the results
of the local executor but for wall-clock fields, keeps job order, fails fast, leaves the caller's
Ray instance up, gives a job that trains on CUDA a GPU; and the executor's errors (unknown one, an address without Ray, Ray missing)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pytest

import numerics
from llm.__main__ import main
from llm.config import config_from_dict
from llm.orchestrate.executor import check_executor, map_jobs, ray_task_options
from llm.orchestrate.jobs import Job
from llm.orchestrate.sweep import run_sweep, unit_gpus
from llm.orchestrate.sweep_spec import load_sweep
from tests.llm import ray_jobs
from tests.llm.test_sweep import _write

# What differs between two identical sweeps run apart: wall-clock times and where they ran.
WALL_CLOCK = {"timings_seconds", "eval_seconds", "train_seconds"}
WHERE = {"workers", "executor"}


def _strip(doc: Any) -> Any:
    """`doc` without its wall-clock fields (at any depth)."""
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k not in WALL_CLOCK}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance of 2 CPUs and 1 GPU (declared: Ray schedules it and sets a task's
    ``CUDA_VISIBLE_DEVICES``; nothing here uses CUDA), started (and shut down) by the test, not
    the executor."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_sweep_matches_local(tmp_path, tiny_model_path, ray_local):
    config = _write(tmp_path, tiny_model_path)
    spec = load_sweep(config)
    local = run_sweep(spec, tmp_path / "local", workers=1, progress=False, num_resamples=20)
    remote = run_sweep(
        spec, tmp_path / "ray", workers=2, progress=False, num_resamples=20, executor="ray"
    )
    assert ray_local.is_initialized()  # the caller's instance stays up
    assert remote["settings"]["executor"] == "ray" and local["settings"]["executor"] == "local"
    files = [json.loads((tmp_path / d / "results.json").read_text()) for d in ("local", "ray")]
    for doc in files:
        for key in WHERE:
            doc["settings"].pop(key)
    assert _strip(files[0]) == _strip(files[1])
    assert remote["reused"] == {"runs": 0, "of": 2, "evals": 0, "evals_of": 5}
    assert [m["label"] for m in remote["models"]] == ["base", *["grpo"] * 2, *["entropy_bonus"] * 2]
    # the run folders were written by the Ray workers, and are reused as the local ones are
    again = run_sweep(spec, tmp_path / "ray", workers=2, progress=False, num_resamples=20,
                      executor="ray")  # fmt: skip
    assert again["reused"] == {"runs": 2, "of": 2, "evals": 5, "evals_of": 5}


@pytest.mark.slow
def test_ray_keeps_job_order_and_fails_fast(ray_local):
    jobs = [(0, 0.6), (1, 0.0), (2, 0.3), (3, 0.0)]  # finish out of order
    out = map_jobs(ray_jobs.square_after, jobs, workers=2, progress=False, desc="", name=str,
                   executor="ray")  # fmt: skip
    assert out == [0, 1, 4, 9]
    start = time.perf_counter()
    with pytest.raises(ValueError, match="job 1 failed") as err:
        map_jobs(ray_jobs.fail_one, [0, 1, 2, 3], workers=2, progress=False, desc="", name=str,
                 executor="ray")  # fmt: skip
    assert type(err.value) is ValueError and str(err.value) == "job 1 failed"  # the job's own
    assert time.perf_counter() - start < 300  # the others were ended, not waited for (600 s)
    assert ray_local.is_initialized()
    # ... and ended before map_jobs raised: the whole 2-CPU instance is free for the next task
    # (a lost cancel would hold a CPU for the rest of the 600 s sleep; 120 s of margin for a new
    # worker's start on a loaded machine, where it took 0.1-0.3 s).
    whole = ray_local.remote(num_cpus=2)(ray_jobs.square_after)
    assert ray_local.get(whole.remote((3, 0.0)), timeout=120) == 9


def _unit(device: str) -> list[Job]:
    cfg = config_from_dict({"model_path": "unused", "system": {"device": device}})
    return [Job(device, None, 0, cfg, "unused", "", [], [], {}, False)]


@pytest.mark.slow
def test_ray_asks_a_gpu_for_a_job_that_trains_on_cuda(ray_local):
    units = [_unit("cuda"), _unit("cpu"), _unit("cuda:0")]
    assert [unit_gpus(u) for u in units] == [1.0, 0.0, 1.0]
    assert ray_task_options(units[0], 1, unit_gpus) == {"num_cpus": 1, "num_gpus": 1.0}
    assert ray_task_options(units[1], 2, None) == {"num_cpus": 2, "num_gpus": 0.0}
    with pytest.raises(ValueError, match="expected >= 0"):
        ray_task_options(units[1], 1, lambda u: -1)
    # The jobs Ray runs are the units' names (a unit's module imports torch in every Ray worker);
    # the GPUs asked for are the units' own (`unit_gpus`), as a sweep asks.
    by_name = {u[0].name: u for u in units}
    seen = map_jobs(ray_jobs.gpus_seen, list(by_name), workers=2, progress=False, desc="",
                    name=str, executor="ray",
                    gpus_per_job=lambda name: unit_gpus(by_name[name]))  # fmt: skip
    # The CUDA jobs got the instance's one GPU (one after the other), the CPU job none.
    assert [(n, len(ids)) for n, ids, _ in seen] == [("cuda", 1), ("cpu", 0), ("cuda:0", 1)]
    assert seen[0][2] == "0" and seen[2][2] == "0" and seen[1][2] in ("", None)


@pytest.mark.slow
def test_ray_tasks_compute_under_the_drivers_numerics(ray_local, monkeypatch):
    """A ``SHARPENING_NUMERICS`` set after the instance started (an extension following its
    study's version, `numerics.following`) reaches every task through its ``runtime_env``: a
    cluster's workers do not inherit the driver's environment."""
    monkeypatch.setenv(numerics.OPT_OUT_ENV, "pinned-v2")
    assert ray_task_options(_unit("cpu"), 1, None)["runtime_env"] == {
        "env_vars": {numerics.OPT_OUT_ENV: "pinned-v2"}
    }
    seen = map_jobs(ray_jobs.numerics_seen, [0, 1], workers=2, progress=False, desc="", name=str,
                    executor="ray")  # fmt: skip
    assert seen == [(0, "pinned-v2", 2), (1, "pinned-v2", 2)]
    monkeypatch.delenv(numerics.OPT_OUT_ENV)
    assert "runtime_env" not in ray_task_options(_unit("cpu"), 1, None)


def test_a_log_gets_a_line_per_finished_job(capsys):
    """`log` without `progress` (stderr a file): one `LineProgress` line per job, in order."""
    out = map_jobs(abs, [-1, -2, -3], workers=1, progress=False, desc="jobs", name=str, log=True)
    assert out == [1, 2, 3]
    lines = capsys.readouterr().err.splitlines()
    assert [x.split(",")[0] for x in lines] == [
        "jobs: 1/3 (-1)",
        "jobs: 2/3 (-2)",
        "jobs: 3/3 (-3)",
    ]
    assert all(x.endswith("left") and "elapsed" in x for x in lines)
    map_jobs(abs, [-1], workers=1, progress=False, desc="jobs", name=str)  # neither: silent
    assert capsys.readouterr().err == ""


def test_progress_is_a_bar_on_a_terminal_and_lines_in_a_log(monkeypatch, capsys):
    """`experiment.cli.progress_bar` decides by stderr when not told: tqdm's bar on a terminal,
    `LineProgress` where stderr is a file, nothing without `progress`."""
    from tqdm import tqdm

    from experiment.cli import LineProgress, progress_bar

    assert isinstance(progress_bar(3, "d", "run", progress=True), LineProgress)  # captured: a file
    assert isinstance(progress_bar(3, "d", "run", progress=True, log=False), tqdm)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = progress_bar(3, "d", "run", progress=True)
    assert isinstance(bar, tqdm) and not bar.disable
    bar.close()
    quiet = progress_bar(3, "d", "run", progress=False)
    assert isinstance(quiet, tqdm) and quiet.disable
    quiet.update()
    quiet.close()
    capsys.readouterr()


def test_executor_errors(monkeypatch, capsys):
    with pytest.raises(ValueError, match="expected one of local, ray"):
        check_executor("dask")
    with pytest.raises(ValueError, match="is for executor 'ray'"):
        check_executor("local", "head:6379")
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"the ray extra: pip install .ray>=2.40."):
        check_executor("ray")
    assert main(["sweep", "--config", "none.toml", "--executor", "ray"]) == 2
    assert "pip install 'ray>=2.40'" in capsys.readouterr().err


@pytest.mark.slow
def test_ray_runs_the_batched_engine_as_the_local_one(tmp_path, tiny_model_path, ray_local):
    """`--engine batched --executor ray`: batches are Ray tasks; one local worker packs one batch,
    two Ray workers two: the same results."""
    config = _write(tmp_path, tiny_model_path, "0.1, 0.3, 0.5")
    spec = load_sweep(config)
    kw = {"progress": False, "num_resamples": 20, "engine": "batched"}
    local = run_sweep(spec, tmp_path / "local", workers=1, **kw)
    remote = run_sweep(spec, tmp_path / "ray", workers=2, executor="ray", **kw)
    assert local["settings"]["batches"] == [1, 4] and remote["settings"]["batches"] == [1, 2, 2]
    files = [json.loads((tmp_path / d / "results.json").read_text()) for d in ("local", "ray")]
    for doc in files:
        for key in (*WHERE, "batches"):
            doc["settings"].pop(key)
    assert _strip(files[0]) == _strip(files[1])
