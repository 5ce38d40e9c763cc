"""Every registered method equals its slow reference on random batches (Hypothesis).

One Hypothesis property over the registered methods (`CASES`: a method drawn with
``st.sampled_from``, then a batch and a setting for it; an explicit example per method, so each
is checked whatever the sample), 4x the profile's examples in all (200 by default). For each
drawn method, batch and hyper-parameter setting: the fast advantages
(NumPy) equal the reference loop, and the fast loss evaluated in torch float64 equals the
reference loss in value and in its gradients with respect to ``logp`` (and ``entropy`` /
``cand_logp`` where present); the NumPy loss value is checked too. Batches include all-correct and
all-wrong groups, G = 1, fully masked responses, exact ties and very negative log-probs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import shaping
from shaping.strategies import batches

from . import reference as ref
from .helpers import assert_close, check_every, evaluate
from .strategies import hypers, random_batch

NAMES = ref.METHOD_NAMES


def _all_needs(name: str) -> frozenset[str]:
    # Draw every key the method may need under any setting (entropy: form="token", entropy_coef).
    return ref.NEEDS[name] | {"entropy"}


def _no_near_ties(batch: dict, name: str, hyper: dict) -> bool:
    """False if two length-normalized log-probs differ only by float rounding.

    Ranks of values equal in exact arithmetic but summed in different orders are decided by the
    last bit, which no backend specifies; exact ties (identical rows) are kept.
    """
    if name in ("clip_cov", "kl_cov"):
        return _no_near_cov_ties(batch, name, hyper)
    if name != "unlikeliness":
        return True
    norm = ref.seq_logp(batch["logp_old"], batch["mask"], "mean")
    for row in norm:
        for i in range(len(row)):
            for j in range(i):
                if row[i] != row[j] and abs(row[i] - row[j]) < 1e-9:
                    return False
    return True


def _no_near_cov_ties(batch: dict, name: str, hyper: dict) -> bool:
    """False if Clip-Cov's / KL-Cov's selection hangs on float rounding: a covariance within
    1e-9 of a band edge, or the last selected and first unselected covariances within 1e-9 of
    each other without coming from the same (advantage, log-prob) pair (equal pairs give equal
    covariances in both implementations, and both then order by position)."""
    h = ref.hyper(name, **hyper)
    adv = ref.advantages(name, batch, **hyper)
    mask = np.asarray(batch["mask"], dtype=np.float64)
    cov = ref._covariances(adv, batch, mask)
    valid = [tuple(c) for c in np.argwhere(mask > 0.5)]
    if name == "clip_cov":
        edges = (h["clip_cov_lb"], h["clip_cov_ub"])
        if any(abs(cov[c] - e) < 1e-9 for c in valid for e in edges):
            return False
    lp = np.asarray(batch["logp"], dtype=np.float64)
    order = sorted(valid, key=lambda c: (-cov[c], c))
    for x, y in itertools.pairwise(order):
        near = abs(cov[x] - cov[y]) < 1e-9
        if near and (adv[x[:2]], lp[x]) != (adv[y[:2]], lp[y]):
            return False
    return True


def test_every_method_has_a_slow_reference():
    assert sorted(shaping.METHODS) == sorted(ref.ADVANTAGES)


def test_docstring_documents_shapes_source_and_every_hyper_parameter():
    check_every(((name,) for name in NAMES), _documents_shapes_source_and_hypers)


def _documents_shapes_source_and_hypers(name: str) -> None:
    method = shaping.get_method(name)
    doc = method.function.__doc__
    assert method.name == name and method.source and method.doc
    assert "Shapes:" in doc and "Source:" in doc and "docs/formulas.md §" in doc
    own = set(method.defaults) - set(shaping.COMMON_DEFAULTS)
    overridden = {k for k, v in shaping.COMMON_DEFAULTS.items() if method.defaults[k] != v}
    for key in own | overridden:
        assert f"``{key}``" in doc, f"{name}: hyper-parameter {key} is not documented"


def test_needs_are_exactly_what_the_loss_reads():
    check_every(((name,) for name in NAMES), _needs_are_what_the_loss_reads)


def _needs_are_what_the_loss_reads(name: str) -> None:
    # The method runs on the base keys plus its needs, and names each needed key it misses.
    method = shaping.get_method(name)
    over = {"form": "token"} if "form" in method.defaults else {}
    needs = method.needs_for(**over)
    assert method.needs_for(**over, kl_coef=0.1) == needs | {"logp_ref"}
    batch = shaping.example_batch(needs, 2, 4, 5, 3, np)
    loss, _ = method.loss(batch, **over)
    assert np.isfinite(loss)
    for key in needs:
        partial = {k: v for k, v in batch.items() if k != key}
        with pytest.raises(ValueError, match=key):
            method.loss(partial, **over)


def _case(name: str) -> st.SearchStrategy:
    return batches(_all_needs(name)).flatmap(
        lambda batch: hypers(name, batch).map(lambda hyper: (name, batch, hyper))
    )


#: A method, a batch with every key it may need and a hyper-parameter setting valid for it.
CASES = st.sampled_from(NAMES).flatmap(_case)


def _with_an_example_per_method(test):
    """`test` with one explicit example per registered method (a seeded batch at the method's
    defaults), so every method is checked whatever the drawn sample holds."""
    for i, name in enumerate(NAMES):
        test = example(case=(name, random_batch(seed=100 + i), {}))(test)
    return test


@_with_an_example_per_method
@settings(max_examples=4 * settings.default.max_examples)
@given(case=CASES)
def test_fast_equals_reference(case):
    torch = pytest.importorskip("torch")
    name, batch, hyper = case
    assume(_no_near_ties(batch, name, hyper))
    method = shaping.get_method(name)

    want_adv = ref.advantages(name, batch, **hyper)
    assert_close(method.advantages(batch, **hyper), want_adv, what=f"{name} advantages (numpy)")
    tb = {k: torch.from_numpy(np.array(v)) for k, v in batch.items()}
    assert_close(method.advantages(tb, **hyper), want_adv, what=f"{name} advantages (torch)")

    want_loss, want_grads = ref.loss(name, batch, **hyper)
    value, grads = evaluate(method, batch, "torch.grad", hyper)
    assert_close(value, want_loss, what=f"{name} loss")
    for key, want in want_grads.items():
        assert_close(grads[key], want, what=f"{name} d loss / d {key}")
    numpy_value, _ = evaluate(method, batch, "numpy", hyper)
    assert_close(numpy_value, want_loss, what=f"{name} loss (numpy)")


def test_metrics_are_detached_and_finite():
    check_every(((name,) for name in NAMES), _metrics_are_detached_and_finite)


def _metrics_are_detached_and_finite(name: str) -> None:
    torch = pytest.importorskip("torch")
    batch = random_batch(3)
    tb = {k: torch.from_numpy(np.array(v)) for k, v in batch.items()}
    tb["logp"].requires_grad_(True)
    loss, metrics = shaping.get_method(name).loss(tb, **_valid_defaults(name, batch))
    assert loss.ndim == 0 and loss.requires_grad
    for key, value in metrics.items():
        assert not getattr(value, "requires_grad", False), key
        assert np.all(np.isfinite(value.detach().numpy())), key


def _valid_defaults(name: str, batch: dict) -> dict:
    if "k" in shaping.METHODS[name].defaults:
        return {"k": min(4, batch["rewards"].shape[1])}
    return {}
