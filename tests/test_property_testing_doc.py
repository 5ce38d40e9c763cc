"""The examples of docs/property_testing.md run as written: each ```python block is executed on
its own (as a user's test file would be) and every ``test_*`` function it defines is called, so
the doc and the package cannot drift apart. The closed-form example is also run with the wrong
conjecture the doc mentions, which must fail."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from scipy.special import log_softmax

DOC = Path(__file__).resolve().parents[1] / "docs" / "property_testing.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.S | re.M)


def _run(code: str, index: int) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": f"property_testing_example_{index}"}
    exec(compile(code, f"{DOC}:block {index}", "exec"), namespace)
    return namespace


def _tests(namespace: dict[str, object]) -> list:
    return [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]


def test_the_doc_has_its_two_examples():
    assert len(BLOCKS) == 2
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
    with pytest.raises(AssertionError):
        namespace["test_my_closed_form_is_the_numerical_optimum"]()
