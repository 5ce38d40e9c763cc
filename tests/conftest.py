"""Shared test configuration: Hypothesis profiles.

`default` is deterministic (derandomized, no deadline) so CI is reproducible; set
`HYPOTHESIS_PROFILE=explore` for a slower randomized search with more examples.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    derandomize=True,
    deadline=None,
    print_blob=True,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    derandomize=False,
    deadline=None,
    print_blob=True,
    max_examples=1000,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# tests/vllm_api checks our vLLM calls against the real vLLM (`make test-vllm`, its own venv with the
# `gpu` extra); without vLLM installed it is not collected at all.
collect_ignore = [] if importlib.util.find_spec("vllm") else ["vllm_api"]


# One vLLM engine per process: vLLM's single-process executor initializes torch.distributed and sleep
# mode's allocator serves one engine, so a second engine in the same process crashes. Tests that
# build an engine therefore run in a fresh Python process of their own (`run_in_own_process`),
# and are skipped in the process that launches them (`in_engine_process`).
ENGINE_PROCESS_ENV = "SHARPENING_ENGINE_PROCESS"
REPO_ROOT = Path(__file__).resolve().parents[1]


def in_engine_process() -> bool:
    """True inside a process started by `run_in_own_process`."""
    return os.environ.get(ENGINE_PROCESS_ENV) == "1"


def run_in_own_process(node: str, *, marker: str | None = None, timeout: float = 1800) -> str:
    """Run the pytest node `node` (``FILE`` or ``FILE::TEST``) in a fresh Python process, from the
    repository root, with `ENGINE_PROCESS_ENV` set; return its output.

    Raises:
        pytest.fail.Exception: the child's tests failed or none ran (its output is the message).
    """
    import pytest

    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", node]
    if marker:
        cmd += ["-m", marker]
    env = {**os.environ, ENGINE_PROCESS_ENV: "1"}
    res = subprocess.run(
        cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    out = res.stdout + res.stderr
    if res.returncode != 0:
        pytest.fail(f"{node} in its own process exited with {res.returncode}:\n{out[-6000:]}")
    return out
