"""Shared test configuration: Hypothesis profiles, and running a test in a process of its own
(`own_process`, `run_in_own_process`: one vLLM engine per process).

`default` is deterministic (derandomized, no deadline) so CI is reproducible; set
`HYPOTHESIS_PROFILE=explore` for a slower randomized search with more examples.
"""

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from shaping import methods as shaping_methods

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


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config, report):
    """A test report as pytest-xdist sends it from a worker, every string made UTF-8-encodable.

    execnet refuses a string that UTF-8 cannot encode (a lone surrogate, e.g. from bytes decoded
    with ``surrogateescape``): the worker then dies with an INTERNALERROR that hides which test
    failed and how. Lone surrogates become ``\\udcXX`` escapes, so the failure is reported.
    """
    return _encodable((yield))


def _encodable(data):
    if isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            return data.encode("utf-8", "backslashreplace").decode("utf-8")
        return data
    if isinstance(data, dict):
        return {_encodable(k): _encodable(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return type(data)(_encodable(v) for v in data)
    return data


# tests/vllm_api checks our vLLM calls against the real vLLM (`make test-vllm`, its own venv with the
# `gpu` extra); without vLLM installed it is not collected at all.
collect_ignore = [] if importlib.util.find_spec("vllm") else ["vllm_api"]


# One vLLM engine per process: vLLM's single-process executor initializes torch.distributed and sleep
# mode's allocator serves one engine, so a second engine in the same process crashes. A test that
# builds an engine therefore runs in a fresh Python process of its own: the process that collects it
# re-runs its node there (`run_in_own_process`) and only reports the child's outcome; the child,
# marked by `ENGINE_PROCESS_ENV`, runs the body. `own_process` wraps a whole test that way.
ENGINE_PROCESS_ENV = "SHARPENING_ENGINE_PROCESS"
REPO_ROOT = Path(__file__).resolve().parents[1]


def in_engine_process() -> bool:
    """True inside a process started by `run_in_own_process`."""
    return os.environ.get(ENGINE_PROCESS_ENV) == "1"


def node_of(item) -> str:
    """`item`'s pytest node as ``ABSOLUTE_FILE::NAME[PARAMS]``: valid from the repository root
    whatever rootdir the collecting run had (a test file outside the repository included)."""
    return f"{item.path}::{item.nodeid.split('::', 1)[1]}"


def run_in_own_process(node: str, *, timeout: float = 1800) -> str:
    """Run the one pytest node `node` (``FILE::TEST``) in a fresh Python process, from the
    repository root, with `ENGINE_PROCESS_ENV` set; print its output (pytest shows it with ``-s``
    or ``-rA``) and return it. The calling process only waits for the child.

    Raises:
        pytest.fail.Exception: the child exited non-zero (its test failed, or nothing was
            collected) or passed nothing without skipping; its output is the message.
        pytest.skip.Exception: the child skipped the test (its reason is the message).
    """
    import pytest

    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-rs", "-p", "no:cacheprovider", node]
    env = {**os.environ, ENGINE_PROCESS_ENV: "1"}
    res = subprocess.run(
        cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    out = res.stdout + res.stderr
    if res.returncode != 0:
        pytest.fail(f"{node} in its own process exited with {res.returncode}:\n{out[-6000:]}")
    print(f"--- {node} in its own process ---\n{out}")
    if not re.search(r"\b1 passed\b", out):
        skipped = re.search(r"^SKIPPED \[\d+\] [^\n]*?:\d+: (.*)$", out, re.MULTILINE)
        if skipped:
            pytest.skip(f"in its own process: {skipped.group(1)}")
        pytest.fail(f"{node} in its own process passed no test:\n{out[-6000:]}")
    return out


def own_process(test: Callable) -> Callable:
    """Decorator: `test` runs in a fresh Python process of its own (`run_in_own_process`), with
    its fixtures, so an engine it builds is the only one in its process.

    In the child (`in_engine_process`) `test` is returned unchanged. Elsewhere it is replaced by a
    launcher that asks only for ``request``: none of `test`'s fixtures are set up in the
    collecting process, and selecting the test alone (``pytest FILE::TEST``) still runs it. Not
    for parametrized tests (the launcher has no parameters); there, call `run_in_own_process`
    from the body. Marks applied above the decorator (``skipif``) act in both processes.
    """
    if in_engine_process():
        return test

    def launcher(request) -> None:
        run_in_own_process(node_of(request.node))

    launcher.__name__ = test.__name__
    launcher.__qualname__ = test.__qualname__
    launcher.__module__ = test.__module__
    launcher.__doc__ = test.__doc__
    launcher.pytestmark = list(getattr(test, "pytestmark", []))
    launcher.place_as = test  # pytest reports the test's file and line (a skip's), not these
    return launcher


@pytest.fixture
def registry_snapshot():
    """The method registry as it was before the test (`shaping.import_methods` registers a user's
    methods in this process; the registry's own tests expect the package's methods alone)."""
    saved, imported = dict(shaping_methods._REGISTRY), list(shaping_methods._IMPORTED)
    yield
    shaping_methods._REGISTRY.clear()
    shaping_methods._REGISTRY.update(saved)
    shaping_methods._IMPORTED[:] = imported
