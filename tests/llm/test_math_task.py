"""Math task: boxed extraction, math-verify grading (equivalences, bounds, threads), loaders, prompts,
generator."""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.tasks import (
    BOXED_INSTRUCTION,
    MATH_TEMPLATES,
    MAX_ANSWER_CHARS,
    MAX_ANSWER_DEPTH,
    MathProblem,
    MathVerdict,
    answers_equivalent,
    compute_math_score,
    extract_boxed,
    generate_math_problems,
    load_math_problems,
    make_math_prompt,
    math_verdict,
    write_math_jsonl,
)

HALF = MathProblem("What is $1/2$ as a fraction?", "\\frac{1}{2}", id="h", source="unit")


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_parquet(path, rows) -> None:
    pa = pytest.importorskip("pyarrow")  # brought by `datasets`, the `llm` extra
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


# --------------------------------------------------------------------------------------------------
# extract_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is $\\boxed{42}$.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}} done", "\\frac{\\sqrt{2}}{2}"),
        ("first \\boxed{1}, then \\boxed{2}, finally \\boxed{ 3 }", "3"),
        ("\\fbox{7}", "7"),
        ("\\boxed{1} and \\fbox{2}", "2"),
        ("\\fbox{1} and \\boxed{2}", "2"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("\\boxed{a\\}b}", "a\\}b"),
        ("\\boxed {5}", "5"),
        ("the answer is $\\boxed 5$ indeed", "5"),
        ("\\boxed 12\nnext line", "12"),
        ("\\boxed{}", ""),
        ("\\boxed{\\boxed{3}}", "3"),
        ("\\boxed{4} \\boxedfoo{9}", "4"),
        ("no box here", None),
        ("", None),
        ("\\boxed{1} then \\boxed{2", None),  # the last box is cut off: no answer
        ("ends with \\boxed", None),
        ("\\boxed", None),
        ("\\boxed $", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_extract_boxed_linear_time() -> None:
    texts = ["\\boxed{" * 50_000, "{" * 200_000 + "\\boxed{1}", "x" * 10**6, "\\boxedx" * 50_000]
    for text in texts:
        start = time.perf_counter()
        extract_boxed(text)
        assert time.perf_counter() - start < 0.5


# --------------------------------------------------------------------------------------------------
# Equivalence (math-verify in the grader process)


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("\\frac{1}{2}", "0.5"),
        ("\\frac{1}{2}", "1/2"),
        ("0.5", "\\dfrac12"),
        ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
        ("\\frac{\\sqrt2}{2}", "\\frac{1}{\\sqrt{2}}"),
        ("27", "27.0"),
        ("3", "x=3"),
        ("x=3", "3"),
        ("[1,2)", "[1, 2)"),
        ("(-\\infty,2)\\cup(3,\\infty)", "(-\\infty, 2) \\cup (3, \\infty)"),
        ("\\text{(C)}", "C"),
        ("1,2", "2,1"),
        ("x^2+2x+1", "(x+1)^2"),
        ("10\\%", "10"),
        ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
        ("\\boxed{5}", "5"),  # a boxed reference is unwrapped
    ],
)
def test_equivalent(gold: str, pred: str) -> None:
    assert answers_equivalent(gold, pred)


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("3", "4"),
        ("3", "3.0001"),
        ("\\frac{1}{3}", "0.333"),
        ("(1,2]", "[1,2)"),
        ("(3,-1)", "(-1,3)"),
        ("\\sqrt{3}", "1.732"),
        ("2", "-2"),
        ("\\text{(C)}", "D"),
    ],
)
def test_not_equivalent(gold: str, pred: str) -> None:
    assert not answers_equivalent(gold, pred)


def test_in_process_grading_agrees_with_grader_process() -> None:
    """The unbounded in-process path is the reference for the isolated one."""
    pairs = [("\\frac{1}{2}", "0.5"), ("3", "x=3"), ("3", "4"), ("(1,2]", "[1,2)")]
    for gold, pred in pairs:
        assert answers_equivalent(gold, pred, timeout_s=None) == answers_equivalent(gold, pred)


