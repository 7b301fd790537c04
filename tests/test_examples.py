"""The examples stay true to the code: each runs to the end."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(name: str, *argv: str) -> None:
    old = sys.argv
    sys.argv = [name, *argv]
    try:
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    finally:
        sys.argv = old


def test_custom_domain_example(capsys):
    run("custom_domain.py")
    out = capsys.readouterr().out
    assert "real: reward 1.0" in out and "rehearsal: reward 1.0" in out


def test_quickstart_example(capsys):
    run("quickstart.py", "--model", "tiny")
    out = capsys.readouterr().out
    assert "executor=real" in out and "executor=rehearsal" in out and "reward 1.00" in out
