"""Countdown task: verifier (fuzzed, adversarial), generator, solver vs brute force, I/O, templates."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.tasks import (
    MAX_DEPTH,
    MAX_EXPRESSION_CHARS,
    CountdownProblem,
    Expr,
    ac_key,
    commutative_key,
    compact_completion,
    compact_words,
    compute_score,
    count_solutions,
    evaluate,
    extract_answer,
    generate_problems,
    load_problems,
    make_prompt,
    parse_expression,
    solution_multiplicity,
    solve,
    solve_brute_force,
    to_infix,
    verify,
    write_problems_jsonl,
)

P3 = CountdownProblem((3, 5, 7), 22)  # 3 * 5 + 7
SCORES = {0.0, 0.1, 1.0}
# Generous per-call bound: a call takes microseconds; this only catches super-linear blow-ups.
MAX_CALL_S = 0.05


def answer(eq: str) -> str:
    return f"<think> working </think>\n<answer> {eq} </answer>"


def tinyzero_extract(text: str, split_on_assistant: bool) -> str | None:
    """TinyZero's `extract_solution` (verl/utils/reward_score/countdown.py), regex and all."""
    if split_on_assistant:
        if "Assistant:" in text:
            text = text.split("Assistant:", 1)[1]
        elif "<|im_start|>assistant" in text:
            text = text.split("<|im_start|>assistant", 1)[1]
        else:
            return None
    text = text.split("\n")[-1]
    matches = list(re.finditer(r"<answer>(.*?)</answer>", text))
    return matches[-1].group(1).strip() if matches else None


def timed_score(text: str, problem: CountdownProblem, **kw: bool) -> float:
    t0 = time.perf_counter()
    s = compute_score(text, problem, **kw)
    assert time.perf_counter() - t0 < MAX_CALL_S
    return s


# ------------------------------------------------------------------------------------------------
# Verifier: the scoring rules


@pytest.mark.parametrize(
    ("eq", "score", "reason"),
    [
        ("3 * 5 + 7", 1.0, "correct"),
        ("7 + 5 * 3", 1.0, "correct"),
        ("(3 * 5) + (7)", 1.0, "correct"),
        ("( 3 * 5 ) + 7", 1.0, "correct"),  # the compact, one-word-per-token rendering
        ("3 + 5 + 7", 0.1, "wrong_value"),
        ("", 0.1, "invalid_expression"),  # well-formed tags, empty content: TinyZero gives 0.1
        ("3 * 5", 0.1, "wrong_numbers"),  # a number missing
        ("3 * 5 + 7 + 1", 0.1, "wrong_numbers"),  # an extra number
        ("3 * 5 + 7 - 7 + 7", 0.1, "wrong_numbers"),  # a number reused
        ("3 * 3 + 7", 0.1, "wrong_numbers"),
        ("35 - 7 - 6", 0.1, "wrong_numbers"),  # digits glued into other numbers
        ("3 * 5 + 7 = 22", 0.1, "invalid_expression"),
        ("-3 + 5 * 7 - 10", 0.1, "invalid_expression"),
        ("3 * 5 - -7", 0.1, "invalid_expression"),  # unary minus is not allowed
        ("+3 * 5 + 7", 0.1, "invalid_expression"),
        ("3. * 5 + 7", 0.1, "invalid_expression"),  # float literal (TinyZero's eval accepts it)
        ("3 * 05 + 7", 0.1, "invalid_expression"),  # leading zero: a Python syntax error
        ("3 ** 5 + 7", 0.1, "invalid_expression"),
        ("3 // 5 + 7", 0.1, "invalid_expression"),
        ("(3 * 5)(7)", 0.1, "invalid_expression"),  # a call
        ("__import__('os').system('true')", 0.1, "invalid_expression"),
        ("3 × 5 + 7", 0.1, "invalid_expression"),
        ("٣ * 5 + 7", 0.1, "invalid_expression"),  # non-ASCII digit
    ],
)
def test_scoring_rules(eq: str, score: float, reason: str) -> None:
    v = verify(answer(eq), P3)
    assert (v.score, v.reason) == (score, reason)


