"""The shared sweep grammar (`experiment.spec`): the checkpoints (the sweep's own and a setting's
that trains another number of steps), the ``tune`` table and the equal-budget check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiment.spec import (
    BUDGET_EQUAL,
    BUDGET_UNEQUAL,
    Budget,
    budget_difference,
    check_budget,
    extend_checkpoints,
    parse_checkpoints,
    parse_methods,
    parse_tune,
    untune,
)


def test_parse_checkpoints_counts_and_lists():
    assert parse_checkpoints(3, 120) == (40, 80, 120)
    assert parse_checkpoints([0, 50, 100], 150) == (50, 100, 150)
    with pytest.raises(ValueError, match="checkpoints"):
        parse_checkpoints([200], 150)


def test_extend_checkpoints_examples():
    assert extend_checkpoints((40, 80, 120), 240) == (40, 80, 120, 160, 200, 240)
    assert extend_checkpoints((40, 80, 120), 100) == (40, 80, 100)
    assert extend_checkpoints((40, 80, 120), 130) == (40, 80, 120, 130)
    assert extend_checkpoints((50,), 120) == (50, 100, 120)
    with pytest.raises(ValueError, match="steps"):
        extend_checkpoints((40,), 0)


@given(count=st.integers(1, 6), steps=st.integers(6, 300), other=st.integers(1, 600))
@settings(max_examples=200, deadline=None)
def test_extend_checkpoints_keeps_the_sweeps_steps_and_spacing(count, steps, other):
    """The sweep's steps up to `other` are kept, the last is `other`, the steps ascend, and past
    the sweep's last checkpoint they are spaced as its last two (or its first from 0)."""
    base = parse_checkpoints(count, steps)
    out = extend_checkpoints(base, other)
    assert list(out) == sorted(set(out)) and out[-1] == other
    assert {c for c in base if c <= other} <= set(out)
    assert extend_checkpoints(base, steps) == base
    gap = base[-1] - (base[-2] if len(base) > 1 else 0)
    beyond = [c for c in out if c > base[-1]]
    assert all(b - a == gap for a, b in zip([base[-1], *beyond], beyond[:-1], strict=False))


# ---------------------------------------------------------------------------------------------
# Equal tuning budgets (issue 37, item 5): the ``tune`` table and the budget check.

METHODS = [
    {"method": "grpo"},
    {"method": "ds_grpo", "zip": {"gamma_p": [0.3, 1.0], "gamma_n": [0.05, 0.2]}},
    {"method": "entropy_bonus", "fixed": {"form": "token"}, "grid": {"eta": [0.1]}},
]
TUNE = {"optim.lr": [1e-4, 2e-4], "kl_coef": [0.0, 0.1]}


def test_tune_crosses_every_entry_the_reference_included():
    entries = parse_methods(METHODS, tune=TUNE)
    combos = [{"optim.lr": a, "kl_coef": b} for a in (1e-4, 2e-4) for b in (0.0, 0.1)]
    assert [e.points for e in entries] == [
        tuple(combos),
        tuple({"gamma_p": g, "gamma_n": n, **c} for g, n in ((0.3, 0.05), (1.0, 0.2))
              for c in combos),
        tuple({"eta": 0.1, **c} for c in combos),
    ]  # fmt: skip
    assert entries[2].fixed == {"form": "token"}
    # Readable, unique setting labels: the tuning values follow the setting's own.
    labels = [",".join(f"{k}={v}" for k, v in p.items()) for e in entries for p in e.points]
    assert "gamma_p=1.0,gamma_n=0.2,optim.lr=0.0001,kl_coef=0.1" in labels
    assert len(set(labels)) == len(labels) == 4 + 8 + 4
    assert parse_methods(METHODS) == parse_methods(METHODS, tune={})  # no tune: as written