# --------------------------------------------------------------------------------------------------
# Scores and verdicts


def test_scores_and_verdicts() -> None:
    assert compute_math_score("thus \\boxed{0.5}.", HALF) == 1.0
    assert compute_math_score("thus \\boxed{0.5}.", HALF, format_score=0.1) == 1.0
    assert compute_math_score("\\boxed{0.6}", HALF) == 0.0
    assert compute_math_score("\\boxed{0.6}", HALF, format_score=0.1) == 0.1
    assert compute_math_score("the answer is 1/2", HALF, format_score=0.1) == 0.0
    assert compute_math_score("\\boxed{}", HALF, format_score=0.1) == 0.1
    long_box = "\\boxed{" + "1+" * MAX_ANSWER_CHARS + "1}"
    assert compute_math_score(long_box, HALF, format_score=0.1) == 0.1
    assert math_verdict("\\boxed{1/2}", HALF) == MathVerdict("1/2", True, True, False)
    assert math_verdict("\\boxed{2}", HALF) == MathVerdict("2", False, True, False)
    assert math_verdict("none", HALF) == MathVerdict(None, False, False, False)
    # An earlier correct box does not rescue a later wrong one.
    assert compute_math_score("\\boxed{1/2}? no: \\boxed{1/3}", HALF) == 0.0


SCORES = {0.0, 0.25, 1.0}


@settings(max_examples=30, deadline=None)
@given(st.text())
def test_never_raises_on_arbitrary_text(text: str) -> None:
    assert compute_math_score(text, HALF, format_score=0.25) in SCORES


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet=st.sampled_from("0123456789{}^_\\+-*/()[]=.,xy !$frac sqrt"), max_size=60))
def test_never_raises_on_boxed_garbage(inner: str) -> None:
    assert compute_math_score("\\boxed{" + inner + "}", HALF, format_score=0.25) in SCORES


def test_pathological_answers_are_bounded() -> None:
    """SymPy would work for minutes on these; the grader process is killed after `timeout_s`."""
    problem = MathProblem("p", "27")
    start = time.perf_counter()
    verdict = math_verdict("\\boxed{9^{9^{9}}}", problem, timeout_s=1.0)
    assert time.perf_counter() - start < 5.0
    assert verdict == MathVerdict("9^{9^{9}}", False, True, True)
    assert compute_math_score("\\boxed{27.0}", problem) == 1.0  # the grader restarts
    huge = "\\boxed{" + "9" * 900 + "}"
    for text in (huge, "\\boxed{\\frac{1}{0}}", "\\boxed{10^{-1000}}"):
        assert compute_math_score(text, problem, format_score=0.25) in SCORES


def test_deep_nesting_is_wrong_without_parsing() -> None:
    """math-verify's LaTeX parser is exponential in nesting depth; deeper answers are not parsed."""
    problem = MathProblem("p", "1")
    deep = "{" * (MAX_ANSWER_DEPTH + 1) + "1" + "}" * (MAX_ANSWER_DEPTH + 1)
    start = time.perf_counter()
    assert math_verdict(f"\\boxed{{{deep}}}", problem) == MathVerdict(deep, False, True, False)
    assert time.perf_counter() - start < 0.1
    assert compute_math_score("\\boxed{((1))}", problem) == 1.0


def test_grader_start_failure(monkeypatch) -> None:
    """A grader that cannot start is an error at first, a timed-out answer after a good start."""
    from llm.tasks.math import grader as math_task

    monkeypatch.setattr(math_task, "_GRADER_BOOT", "import sys; sys.exit(1)")
    monkeypatch.setattr(math_task._GraderProcess, "started_once", False)
    with pytest.raises(RuntimeError, match="failed to start"):
        math_task._GraderProcess().judge("1", "2", 1.0)
    monkeypatch.setattr(math_task._GraderProcess, "started_once", True)
    assert math_task._GraderProcess().judge("1", "2", 1.0) == (False, True)
    with pytest.raises(ValueError, match="timeout_s"):
        answers_equivalent("1", "2", timeout_s=0)