def test_division_by_zero_is_format_score() -> None:
    p = CountdownProblem((3, 5, 5), 3)
    v = verify(answer("3 / (5 - 5)"), p)
    assert (v.score, v.reason) == (0.1, "division_by_zero")
    # Exact fractions: an intermediate non-integer is fine, 1/3 * 3 is exactly 1.
    assert compute_score(answer("(1 / 3) * 3"), CountdownProblem((1, 3, 3), 1)) == 1.0


def test_extraction_rules() -> None:
    assert compute_score("no tags at all", P3) == 0.0
    assert compute_score("<answer> 3 * 5 + 7", P3) == 0.0  # unclosed
    # Only the last line counts (TinyZero's split('\n')[-1]).
    assert compute_score("<answer> 3 * 5 + 7 </answer>\nthat's it", P3) == 0.0
    # The last answer on that line wins.
    assert compute_score("<answer> 3 * 5 + 7 </answer> <answer> 1 </answer>", P3) == 0.1
    assert (
        compute_score("<answer> 1 </answer> <answer> 3 * 5 + 7 </answer><|endoftext|>", P3) == 1.0
    )
    # Tags spanning lines never match.
    assert compute_score("<answer> 3 * 5\n+ 7 </answer>", P3) == 0.0
    # Custom scores pass through.
    assert compute_score(answer("3 + 5 + 7"), P3, format_score=0.0) == 0.0
    assert compute_score(answer("7 + 15"), P3, score=2.0) == 0.1


def test_split_on_assistant() -> None:
    text = make_prompt(P3, "base") + " 3 * 5 = 15, + 7.</think>\n<answer> 3 * 5 + 7 </answer>"
    assert compute_score(text, P3, split_on_assistant=True) == 1.0
    qwen = make_prompt(P3, "qwen-instruct") + "</think>\n<answer> 7 + 3 * 5 </answer><|im_end|>"
    assert compute_score(qwen, P3, split_on_assistant=True) == 1.0
    assert compute_score("<answer> 3 * 5 + 7 </answer>", P3, split_on_assistant=True) == 0.0
    # The format example inside the prompt is never taken for an answer.
    for template in ("base", "qwen-instruct"):
        assert compute_score(make_prompt(P3, template), P3, split_on_assistant=True) == 0.0


def test_chatml_fewshot_shows_solved_problems_and_asks_for_the_answer_alone() -> None:
    prompt = make_prompt(P3, "chatml-fewshot")
    turns = prompt.split("<|im_start|>")[1:]
    assert [t.split("\n", 1)[0] for t in turns] == ["system"] + ["user", "assistant"] * 5
    assert (
        turns[-2]
        == "user\nUsing the numbers [3, 5, 7], write an equation whose value is 22.<|im_end|>\n"
    )
    assert turns[-1] == "assistant\n"  # left open for the answer
    # Every shown answer solves its problem (a wrong shot would teach a wrong answer).
    for user, reply in zip(turns[1:-2:2], turns[2:-2:2], strict=True):
        nums, target = re.search(r"numbers \[(.*)\], .* value is (\d+)\.", user).groups()
        problem = CountdownProblem(tuple(int(n) for n in nums.split(", ")), int(target))
        assert (
            compute_score(reply.removeprefix("assistant\n").removesuffix("<|im_end|>\n"), problem)
            == 1.0
        )
    # The shots never count as the answer; the response does.
    assert compute_score(prompt, P3, split_on_assistant=True) == 0.0
    assert (
        compute_score(prompt + "<answer> 3 * 5 + 7 </answer>", P3, split_on_assistant=True) == 1.0
    )


# ------------------------------------------------------------------------------------------------
# Verifier: adversarial input


def test_power_tower_rejected_fast() -> None:
    p = CountdownProblem((9, 9, 9), 1)
    for eq in ("9**9**9", "9 ** 9 ** 9", "(9**9)**9", "9*" * 60 + "9"):
        v = verify(answer(eq), p)
        assert v.score == 0.1
    t0 = time.perf_counter()
    assert compute_score(answer("9**9**9"), p) == 0.1
    assert time.perf_counter() - t0 < 0.01


