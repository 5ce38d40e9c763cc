"""Tasks with verifiable rewards for the LLM side: Countdown (seed 000, App. C.1) and competition
math (seed 000, Sec. 4.3; seed 001, Sec. 4.1), registered by name in `TASKS`.

A new task is one module that builds a `Task` (problems, prompts, reward, answer key) plus one
`register_task` line below; the trainer, `llm eval` and the config find it by name.

Pure Python and numpy: no torch, no transformers; `datasets`/pyarrow only inside the Parquet
loaders; math-verify only inside the math grader.
"""

from llm.tasks.countdown.grading import (
    CORRECT_SCORE,
    FORMAT_SCORE,
    Verdict,
    compute_score,
    extract_answer,
    solves,
    verify,
)
from llm.tasks.countdown.loaders import load_problems, write_problems_jsonl
from llm.tasks.countdown.problem import CountdownProblem, generate_problems, problem_from_row
from llm.tasks.countdown.solver import (
    MAX_SOLVER_NUMBERS,
    count_solutions,
    solution_multiplicity,
    solve,
    solve_brute_force,
)
from llm.tasks.countdown.task import (
    COMPACT_WORDS,
    COUNTDOWN,
    TEMPLATES,
    compact_completion,
    compact_words,
    make_prompt,
)
from llm.tasks.expr import (
    MAX_DEPTH,
    MAX_EXPRESSION_CHARS,
    MAX_NODES,
    Expr,
    ac_key,
    commutative_key,
    evaluate,
    leaves,
    parse_expression,
    solution_key,
    to_infix,
)
from llm.tasks.math.grading import (
    GRADE_TIMEOUT_S,
    MAX_ANSWER_CHARS,
    MAX_ANSWER_DEPTH,
    MathVerdict,
    answers_equivalent,
    compute_math_score,
    extract_boxed,
    math_verdict,
)
from llm.tasks.math.loaders import MATH_LAYOUTS, load_math_problems, write_math_jsonl
from llm.tasks.math.problem import (
    BOXED_INSTRUCTION,
    MATH_TEMPLATES,
    MathProblem,
    generate_math_problems,
    make_math_prompt,
)
from llm.tasks.math.task import MATH
from llm.tasks.registry import TASKS, Problem, Task, UnknownTaskError, register_task

register_task(COUNTDOWN)
register_task(MATH)

__all__ = [
    "BOXED_INSTRUCTION",
    "COMPACT_WORDS",
    "CORRECT_SCORE",
    "COUNTDOWN",
    "FORMAT_SCORE",
    "GRADE_TIMEOUT_S",
    "MATH",
    "MATH_LAYOUTS",
    "MATH_TEMPLATES",
    "MAX_ANSWER_CHARS",
    "MAX_ANSWER_DEPTH",
    "MAX_DEPTH",
    "MAX_EXPRESSION_CHARS",
    "MAX_NODES",
    "MAX_SOLVER_NUMBERS",
    "TASKS",
    "TEMPLATES",
    "CountdownProblem",
    "Expr",
    "MathProblem",
    "MathVerdict",
    "Problem",
    "Task",
    "UnknownTaskError",
    "Verdict",
    "ac_key",
    "answers_equivalent",
    "commutative_key",
    "compact_completion",
    "compact_words",
    "compute_math_score",
    "compute_score",
    "count_solutions",
    "evaluate",
    "extract_answer",
    "extract_boxed",
    "generate_math_problems",
    "generate_problems",
    "leaves",
    "load_math_problems",
    "load_problems",
    "make_math_prompt",
    "make_prompt",
    "math_verdict",
    "parse_expression",
    "problem_from_row",
    "register_task",
    "solution_key",
    "solution_multiplicity",
    "solve",
    "solve_brute_force",
    "solves",
    "to_infix",
    "verify",
    "write_math_jsonl",
    "write_problems_jsonl",
]