def test_tune_errors_name_the_key():
    with pytest.raises(ValueError, match=r"methods\[grpo\]: \['kl_coef'\] tuned for every"):
        parse_methods([{"method": "grpo", "points": [{}, {"kl_coef": 0.1}]}], tune=TUNE)
    with pytest.raises(ValueError, match=r"tune\.kl_coef: expected a non-empty list"):
        parse_tune({"kl_coef": 0.1})
    with pytest.raises(ValueError, match=r"tune\.kl_coef: expected distinct values"):
        parse_tune({"kl_coef": [0.1, 0.1]})
    with pytest.raises(ValueError, match="tune: expected a table"):
        parse_tune([0.1])
    seen = []
    parse_methods(METHODS[:1], lambda m, k, where: seen.append((m, k, where)), tune=TUNE)
    assert ("grpo", "optim.lr", "methods[grpo]") in seen  # the leg vets tuned keys too


def test_untune_writes_the_same_settings_without_tune():
    doc = {"seeds": [0], "tune": TUNE, "methods": METHODS}
    out = untune(doc)
    assert "tune" not in out and doc["tune"] == TUNE  # a copy
    assert parse_methods(out["methods"]) == parse_methods(METHODS, tune=TUNE)
    plain = {"seeds": [0], "methods": METHODS}
    assert untune(plain) == plain


def _budgets(lrs: dict[str, list[float]], steps: tuple[int, ...] = (50, 100)) -> list[Budget]:
    return [Budget(label, coeff, {"lr": lr, "kl_coef": 0.0, "checkpoints": steps})
            for (label, coeff), values in lrs.items() for lr in values]  # fmt: skip


def test_check_budget_accepts_equal_and_names_the_first_difference():
    ref = {("grpo", "default"): [1e-4, 2e-4]}
    equal = _budgets(
        {**ref, ("casp", "alpha=0.1"): [1e-4, 2e-4], ("casp", "alpha=1"): [2e-4, 1e-4]}
    )
    assert budget_difference(equal, ["grpo"]) is None
    assert check_budget(equal, ["grpo"], unequal=False) == (BUDGET_EQUAL, None)
    assert BUDGET_EQUAL == "equal"
    assert check_budget(equal, ["grpo"], unequal=True)[0] == BUDGET_EQUAL  # nothing to excuse
    # One coefficient of one method at the base learning rate alone: refused, in one line.
    rows = _budgets({**ref, ("casp", "alpha=0.1"): [1e-4, 2e-4], ("casp", "alpha=1"): [2e-4]})
    message = ("unequal tuning budgets: methods[casp] (alpha=1) is tuned over lr [0.0002], the "
               "reference (grpo) over [0.0001, 0.0002]; give every method the reference's tuning "
               "(a top-level tune table) or set [study] unequal_budget = true")  # fmt: skip
    with pytest.raises(ValueError) as err:
        check_budget(rows, ["grpo"], unequal=False)
    assert str(err.value) == message and "\n" not in message
    assert check_budget(rows, ["grpo"], unequal=True)[0] == BUDGET_UNEQUAL == "unequal (explicit)"
    # Read at the final checkpoint alone while GRPO is early-stopped: the checkpoints differ.
    late = _budgets(ref) + _budgets({("psr", "default"): [1e-4, 2e-4]}, steps=(100,))
    assert budget_difference(late, ["grpo"]) == (
        "methods[psr] (default) is tuned over checkpoints [(100)], the reference (grpo) over "
        "[(50, 100)]"
    )
    # The reference's union over two labels; a method that zips lr with kl_coef gets each value
    # but not each combination.
    two = [Budget("grpo", "default", {"lr": 0.1, "kl_coef": k}) for k in (0.0, 0.3)]
    two += [Budget("grpo_lr", "default", {"lr": 0.03, "kl_coef": k}) for k in (0.0, 0.3)]
    zipped = two + [Budget("nsr", "default", {"lr": a, "kl_coef": k})
                    for a, k in ((0.1, 0.0), (0.03, 0.3))]  # fmt: skip
    assert budget_difference(zipped, ["grpo", "grpo_lr"]) == (
        "methods[nsr] (default) is tuned over (lr, kl_coef) in [(0.03, 0.3), (0.1, 0)], the "
        "reference (grpo, grpo_lr) in [(0.03, 0), (0.03, 0.3), (0.1, 0), (0.1, 0.3)]"
    )
