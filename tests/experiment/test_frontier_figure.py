"""The frontier figure as small multiples (`experiment.report.frontier_figure`, `plot_frontier`):
one panel per method and measure against the reference's hull, a shared scale, a colour per
method that never repeats, the notes in the titles, the same bytes from the same inputs."""

from __future__ import annotations

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pytest

import shaping
from experiment import estimand, report, reread

REF = ("grpo",)


def _analysis(labels, seed=0):
    """``{measure: section}`` with what the figure reads: per label 2 settings × 3 checkpoints."""
    rng = np.random.default_rng(seed)
    out = {}
    for measure, k in (("pass_at_k", 16), ("distinct_correct", None)):
        models = []
        for label in labels:
            for s in range(2):
                for step in (0, 50, 100):
                    x, y = rng.uniform(-0.1, 0.3), rng.uniform(-0.2, 0.3)
                    dx, dy = rng.uniform(0.001, 0.05, size=2)
                    models.append({"label": label, "setting": f"lr={s}", "step": step, "x": x,
                                   "y": y, "x_lo": x - dx, "x_hi": x + dx, "y_lo": y - dy,
                                   "y_hi": y + dy})  # fmt: skip
        out[measure] = {"models": models, "k": k}
    return out


def _rgba(line):
    return mcolors.to_rgba(line.get_color())


def test_one_panel_per_method_shared_scale_distinct_colours():
    labels = ["grpo", "ds_grpo", "outcome_ucb", "entropy_bonus", "my_method", "casp", "nsr"]
    analysis = _analysis(labels)
    notes = {"pass_at_k": {"ds_grpo": "refuted"}, "distinct_correct": {"nsr": "lr=0.1, step 50"}}
    fig = report.frontier_figure(analysis, labels=labels, reference=REF, title="t", notes=notes,
                                 columns=4)  # fmt: skip
    try:
        methods = labels[1:]
        assert len(fig.axes) == 2 * len(methods)  # per measure, one panel per non-reference label
        blocks = [fig.axes[: len(methods)], fig.axes[len(methods) :]]
        xlims = {ax.get_xlim() for ax in fig.axes}
        assert len(xlims) == 1  # one pass@1 scale everywhere
        for (measure, a), block in zip(analysis.items(), blocks, strict=True):
            assert len({ax.get_ylim() for ax in block}) == 1  # one scale per measure
            lo, hi = block[0].get_ylim()
            assert lo <= min(m["y_lo"] for m in a["models"]) and hi >= max(
                m["y_hi"] for m in a["models"]
            )
            ref = [m for m in a["models"] if m["label"] == "grpo"]
            hull = estimand.upper_hull(np.array([m["x"] for m in ref]), [m["y"] for m in ref])
            colours = []
            for ax, label in zip(block, methods, strict=True):
                assert ax.get_title(loc="left").startswith(label)
                note = notes.get(measure, {}).get(label)
                if note:
                    assert ax.get_title(loc="left").replace("\n", " ") == f"{label}: {note}"
                black = [ln for ln in ax.get_lines() if _rgba(ln) == (0, 0, 0, 1)]
                assert any(np.array_equal(ln.get_xdata(), hull.vx) for ln in black)  # GRPO's hull
                own = {_rgba(ln) for ln in ax.get_lines() if ln.get_linewidth() == 1.4}
                assert len(own) == 1  # the method's hull, in its colour
                colours.append(own.pop())
            assert len(set(colours)) == len(methods)
            named = report.method_colors(methods)
            assert colours == [mcolors.to_rgba(named[lb]) for lb in methods]
    finally:
        plt.close(fig)


def test_method_colours_never_repeat():
    named = report.METHOD_COLORS
    assert set(shaping.METHODS) <= set(named)  # every registered method has its own colour
    assert len(set(map(mcolors.to_rgba, named.values()))) == len(named)
    spare = set(map(mcolors.to_rgba, report.SPARE_COLORS))
    assert len(spare) == len(report.SPARE_COLORS) and not spare & set(
        map(mcolors.to_rgba, named.values())
    )
    labels = [*named, *(f"user_{i}" for i in range(len(report.SPARE_COLORS)))]
    got = report.method_colors(labels)
    assert len(set(got.values())) == len(labels)
    assert all(got[lb] == named[lb] for lb in named)  # a method keeps its colour
    with pytest.raises(ValueError, match=r"^labels: .*'user_extra'"):
        report.method_colors([*labels, "user_extra"])


def test_the_reference_alone_is_one_panel():
    """A sweep of GRPO alone (a resume test, a reference-only study stage) draws its models and
    hull in one panel per measure."""
    fig = report.frontier_figure(_analysis(["grpo"]), labels=["grpo"], reference=REF, title="t")
    try:
        assert len(fig.axes) == len(_analysis(["grpo"]))
        assert all(ax.get_title(loc="left").startswith("grpo alone") for ax in fig.axes)
    finally:
        plt.close(fig)


def test_bad_input_refused():
    analysis = _analysis(["grpo"])
    with pytest.raises(ValueError, match=r"^labels: empty"):
        report.frontier_figure(analysis, labels=[], reference=REF, title="t")
    with pytest.raises(ValueError, match=r"^columns: 0"):
        report.frontier_figure(analysis, labels=["grpo", "x"], reference=REF, title="t", columns=0)


def test_same_bytes_no_timestamp(tmp_path):
    labels = ["grpo", "ds_grpo", "casp"]
    analysis = _analysis(labels, seed=1)
    paths = [tmp_path / "a.png", tmp_path / "b.png"]
    for p in paths:
        report.plot_frontier(analysis, p, labels=labels, reference=REF, title="t")
    data = [p.read_bytes() for p in paths]
    assert data[0] == data[1] and data[0][:8] == b"\x89PNG\r\n\x1a\n"
    assert b"Software" not in data[0] and b"matplotlib" not in data[0]


def test_frontier_notes_words_on_their_claims_measure():
    result = {"claims": [{"claim": "grpo_sharpens", "verdict": "supported"},
                         {"claim": "ds_grpo", "verdict": "refuted"},
                         {"claim": "entropy_bonus", "verdict": "not resolved"},
                         {"claim": "grpo_spread", "verdict": ""}]}  # fmt: skip
    picks = {"pass_at_k": {"ds_grpo": {"setting": "lr=0.1", "step": 50}},
             "distinct_correct": {"ds_grpo": {"setting": "lr=0.3", "step": 100}}}  # fmt: skip
    claims = [("grpo_sharpens", "grpo", "pass_at_k", ""), ("ds_grpo", "ds_grpo", "pass_at_k", ""),
              ("entropy_bonus", "entropy_bonus", "distinct_correct", ""),
              ("casp", "casp", "pass_at_k", "")]  # fmt: skip
    notes = reread.frontier_notes(result, picks, claims)
    assert notes["explore"] == {"pass_at_k": {"ds_grpo": "lr=0.1, step 50"},
                                "distinct_correct": {"ds_grpo": "lr=0.3, step 100"}}  # fmt: skip
    assert notes["confirm"] == {"pass_at_k": {"grpo": "supported", "ds_grpo": "refuted"},
                                "distinct_correct": {"entropy_bonus": "not resolved"}}  # fmt: skip