def test_deep_nesting_bounded() -> None:
    p = CountdownProblem((1,), 1)
    for depth in (10, 99, 1_000, 100_000):
        s = timed_score(answer("(" * depth + "1" + ")" * depth), p)
        # Parentheses add no node: within the length bound this is just `1`.
        assert s == (1.0 if 2 * depth + 1 <= MAX_EXPRESSION_CHARS else 0.1)
    # A long right-nested chain of operations exceeds the depth bound while short enough.
    chain = "1+(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1)
    assert len(chain) <= MAX_EXPRESSION_CHARS
    assert parse_expression(chain) is None
    assert (
        verify(answer(chain), CountdownProblem((1,) * (MAX_DEPTH + 2), MAX_DEPTH + 2)).score == 0.1
    )
    # Unary chains and huge inputs.
    assert timed_score(answer("-" * 150 + "1"), p) == 0.1
    assert timed_score(answer("1+" * 1_000_000 + "1"), p) == 0.1
    # The content runs from the first tag to the first closing tag, as with TinyZero's lazy regex.
    assert timed_score("<answer>" * 100_000 + "1" + "</answer>", p) == 0.1
    # Many unclosed tags: quadratic for the regex, linear here.
    assert timed_score("<answer>" * 1_000_000, p) == 0.0


@settings(max_examples=400)
@given(st.text())
def test_fuzz_arbitrary_text(text: str) -> None:
    assert timed_score(text, P3) in SCORES
    assert timed_score(text, P3, split_on_assistant=True) in SCORES
    assert timed_score(f"<answer>{text}</answer>", P3) in SCORES


ARITH = st.text(alphabet="0123456789+-*/(). \t", max_size=60)


@settings(max_examples=400)
@given(ARITH)
def test_fuzz_arithmetic_text(eq: str) -> None:
    v = verify(f"<answer>{eq}</answer>", P3)
    assert v.score in SCORES
    if v.score == 1.0:
        expr = parse_expression(eq.strip())
        assert expr is not None and evaluate(expr) == P3.target


TAG_PIECES = st.sampled_from(
    ["<answer>", "</answer>", "<answer", "answer>", " 1 ", "\n", "x", "Assistant:"]
)


@settings(max_examples=300)
@given(st.lists(TAG_PIECES, max_size=12).map("".join), st.booleans())
def test_extraction_matches_tinyzero_regex(text: str, split: bool) -> None:
    assert extract_answer(text, split_on_assistant=split) == tinyzero_extract(text, split)


# ------------------------------------------------------------------------------------------------
# Expressions


@st.composite
def trees(draw: st.DrawFn, nums: tuple[int, ...]) -> Expr:
    """A random tree whose leaves are a permutation of `nums`."""

    def build(leaves: list[int]) -> Expr:
        if len(leaves) == 1:
            return leaves[0]
        k = draw(st.integers(1, len(leaves) - 1))
        op = draw(st.sampled_from("+-*/"))
        return (op, build(leaves[:k]), build(leaves[k:]))

    return build(draw(st.permutations(list(nums))))


@settings(max_examples=200)
@given(st.data())
def test_infix_round_trip(data: st.DataObject) -> None:
    nums = tuple(data.draw(st.lists(st.integers(0, 120), min_size=1, max_size=6)))
    expr = data.draw(trees(nums))
    assert parse_expression(to_infix(expr)) == expr
    assert parse_expression(to_infix(expr, spaced=True)) == expr


SMALL_PROBLEMS = generate_problems(40, seed=7, num_numbers=(2, 3, 4))


@settings(max_examples=200)
@given(st.data())
def test_verifier_agrees_with_solver(data: st.DataObject) -> None:
    """Any expression over the numbers scores 1.0 iff its class is among the solver's solutions."""
    problem = data.draw(st.sampled_from(SMALL_PROBLEMS))
    expr = data.draw(trees(problem.nums))
    keys = {commutative_key(e) for e in solve(problem)}
    correct = compute_score(answer(to_infix(expr)), problem) == 1.0
    assert correct == (evaluate(expr) == problem.target) == (commutative_key(expr) in keys)


# ------------------------------------------------------------------------------------------------
# Generator and solver


