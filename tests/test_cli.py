from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from envace_gym import Domain, DomainError, register_domain
from envace_gym.cli import build_parser, main
from envace_gym.domains import registry
from envace_gym.recipes.demo import run_demo


def test_domains_lists_the_builtins(capsys):
    assert main(["domains", "--details"]) == 0  # task counts need each domain built
    out = capsys.readouterr().out
    for name in ("units", "bank", "travel"):
        assert name in out
    assert "1000 train, 200 test" in out


def test_domains_lists_without_building(capsys, monkeypatch):
    """The plain listing reads each factory's description; a factory that fails when called is never called."""
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))  # leaves no trace

    def broken() -> Domain:
        """Fails when built."""
        raise DomainError("this domain was built")

    register_domain("broken", broken)
    assert main(["domains"]) == 0
    out = capsys.readouterr().out
    assert "broken     Fails when built" in out and "units-v0   Unit conversion: one tool call, one number." in out
    assert "tasks" not in out  # nothing was counted
    assert main(["domains", "--details"]) == 0
    assert "broken     not available: this domain was built" in capsys.readouterr().out


def test_domains_named_are_built_and_a_typo_is_answered(capsys):
    assert main(["domains", "units", "bank"]) == 0
    out = capsys.readouterr().out
    assert "units-v0     3 tools, 1000 train, 200 test tasks" in out and "bank-v0      4 tools" in out
    assert "travel" not in out
    assert main(["domains", "bnak"]) == 2
    assert "did you mean 'bank'?" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_shows_rehearsed_next_to_real():
    out = io.StringIO()
    stats = run_demo("bank", episodes=2, policy="tiny", max_new_tokens=8, out=out)
    text = out.getvalue()
    assert stats.episodes == 2 and stats.rehearsals >= 2
    assert text.count("rehearsed:") == stats.rehearsals == text.count("real:")
    assert "mean reward" in text and "scores the reference, not the model" in text  # whose acts were scored


def test_demo_with_the_policy_acting():
    out = io.StringIO()
    stats = run_demo("units", episodes=1, act="policy", policy="tiny", max_new_tokens=8, out=out)
    assert stats.episodes == 1 and "act:" in out.getvalue() and "the model's own Act turns" in out.getvalue()


def test_errors_are_reported_not_raised(capsys):
    assert main(["demo", "--domain", "no-such-domain", "--model", "tiny", "--episodes", "1"]) == 2
    assert "unknown domain" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_quick_on_the_tiny_model(capsys, tmp_path):
    out = tmp_path / "table.md"
    assert main(["bench", "--model", "tiny", "--quick", "--out", str(out)]) == 0
    table = out.read_text()
    for measure in ("collector vs raw generate", "naive single-env loop", "turn", "ToolRegistry.validate"):
        assert measure in table
    assert table.count("\n| ") >= 8  # header, separator and seven measures


@pytest.mark.slow
def test_bench_train_quick_on_the_tiny_model(tmp_path):
    out = tmp_path / "train.md"
    assert main(["bench", "--train", "--model", "tiny", "--quick", "--out", str(out)]) == 0
    table = out.read_text()
    for measure in ("(a) SFT steps", "(b) EnvACE separate", "(c) EnvACE inline", "(d) real tools", "bfloat16"):
        assert measure in table
    rows = [line for line in table.splitlines() if line.startswith("| (")]
    assert all(float(line.split("|")[4]) > 0 for line in rows)  # every ratio measured


