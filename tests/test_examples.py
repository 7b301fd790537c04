"""The examples stay true to the code: each runs to the end."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(name: str, *argv: str) -> None:
    """Run ``examples/<name>`` (or ``benchmarks/<name>``) as a script with ``argv``."""
    path = EXAMPLES / name if (EXAMPLES / name).is_file() else EXAMPLES.parent / "benchmarks" / name
    old = sys.argv
    sys.argv = [name, *argv]
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv = old


def test_custom_domain_example(capsys):
    run("custom_domain.py")
    out = capsys.readouterr().out
    assert "real: reward 1.0" in out and "rehearsal: reward 1.0" in out


@pytest.mark.slow
def test_quickstart_example(capsys):
    run("quickstart.py", "--model", "tiny")
    out = capsys.readouterr().out
    assert "executor=real" in out and "executor=rehearsal" in out and "reward 1.00" in out


@pytest.mark.slow
def test_rehearsal_format_benchmark_counts_every_rehearsed_call(capsys):
    run("rehearsal_format.py", "--model", "tiny", "--tasks", "2", "--setting", "0:1")
    out = capsys.readouterr().out
    (row,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["temperature"] == 0 and row["calls"] >= 2  # both tasks' calls were rehearsed
    assert row["well_formed"] <= row["calls"] and sum(row["codes"].values()) == row["calls"]
