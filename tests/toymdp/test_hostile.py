"""Issue 40: every toy error is one line naming its file, and a failed sweep leaves nothing."""

from __future__ import annotations

from pathlib import Path

from tests.toymdp.test_sweep import TINY
from toymdp import sweep as S
from toymdp.__main__ import main


def _write(tmp_path: Path, text: str, name: str = "tiny.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


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
