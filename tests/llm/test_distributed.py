"""Data parallelism: one update step over 2 gloo processes (torchrun; DDP and FSDP2) gives the
parameters of the single-process step on the same global batch (llm/run/distributed.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.tolerance import DATA_PARALLEL_N, assert_close

WORKER = Path(__file__).with_name("dist_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], world: int, worker: Path = WORKER) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
    }
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    launcher = [sys.executable]
    if world > 1:
        launcher += [
            "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
        ]  # fmt: skip
    proc = subprocess.run(
        [*launcher, str(worker), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def _params(out: Path, step: int = 1) -> dict[str, torch.Tensor]:
    return load_file(out / "checkpoints" / f"step_{step:06d}" / "model.safetensors")


def _loss(out: Path) -> float:
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["losses/loss"]


# The runs compared, by data-parallel kind: (method, prompts per update[, steps]). A method ending
# in ``+kl`` turns on the KL controls (`dist_worker.main`).
KL = ("grpo+kl", "0", "2")
CASES = {
    "ddp": [("grpo", "0"), ("entropy_bonus", "0"), KL],
    "fsdp2": [("grpo", "0"), ("grpo", "2"), KL],
}


def _launch_each(runs: dict[tuple[str, ...], Path], model: str, parallel: str, world: int) -> None:
    """Every run of `runs` (case -> its output folder) in one launch of `world` processes."""
    each = [" ".join([model, str(out), parallel, *case]) for case, out in runs.items()]
    _run(["--each", *each], world=world)


@pytest.fixture(scope="module")
def single(tiny_model_path, tmp_path_factory) -> dict[tuple[str, ...], Path]:
    """The single-process reference runs of every case (shared by DDP and FSDP2), in one
    process."""
    cases = sorted({case for cases in CASES.values() for case in cases})
    runs = {case: tmp_path_factory.mktemp("single_" + "_".join(case)) for case in cases}
    _launch_each(runs, tiny_model_path, "auto", world=1)
    return runs


def _assert_one_step_equal(ref: Path, out: Path, base: dict[str, torch.Tensor]) -> None:
    want, got = _params(ref), _params(out)
    assert want.keys() == got.keys()
    moved = max((want[k] - base[k]).abs().max().item() for k in want)
    assert moved > 1e-4, "the step did not change the parameters: the test would be vacuous"
    for k in want:
        assert_close(got[k], want[k], dtype="float32", n=DATA_PARALLEL_N, elementwise=True)
    assert_close(_loss(out), _loss(ref), dtype="float32", n=DATA_PARALLEL_N)


def _assert_kl_controls_equal(ref: Path, out: Path) -> None:
    """The KL in the reward, the adaptive coefficients and a reference reset after every step
    (docs/formulas.md §2.35-§2.37): the sharded reference is reset from the sharded policy, and
    its gathered copy in the checkpoint is the policy of the reset step."""
    want, got = _params(ref, 2), _params(out, 2)
    for k in want:
        assert_close(got[k], want[k], dtype="float32", n=DATA_PARALLEL_N, elementwise=True)
    for step in (1, 2):
        one = load_file(
            ref / "checkpoints" / f"step_{step:06d}" / "reference" / "model.safetensors"
        )
        folder = out / "checkpoints" / f"step_{step:06d}"
        two = load_file(folder / "reference" / "model.safetensors")
        for k in want:
            assert torch.equal(one[k], _params(ref, step)[k]), (step, k)
            assert_close(two[k], one[k], dtype="float32", n=DATA_PARALLEL_N, elementwise=True)
        if (folder / "model.safetensors").is_file():  # FSDP2 exports the weights at the last step
            policy = load_file(folder / "model.safetensors")
            assert all(torch.equal(policy[k], two[k]) for k in policy), step
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["control/reference_step"] for r in rows] == [1.0, 2.0]
    assert rows[1]["control/kl"] == 0.0  # step 2 samples from the reference itself


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_processes_equal_one(parallel, single, tiny_model_path, tmp_path):
    """Every case of `CASES` (one launch of 2 processes runs them all): one update step (and a
    gradient accumulation over 2 prompts per update) gives the single-process parameters and
    loss; with the KL controls, two steps give its parameters and references."""
    runs = {case: tmp_path / "_".join(case) for case in CASES[parallel]}
    _launch_each(runs, tiny_model_path, parallel, world=2)
    base = load_file(Path(tiny_model_path) / "model.safetensors")
    for case, out in runs.items():
        try:
            if case == KL:
                _assert_kl_controls_equal(single[case], out)
            else:
                _assert_one_step_equal(single[case], out, base)
        except AssertionError as e:
            raise AssertionError(f"{parallel} {' '.join(case)}: {e}") from e


@pytest.mark.slow
def test_generate_shared_gives_a_group_the_same_requests(tiny_model_path, tmp_path):
    """vLLM tensor parallelism: both ranks of a group submit the group's prompts with the first
    rank's seed, and each keeps its own prompts' rollouts."""
    _run([tiny_model_path, str(tmp_path), "ddp", "grpo", "0", "1", "share"], world=2)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["calls"] == r1["calls"] == [[r0["mine"] + r1["mine"], 1000]]
    for r in (r0, r1):
        assert r["roll_prompts"] == r["mine"] and r["rows"] == 2