def test_grading_inside_threads() -> None:
    """math-verify's signal-based timeouts fail outside the main thread; ours do not."""
    results: list[float] = []
    thread = threading.Thread(
        target=lambda: results.append(compute_math_score("\\boxed{.5}", HALF))
    )
    thread.start()
    thread.join(timeout=60)
    assert results == [1.0]
    texts = ["\\boxed{0.5}", "\\boxed{2}", "\\boxed{1/2}", "x"] * 3
    with ThreadPoolExecutor(max_workers=4) as pool:
        scores = list(pool.map(lambda t: compute_math_score(t, HALF), texts))
    assert scores == [1.0, 0.0, 1.0, 0.0] * 3


# --------------------------------------------------------------------------------------------------
# Loaders


def test_math500_layout_jsonl(tmp_path) -> None:
    path = tmp_path / "math500.jsonl"
    row = {
        "problem": "Compute $\\dbinom{5}{2}$.",
        "solution": "... so $\\boxed{10}$.",
        "answer": "10",
        "subject": "Counting & Probability",
        "level": 2,
        "unique_id": "test/counting_and_probability/1.json",
    }
    write_jsonl(path, [row, {**row, "answer": " \\frac{1}{2} ", "unique_id": "u2"}])
    problems = load_math_problems(path)
    assert problems[0] == MathProblem(
        row["problem"],
        "10",
        "test/counting_and_probability/1.json",
        "math500",
        "2",
        "Counting & Probability",
    )
    assert problems[1].answer == "\\frac{1}{2}"
    assert load_math_problems(path, source="MATH500", limit=1)[0].source == "MATH500"
    assert load_math_problems(path, limit=0) == []


def test_hendrycks_math_answer_from_solution(tmp_path) -> None:
    path = tmp_path / "train.jsonl"
    write_jsonl(
        path,
        [
            {
                "problem": "Find $x$.",
                "level": "Level 5",
                "type": "Algebra",
                "solution": "We get $x = \\boxed{\\frac{3}{4}}$.",
            }
        ],
    )
    (p,) = load_math_problems(path)
    assert (p.answer, p.level, p.subject, p.id) == ("\\frac{3}{4}", "5", "Algebra", "0")


def test_aime_layout_parquet(tmp_path) -> None:
    path = tmp_path / "aime24.parquet"
    write_parquet(
        path,
        [
            {"ID": "2024-I-1", "Problem": "Find the number.", "Answer": 204},
            {"ID": "2024-I-2", "Problem": "Another.", "Answer": 25},
        ],
    )
    problems = load_math_problems(path)
    assert [(p.id, p.answer, p.source) for p in problems] == [
        ("2024-I-1", "204", "aime24"),
        ("2024-I-2", "25", "aime24"),
    ]
    assert compute_math_score("\\boxed{204}", problems[0]) == 1.0


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_amc_float_answers(tmp_path, suffix: str) -> None:
    rows = [
        {"id": 0, "problem": "a", "answer": 27.0, "url": "u"},
        {"id": 1, "problem": "b", "answer": 0.5, "url": "u"},
    ]
    path = tmp_path / f"amc23{suffix}"
    (write_jsonl if suffix == ".jsonl" else write_parquet)(path, rows)
    problems = load_math_problems(path, source="AMC23")
    assert [(p.id, p.answer, p.source) for p in problems] == [
        ("0", "27", "AMC23"),
        ("1", "0.5", "AMC23"),
    ]


DAPO_USER = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "Let $f(x)=x^2$. Find $f(3)$.\n\nIt has two paragraphs.\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def dapo_row(content: str, index: str) -> dict:
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": content, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": "9", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": index},
    }


def test_dapo_layout_parquet(tmp_path) -> None:
    path = tmp_path / "dapo.parquet"
    write_parquet(path, [dapo_row(DAPO_USER, "a1"), dapo_row("Find $f(3)$ for $f(x)=x^2$.", "a2")])
    first, second = load_math_problems(path)
    assert first == MathProblem(
        "Let $f(x)=x^2$. Find $f(3)$.\n\nIt has two paragraphs.", "9", "a1", "math_dapo"
    )
    # Without DAPO's exact wrapper the user turn is kept whole.
    assert second.problem == "Find $f(3)$ for $f(x)=x^2$." and second.id == "a2"


