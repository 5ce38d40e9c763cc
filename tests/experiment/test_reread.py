"""A study's lift inputs (`experiment.reread`): stored and loaded without loss, read the same in any
memory layout, and the errors of a re-read name what is missing. (The end-to-end re-read of a
whole study is in tests/toymdp/test_study.py and tests/llm/test_study.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiment import frontier, report, reread
from experiment.__main__ import main


def _inputs(seed: int, m: int = 5, s: int = 3, p: int = 6) -> dict:
    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.uniform(0.0, 0.05, (m, s, p)), axis=0)
    x[0] = 0.0  # the base
    y = 0.3 * x - x**2 + rng.normal(0.0, 0.01, (m, s, p))
    y[0] = 0.0
    models = frontier.Models(["grpo"] * 3 + ["ds_grpo"] * 2, ["base", "a", "a", "b", "b"],
                             [0, 10, 20, 10, 20])  # fmt: skip
    rows = [{"label": models.method[i], "params": {"gamma": 0.1 * i}, "setting": models.setting[i],
             "step": models.step[i]} for i in range(m)]  # fmt: skip
    return {"pass_at_k": {"x": x, "y": y, "models": models, "rows": rows, "reference": ["grpo"],
                          "k": 16}}  # fmt: skip


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_inputs_round_trip_to_the_same_sections(tmp_path_factory, seed):
    inputs = _inputs(seed)
    path = tmp_path_factory.mktemp("rr") / reread.INPUTS
    intro = f"Lift over GRPO; {report.LIFT_METHOD}; {report.LIFT_STATUS}."
    reread.save_inputs(path, inputs, num_resamples=50, seed=3, intro=intro,
                       labels=["grpo", "ds_grpo"], title="t")  # fmt: skip
    stage = reread.load_inputs(path)
    a = inputs["pass_at_k"]
    direct, _ = report.lift_analysis(a["x"], a["y"], a["models"], a["rows"], ["grpo"], k=16,
                                     num_resamples=50, seed=3)  # fmt: skip
    assert json.dumps(reread.sections(stage)["pass_at_k"]) == json.dumps(direct)
    # The procedure's texts are placeholders in the file, so a later procedure writes its own.
    assert report.LIFT_METHOD not in stage["intro"] and "<lift method>" in stage["intro"]
    assert stage["labels"] == ["grpo", "ds_grpo"] and stage["measures"]["pass_at_k"]["k"] == 16


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_the_lift_analysis_does_not_depend_on_memory_layout(seed):
    """A transposed view and its contiguous copy hold the same numbers: the same bytes out."""
    a = _inputs(seed)["pass_at_k"]
    view_x = np.ascontiguousarray(a["x"].transpose(0, 2, 1)).transpose(0, 2, 1)
    view_y = np.ascontiguousarray(a["y"].transpose(0, 2, 1)).transpose(0, 2, 1)
    assert not view_x.flags["C_CONTIGUOUS"]
    kw = {"k": 16, "num_resamples": 50, "seed": 1}
    one, _ = report.lift_analysis(a["x"], a["y"], a["models"], a["rows"], "grpo", **kw)
    two, _ = report.lift_analysis(view_x, view_y, a["models"], a["rows"], "grpo", **kw)
    assert json.dumps(one) == json.dumps(two)


def test_reread_errors_name_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match=r"study\.json is missing"):
        reread.reread(tmp_path)
    (tmp_path / "study.json").write_text(json.dumps({"study": "old", "procedure": "lift v3"}))
    with pytest.raises(ValueError, match=r"has no 'reading'.*re-run the study"):
        reread.reread(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"lift_inputs\.npz does not exist"):
        reread.load_inputs(tmp_path / reread.INPUTS)
    np.savez(tmp_path / "other.npz", a=np.zeros(2))
    with pytest.raises(ValueError, match="has no 'meta' entry"):
        reread.load_inputs(tmp_path / "other.npz")


COMMITTED = sorted(
    p.parent
    for p in (Path(__file__).parents[2] / "figures").glob("*/study.json")
    if "reading" in json.loads(p.read_text())
)


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_the_committed_studies_read_as_committed(folder, tmp_path, capsys):
    """Every committed study with lift inputs re-reads (`python -m experiment reread`) to its
    committed study.json: the README's claims are the procedure in force's reading (a new
    procedure must re-read and re-publish them)."""
    assert main(["reread", str(folder), "--out", str(tmp_path)]) == 0
    assert "re-read by" in capsys.readouterr().out
    again = json.loads((tmp_path / "study.json").read_text())
    committed = json.loads((folder / "study.json").read_text())
    again.pop("reread")
    committed.pop("reread", None)  # a committed re-read records itself too
    assert again == committed
    assert (tmp_path / "verdicts.md").read_text() == (folder / "verdicts.md").read_text()


def test_the_reread_command_names_a_bad_folder(tmp_path, capsys):
    assert main(["reread", str(tmp_path)]) == 2
    assert "study.json is missing" in capsys.readouterr().err