MISTAKES = [
    (["train", "--mode", "foo"], "invalid choice: 'foo'"),
    (["train", "--rehearsal_mode", "bogus"], "invalid choice: 'bogus'"),
    (["train", "--stepz", "1"], "unrecognized arguments: --stepz 1"),
    (["train", "--steps", "x"], "invalid int value"),
    (["train", "--model", "/no/such/path"], "model path '/no/such/path' does not exist"),
    (["train", "--domain", "no-such-domain"], "unknown domain"),
    (["train", "--config", "/no/such/file.yaml"], "No such file"),
    (["train", "--config=/no/such/file.yaml"], "No such file"),
    (["train", "--config"], "--config takes one YAML file"),
    (["eval", "--model", "/no/such/path"], "does not exist"),
    (["eval", "--domain", "no-such-domain"], "unknown domain"),
    (["eval", "--domian", "bank"], "unrecognized arguments: --domian"),
    (["eval", "--rehearse", "parallel", "--horizon", "0"], "--horizon must be at least 1, --budget at least 0"),
    (["eval", "--budget", "-1"], "--budget at least 0"),
    (["eval", "--num-tasks", "0"], "--num-tasks and trials must be at least 1"),
    (["eval", "--trials", "0"], "--num-tasks and trials must be at least 1"),
    (["eval", "--num_tasks", "0"], "--num-tasks and trials must be at least 1"),  # either spelling
    (["eval", "--user", "rehearse"], "evaluation trains nothing"),
    (["eval", "--executor", "real"], "evaluation sets executor itself"),
    (["train", "--tasks-per-step", "0"], "tasks_per_step must be at least 1"),
    (["eval", "--user-temperature", "0.5"], "user='scripted' has none"),
    (["eval", "--user", "llm", "--user-max-tokens", "-1"], "no budget but the context"),
    (["eval", "--max-messages", "0"], "--max-messages must be at least 1 or None"),
    (["eval", "--domain", "units", "--agent-prompt", "tau2"], "--agent-prompt chooses the agent's system prompt"),
    (["train", "--group_size", "1"], "group_size must be at least 2"),
    (["train", "--vllm_mode", "remote"], "invalid choice: 'remote'"),
    (["train", "--vllm_mode", "server"], "vllm_mode server generates with vLLM servers: add use_vllm"),
    (["train", "--vllm_server_base_urls", "http://h:8000"], "set vllm_mode server"),
    (["train", "--mode", "sft", "--vllm_mode", "server"], "mode sft plays none"),
    (["train", "--mode", "real-tools", "--use_vllm", "--vllm_mode", "server", "--vllm_server_base_urls", "http://a:1",
      "http://b:1"], "talks to one server"),  # fmt: skip
    (["train", "--mode", "real-tools", "--use_vllm", "--vllm_mode", "server", "--vllm_server_weights_dir", "w"],
     "leave it out"),  # fmt: skip
    (["experiment", "--conditions", "sft+envace-separate"], "add the 'sft' condition"),
    (["experiment", "--conditions", "foo"], "invalid choice: 'foo'"),
    (["experiment", "--model", "./no/such/model"], "does not exist"),
    (["demo", "--model", "~/no/such/model"], "does not exist"),
    (["bench", "--model", "/no/such/path"], "does not exist"),
]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any attempt to load a model fails the test: the CLI must refuse a mistake before loading anything."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the mistake was reported")

    import envace_gym.policy.default_model
    import envace_gym.policy.tiny
    from envace_gym.policy import TransformersPolicy

    monkeypatch.setattr(envace_gym.policy.default_model, "load_default_policy", refuse)
    monkeypatch.setattr(envace_gym.policy.default_model, "ensure_default_model", refuse)
    monkeypatch.setattr(envace_gym.policy.tiny, "tiny_policy", refuse)
    monkeypatch.setattr(envace_gym.policy.tiny, "quick_look_policy", refuse)  # what --model tiny builds
    monkeypatch.setattr(TransformersPolicy, "from_pretrained", refuse)


