"""Jobs for the Ray executor's tests (`tests/llm/test_executor.py`), in a module of their own: a
Ray worker imports the module of the function it runs, and this one imports no torch (the test
module does: ~10 s per worker on 2 cores)."""

from __future__ import annotations

import os
import time


def square_after(job: tuple[int, float]) -> int:
    """`x²` after sleeping `seconds` (jobs that finish out of order)."""
    x, seconds = job
    time.sleep(seconds)
    return x * x


def fail_one(job: int) -> int:
    """Job 1 fails at once; the others run for ten minutes unless ended."""
    if job == 1:
        raise ValueError("job 1 failed")
    time.sleep(600)
    return job


def gpus_seen(job: str) -> tuple[str, list, str | None]:
    """Job `job`'s name, the GPUs Ray gave its task and the task's ``CUDA_VISIBLE_DEVICES``."""
    import ray  # inside the Ray task: what the scheduler gave it

    return job, ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")


def numerics_seen(job: int) -> tuple[int, str | None, int]:
    """Job `job`, the task's ``SHARPENING_NUMERICS`` and the numerics version it computes under."""
    import numerics  # in a fresh worker: pinned as its environment says

    return job, os.environ.get(numerics.OPT_OUT_ENV), numerics.version()
