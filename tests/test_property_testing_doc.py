"""The examples of docs/property_testing.md run as written: each ```python block but the
``conftest.py`` is executed on its own (as a user's test file would be) and every ``test_*``
function it defines is called, so the doc and the package cannot drift apart. The closed-form
example is also run with the wrong conjecture the doc mentions, which must fail. The doc's
examples and its ``conftest.py`` also run as a user's own project, under pytest in a fresh
process, with numerics' late-import warning an error."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from scipy.special import log_softmax

DOC = Path(__file__).resolve().parents[1] / "docs" / "property_testing.md"
FENCED = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.S | re.M)
CONFTEST = [b for b in FENCED if b.startswith("# conftest.py")]
BLOCKS = [b for b in FENCED if not b.startswith("# conftest.py")]


def _run(code: str, index: int) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": f"property_testing_example_{index}"}
    exec(compile(code, f"{DOC}:block {index}", "exec"), namespace)
    return namespace


def _tests(namespace: dict[str, object]) -> list:
    return [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]


def test_the_doc_has_its_two_examples_and_a_conftest():
    assert len(BLOCKS) == 2 and len(CONFTEST) == 1
    assert all(len(_tests(_run(code, i))) == 1 for i, code in enumerate(BLOCKS))


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_every_example_of_the_doc_passes(index):
    for test in _tests(_run(BLOCKS[index], index)):
        test()


def test_the_closed_form_example_catches_the_wrong_conjecture():
    namespace = _run(BLOCKS[0], 0)

    def divided_by_beta(log_pb, reward, beta, eta):  # the doc's wrong variant: β, not β + η
        return log_softmax((beta * log_pb + reward) / beta)

    namespace["my_entropy_optimum"] = divided_by_beta
    # Found, not shrunk: shrinking the counterexample, which a user wants, took 10 s here.
    test = settings(phases=[Phase.explicit, Phase.generate])(
        namespace["test_my_closed_form_is_the_numerical_optimum"]
    )
    with pytest.raises(AssertionError):
        test()


@pytest.mark.slow
def test_the_examples_run_as_a_users_project_without_the_late_import_warning(tmp_path):
    """The user's layout: the doc's conftest.py and its examples in one test module whose imports
    are sorted (numpy and scipy before `theory`), run by pytest in a fresh process; numerics'
    RuntimeWarning (numpy loaded before the pins) fails the run."""
    (tmp_path / "conftest.py").write_text(CONFTEST[0], encoding="utf-8")
    (tmp_path / "test_mine.py").write_text("\n\n".join(BLOCKS), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(DOC.parents[1])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
         "error::RuntimeWarning", "test_mine.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