def test_dapo_processed_layout(tmp_path) -> None:
    """open-r1/DAPO-Math-17k-Processed: `prompt` is the bare problem, `solution` the answer."""
    path = tmp_path / "dapo_processed.jsonl"
    row = {
        "prompt": "Find $f(3)$.",
        "solution": "9",
        "data_source": "math_dapo",
        "source_prompt": [{"content": DAPO_USER, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": "9", "style": "rule"},
        "extra_info": {"index": "x"},
    }
    write_jsonl(path, [row])
    assert load_math_problems(path) == [MathProblem("Find $f(3)$.", "9", "x", "math_dapo")]


def test_gsm8k_layout_and_json_files(tmp_path) -> None:
    rows = [
        {"question": "Tom has 3 apples...", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "Big numbers", "answer": "...\n#### 1,000"},
    ]
    as_list = tmp_path / "gsm8k.json"
    as_list.write_text(json.dumps(rows), encoding="utf-8")
    as_columns = tmp_path / "cols.json"
    as_columns.write_text(json.dumps({k: [r[k] for r in rows] for k in rows[0]}), encoding="utf-8")
    as_lines = tmp_path / "lines.json"
    write_jsonl(as_lines, rows)
    for path in (as_list, as_columns, as_lines):
        problems = load_math_problems(path, source="GSM8K")
        assert [(p.answer, p.id, p.source) for p in problems] == [
            ("7", "0", "GSM8K"),
            ("1000", "1", "GSM8K"),
        ]


def test_write_load_round_trip(tmp_path) -> None:
    problems = [
        HALF,
        MathProblem("ünïcode $\\{x\\}$", "x=3", "id-2", "AIME24", "5", "Algebra"),
        *generate_math_problems(5, seed=3),
    ]
    path = tmp_path / "out.jsonl"
    write_math_jsonl(problems, path)
    assert load_math_problems(path) == problems
    assert not (tmp_path / "out.jsonl.tmp").exists()


def test_empty_file(tmp_path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n", encoding="utf-8")
    assert load_math_problems(path) == []


@pytest.mark.parametrize(
    ("rows", "pattern"),
    [
        ([{"problem": "a", "answer": "1"}, {"problem": "b"}], r"line 2: missing field 'answer'"),
        (
            [{"problem": "a", "answer": "1"}, {"problem": "", "answer": "1"}],
            r"line 2: field 'problem'",
        ),
        ([{"problem": "a", "answer": True}], r"line 1: field 'answer'"),
        ([{"problem": "a", "answer": [1, 2]}], r"line 1: field 'answer'"),
        ([{"problem": "a", "answer": "  "}], r"line 1: field 'answer'"),
        ([{"problem": "a", "solution": "no box"}], r"line 1: field 'solution'"),
        ([{"question": "q", "answer": "no hashes"}], r"line 1: field 'answer'.*####"),
        ([dapo_row("x", "1") | {"reward_model": {"style": "r"}}], r"line 1: field 'reward_model'"),
        (
            [dapo_row("x", "1") | {"prompt": [{"role": "system", "content": "s"}]}],
            r"field 'prompt'",
        ),
        ([[1, 2]], r"line 1: expected an object"),
    ],
)
def test_row_errors_name_file_row_and_field(tmp_path, rows, pattern: str) -> None:
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, rows)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + pattern):
        load_math_problems(path)


def test_parquet_row_error_names_row(tmp_path) -> None:
    path = tmp_path / "bad.parquet"
    write_parquet(path, [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": None}])
    with pytest.raises(ValueError, match=r"bad\.parquet: row 1: missing field 'answer'"):
        load_math_problems(path)


def test_file_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        load_math_problems(tmp_path / "nope.jsonl")
    txt = tmp_path / "x.txt"
    txt.write_text("a,b\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"x\.txt: expected a \.jsonl, \.json, \.parquet or \.csv"):
        load_math_problems(txt)
    csv = tmp_path / "x.csv"  # a CSV is read (llm.tasks.io.csv_rows); its columns are checked
    csv.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"x\.csv: unknown column layout"):
        load_math_problems(csv)
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"problem": "a", "answer": "1"}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 2: invalid JSON"):
        load_math_problems(bad_json)
    unknown = tmp_path / "unknown.jsonl"
    write_jsonl(unknown, [{"text": "a", "label": 1}])
    with pytest.raises(ValueError, match=r"unknown\.jsonl: unknown column layout") as info:
        load_math_problems(unknown)
    assert "['label', 'text']" in str(info.value)
    assert all(name in str(info.value) for name in ("math", "dapo", "gsm8k"))
    with pytest.raises(ValueError, match="limit"):
        load_math_problems(unknown, limit=-1)


# --------------------------------------------------------------------------------------------------
# Prompts


def test_templates() -> None:
    problem = MathProblem("Find $\\{x\\}$ if $x^{2} = 4$.", "2")
    assert make_math_prompt(problem, "qwen-math") == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within "
        "\\boxed{}.<|im_end|>\n<|im_start|>user\nFind $\\{x\\}$ if $x^{2} = 4$.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert make_math_prompt(problem, "qwen3") == (
        "<|im_start|>user\nFind $\\{x\\}$ if $x^{2} = 4$.\n" + BOXED_INSTRUCTION + "<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert make_math_prompt(problem, "qwen3-nothink") == (
        make_math_prompt(problem, "qwen3") + "<think>\n\n</think>\n\n"
    )
    assert make_math_prompt(problem, "plain") == (
        "Question: Find $\\{x\\}$ if $x^{2} = 4$.\n" + BOXED_INSTRUCTION + "\nAnswer:"
    )
    for name in MATH_TEMPLATES:
        assert problem.problem in make_math_prompt(problem, name)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"template.*'chatml'"):
        make_math_prompt(problem, "chatml")  # type: ignore[arg-type]


