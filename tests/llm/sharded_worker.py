"""The FSDP2 kill-and-resume run of `dist_worker` (2 steps, killed after step 1), with probes on
the resume that record what each rank reads.

`main` runs in each rank that tests/llm/test_sharded_checkpoint.py forks; by hand, run
``torchrun --nproc_per_node 2 sharded_worker.py MODEL OUT MODE``. MODE is ``kill`` or
``resume``. On ``resume`` every rank writes ``OUT/probe_rank<r>.json``:

- ``dcp_read``: bytes this rank read from the DCP shard files, by file (each `ReadItem` that
  `FileSystemReader.read_data` serves is one byte range of one file);
- ``dcp_elements``: tensor elements this rank deserialized from them (DCP `torch.load`s each
  tensor from a byte-range view of a shard file);
- ``torch_load``: every other `torch.load`, of a file (its name and whether what it returned
  held an ``optimizer`` entry);
- ``optim_local`` / ``optim_global``: elements of the AdamW state tensors this rank holds after
  `restore_checkpoint` (its shards) and of the full tensors they are shards of.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import torch
from torch.distributed.checkpoint import FileSystemReader

try:  # run as a script: dist_worker.py sits beside it
    from dist_worker import exit_launched_rank
    from dist_worker import main as run_worker
except ModuleNotFoundError:  # imported from the repository root (the test)
    from tests.llm.dist_worker import exit_launched_rank
    from tests.llm.dist_worker import main as run_worker

import llm.train.trainer


def _numel(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, dict):
        return sum(_numel(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_numel(v) for v in obj)
    return 0


def _install_probes(probe: dict[str, Any]) -> None:
    read_data, load, restore = (
        FileSystemReader.read_data,
        torch.load,
        llm.train.trainer.restore_checkpoint,
    )

    def recording_read_data(self, plan, planner):
        for item in plan.items:
            where = self.storage_data[item.storage_index]
            reads = probe["dcp_read"]
            reads[where.relative_path] = reads.get(where.relative_path, 0) + where.length
        return read_data(self, plan, planner)

    def recording_load(f, *args, **kwargs):
        value = load(f, *args, **kwargs)
        if isinstance(f, str | os.PathLike):
            probe["torch_load"].append(
                {
                    "file": Path(f).relative_to(Path(f).parents[1]).as_posix(),
                    "optimizer": isinstance(value, dict) and "optimizer" in value,
                }
            )
        else:  # DCP reads each tensor of a shard file through torch.load of a byte-range view
            probe["dcp_elements"] += _numel(value)
        return value

    def recording_restore(ckpt, policy, optimizer, scheduler, info):
        result = restore(ckpt, policy, optimizer, scheduler, info)
        for state in optimizer.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                t = state[key]
                local = t.to_local() if hasattr(t, "to_local") else t
                probe["optim_local"] += local.numel()
                probe["optim_global"] += t.numel()  # a DTensor's numel is the full tensor's
        return result

    FileSystemReader.read_data = recording_read_data
    torch.load = recording_load
    llm.train.trainer.restore_checkpoint = recording_restore


def main(model: str, out: str, mode: str) -> None:
    probe: dict[str, Any] = {
        "dcp_read": {}, "dcp_elements": 0, "torch_load": [], "optim_local": 0, "optim_global": 0,
    }  # fmt: skip
    if mode == "resume":
        _install_probes(probe)
    rank = int(os.environ.get("RANK", "0"))
    run_worker(model, out, "fsdp2", "grpo", "0", "2", mode)
    if mode == "resume":
        Path(out, f"probe_rank{rank}.json").write_text(json.dumps(probe))


if __name__ == "__main__":
    main(*sys.argv[1:])
    exit_launched_rank()