def test_generator_deterministic_and_in_range() -> None:
    a = generate_problems(300, seed=3)
    assert a == generate_problems(300, seed=3)
    assert a != generate_problems(300, seed=4)
    assert a == generate_problems(300, seed=np.random.default_rng(3))
    assert {len(p.nums) for p in a} == {3, 4}
    assert all(1 <= x <= 99 for p in a for x in p.nums)
    assert all(1 <= p.target <= 999 for p in a)
    b = generate_problems(50, seed=0, num_numbers=3, max_number=9, max_target=20)
    assert all(len(p.nums) == 3 and max(p.nums) <= 9 and p.target <= 20 for p in b)
    with pytest.raises(ValueError, match="num_numbers"):
        generate_problems(1, seed=0, num_numbers=0)
    with pytest.raises(RuntimeError):
        generate_problems(
            1, seed=0, num_numbers=2, max_number=1, min_target=5, max_target=6, max_tries=50
        )


def test_generated_problems_solvable_and_solutions_verify() -> None:
    for problem in generate_problems(60, seed=11):
        for distinct in ("commutative", "ac"):
            sols = solve(problem, distinct=distinct)
            assert sols, problem
            for expr in sols:
                assert compute_score(answer(to_infix(expr)), problem) == 1.0
                assert compute_score(compact_completion(expr), problem) == 1.0


CASES = [
    *generate_problems(25, seed=5, num_numbers=3),
    *generate_problems(8, seed=6, num_numbers=4, max_number=12),
    *generate_problems(4, seed=8, num_numbers=4),
    CountdownProblem((3, 3, 3), 3),  # repeated numbers
    CountdownProblem((2, 2, 2, 2), 8),
    CountdownProblem((0, 5, 5), 0),  # zeros: division by zero inside candidates
    CountdownProblem((0, 4, 6), 24),
    CountdownProblem((1, 2, 3), 6),
    CountdownProblem((7, 11, 13), 1000),  # unsolvable
    CountdownProblem((4,), 4),
    CountdownProblem((4, 6), 0),
]


@pytest.mark.parametrize("problem", CASES, ids=str)
def test_solver_matches_brute_force(problem: CountdownProblem) -> None:
    for distinct in ("commutative", "ac"):
        fast = solve(problem, distinct=distinct)
        key = commutative_key if distinct == "commutative" else ac_key
        keys = [key(e) for e in fast]
        assert len(keys) == len(set(keys))  # one representative per class
        assert set(keys) == solve_brute_force(problem, distinct=distinct)


def test_solution_counts_by_hand() -> None:
    # 1+2 only; 2+2 and 2*2; 2/2; 2-2.
    assert count_solutions(CountdownProblem((1, 2), 3)) == 1
    assert count_solutions(CountdownProblem((2, 2), 4)) == 2
    assert count_solutions(CountdownProblem((2, 2), 1)) == 1
    assert count_solutions(CountdownProblem((2, 2), 0)) == 1
    # a + b + c: 3 bracketings modulo commutativity, 1 class modulo associativity.
    p = CountdownProblem((11, 23, 37), 71)
    assert sorted(to_infix(e) for e in solve(p)) == ["11 + 23 + 37", "11 + 37 + 23", "23 + 37 + 11"]
    assert [to_infix(e) for e in solve(p, distinct="ac")] == ["11 + 23 + 37"]
    # 10 + 20 + 30 (3 trees) and 20 * 30 / 10 in 5 trees: 20 / 10 * 30, 30 / (10 / 20), ...
    p = CountdownProblem((10, 20, 30), 60)
    assert count_solutions(p) == 8
    assert sorted(to_infix(e) for e in solve(p, distinct="ac")) == ["10 + 20 + 30", "20 * 30 / 10"]
    assert solution_multiplicity([CountdownProblem((1, 2), 3), CountdownProblem((2, 2), 4)]) == 1.5
    with pytest.raises(ValueError, match="problems"):
        solution_multiplicity([])
    with pytest.raises(ValueError, match="nums"):
        solve(CountdownProblem((1, 2, 3, 4, 5, 6), 1))


def test_solver_fast_on_four_numbers() -> None:
    problems = generate_problems(20, seed=13, num_numbers=4)
    for p in problems:
        best = min(_time(lambda p=p: solve(p)) for _ in range(3))
        assert best < 0.05, (p, best)