@pytest.mark.parametrize(("argv", "says"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_cli_mistakes_get_one_line_before_any_model_loads(argv, says, capsys, no_model_loads, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a refused command might write lands in the repository
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own exit
        rc = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2
    assert len(lines) == 1, err
    assert says in lines[0] and "Traceback" not in err


def test_a_yaml_config_with_unknown_keys_is_one_line(capsys, no_model_loads, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("steps: 2\nstepz: 1\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", str(config)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and "--stepz 1" in err


def test_help_lists_config_defaults_and_the_tiny_model(capsys):
    for command in (["train", "--help"], ["eval", "--help"]):
        with pytest.raises(SystemExit):
            main(command)
        out = " ".join(capsys.readouterr().out.split())
        assert "--model" in out and "'tiny'" in out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "--config YAML" in capsys.readouterr().out
    evaluate = build_parser()._subparsers._group_actions[0].choices["eval"]
    formatter = evaluate._get_formatter()
    for action in evaluate._actions:  # every eval option says what it does, and its default where it has one
        assert action.help, action.option_strings
        if action.help == argparse.SUPPRESS:  # a setting evaluation chooses itself: accepted, to be refused
            continue
        if action.default not in (None, False, argparse.SUPPRESS):
            assert "(default: " in formatter._get_help_string(action), action.option_strings


def test_eval_reaches_a_domain_written_in_python(capsys):
    library = Path(__file__).resolve().parents[1] / "examples" / "custom_domain.py"
    argv = [
        "eval",
        "--domain",
        f"{library}:LibraryDomain",
        "--model",
        "tiny",
        "--num-tasks",
        "1",
        "--max-new-tokens",
        "4",
    ]
    assert main(argv) == 0
    assert "library / test: 1 episodes" in capsys.readouterr().out
    assert main([*argv, "--trials", "2", "--temperature", "1", "--no-fidelity"]) == 0
    out = capsys.readouterr().out
    assert "library / test: 2 episodes" in out and "pass^1 0.000, pass^2 0.000 (2 trials per task)" in out


def test_every_command_takes_both_flag_spellings(capsys):
    """``envace eval --num_tasks 5`` as ``envace train --num_tasks``-style flags are written (it answered
    "unrecognized arguments" before), and ``--num-tasks`` as before: every command takes both, as TRL's parser
    does for ``train`` and ``experiment``."""
    argv = ["eval", "--domain", "units", "--model", "tiny", "--num_tasks", "2", "--max_new_tokens", "4",
            "--no_fidelity", "--on_invalid", "feedback"]  # fmt: skip
    assert main(argv) == 0
    assert "units-v0 / test: 2 episodes" in capsys.readouterr().out
    parser = build_parser()
    spelled = [("demo", "--max_new_tokens", "max_new_tokens"), ("bench", "--work_dir", "work_dir"),
               ("checklists", "--judge_model", "judge_model"), ("eval", "--top-p", "top_p")]  # fmt: skip
    for command, flag, dest in spelled:
        required = ["--domain", "x", "--out", "y"] if command == "checklists" else []
        assert getattr(parser.parse_args([command, *required, flag, "7"]), dest) in (7, 7.0, "7"), flag


def test_check_rehearsal_tells_parsed_accepted_and_equal_apart():
    from envace_gym.domains import CallRecord
    from envace_gym.errors import ErrorCode, ToolError
    from envace_gym.evaluation import check_rehearsal
    from envace_gym.tools import ToolCall

    def flags(result=None, code=None):
        error = ToolError(ErrorCode[code], "m") if code else None
        check = check_rehearsal(CallRecord(1, ToolCall("get_balance"), "rehearsal", result, error), real)
        return check.parsed, check.schema_ok, check.equal, check.fields

    real = {"balance": 10.0, "owner": "Ana"}
    assert flags({"owner": "Ana", "balance": 10.0}) == (True, True, True, 1.0)  # canonical JSON: key order aside
    assert flags({"balance": 11.0, "owner": "Ana"}) == (True, True, False, 0.5)  # the owner right, the sum not
    assert flags({"balance": 10.05, "owner": "Ana"}) == (True, True, False, 1.0)  # within 1%: right, not equal
    assert flags(code="RESULT_SCHEMA_MISMATCH") == (True, False, False, 0.0)  # parsed, but failed the returns schema
    assert flags(code="INVALID_REHEARSAL") == flags(code="LIMIT_EXCEEDED") == (False, False, False, 0.0)


def test_field_share_counts_the_real_leaves_rehearsed_right():
    from envace_gym.evaluation import field_share

    real = {"account": {"id": "A1", "balance": 250}, "history": [5, -3], "frozen": False}
    assert field_share(real, real) == 1.0
    assert field_share({"account": {"id": "A1", "balance": 251}, "history": [5, 3], "frozen": False}, real) == 0.8  # 251 is within 1%
    assert field_share({"account": {"id": "A1"}, "extra": 1}, real) == 0.2  # missing leaves are wrong, extra free
    assert field_share({"account": {"id": "A1", "balance": 250}, "history": [5, -3], "frozen": 0}, real) == 0.8
    assert field_share({"frozen": "false"}, {"frozen": False}) == 0.0  # text is not a flag
    assert field_share([], []) == 1.0 and field_share({"a": 1}, {}) == 0.0  # nothing to get right: equality
    assert field_share("ok", "ok") == 1.0 and field_share(0.0, 1e-12) == 1.0  # a bare value is its own leaf


def test_shorten_cuts_to_the_width_and_keeps_one_line():
    from envace_gym.text import shorten

    assert shorten("abc", 3) == "abc" and shorten("abcd", 3) == "ab…"
    assert shorten({"a": "é"}, 20) == '{"a": "é"}' and shorten(("x",), 20) == '["x"]'
    assert shorten("a\nb", 10) == "a\nb" and shorten("a\nb", 10, one_line=True) == "a\\nb"
    assert shorten(object, 200).startswith("\"<class 'object'>")  # any value prints (default=str)
    with pytest.raises(ValueError, match="width must be at least 1"):
        shorten("x", 0)


def test_train_takes_trl_names_for_the_objective(no_model_loads):
    from envace_gym.cli.main import _parse_settings
    from envace_gym.recipes.train import TrainConfig

    default = _parse_settings(TrainConfig, "envace train", [])
    assert (default.beta, default.epsilon, default.delta) == (0.0, 0.2, 3.0)  # TRL's names, the paper's values
    config = _parse_settings(TrainConfig, "envace train", ["--beta", "0.001", "--epsilon", "0.3", "--delta", "2.5"])
    assert (config.beta, config.epsilon, config.delta) == (0.001, 0.3, 2.5)
