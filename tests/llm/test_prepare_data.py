"""`python -m llm prepare-data` (llm/tasks/prepare.py): local files of the papers' layouts in, one
file of the loader's layout out; CSV input (llm/tasks/io.py:csv_rows); the smoke configs parse."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm.__main__ import main
from llm.config import config_to_toml, load_config
from llm.tasks import CountdownProblem, MathProblem, load_math_problems, load_problems
from llm.tasks.prepare import prepare_problems, write_problems

ROOT = Path(__file__).resolve().parents[2]

problems_st = st.lists(
    st.builds(
        CountdownProblem,
        st.lists(st.integers(0, 99), min_size=1, max_size=4).map(tuple),
        st.integers(-5, 999),
    ),
    min_size=1,
    max_size=12,
)


@given(problems_st, st.integers(0, 14), st.one_of(st.none(), st.integers(1, 14)))
def test_countdown_slice_and_round_trip(tmp_path_factory, problems, skip, rows):
    tmp = tmp_path_factory.mktemp("cd")
    src = tmp / "raw.jsonl"
    src.write_text("".join(json.dumps(p.to_row()) + "\n" for p in problems))
    want = problems[skip:] if rows is None else problems[skip : skip + rows]
    if not want:
        with pytest.raises(ValueError, match="no problems left"):
            prepare_problems("countdown", [src], skip=skip, rows=rows)
        return
    got = prepare_problems("countdown", [src], skip=skip, rows=rows)
    assert got == want
    for suffix in (".jsonl", ".parquet"):
        out = write_problems(got, tmp / f"out{suffix}")
        assert load_problems(out) == want
        assert not list(tmp.glob("*.tmp"))


def test_countdown_tasks_parquet_and_csv_in_tinyzero_split(tmp_path):
    """Countdown-Tasks-3to4's columns (target, nums) in Parquet and CSV; TinyZero's split is
    --rows N, then --skip N --rows M."""
    rows = [{"target": 10 + i, "nums": [i, i + 1, i + 2]} for i in range(9)]
    pq.write_table(pa.Table.from_pylist(rows[:6]), tmp_path / "part0.parquet")
    (tmp_path / "part1.csv").write_text(
        "target,nums,extra\n"
        + f'{rows[6]["target"]},"{rows[6]["nums"]}",x\n'
        + f"{rows[7]['target']},{' '.join(map(str, rows[7]['nums']))},y\n"
        + f'{rows[8]["target"]},"{", ".join(map(str, rows[8]["nums"]))}",z\n'
    )
    inputs = [str(tmp_path / "part0.parquet"), str(tmp_path / "part1.csv")]
    train, test = tmp_path / "cd" / "train.parquet", tmp_path / "cd" / "test.parquet"
    assert main(["prepare-data", "--task", "countdown", "--input", *inputs, "--out", str(train),
                 "--rows", "7"]) == 0  # fmt: skip
    assert main(["prepare-data", "--task", "countdown", "--input", *inputs, "--out", str(test),
                 "--skip", "7", "--rows", "5"]) == 0  # fmt: skip
    expect = [CountdownProblem(tuple(r["nums"]), r["target"]) for r in rows]
    assert load_problems(train) == expect[:7] and load_problems(test) == expect[7:]
    # The training loader takes the file as data.path.
    assert pq.read_table(train).column_names == ["target", "nums"]


def _dapo_row(problem: str, answer: str, index: int) -> dict:
    content = (
        "Solve the following math problem step by step. The last line of your response should be "
        f'of the form Answer: $Answer\n\n{problem}\n\nRemember to put your answer on its own line after "Answer:".'
    )
    return {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"ground_truth": answer, "style": "rule-lm"},
        "extra_info": {"index": str(index)},
    }


def test_math_dapo_english_deduplicated_and_math_levels(tmp_path):
    dapo = [
        _dapo_row("What is $1+1$?", "2", 0),
        _dapo_row("求 $2+2$ 的值。", "4", 1),
        _dapo_row("What is $1+1$?", "2", 2),  # the original release repeats problems
        _dapo_row("Find $x$ if $x^2=9$, $x>0$.", "3", 3),
    ]
    pq.write_table(pa.Table.from_pylist(dapo), tmp_path / "dapo.parquet")
    (tmp_path / "math.csv").write_text(
        "problem,solution,level,type\n"
        '"Compute $3\\cdot 4$.","We get $\\boxed{12}$.",Level 3,Algebra\n'
        '"Compute $5-2$.","So $\\boxed{3}$.",Level 1,Prealgebra\n'
    )
    out = tmp_path / "dapo_en_math12k.parquet"
    args = ["prepare-data", "--task", "math", "--input", str(tmp_path / "dapo.parquet"),
            str(tmp_path / "math.csv"), "--out", str(out), "--dedupe", "--drop-cjk"]  # fmt: skip
    assert main(args) == 0
    got = load_math_problems(out)
    assert [(p.problem, p.answer, p.source) for p in got] == [
        ("What is $1+1$?", "2", "math_dapo"),
        ("Find $x$ if $x^2=9$, $x>0$.", "3", "math_dapo"),
        ("Compute $3\\cdot 4$.", "12", "math"),
        ("Compute $5-2$.", "3", "math"),
    ]
    assert [p.id for p in got[:2]] == ["0", "3"] and got[2].level == "3"
    level = prepare_problems("math", [tmp_path / "math.csv"], levels=[3, 4, 5])
    assert level == [MathProblem("Compute $3\\cdot 4$.", "12", "0", "math", "3", "Algebra")]
    write_problems(level, tmp_path / "l35.jsonl")
    assert load_math_problems(tmp_path / "l35.jsonl") == level


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"task": "gsm8k"}, "task: expected one of"),
        ({"skip": -1}, "skip: expected >= 0"),
        ({"rows": 0}, "rows: expected >= 1"),
        ({"levels": [3]}, "math only"),
        ({"task": "math", "levels": [6]}, "levels: expected MATH levels"),
        ({"inputs": []}, "inputs: expected at least one"),
    ],
)
def test_bad_arguments_are_named(tmp_path, kwargs, match):
    src = tmp_path / "a.jsonl"
    src.write_text('{"target": 3, "nums": [1, 2]}\n')
    args = {"task": "countdown", "inputs": [src], **kwargs}
    with pytest.raises(ValueError, match=match):
        prepare_problems(args.pop("task"), args.pop("inputs"), **args)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('target,nums\n5,"[1, 2"\n', r"bad\.csv: line 2: field 'nums': invalid JSON"),
        ("target,nums\nfive,1 2\n", r"bad\.csv: line 2: field 'target'"),
        ("target,nums\n5,1 x\n", r"bad\.csv: line 2: field 'nums'\[1\]"),
        ("target,nums\n5,1 2,9\n", r"bad\.csv: line 2: 3 cells, expected 2"),
        ("target,target\n5,6\n", r"bad\.csv: line 1: header"),
        ("", r"bad\.csv: empty CSV"),
        ("target\n5\n", r"bad\.csv: line 2: missing field 'nums'"),
    ],
)
def test_csv_errors_name_file_line_and_field(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_problems(path)


def test_output_suffix_is_checked_and_nothing_written(tmp_path):
    with pytest.raises(ValueError, match=r"out: expected a path ending in \.jsonl or \.parquet"):
        write_problems([CountdownProblem((1,), 1)], tmp_path / "x.csv")
    assert not list(tmp_path.iterdir())


def test_an_input_is_never_overwritten(tmp_path, capsys):
    """``--out`` naming one of the inputs (with a slice it would replace the downloaded file by a
    part of it) is refused before anything is read or written, by the command and the writer."""
    from llm.__main__ import main

    src = tmp_path / "in.jsonl"
    text = '{"target": 6, "nums": [1, 2, 3]}\n{"target": 9, "nums": [4, 5]}\n'
    src.write_text(text)
    argv = ["prepare-data", "--task", "countdown", "--input", str(src), "--rows", "1"]
    assert main([*argv, "--out", str(tmp_path / "." / "in.jsonl")]) != 0
    assert "is one of the inputs" in capsys.readouterr().err
    assert src.read_text() == text
    with pytest.raises(ValueError, match="is one of the inputs"):
        write_problems([CountdownProblem((1,), 1)], src, inputs=[src])
    assert main([*argv, "--out", str(tmp_path / "out.jsonl")]) == 0
    assert (tmp_path / "out.jsonl").read_text() == text.splitlines(keepends=True)[0]


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "smoke").glob("*.toml")), ids=str)
def test_smoke_configs_are_their_paper_configs_with_the_named_overrides(path):
    """Each smoke config parses, and is exactly its paper config with the overrides its header
    lists (``#   key=value`` lines): nothing else drifts."""
    sets = [line[4:].strip() for line in path.read_text().splitlines() if line.startswith("#   ")]
    assert "steps=2" in sets
    smoke = load_config(path)
    # Compared resolved (the smoke file lists every [hyper] default the paper file leaves out).
    assert config_to_toml(smoke) == config_to_toml(
        load_config(ROOT / "configs" / path.name, sets=sets)
    )
    assert smoke.steps == 2 and smoke.system.device == "cuda"


def test_there_is_a_smoke_config_per_paper_setup():
    papers = {p.name for p in (ROOT / "configs").glob("*.toml")} - {"countdown_tiny.toml"}
    papers = {n for n in papers if n.startswith(("countdown_qwen", "math_qwen"))}
    smoke = {p.name for p in (ROOT / "configs" / "smoke").glob("*.toml")}
    assert papers and papers <= smoke, sorted(papers - smoke)
