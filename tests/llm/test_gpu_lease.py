"""bench/gpu/lease.py and adopt.py without a GPU: the GGUF's pieces join to the same bytes only
when all are there, a joined file that does not match its sha256 is refused, evaluated runs lose
their checkpoints and nothing else does, the progress file says what a call resumes, an earlier
lease's complete runs are adopted under a study's names (and incomplete ones are not), and the
smoke study and the GPU study files parse."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import sys
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm.config import config_to_toml, load_config
from llm.orchestrate.study_spec import load_study
from llm.orchestrate.sweep import sweep_jobs
from llm.run.checkpoint import STATE_FILE, latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
LEASE = ROOT / "bench" / "gpu" / "lease.py"


@pytest.fixture
def lease(tmp_path, monkeypatch):
    """The module, with its repository root and carry folder moved under `tmp_path`."""
    spec = importlib.util.spec_from_file_location("gpu_lease", LEASE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_lease"] = module
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "CARRY", tmp_path / ".gpu")
    (tmp_path / "configs").mkdir()
    for name in ("study_countdown_smollm2.toml", "countdown_smollm2_gpu.toml"):
        (tmp_path / "configs" / name).write_text((ROOT / "configs" / name).read_text())
    yield module
    sys.modules.pop("gpu_lease", None)


def test_pieces_join_once_all_are_there_and_import_once(lease, tmp_path, monkeypatch):
    src = tmp_path / "model.gguf"
    # 10,240 random bytes (xz cannot shrink them): three pieces of 4,096
    src.write_bytes(random.Random(0).randbytes(10_240))
    manifest = lease.split(src, tmp_path / "carried", piece_bytes=4096)
    assert [p["name"] for p in manifest["pieces"]] == [f"model.gguf.{k:03d}" for k in range(3)]
    imports = []

    def fake_run(cmd, check, cwd):  # import-gguf: records the call, makes the folder
        imports.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(Path(cmd[cmd.index("--gguf") + 1]).read_bytes())

    monkeypatch.setattr(lease.subprocess, "run", fake_run)
    keep = tmp_path / "kept"
    carry = tmp_path / ".gpu"
    for k in range(3):  # one call per piece; the machine keeps `keep` between calls
        if carry.exists():
            for old in carry.iterdir():
                old.rename(tmp_path / f"gone{old.name}")
        carry.mkdir(exist_ok=True)
        (tmp_path / "carried" / f"part{k}").rename(carry / f"part{k}")
        assert lease.gather(keep) is (k == 2)
    model = tmp_path / lease.MODEL / "model.safetensors"
    assert model.read_bytes() == src.read_bytes() and len(imports) == 1
    assert lease.gather(keep) and len(imports) == 1  # a later call imports nothing


def test_the_pieces_carry_the_file_compressed(lease, tmp_path, monkeypatch):
    src = tmp_path / "model.gguf"
    src.write_bytes(bytes(range(256)) * 400)  # 102,400 bytes that xz shrinks to one piece
    manifest = lease.split(src, tmp_path / ".gpu", piece_bytes=4096)
    assert len(manifest["pieces"]) == 1 and manifest["xz"]["bytes"] < manifest["bytes"] // 10
    # import-gguf makes the model folder
    monkeypatch.setattr(lease.subprocess, "run",
                        lambda cmd, check, cwd: Path(cmd[cmd.index("--out") + 1]).mkdir(parents=True))  # fmt: skip
    assert lease.gather(tmp_path / "kept")
    assert (tmp_path / "kept" / "model.gguf").read_bytes() == src.read_bytes()


def test_a_joined_file_that_does_not_match_is_refused(lease, tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(random.Random(1).randbytes(5000))
    lease.split(src, tmp_path / ".gpu", piece_bytes=4096)
    piece = tmp_path / ".gpu" / "part1" / "model.gguf.001"
    piece.write_bytes(b"y" * len(piece.read_bytes()))
    with pytest.raises(SystemExit, match="sha256"):
        lease.gather(tmp_path / "kept")


def _run(root: Path, name: str, *, finished: bool, evals: list[int], steps: int = 20) -> Path:
    run = root / name
    (run / "checkpoints" / f"step_{steps:06d}").mkdir(parents=True)
    (run / "config.toml").write_text(f"steps = {steps}  # training steps\n")
    marker = {"finished": finished, "evals": {str(s): {"eval": {}} for s in evals}}
    (run / "sweep_run.json").write_text(json.dumps(marker))
    return run


def test_prune_deletes_only_evaluated_runs_checkpoints(lease, tmp_path):
    done = _run(tmp_path / "runs", "done", finished=True, evals=[5, 10, 20])
    evaluating = _run(tmp_path / "runs", "evaluating", finished=True, evals=[5, 10])
    training = _run(tmp_path / "runs", "training", finished=False, evals=[])
    assert lease.prune(tmp_path / "runs") == 1
    assert not (done / "checkpoints").exists()
    assert (evaluating / "checkpoints").is_dir() and (training / "checkpoints").is_dir()


def test_prune_keeps_only_the_newest_optimizer_state_of_a_running_run(lease, tmp_path):
    """Older checkpoints lose their states (the sweep evaluates their weights); the newest stays
    what `latest_checkpoint` resumes from."""
    run = _run(tmp_path / "runs", "training", finished=False, evals=[], steps=10)
    ckpts = run / "checkpoints"
    for step in (5, 10):
        folder = ckpts / f"step_{step:06d}"
        folder.mkdir(exist_ok=True)
        (folder / lease.STATE_FILE).write_bytes(b"state")
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"w")
    (ckpts / ".tmp_step_000015").mkdir()  # being written: not a checkpoint yet
    assert lease.prune(tmp_path / "runs") == 0
    assert not (ckpts / "step_000005" / lease.STATE_FILE).exists()
    assert (ckpts / "step_000005" / "model.safetensors").is_file()
    assert latest_checkpoint(run) == ckpts / "step_000010"
    assert lease.STATE_FILE == STATE_FILE


def test_progress_says_what_each_stage_holds_and_what_resumes(lease, tmp_path):
    study = tmp_path / "study"
    _run(study / "explore" / "runs", "done", finished=True, evals=[5, 10, 20])
    _run(study / "confirm" / "runs", "mid", finished=False, evals=[5], steps=10)
    empty = study / "confirm" / "runs" / "new"
    empty.mkdir(parents=True)
    (empty / "sweep_run.json").write_text(json.dumps({"finished": False, "evals": {}}))
    (study / "explore" / "base_eval.json").write_text("{}")
    got = lease.progress(study)
    assert not got["study_json"]
    ex, co = got["stages"]["explore"], got["stages"]["confirm"]
    assert (ex["base_evaluated"], ex["runs_finished"], ex["evaluations"]) == (True, 1, 3)
    assert ex["runs"]["done"] == {"state": "finished", "evals": ["5", "10", "20"]}
    assert (co["base_evaluated"], co["runs_finished"], co["runs_started"]) == (False, 0, 2)
    assert co["runs"]["mid"]["state"] == "resumes at step 10"
    assert co["runs"]["new"]["state"] == "starts over"


def _tiny_study(tmp_path: Path, model: str) -> Path:
    base = (ROOT / "configs" / "countdown_tiny.toml").read_text()
    base = base.replace('model_path = "runs/base_tiny"', f'model_path = "{model}"')
    (tmp_path / "base.toml").write_text(
        base.replace("build_base_model = true", "build_base_model = false")
    )
    study = tmp_path / "study.toml"
    study.write_text(
        'base = "base.toml"\nseeds = [0]\ncheckpoints = [1, 2]\nreference = ["grpo"]\n'
        'tune = { "optim.lr" = [1e-4, 3e-4] }\n[train]\nsteps = 2\n'
        "[eval]\nproblems = 4\nsamples = 2\nseed = 0\n"
        '[[methods]]\nmethod = "grpo"\n'
        '[study]\nname = "adopt"\nconfirm_seeds = [1]\nconfirm_problems = 4\n'
    )  # fmt: skip
    return study


def test_adopt_renames_complete_runs_by_config_and_leaves_the_rest(tmp_path, tiny_model_path):
    """A run folder of the same train config under another name (an earlier study's), finished
    and evaluated at every asked step under the study's key, is packed under the study's name;
    one missing an evaluation is not."""
    spec = importlib.util.spec_from_file_location("gpu_adopt", ROOT / "bench/gpu/adopt.py")
    adopt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(adopt)
    study = _tiny_study(tmp_path, tiny_model_path)
    sweep, _ = load_study(study)
    jobs, _, base_sha, _, key = sweep_jobs(sweep, tmp_path / "x",
                                            engine="process", workers=1, progress=False,
                                            run_bars=False)  # fmt: skip
    old = tmp_path / "old" / "runs" / "gpu" / "study" / "explore"
    for job, name, evals, sha in ((jobs[1], "grpo_lr_a", [1, 2], base_sha),
                                  (jobs[2], "grpo_lr_b", [1], base_sha)):  # fmt: skip
        run = old / "runs" / name
        run.mkdir(parents=True)
        (run / "config.toml").write_text(config_to_toml(job.cfg))
        marker = {"finished": True, "base_sha": sha,
                  "evals": {str(s): {"eval": key} for s in evals}}  # fmt: skip
        (run / "sweep_run.json").write_text(json.dumps(marker))
    (old / "base_eval.json").write_text("{}")
    tarball = tmp_path / "old.tgz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(tmp_path / "old" / "runs", arcname="runs")
    rows = adopt.adopt(tarball, study, tmp_path / "state" / "runs.tgz")
    assert rows == [(jobs[1].name, "grpo_lr_a"), (jobs[2].name, None)]
    with tarfile.open(tmp_path / "state" / "runs.tgz") as tar:
        names = tar.getnames()
    assert f"runs/gpu/study/explore/runs/{jobs[1].name}/sweep_run.json" in names
    assert "runs/gpu/study/explore/base_eval.json" in names
    assert not any(jobs[2].name in n for n in names)
    # A later lease's tarball completes the second run: adopted from it, the first from the earlier.
    later = tmp_path / "later" / "runs" / "gpu" / "study" / "explore" / "runs" / "grpo_lr_b2"
    later.mkdir(parents=True)
    (later / "config.toml").write_text(config_to_toml(jobs[2].cfg))
    marker = {
        "finished": True,
        "base_sha": base_sha,
        "evals": {"1": {"eval": key}, "2": {"eval": key}},
    }
    (later / "sweep_run.json").write_text(json.dumps(marker))
    with tarfile.open(tmp_path / "later.tgz", "w:gz") as tar:
        tar.add(tmp_path / "later" / "runs", arcname="runs")
    rows = adopt.adopt([tarball, tmp_path / "later.tgz"], study, tmp_path / "state" / "runs.tgz")
    assert rows == [(jobs[1].name, "grpo_lr_a"), (jobs[2].name, "grpo_lr_b2")]


def test_the_study_and_its_smoke_version_parse(lease, tmp_path):
    sweep, spec = load_study(ROOT / "configs" / "study_countdown_smollm2.toml")
    assert len(sweep.settings) == 14 and sweep.reference == ["grpo"]
    assert sweep.seeds == [0, 1] and set(spec.confirm_seeds).isdisjoint(sweep.seeds)
    assert spec.confirm_offset >= sweep.eval["problems"]  # fresh problems
    smoke = lease.smoke_study("models/random", tmp_path / "smoke.toml")
    s, sspec = load_study(smoke)
    assert (s.steps, s.checkpoints, s.seeds, sspec.confirm_seeds) == (2, [1, 2], [0], [2])
    assert 'model_path = "models/random"' in (tmp_path / "smoke_base.toml").read_text()
    sweep, spec = load_study(ROOT / "configs" / "study_countdown_smollm2_ds.toml")
    assert [s.label for s in sweep.settings] == ["grpo", "grpo", "ds_grpo", "ds_grpo"]
    assert spec.confirm_train == {"eval": {"dtype": "bfloat16"}}


def test_base_passk_writes_one_row_per_variant(tmp_path, tiny_model_path):
    """bench/gpu/base_passk.py on the offline tiny model (its compact template), on the CPU."""
    spec = importlib.util.spec_from_file_location("base_passk", ROOT / "bench/gpu/base_passk.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "table.json"
    args = ["--model", tiny_model_path, "--config", str(ROOT / "configs/countdown_tiny.toml"),
            "--variants", "3:1-9:1-20", "2:1-9:1-20", "--problems", "2", "--samples", "4",
            "--out", str(out)]  # fmt: skip
    assert module.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["3:1-9:1-20", "2:1-9:1-20"]
    assert rows[1]["num_numbers"] == [2] and set(rows[0]["pass_at_k"]) == {"1", "2", "4"}
    with pytest.raises(ValueError, match="--variants: '3-1-9'"):
        module.parse_variant("3-1-9")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampler_speed_times_each_shape(tmp_path, tiny_model_path, dtype):
    """bench/gpu/sampler_speed.py on the offline tiny model, on the CPU: one row per shape and
    sampler (transformers' generate, then the stacked sampler with its speed-up), the training
    shape (G samples) with log-probs, tokens counted from the response masks; the policy's
    weights in either evaluation dtype (bfloat16: the training shape alone, unprofiled)."""
    spec = importlib.util.spec_from_file_location("sampler", ROOT / "bench/gpu/sampler_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "speed.json"
    config = ROOT / "configs/countdown_tiny.toml"
    group = load_config(config).rollout.group_size
    shapes = [f"2x{group}", "3x2"] if dtype == "float32" else [f"2x{group}"]
    profile = ["--profile", "3"] if dtype == "float32" else []
    args = ["--model", tiny_model_path, "--config", str(config), "--shapes", *shapes,
            "--repeats", "1", *profile, "--set", "data.max_target=20", "--out", str(out),
            "--dtype", dtype, "--samplers", "generate", "stacked"]  # fmt: skip
    assert module.main(args) == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert doc["dtype"] == dtype
    assert [r["shape"] for r in rows] == [s for s in shapes for _ in range(2)]
    assert [r["sampler"] for r in rows] == ["generate", "stacked"] * len(shapes)
    assert [r["training_call"] for r in rows] == [True, True, group == 2, group == 2][: len(rows)]
    assert all(0 < r["new_tokens"] <= r["sequences"] * r["max_new_tokens"] for r in rows)
    assert all(r["speedup_vs_generate"] > 0 for r in rows[1::2])
    with pytest.raises(ValueError, match="--shapes: '16-8'"):
        module.parse_shape("16-8")


def _git_tree(root: Path) -> None:
    """A repository at `root` with a package file and device-unneeded folders, committed."""
    import subprocess

    (root / "llm").mkdir()
    (root / "llm" / "code.py").write_bytes(b"x" * 100_000)
    (root / "figures").mkdir()
    (root / "figures" / "fig.png").write_bytes(random.Random(2).randbytes(3 * 2**20))
    (root / "bench" / "results").mkdir(parents=True)
    (root / "bench" / "results" / "r.json").write_bytes(b"{}" * 50_000)
    for cmd in (["init", "-q"], ["add", "."],
                ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "tree"]):  # fmt: skip
        subprocess.run(["git", *cmd], cwd=root, check=True)


def test_plan_sizes_each_call_with_the_tree_and_fails_above_the_limit(lease, tmp_path, monkeypatch):
    """Offline (no pack): one call per piece of the xz stream plus a last call with the wheels
    alone, each sized with the tree that travels (tracked and untracked-not-ignored files, less
    what `slim` leaves out: the plan's first step); exit 1 above the limit, 0 within it."""
    _git_tree(tmp_path)
    monkeypatch.setattr(lease, "XZ_BYTES", 5 * 2**20)
    monkeypatch.setattr(lease, "PIECE_BYTES", 2 * 2**20)
    monkeypatch.setattr(lease, "WHEELS_BYTES", 1000)
    full = lease._tree_bytes()
    assert full == sum(p.stat().st_size for p in tmp_path.rglob("*")
                       if p.is_file() and ".git" not in p.parts)  # fmt: skip
    tree = lease._tree_bytes(lease.NOT_ON_DEVICE)  # the calls carry the tree as slim leaves it
    assert tree < full
    calls = lease.calls()
    assert [c["bytes"] - tree for c in calls] == [2 * 2**20 + 1000, 2 * 2**20 + 1000, 2**20 + 1000,
                                                  1000]  # fmt: skip
    big = full + 2 * 2**20 + 1000  # the largest call with the tree as it is: over 2.x MiB
    limit = math.ceil((tree + 2 * 2**20 + 1000) / 2**20 * 10) / 10  # fits the slim tree's calls
    assert big > limit * 2**20
    text, fits = lease.plan(limit_mib=limit)
    assert fits and text.count("MiB with the tree's") == 4
    assert "slim: figures/, bench/results/ left out, the tree is 0.1 MiB" in text
    text, fits = lease.plan(limit_mib=2)
    assert not fits and text.count("OVER THE LIMIT of 2 MiB") == 2
    assert lease.main(["plan", "--limit-mib", "2"]) == 1
    assert lease.main(["plan", "--limit-mib", f"{limit}"]) == 0


def test_slim_leaves_the_unneeded_folders_out_and_brings_them_back(lease, tmp_path):
    """A sparse checkout without figures/ and bench/results/: the files leave the working tree
    (and the call's tree) but stay in git; undone, they are back with their bytes. A change under
    those folders is refused, not lost."""
    import subprocess

    _git_tree(tmp_path)
    before = lease._tree_bytes()
    png = (tmp_path / "figures" / "fig.png").read_bytes()
    lease.slim()
    assert not (tmp_path / "figures").exists() and not (tmp_path / "bench" / "results").exists()
    kept = sum(p.stat().st_size for d in ("llm", "configs") for p in (tmp_path / d).rglob("*"))
    assert lease._tree_bytes() == lease._tree_bytes(lease.NOT_ON_DEVICE) == kept < before
    listed = subprocess.run(["git", "ls-files"], cwd=tmp_path, capture_output=True, text=True,
                            check=True).stdout.split()  # fmt: skip
    assert "figures/fig.png" in listed
    lease.slim(undo=True)
    assert (tmp_path / "figures" / "fig.png").read_bytes() == png
    assert lease._tree_bytes() == before
    (tmp_path / "figures" / "new.png").write_bytes(b"new")
    with pytest.raises(SystemExit, match=r"slim: changes under figures/, bench/results/"):
        lease.slim()
    assert (tmp_path / "figures" / "new.png").read_bytes() == b"new"


def test_plan_runs_offline_on_this_checkout():
    """`python bench/gpu/lease.py plan` as a user runs it: each call within 62 MiB, the schedule
    printed; a limit below the largest call exits 1."""
    import subprocess

    cmd = [sys.executable, str(LEASE), "plan"]
    ok = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    sizes = [float(m) for m in re.findall(r"\(([\d.]+) MiB with the tree's", ok.stdout)]
    assert len(sizes) == 3 and max(sizes) <= 62
    assert re.search(r"schedule: WORKERS=\d", ok.stdout)
    low = subprocess.run([*cmd, "--limit-mib", f"{max(sizes) - 1}"], capture_output=True, cwd=ROOT)
    assert low.returncode == 1


def test_the_pace_is_the_committed_leases_slowest_run_per_worker(lease):
    """`PACE_S_PER_WORKER` is the third lease's slowest complete run over its 7 workers (from the
    committed markers), and the fourth lease's own runs at 4 workers (DS-GRPO) lie under it."""
    results = ROOT / "bench" / "results"
    got = lease.pace(results / "gpu_lease_smollm2_2026-11-26_lease3_runs.tgz", 7)
    assert got == pytest.approx(lease.PACE_S_PER_WORKER, abs=0.05)
    with tarfile.open(results / "gpu_lease_smollm2_2026-11-27_lease4_runs.tgz") as tar:
        own = [json.loads(tar.extractfile(m).read()) for m in tar.getmembers()
               if "/explore/runs/ds_grpo" in m.name and m.name.endswith("sweep_run.json")]  # fmt: skip
    seconds = [m["train_seconds"] + sum(e["result"]["eval_seconds"] for e in m["evals"].values())
               for m in own]  # fmt: skip
    assert len(seconds) == 4 and max(seconds) <= 4 * lease.PACE_S_PER_WORKER


@given(
    runs=st.integers(0, 40),
    workers=st.integers(1, 8),
    budgets=st.lists(st.floats(0, 2000, allow_nan=False), min_size=1, max_size=4),
    pace_s=st.floats(1, 100, allow_nan=False),
)
def test_a_schedule_never_lets_a_run_span_a_call_and_fills_each_call(
    runs, workers, budgets, pace_s
):
    """Every call's runs end inside its budget; no run is lost or counted twice; a call that
    leaves runs for later holds as many whole runs per worker as its budget allows."""
    spec = importlib.util.spec_from_file_location("gpu_lease_pure", LEASE)
    lease = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lease)
    s = lease.schedule(runs, workers, budgets, pace_s=pace_s, overhead_s=5.0)
    assert s["run_s"] == pace_s * workers + 5.0
    assert sum(c["runs"] for c in s["calls"]) == s["done"] and s["done"] + s["left"] == runs
    for c in s["calls"]:
        assert c["end_s"] <= c["budget_s"] and c["margin_s"] >= 0
        assert c["runs"] <= c["per_worker"] * workers
        if s["left"]:
            assert c["runs"] == workers * int(c["budget_s"] // s["run_s"])
    best = lease.best_schedule(runs, budgets, workers, pace_s=pace_s, overhead_s=5.0)
    assert all(best["done"] >= lease.schedule(runs, w, budgets, pace_s=pace_s,
                                              overhead_s=5.0)["done"]
               for w in range(1, workers + 1))  # fmt: skip


def test_the_lease_schedule_fits_its_calls(lease):
    """At the measured pace the study's call holds whole runs only with a margin; the worker count
    chosen finishes at least as many runs as the 7 workers of the fourth lease."""
    budgets = lease.study_budgets()
    best = lease.best_schedule(lease.REMAINING_RUNS, budgets, lease.MAX_WORKERS)
    seven = lease.schedule(lease.REMAINING_RUNS, 7, budgets)
    assert best["done"] >= seven["done"] and best["done"] > 0
    assert min(c["margin_s"] for c in best["calls"] if c["runs"]) >= 30
    assert (
        sum(budgets) + lease.FIRST_CALL_S + 3 * lease.END_S + lease.STUDY_START_S <= lease.LEASE_S
    )
    text = lease.schedule_text(best)
    assert f"WORKERS={best['workers']}" in text and f"{best['left']} left for the next" in text
    with pytest.raises(ValueError, match="workers 0"):
        lease.schedule(3, 0, budgets)