def test_problem_validation() -> None:
    with pytest.raises(ValueError, match="answer"):
        MathProblem("p", " ")
    with pytest.raises(ValueError, match="answer"):
        MathProblem("p", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="level"):
        MathProblem("p", "3", level=5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Generator


def latex_value(problem: MathProblem) -> int:
    """Independent evaluation of a generated expression problem (trusted, generated text)."""
    expr = re.search(r"\$(.*)\$", problem.problem).group(1)  # type: ignore[union-attr]
    assert re.fullmatch(r"[\d\s+\-()]*(\\times[\d\s+\-()]*)*", expr), expr
    return int(eval(expr.replace("\\times", "*")))


def test_generator_deterministic_and_correct() -> None:
    problems = generate_math_problems(60, seed=7)
    assert problems == generate_math_problems(60, seed=7)
    assert problems != generate_math_problems(60, seed=8)
    assert len({p.id for p in problems}) == 60
    kinds = {"$" in p.problem for p in problems}
    assert kinds == {True, False}  # both expressions and word problems
    for p in problems:
        assert 0 <= int(p.answer) <= 999 and p.source == "arithmetic"
        if "$" in p.problem:
            assert latex_value(p) == int(p.answer)
    for p in problems[:15]:
        assert compute_math_score(f"so \\boxed{{{p.answer}}}", p) == 1.0
        # ".0" forces the comparison through math-verify rather than string equality.
        assert compute_math_score(f"\\boxed{{{p.answer}.0}}", p) == 1.0
        assert compute_math_score(f"\\boxed{{{int(p.answer) + 1}}}", p) == 0.0
    only_expressions = generate_math_problems(20, seed=1, word_fraction=0.0, num_operands=4)
    assert all(latex_value(p) == int(p.answer) for p in only_expressions)
    with pytest.raises(ValueError, match="num_operands"):
        generate_math_problems(1, seed=0, num_operands=1)
