"""Sharded FSDP2 checkpoints (llm/run/checkpoint.py): 2 gloo processes train 2 steps, are killed after
step 1 and resume from its sharded (torch.distributed.checkpoint) checkpoint.

One set of runs (module fixture: a one-process reference, the killed and the resumed launch of 2
ranks) serves every test: the resumed run ends where the uninterrupted one does; no rank reads or
holds a full optimizer state and no file holds one; the last step's Hugging Face export is what
``eval`` loads; a torn sharded checkpoint is skipped on resume.

Each run's processes are spawned by this one (`_launch`), given the environment torchrun gives
its ranks (torchrun launches of FSDP2 are tests/llm/test_distributed.py's). Spawned, not forked: a
rank forked from a pytest worker whose earlier tests left threads behind can hang before its first
line. No launch trains in this process, and the resumed ranks know of the killed ones only what
they read from disk.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from llm.run.checkpoint import (
    COMPLETE_FILE,
    RNG_DIR,
    SHARDED_DIR,
    STATE_FILE,
    export_checkpoint,
    find_resume_checkpoint,
    latest_checkpoint,
)
from llm.run.folder import RunFolderError
from tests.llm import dist_worker, sharded_worker
from tests.llm.test_distributed import _params
from tests.tolerance import DATA_PARALLEL_N, assert_close

pytestmark = pytest.mark.slow

_RANK_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _rank(
    target: Callable[..., None], args: tuple, rank: int, world: int, port: int, log: Path
) -> None:
    """A spawned rank: `target(*args)` with torchrun's environment for `rank` of `world` (none for
    one process), its output written to `log`; it ends as a torchrun rank's script does
    (`dist_worker.exit_launched_rank`), or with exit code 1 and the traceback in `log`."""
    with open(log, "w") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    for key in _RANK_ENV:
        os.environ.pop(key, None)
    if world > 1:
        os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    try:
        target(*args)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    dist_worker.exit_launched_rank()


def _launch(target: Callable[..., None], args: tuple, world: int, logs: Path) -> None:
    """`target(*args)` in `world` spawned processes, the ranks of one gloo process group; asserts
    that every rank exits with 0 (a failed rank's peers are killed: they would wait in a
    collective), showing the ranks' output otherwise."""
    with socket.socket() as s:  # a free port for rank 0's store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs.mkdir(parents=True)
    # spawn, not fork (module docstring): a fresh-clone make test lost 300 s to a hung fork
    spawn = multiprocessing.get_context("spawn")
    procs = [
        spawn.Process(target=_rank, args=(target, args, r, world, port, logs / f"rank{r}.log"))
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and any(p.exitcode is None for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs):
            break
        time.sleep(0.05)
    for proc in procs:
        if proc.exitcode is None:
            proc.kill()
        proc.join()
    out = "".join(f"--- rank {r} ---\n" + (logs / f"rank{r}.log").read_text()[-4000:]
                  for r in range(world))  # fmt: skip
    assert [p.exitcode for p in procs] == [0] * world, out


@pytest.fixture(scope="module")
def runs(tiny_model_path, tmp_path_factory) -> dict[str, Path]:
    """``one``: one process, 2 steps; ``two``: 2 FSDP2 processes killed after step 1 (sharded
    checkpoint), then resumed to step 2 with the probes of `sharded_worker`."""
    root = tmp_path_factory.mktemp("sharded")
    one, two = root / "one", root / "two"
    model = tiny_model_path
    _launch(dist_worker.main, (model, str(one), "fsdp2", "grpo", "0", "2", "run"), 1, root / "l1")
    _launch(sharded_worker.main, (model, str(two), "kill"), 2, root / "l2")
    assert not (two / "checkpoints" / "step_000002").exists()
    _launch(sharded_worker.main, (model, str(two), "resume"), 2, root / "l3")
    return {"one": one, "two": two}


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert_close(got[k], want[k], dtype="float32", n=DATA_PARALLEL_N, elementwise=True)


def test_resume_from_shards_equals_uninterrupted_run(runs):
    """Killed after step 1 and resumed from its shards, 2 processes end where one process does
    after 2 uninterrupted steps (weights from the last step's Hugging Face export)."""
    _assert_same(_params(runs["two"], 2), _params(runs["one"], 2))
    moved = max((_params(runs["one"], 2)[k] - _params(runs["one"], 1)[k]).abs().max().item()
                for k in _params(runs["one"], 1))  # fmt: skip
    assert moved > 1e-4, "step 2 did not change the parameters: the test would be vacuous"


def _moment(fqn: str) -> bool:
    return fqn.startswith("optimizer.state.") and fqn.endswith(("exp_avg", "exp_avg_sq"))


def _elements_by_file(ckpt: Path, keep=lambda fqn: True) -> tuple[dict[str, int], int]:
    """Tensor elements of the entries `keep` selects stored in each shard file of `ckpt`, from
    the DCP metadata (each chunk of a tensor names its file and byte range), and their total."""
    metadata = FileSystemReader(str(ckpt / SHARDED_DIR)).read_metadata()
    where = {(i.fqn, tuple(i.offset or ())): info.relative_path for i, info in
             metadata.storage_data.items()}  # fmt: skip
    by_file: dict[str, int] = {}
    total = 0
    for fqn, md in metadata.state_dict_metadata.items():
        if not (keep(fqn) and hasattr(md, "chunks")):  # tensors only (not pickled values)
            continue
        total += math.prod(md.size)
        for chunk in md.chunks:
            name = where[(fqn, tuple(chunk.offsets))]
            by_file[name] = by_file.get(name, 0) + math.prod(chunk.sizes)
    return by_file, total


def test_no_rank_reads_or_holds_a_full_state(runs):
    """The checkpoint holds one shard file per rank, each with half of the AdamW moments (from
    DCP's metadata), and no other file holds optimizer state; on resume each rank deserialized
    half of the checkpoint's tensor elements (its shards, plus the replicated step counters),
    loaded no file with an optimizer state, and holds half of every AdamW moment tensor."""
    ckpt = runs["two"] / "checkpoints" / "step_000001"
    files = sorted(p.name for p in (ckpt / SHARDED_DIR).iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    moments, total = _elements_by_file(ckpt, _moment)
    assert set(moments) == {"__0_0.distcp", "__1_0.distcp"}
    assert sum(moments.values()) == total > 0
    for name, n in moments.items():
        assert n <= 0.55 * total, f"{name} holds {n} of {total} AdamW moment elements"
    state = torch.load(ckpt / STATE_FILE, weights_only=False)
    assert "optimizer" not in state and state["layout"] == "sharded"
    assert not (ckpt / "model.safetensors").exists()  # no export before the last step
    _, stored = _elements_by_file(ckpt)

    for rank in (0, 1):
        probe = json.loads((runs["two"] / f"probe_rank{rank}.json").read_text())
        assert probe["optim_local"] * 2 == probe["optim_global"] == total
        read = probe["dcp_elements"]
        assert 0.45 * stored <= read <= 0.55 * stored, (rank, read, stored)
        loaded = {entry["file"] for entry in probe["torch_load"]}
        assert loaded <= {f"step_000001/{STATE_FILE}"} | {
            f"{RNG_DIR}/rank_{r:05d}.pt" for r in (0, 1)
        }, loaded
        assert not any(entry["optimizer"] for entry in probe["torch_load"])


def test_last_step_exports_a_model_folder(runs, tmp_path):
    """The last step's checkpoint holds the consolidated weights (``eval --model RUN`` loads it);
    an intermediate one does not, and `export_checkpoint` turns it into the same weights as the
    one-process run's step 1."""
    two = runs["two"]
    assert latest_checkpoint(two) == two / "checkpoints" / "step_000002"
    out = export_checkpoint(two / "checkpoints" / "step_000001", tmp_path / "export")
    _assert_same(load_file(out / "model.safetensors"), _params(runs["one"], 1))
    assert (out / "tokenizer.json").is_file()


@pytest.mark.parametrize("damage", ["truncate_shard", "no_marker", "no_rng", "torn_metadata"])
def test_torn_sharded_checkpoint_is_skipped(runs, tmp_path, damage):
    """A damaged newest sharded checkpoint is skipped (with a warning naming it, or silently when
    its COMPLETE marker is missing) and resume falls back to the one before."""
    run = tmp_path / "run"
    shutil.copytree(runs["two"], run)
    newest = run / "checkpoints" / "step_000002"
    if damage == "truncate_shard":
        shard = newest / SHARDED_DIR / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "no_marker":
        (newest / COMPLETE_FILE).unlink()
    elif damage == "no_rng":
        (newest / RNG_DIR / "rank_00001.pt").unlink()
    else:
        (newest / SHARDED_DIR / ".metadata").write_bytes(b"torn")
    if damage == "no_marker":
        found = find_resume_checkpoint(run, 3)
    else:
        with pytest.warns(UserWarning, match="skipped checkpoint .*step_000002"):
            found = find_resume_checkpoint(run, 3)
    assert found == run / "checkpoints" / "step_000001"
    shutil.rmtree(run / "checkpoints" / "step_000001")
    if damage == "no_marker":
        assert find_resume_checkpoint(run, 3) is None
    else:
        with pytest.raises(RunFolderError, match="no checkpoint loads"), pytest.warns(UserWarning):
            find_resume_checkpoint(run, 3)
