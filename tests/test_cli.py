from __future__ import annotations

import io

from envace_gym.cli import main
from envace_gym.demo import run_demo


def test_domains_lists_the_builtins(capsys):
    assert main(["domains"]) == 0
    out = capsys.readouterr().out
    for name in ("units", "bank", "travel"):
        assert name in out
    assert "1000 train, 200 test" in out


def test_demo_shows_rehearsed_next_to_real():
    out = io.StringIO()
    stats = run_demo("bank", episodes=2, policy="tiny", max_new_tokens=8, out=out)
    text = out.getvalue()
    assert stats.episodes == 2 and stats.rehearsals >= 2
    assert text.count("rehearsed:") == stats.rehearsals == text.count("real:")
    assert "mean reward" in text


def test_demo_with_the_policy_acting():
    out = io.StringIO()
    stats = run_demo("units", episodes=1, act="policy", policy="tiny", max_new_tokens=8, out=out)
    assert stats.episodes == 1 and "act:" in out.getvalue()


def test_errors_are_reported_not_raised(capsys):
    assert main(["demo", "--domain", "no-such-domain", "--model", "tiny", "--episodes", "1"]) == 2
    assert "unknown domain" in capsys.readouterr().err


def test_bench_quick_on_the_tiny_model(capsys, tmp_path):
    out = tmp_path / "table.md"
    assert main(["bench", "--model", "tiny", "--quick", "--out", str(out)]) == 0
    table = out.read_text()
    for measure in ("collector vs raw generate", "naive single-env loop", "turn", "ToolRegistry.validate"):
        assert measure in table
    assert table.count("\n| ") >= 8  # header, separator and seven measures


def test_bench_train_quick_on_the_tiny_model(tmp_path):
    out = tmp_path / "train.md"
    assert main(["bench", "--train", "--model", "tiny", "--quick", "--out", str(out)]) == 0
    table = out.read_text()
    for measure in ("(a) SFT steps", "(b) EnvACE separate", "(c) EnvACE inline", "(d) real tools", "bfloat16"):
        assert measure in table
    rows = [line for line in table.splitlines() if line.startswith("| (")]
    assert all(float(line.split("|")[4]) > 0 for line in rows)  # every ratio measured
