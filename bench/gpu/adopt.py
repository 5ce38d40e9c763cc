"""Carry an earlier lease's finished runs into a study under the names that study gives them.

    python bench/gpu/adopt.py bench/results/gpu_lease_smollm2_2026-11-26_lease3_runs.tgz \
        bench/results/gpu_lease_smollm2_2026-11-27_lease4_runs.tgz \
        --study configs/study_countdown_smollm2.toml             # writes .gpu/state/runs.tgz

A study names a run folder after its setting (`llm.orchestrate.sweep_spec.run_name`): the third lease's
``grpo_seed0`` (GRPO at the base config's lr 3e-5) is ``grpo_optim.lr=3e-05_seed0`` in a study that
tunes the learning rate, though it is the same run. This matches each of the study's exploratory
runs to an earlier run folder (of any of the tarballs, a complete one first, a later tarball's
before an earlier's) by its train config (``config.toml``, compared as
`llm.config.config_to_toml` writes it; a config saved under a key removed since, such as
``eval.n_samples``, is upgraded first and the move recorded in the folder,
`llm.run.checkpoint.upgrade_run_config`), checks the earlier marker's base weights (when the model
folder is here) and which of the asked evaluations it holds under the study's evaluation key
(`llm.orchestrate.jobs.same_eval`), and packs the runs that `llm.orchestrate.jobs` will reuse,
renamed, with the exploratory base evaluation, as ``runs/gpu/study/explore`` in `--out`
(bench/gpu/device_call.sh unpacks it before its study). A run that is not complete would be
trained again from scratch there (its checkpoints are gone), so it is left out. Prints one line per
run of the study: adopted from which folder, or trained in the lease.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from experiment.store import read_json
from llm.config import config_to_toml, load_saved_config
from llm.orchestrate.jobs import RUN_MARKER, same_eval
from llm.orchestrate.study_spec import load_study
from llm.orchestrate.sweep import sweep_jobs
from llm.run.checkpoint import upgrade_run_config

ROOT = Path(__file__).resolve().parents[2]
STUDY_DIR = Path("runs/gpu/study")
"""The folder bench/gpu/device_call.sh gives the study (``--out``)."""


def adopt(tarballs: Path | list[Path], study: Path, out: Path) -> list[tuple[str, str | None]]:
    """Write `out` (module docstring) from one or several earlier leases' ``runs.tgz``; returns
    (study run name, adopted folder name or None) per exploratory run of the study."""
    tarballs = [tarballs] if isinstance(tarballs, Path) else list(tarballs)
    spec, _ = load_study(study)  # the exploratory sweep
    rows: list[tuple[str, str | None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        candidates: dict[str, list[Path]] = {}  # train config -> run folders, latest tarball first
        base_evals = []
        for k, tarball in enumerate(reversed(tarballs)):
            with tarfile.open(tarball) as tar:
                tar.extractall(tmp / f"old{k}", filter="data")
            old_explore = next((tmp / f"old{k}").rglob("explore"), None)
            if old_explore is None or not (old_explore / "runs").is_dir():
                raise SystemExit(f"{tarball}: no explore/runs folder in it")
            base_evals.append(old_explore / "base_eval.json")
            for d in sorted((old_explore / "runs").iterdir()):
                if (d / "config.toml").is_file() and (d / RUN_MARKER).is_file():
                    moved = upgrade_run_config(d)  # an earlier lease's removed spellings
                    if moved:
                        print(f"{tarball.name}: {d.name}: upgraded "
                              + ", ".join(f"{a} -> {b}" for a, b in moved.items()))  # fmt: skip
                    text = config_to_toml(load_saved_config(d / "config.toml")[0])
                    candidates.setdefault(text, []).append(d)
        new_explore = tmp / "new" / STUDY_DIR / "explore"
        jobs, _, base_sha, _, eval_key = sweep_jobs(
            spec, new_explore, engine="process", workers=1, progress=False, run_bars=False
        )

        def complete(src: Path, steps: list[int]) -> bool:
            marker = read_json(src / RUN_MARKER)
            return bool(
                marker is not None
                and marker.get("finished")
                and marker.get("base_sha") == base_sha
                and all(same_eval(marker.get("evals", {}).get(str(s), {}).get("eval"), eval_key)
                        for s in steps)
            )  # fmt: skip

        for job in jobs[1:]:
            found = [d for d in candidates.get(config_to_toml(job.cfg), [])
                     if complete(d, job.steps)]  # fmt: skip
            if found:
                shutil.copytree(
                    found[0], Path(job.out), ignore=shutil.ignore_patterns("checkpoints")
                )
            rows.append((job.name, found[0].name if found else None))
        base_eval = next((b for b in base_evals if b.is_file()), None)
        if base_eval is not None:
            shutil.copy(base_eval, new_explore / "base_eval.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(tmp / "new" / "runs", arcname="runs")
        out.write_bytes(buf.getvalue())
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tarballs", type=Path, nargs="+", help="earlier leases' runs.tgz, oldest first")
    ap.add_argument("--study", type=Path, required=True, help="the study file the lease runs")
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu" / "state" / "runs.tgz")
    args = ap.parse_args(argv)
    rows = adopt(args.tarballs, args.study, args.out)
    for name, src in rows:
        print(f"{name}: " + (f"adopted from {src}" if src else "trained in the lease"))
    print(f"{sum(s is not None for _, s in rows)} of {len(rows)} runs adopted -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
