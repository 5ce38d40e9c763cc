"""A study's lift inputs (`experiment.reread`): stored and loaded without loss, read the same in any
memory layout, and the errors of a re-read name what is missing. (The end-to-end re-read of a
whole study is in tests/toymdp/test_study.py and tests/llm/test_study.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiment import frontier, report, reread, store
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
def test_the_committed_studies_read_as_committed(folder, tmp_path, capsys, monkeypatch):
    """Every committed study with lift inputs re-reads (`python -m experiment reread`) to its
    committed study.json: the README's claims are the procedure in force's reading (a new
    procedure must re-read and re-publish them). The frontier figures, which this test does not
    compare and which take a third of a re-read, are not drawn: each stage's is asked for (the
    re-reads of tests/toymdp/test_study.py and tests/llm/test_study.py draw theirs)."""
    drawn = []
    monkeypatch.setattr(report, "plot_frontier", lambda found, path, **kw: drawn.append(path))
    assert main(["reread", str(folder), "--out", str(tmp_path)]) == 0
    stages = reread.input_files(folder)
    assert sorted(drawn) == sorted(tmp_path / f"{stage}_frontier.png" for stage in stages)
    assert "(the procedure it was read by)" in capsys.readouterr().out  # every study: in force
    again = json.loads((tmp_path / "study.json").read_text())
    committed = json.loads((folder / "study.json").read_text())
    again.pop("reread")
    committed.pop("reread", None)  # a committed re-read records itself too
    assert again == committed
    assert (tmp_path / "verdicts.md").read_text() == (folder / "verdicts.md").read_text()


def test_the_reread_command_names_a_bad_folder(tmp_path, capsys):
    assert main(["reread", str(tmp_path)]) == 2
    assert "study.json is missing" in capsys.readouterr().err


# Issue 54, items 1-2: a published folder is one study, and every error names its file.

ROOT = Path(__file__).parents[2]
FIGURES = ROOT / "figures"


def _copy(name: str, dest: Path) -> Path:
    shutil.copytree(FIGURES / name, dest)
    return dest


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_a_reread_into_another_studys_folder_is_refused(tmp_path, capsys):
    strong = _copy("llm_study_countdown_strong", tmp_path / "S")
    before = _tree(strong)
    err = _one_line_error(capsys, ["reread", str(FIGURES / "llm_study_countdown_mild"),
                                   "--out", str(strong)])  # fmt: skip
    assert "tiny LLM, Countdown, strong" in err and "tiny LLM, Countdown, mild" in err
    assert (
        "configs/study_countdown_strong.toml" in err and "configs/study_countdown_mild.toml" in err
    )
    assert _tree(strong) == before  # nothing written


def test_an_unfinished_study_is_not_published_into_a_study(tmp_path, capsys):
    mild = _copy("llm_study_countdown_mild", tmp_path / "M")
    before = _tree(mild)
    src = tmp_path / "unfinished"
    (src / "explore").mkdir(parents=True)
    for name in ("lifts.md", "frontier.png", "lift_inputs.npz"):
        shutil.copy(
            FIGURES / "llm_study_countdown_strong" / f"explore_{name}", src / "explore" / name
        )
    err = _one_line_error(capsys, ["publish", str(src), str(mild)])
    assert "unfinished study" in err and "tiny LLM, Countdown, mild" in err
    assert _tree(mild) == before
    # Nor into the leftovers of another publication (no study.json, its confirmation files).
    (mild / "study.json").unlink()
    err = _one_line_error(capsys, ["publish", str(src), str(mild)])
    assert "confirm_lift_inputs.npz" in err and "of an earlier publication" in err
    # A folder of its own takes it.
    assert main(["publish", str(src), str(tmp_path / "own")]) == 0
    assert sorted(_tree(tmp_path / "own")) == ["explore_frontier.png", "explore_lift_inputs.npz",
                                               "explore_lifts.md"]  # fmt: skip


def test_lift_inputs_of_another_study_are_refused_by_name(tmp_path, capsys):
    mild = _copy("llm_study_countdown_mild", tmp_path / "M")
    strong_inputs = FIGURES / "llm_study_countdown_strong" / "explore_lift_inputs.npz"
    shutil.copy(strong_inputs, mild / "explore_lift_inputs.npz")
    before = _tree(mild)
    for argv in (["reread", str(mild)], ["reread", str(mild), "--out", str(tmp_path / "o")],
                 ["publish", str(mild), str(tmp_path / "p")]):  # fmt: skip
        err = _one_line_error(capsys, argv)
        assert f"{mild / 'explore_lift_inputs.npz'}: not the explore lift inputs of" in err
        assert "the folder mixes studies" in err
    assert _tree(mild) == before
    assert not (tmp_path / "o").exists() and not (tmp_path / "p").exists()


def test_publishing_a_published_study_copies_what_a_reread_needs(tmp_path, capsys):
    gpu = FIGURES / "gpu"
    assert main(["publish", str(gpu), str(tmp_path / "D")]) == 0
    published = sorted(Path(p).name for p in capsys.readouterr().out.split())
    assert published == sorted(reread.PUBLISHED.values())
    for name in published:  # the same bytes: the committed study.json records its digest
        assert (tmp_path / "D" / name).read_bytes() == (gpu / name).read_bytes(), name
    assert main(["publish", str(gpu), str(tmp_path / "D")]) == 0  # the same study again: fine
    capsys.readouterr()
    assert main(["reread", str(tmp_path / "D"), "--out", str(tmp_path / "E")]) == 0
    assert (tmp_path / "E" / "verdicts.md").read_bytes() == (gpu / "verdicts.md").read_bytes()
    # The re-read's folder carries its inputs: it re-reads on its own, in place, keeping the
    # record of the re-reads before (the committed study's own, then the first one here).
    first = json.loads((tmp_path / "E" / "study.json").read_text())["reread"]
    assert main(["reread", str(tmp_path / "E")]) == 0
    assert (tmp_path / "E" / "verdicts.md").read_bytes() == (gpu / "verdicts.md").read_bytes()
    record = json.loads((tmp_path / "E" / "study.json").read_text())["reread"]
    committed = json.loads((gpu / "study.json").read_text())["reread"]  # re-read when published
    assert first["earlier"] == [committed] and record["from"] == first["procedure"]
    assert record["earlier"] == [committed, {k: v for k, v in first.items() if k != "earlier"}]


def test_a_study_without_the_digest_is_upgraded_once(tmp_path, capsys):
    gpu = _copy("gpu", tmp_path / "G")
    doc = json.loads((gpu / "study.json").read_text())
    digest = doc.pop(reread.HASH_KEY)
    (gpu / "study.json").write_text(json.dumps(doc, indent=1) + "\n")
    verdicts = (gpu / "verdicts.md").read_bytes()
    err = _one_line_error(capsys, ["reread", str(gpu), "--out", str(tmp_path / "o")])
    assert f"{gpu / 'study.json'}: no 'inputs_sha256'" in err and "experiment upgrade" in err
    assert main(["upgrade", str(gpu)]) == 0
    assert "recorded inputs_sha256" in capsys.readouterr().out
    assert (gpu / "study.json").read_bytes() == (FIGURES / "gpu" / "study.json").read_bytes()
    assert json.loads((gpu / "study.json").read_text())[reread.HASH_KEY] == digest
    assert (gpu / "verdicts.md").read_bytes() == verdicts
    assert main(["upgrade", str(gpu)]) == 0  # once: now checked, not rewritten
    assert "inputs_sha256 checked" in capsys.readouterr().out


def test_the_digest_is_of_the_content_not_the_zip(tmp_path):
    """Saving the same inputs twice gives other zip bytes (write times) but the same digest."""
    intro = f"Lift; {report.LIFT_METHOD}; {report.LIFT_STATUS}."
    kw = {"num_resamples": 50, "seed": 3, "intro": intro, "labels": ["grpo"], "title": "t"}
    reread.save_inputs(tmp_path / "a.npz", _inputs(1), **kw)
    reread.save_inputs(tmp_path / "b.npz", _inputs(1), **kw)
    reread.save_inputs(tmp_path / "c.npz", _inputs(2), **kw)
    assert reread.inputs_sha256(tmp_path / "a.npz") == reread.inputs_sha256(tmp_path / "b.npz")
    assert reread.inputs_sha256(tmp_path / "a.npz") != reread.inputs_sha256(tmp_path / "c.npz")


def _save(path: Path, inputs: dict) -> Path:
    intro = f"Lift; {report.LIFT_METHOD}; {report.LIFT_STATUS}."
    return reread.save_inputs(path, inputs, num_resamples=50, seed=3, intro=intro,
                              labels=["grpo", "ds_grpo"], title="t")  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda a: a["x"].__setitem__((1, 0, 0), -5.0),
            r"x_pass_at_k must be finite and within "
            r"\[-1, 1\].*-5\.0 at model 1 \(grpo a step 10\), seed 0, problem 0",
        ),
        (lambda a: a["y"].__setitem__((2, 1, 3), 1.5), r"y_pass_at_k must be finite and within"),
        (lambda a: a["y"].__setitem__((2, 1, 3), np.nan), r"y_pass_at_k must be finite"),
        (lambda a: a.__setitem__("y", a["y"][:, :, :4]), r"the gains' shapes differ"),
        (lambda a: a.__setitem__("x", a["x"][:, 0]), r"x_pass_at_k must be a float array"),
        (
            lambda a: a.__setitem__("rows", a["rows"][:3]),
            r"measure 'pass_at_k' has 5 models in its gains but",
        ),
    ],
)
def test_bad_values_in_lift_inputs_are_named(tmp_path, edit, named):
    inputs = _inputs(0)
    edit(inputs["pass_at_k"])
    path = _save(tmp_path / "bad.npz", inputs)
    with pytest.raises(ValueError, match=f"lift inputs: {re.escape(str(path))}: " + named):
        reread.load_inputs(path)


def test_a_distinct_count_gain_may_exceed_one(tmp_path):
    inputs = _inputs(0)
    a = inputs["pass_at_k"]
    inputs["distinct_correct"] = {**a, "y": 3.0 * np.ones_like(a["y"]), "k": None}
    stage = reread.load_inputs(_save(tmp_path / "ok.npz", inputs))
    assert stage["measures"]["distinct_correct"]["y"].max() == 3.0


def _corrupt_crc(path: Path) -> None:
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("x_pass_at_k.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(
            lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), id="truncated"
        ),
        pytest.param(lambda p: p.write_bytes(b"not a zip at all" * 10), id="garbage"),
        pytest.param(_corrupt_crc, id="crc"),
        pytest.param(lambda p: np.savez(p, meta=np.array([{"a": 1}], dtype=object)), id="pickled"),
        pytest.param(lambda p: p.write_bytes(b""), id="empty"),
        pytest.param(lambda p: np.savez(p, meta=np.array("{not json")), id="bad-meta"),
        pytest.param(lambda p: np.savez(p, meta=np.array(json.dumps({"seed": 1}))), id="meta-keys"),
    ],
)
def test_a_corrupt_lift_inputs_file_is_one_named_error(tmp_path, capsys, spoil):
    folder = _copy("gpu", tmp_path / "G")
    path = folder / "confirm_lift_inputs.npz"
    spoil(path)
    with pytest.raises(ValueError, match=f"lift inputs: {re.escape(str(path))}"):
        reread.load_inputs(path)
    err = _one_line_error(capsys, ["reread", str(folder), "--out", str(tmp_path / "o")])
    assert str(path) in err and "allow_pickle" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("key", ["study", "picks", "design", "provenance", "reading.how",
                                 "design.alpha", "picks.pass_at_k"])  # fmt: skip
def test_a_study_json_without_a_key_is_named(tmp_path, capsys, key):
    folder = _copy("gpu", tmp_path / "G")
    doc = json.loads((folder / "study.json").read_text())
    head, _, sub = key.partition(".")
    if sub:
        del doc[head][sub]
    else:
        del doc[head]
    (folder / "study.json").write_text(json.dumps(doc))
    err = _one_line_error(capsys, ["reread", str(folder), "--out", str(tmp_path / "o")])
    assert f"{folder / 'study.json'}: no key '{key}'" in err
    err = _one_line_error(capsys, ["publish", str(folder), str(tmp_path / "p")])
    assert f"{folder / 'study.json'}: no key '{key}'" in err


def test_concurrent_writers_of_one_file_never_collide(tmp_path):
    """Each writer has its own temporary file: no writer fails, the target is one writer's whole
    text, and no temporary file is left."""
    target = tmp_path / "confirm_lifts.md"
    texts = [f"writer {i}\n" * 2000 for i in range(8)]

    def write(text: str) -> None:
        for _ in range(25):
            store.write_text(target, text)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, texts))
    assert target.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["confirm_lifts.md"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "f").write_text("x")
    with pytest.raises(OSError):
        store.write_text(tmp_path / "taken", "text")  # a non-empty folder cannot be replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(np, "savez_compressed", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        store.save_npz(tmp_path / "a.npz", {"a": np.zeros(2)}, compressed=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_two_concurrent_rereads_into_one_folder_both_succeed(tmp_path):
    """Two processes re-reading one study into one folder (issue 54: 1 in 8 failed on a shared
    temporary file) both succeed and leave the committed verdicts and no temporary file."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "experiment", "reread", str(FIGURES / "gpu"), "--out",
           str(tmp_path / "o")]  # fmt: skip
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert (tmp_path / "o" / "verdicts.md").read_bytes() == (
        FIGURES / "gpu" / "verdicts.md"
    ).read_bytes()
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == sorted(reread.PUBLISHED.values())


def test_a_failed_reread_leaves_no_temporary_file(tmp_path, monkeypatch):
    replace, calls = os.replace, []

    def fail_third(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(f"{dst}: no space left on device")
        replace(src, dst)

    monkeypatch.setattr(store.os, "replace", fail_third)
    with pytest.raises(OSError, match="no space left"):
        reread.reread(FIGURES / "gpu", tmp_path / "o")
    left = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert left == sorted(Path(c).name for c in calls[:2])  # what was written, whole; no temp


def test_a_destination_that_is_a_file_is_refused_by_name(tmp_path, capsys):
    """`reread --out` and `publish` onto a path that is a file: one line naming it (it was the
    OS's '[Errno 17] File exists'), the file left as it was."""
    taken = tmp_path / "taken"
    taken.write_text("mine")
    study = str(Path(__file__).parents[2] / "figures" / "toy_study_fig6")
    for argv in (["reread", study, "--out", str(taken)], ["publish", study, str(taken)]):
        assert main(argv) == 2
        assert f"{str(taken)!r} is a file, not a folder" in capsys.readouterr().err
    assert taken.read_text() == "mine"
