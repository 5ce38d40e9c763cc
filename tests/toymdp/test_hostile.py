"""Issue 40: the toy sweep refuses the values its methods forbid, through the LLM sweep's check
(`experiment.schema.check_hyper`), and every toy error is one line naming its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.toymdp.test_sweep import TINY
from toymdp import sweep as S
from toymdp import sweep_spec as D
from toymdp.__main__ import main


def _write(tmp_path: Path, text: str, name: str = "tiny.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _entry(method: str, body: str) -> str:
    return f'{TINY}\n[[methods]]\nmethod = "{method}"\n{body}\n'


@pytest.mark.parametrize(
    ("method", "body", "named"),
    [
        ("ds_grpo", "grid = { gamma_p = [-0.5, 0.3] }", r"ds_grpo.*gamma_p must be >= 0, got -0.5"),
        ("casp", "fixed = { alpha = 1.5 }", r"casp.*alpha must be in \[0, 1\], got 1.5"),
        ("ds_grpo", "grid = { kl_coef = [-1.0] }", r"ds_grpo.*kl_coef must be >= 0, got -1.0"),
        ("ds_grpo", "grid = { lr = [-0.1] }", r"methods\[ds_grpo\]\.lr: expected a number > 0"),
        (
            "ds_grpo",
            'grid = { gamma_p = ["a"] }',
            r"methods\[ds_grpo\]\.gamma_p: expected a finite number .*got 'a'",
        ),
        ("casp", "grid = { top_n = [0] }", r"casp.*top_n must be an int >= 1, got 0"),
    ],
)
def test_the_toy_sweep_refuses_what_a_method_forbids(tmp_path, capsys, method, body, named):
    path = _write(tmp_path, _entry(method, body))
    with pytest.raises(ValueError, match=named):
        D.load_config(path)
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "usage" not in err
    assert not out.exists()  # refused before anything was written


def test_a_non_utf8_file_is_named_by_every_command(tmp_path, capsys) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b"# \xff\n" + TINY.encode())
    for command in ("sweep", "study"):
        assert main([command, "--config", str(path), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert f"{path}, line 1: not UTF-8 text" in err and err.count("\n") == 1


def test_a_sweep_that_fails_after_compiling_leaves_no_folder(tmp_path, capsys, monkeypatch):
    def fail(*args, **kwargs):
        raise ValueError("analysis failed")

    monkeypatch.setattr(S, "analyse", fail)
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(_write(tmp_path, TINY)), "--out", str(out)]) == 2
    assert "analysis failed" in capsys.readouterr().err
    assert not out.exists()  # its .cache/jax included
