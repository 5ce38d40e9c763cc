"""`tests.conftest.own_process` and `run_in_own_process`: how the GPU tests keep one vLLM engine per
process. Checked on CPU with trivial bodies: a pytest run (the collecting process) of a module whose
tests are isolated; each body and its fixtures run in another process, none of those fixtures in the
collecting one, and the child's failure, with its message, and its skip reach the collecting run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ENGINE_PROCESS_ENV, REPO_ROOT, in_engine_process

CHILD_TESTS = """
import os

import pytest

from tests.conftest import in_engine_process, node_of, own_process, run_in_own_process

LOG = {log!r}


def note(what):
    with open(LOG, "a") as f:
        f.write(f"{{what}} {{os.getpid()}} {{in_engine_process()}}\\n")


note("import")


@pytest.fixture
def engine():  # stands in for a vLLM engine: must only be built in the test's own process
    note("fixture")
    return "engine"


@own_process
def test_ok(engine):
    assert engine == "engine"
    note("body")


@own_process
def test_fails():
    assert False, "boom from the child"


@own_process
def test_skips():
    pytest.skip("no engine here")


@pytest.mark.parametrize("x", [7])
def test_param(x, request):  # parametrized: isolated from the body, as test_one_step_on_cuda is
    if not in_engine_process():
        run_in_own_process(node_of(request.node))
        return
    note(f"param{{x}}")
"""


@pytest.mark.slow
def test_own_process_runs_each_body_elsewhere_and_reports_it(tmp_path):
    assert not in_engine_process()
    log = tmp_path / "log.txt"
    path = tmp_path / "test_isolated_child.py"
    path.write_text(CHILD_TESTS.format(log=str(log)))
    env = {k: v for k, v in os.environ.items() if k != ENGINE_PROCESS_ENV}
    # The test file lies outside the collecting run's rootdir: `node_of` must still name it for
    # the child, which runs from the repository root.
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(path)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert re.search(r"1 failed, 2 passed, 1 skipped", out), out
    assert "boom from the child" in out  # the child's assertion message, in the parent's report
    assert "in its own process: no engine here" in out  # the child's skip reason

    rows = [line.split() for line in log.read_text().splitlines()]
    (parent,) = {pid for what, pid, child in rows if child == "False"}
    assert all(what == "import" for what, pid, child in rows if pid == parent)  # no fixture
    body = {what: pid for what, pid, child in rows if child == "True" and what != "import"}
    assert body["fixture"] == body["body"] != parent  # the fixture with its test, elsewhere
    assert body["param7"] != parent
    children = {pid for what, pid, child in rows if child == "True"}
    assert parent not in children and len(children) == 4  # a fresh process per test