def _time(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------
# Files


def test_jsonl_round_trip(tmp_path) -> None:
    problems = generate_problems(30, seed=2)
    path = tmp_path / "cd.jsonl"
    write_problems_jsonl(problems, path)
    assert load_problems(path) == problems
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"target", "nums"}
    # Extra columns are ignored, blank lines skipped.
    path.write_text('{"target": 22, "nums": [3, 5, 7], "split": "train"}\n\n')
    assert load_problems(path) == [P3]


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", r"line 2: invalid JSON"),
        ('{"nums": [1, 2]}', r"line 2: missing field 'target'"),
        ('{"target": 3}', r"line 2: missing field 'nums'"),
        ('{"target": "3", "nums": [1, 2]}', r"line 2: field 'target'"),
        ('{"target": true, "nums": [1, 2]}', r"line 2: field 'target'"),
        ('{"target": 3.0, "nums": [1, 2]}', r"line 2: field 'target'"),
        ('{"target": 3, "nums": "1 2"}', r"line 2: field 'nums'"),
        ('{"target": 3, "nums": []}', r"line 2: field 'nums'"),
        ('{"target": 3, "nums": [1, -2]}', r"line 2: field 'nums'\[1\]"),
        ('{"target": 3, "nums": [1, 2.5]}', r"line 2: field 'nums'\[1\]"),
        ("[3, [1, 2]]", r"line 2: expected an object"),
    ],
)
def test_jsonl_errors_name_line_and_field(tmp_path, line: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"target": 22, "nums": [3, 5, 7]}\n' + line + "\n")
    with pytest.raises(ValueError, match=match):
        load_problems(path)


def test_loader_rejects_unknown_suffix(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"\.jsonl, \.parquet or \.csv"):
        load_problems(tmp_path / "x.tsv")


def test_parquet_without_datasets_is_a_clear_error(tmp_path, monkeypatch) -> None:
    path = tmp_path / "cd.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ValueError, match="datasets"):
        load_problems(path)


def test_parquet_round_trip(tmp_path) -> None:
    datasets = pytest.importorskip("datasets")
    problems = generate_problems(20, seed=9)
    path = tmp_path / "cd.parquet"
    datasets.Dataset.from_list([p.to_row() for p in problems]).to_parquet(str(path))
    assert load_problems(path) == problems
    bad = tmp_path / "bad.parquet"
    datasets.Dataset.from_list(
        [{"target": 1, "nums": [1]}, {"target": 2, "nums": [-1]}]
    ).to_parquet(str(bad))
    with pytest.raises(ValueError, match=r"row 1: field 'nums'\[0\]"):
        load_problems(bad)


# ------------------------------------------------------------------------------------------------
# Templates and the problem type


def test_templates() -> None:
    base = make_prompt(P3, "base")
    assert "[3, 5, 7]" in base and "22" in base and "<answer> </answer>" in base
    assert base.endswith("\n<think>") and base.count("Assistant:") == 1
    assert base.index("User:") < base.index("Assistant:")
    qwen = make_prompt(P3, "qwen-instruct")
    assert qwen.startswith("<|im_start|>system\n") and "<|im_start|>user\n" in qwen
    assert qwen.endswith("<|im_start|>assistant\nLet me work through this step by step.\n<think>")
    assert "[3, 5, 7]" in qwen and "<answer> </answer>" in qwen
    assert make_prompt(P3, "compact") == "nums 3 5 7 target 22 :"
    with pytest.raises(ValueError, match="template"):
        make_prompt(P3, "chatml")  # type: ignore[arg-type]


def test_compact_format_is_word_level() -> None:
    vocab = set(compact_words(999))
    for problem in generate_problems(30, seed=4):
        prompt = make_prompt(problem, "compact")
        for expr in solve(problem):
            completion = compact_completion(expr)
            assert completion.startswith("<answer> ") and completion.endswith(" </answer>")
            assert set(prompt.split()) <= vocab and set(completion.split()) <= vocab


def test_problem_validation() -> None:
    assert CountdownProblem([3, 5, 7], np.int64(22)) == P3  # type: ignore[arg-type]
    assert hash(CountdownProblem((np.int64(3), 5, 7), 22)) == hash(P3)
    for nums, target in [((), 1), ((1, -2), 1), ((1.5,), 1), ((True,), 1), ((1,), Fraction(1))]:
        with pytest.raises(ValueError):
            CountdownProblem(nums, target)  # type: ignore[arg-type]


def test_no_torch_import() -> None:
    code = (
        "import sys, llm.tasks; assert not {'torch', 'transformers', 'datasets'} & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
