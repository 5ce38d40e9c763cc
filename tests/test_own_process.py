"""`tests.conftest.run_in_own_process`: how the GPU tests keep one vLLM engine per process. The
child runs in a different process with the marker variable set; its failures fail the caller."""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import in_engine_process, run_in_own_process

CHILD_TESTS = """
import os
from tests.conftest import in_engine_process

def test_child():
    assert in_engine_process()
    print("CHILD_PID", os.getpid())

def test_fails():
    assert False, "boom from the child"
"""


def test_run_in_own_process(tmp_path):
    assert not in_engine_process()
    path = tmp_path / "test_isolated_child.py"
    path.write_text(CHILD_TESTS)
    out = run_in_own_process(f"{path}::test_child")
    pid = int(re.search(r"CHILD_PID (\d+)", out).group(1))
    assert pid != os.getpid()
    with pytest.raises(pytest.fail.Exception, match="boom from the child"):
        run_in_own_process(f"{path}::test_fails")
