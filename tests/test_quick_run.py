"""Issue 55, as a new user meets it: a run that can learn nothing says why, once, with the remedy (from
``envace train``, ``EnvACEGRPOTrainer`` and a ``make_rollout_func`` run), and ``--warm_start sft`` runs the
short SFT on the user's own domain (examples/calendar_domain.py) before GRPO."""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from pathlib import Path

import pytest

from envace_gym.cli import main
from envace_gym.domains import CallRecord
from envace_gym.tools import ToolCall
from envace_gym.training.diagnosis import NoLearningMonitor, NoLearningWarning, diagnose, step_evidence

CALENDAR = f"{Path(__file__).resolve().parents[1] / 'examples' / 'calendar_domain.py'}:CalendarDomain"
NO_CALL, VALID_CALL, REHEARSED, BAD_REHEARSAL = (0, 0, 0, 0), (1, 1, 0, 0), (1, 1, 1, 0), (1, 1, 1, 1)


def no_learning_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, NoLearningWarning)]


def test_each_cause_is_named_with_its_remedy_and_a_spread_is_not_flagged():
    groups = ["a", "a", "b", "b"]
    nothing = step_evidence(groups, [0.0] * 4, [NO_CALL] * 4)
    assert "no episode wrote a valid tool call (none wrote any tool call)" in diagnose(nothing)
    assert "--warm_start sft" in diagnose(nothing)
    malformed = step_evidence(groups, [0.0] * 4, [(2, 0, 0, 0)] * 4)
    assert "its 8 call(s) were all malformed or invalid" in diagnose(malformed)
    invalid = step_evidence(groups, [0.0] * 4, [BAD_REHEARSAL] * 4)
    assert "every one of the 4 rehearsal(s) was invalid" in diagnose(invalid)
    alike = step_evidence(groups, [0.5] * 4, [REHEARSED] * 4)
    assert "failed (or passed) alike" in diagnose(alike) and "partial credit" in diagnose(alike)
    solved = step_evidence(groups, [1.0] * 4, [REHEARSED] * 4)
    assert "every episode earned full marks" in diagnose(solved)
    spread = step_evidence(groups, [0.0, 1.0, 0.5, 0.5], [VALID_CALL] * 4)
    assert diagnose(spread) is None  # group a can learn
    assert "no rehearse rows in this step (no valid call was rehearsed)" in diagnose(spread, rehearse_rows=0)
    assert diagnose(spread, rehearse_rows=3) is None
    assert diagnose(step_evidence(groups, [None] * 4, [NO_CALL] * 4)) is None  # all masked: reported elsewhere
    monitor = NoLearningMonitor("test")
    with pytest.warns(NoLearningWarning) as caught:
        monitor.observe(nothing)
        assert monitor.observe(invalid) is None  # one warning per run
    assert len(no_learning_warnings(caught.list)) == 1


@pytest.mark.slow
def test_envace_train_on_an_untrained_model_says_why_nothing_learns(tiny_path, tmp_path, capsys):
    """The issue's first run: an untrained model on the user's domain writes no call; the run warns once."""
    argv = ["train", "--mode", "rehearsal", "--model", tiny_path, "--domain", CALENDAR, "--output_dir",
            str(tmp_path / "run"), "--steps", "2", "--tasks_per_step", "1", "--group_size", "2",
            "--max_new_tokens", "16"]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(argv) == 0
    found = no_learning_warnings(caught)
    assert len(found) == 1, found  # two steps, both without a spread: said once
    assert found[0].startswith("EnvACEGRPOTrainer: no group of this step has a reward spread")
    assert "no episode wrote a valid tool call" in found[0] and "envace train --warm_start sft" in found[0]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["frac_reward_zero_std"] == 1 and logged[0]["rows/rehearse"] == 0  # what the warning explains


@pytest.mark.slow
def test_the_pure_torch_trainer_says_why_nothing_learns_once():
    """The trainer ``envace experiment`` runs: an untrained tiny model writes no valid call, so neither of two
    steps has a reward spread; one warning, naming the cause and the remedy."""
    from envace_gym.policy.tiny import tiny_policy
    from envace_gym.training.trainer import TrainerConfig, train

    config = TrainerConfig(domain="units", steps=2, tasks_per_step=1, group_size=2, max_new_tokens=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = train(tiny_policy(), config)
    found = no_learning_warnings(caught)
    assert len(found) == 1, found
    assert found[0].startswith("envace_gym.training.train: no group of this step has a reward spread")
    assert "no episode wrote a valid tool call" in found[0] and "--warm_start sft" in found[0]
    assert [h["frac_reward_zero_std"] for h in history] == [1, 1]  # what the warning explains


@pytest.mark.slow
def test_envace_grpo_trainer_stays_quiet_when_its_groups_have_a_spread(tiny_path, tmp_path):
    """Something can learn: a reward function that tells episodes apart gives every group a spread (real tools:
    no rehearse rows are expected), so no warning."""
    from transformers import AutoTokenizer

    from envace_gym.integrations import trl as envace_trl

    def by_length(completions, **_):  # differs between a group's sampled episodes
        return [float(len(json.dumps(c))) / 1000 for c in completions]

    args = envace_trl.EnvACEGRPOConfig(
        output_dir=str(tmp_path), domain="units", executor="real", per_device_train_batch_size=4, num_generations=2,
        max_completion_length=16, max_steps=1, logging_steps=1, use_cpu=True, report_to="none", save_strategy="no",
    )  # fmt: skip
    trainer = envace_trl.EnvACEGRPOTrainer(
        model=tiny_path, args=args, processing_class=AutoTokenizer.from_pretrained(tiny_path), reward_funcs=[by_length]
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert trainer.state.log_history[0]["frac_reward_zero_std"] < 1
    assert no_learning_warnings(caught) == [] and trainer.no_learning.warned is None


def _played(task_ids, rewards, calls):
    """A rollout batch as the collector returns it: one episode per prompt, its reward and call records."""
    from envace_gym.rollout.collector import EpisodeResult, RolloutBatch, Row

    row = Row("episode", (1, 2), (3, 4), (-1.0, -1.0), (1, 1))
    return RolloutBatch(
        [
            EpisodeResult(i, i, t, r, r == 1.0, True, False, 1, {}, [], list(c), [row], row)
            for i, (t, r, c) in enumerate(zip(task_ids, rewards, calls, strict=True))
        ]
    )


def test_make_rollout_func_says_why_nothing_learns_once_and_not_when_groups_have_a_spread(tmp_path, monkeypatch):
    """The rollout_func path: TRL's GRPOTrainer computes its own metrics; the rollout func sees the episodes."""
    from types import SimpleNamespace

    from trl import GRPOConfig

    from envace_gym.integrations import trl as envace_trl
    from envace_gym.integrations.trl import rollout_func as rollout_module
    from envace_gym.policy.tiny import tiny_policy

    policy = tiny_policy()
    ids = ["units/train/000", "units/train/000", "units/train/001", "units/train/001"]  # TRL's G=2 repeats
    monkeypatch.setattr(rollout_module, "rollout_weights", lambda trainer: contextlib.nullcontext(policy))
    trainer = SimpleNamespace(args=GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, use_cpu=True, report_to="none",
    ))  # fmt: skip
    malformed = CallRecord(1, None, None)
    rehearsed = CallRecord(1, ToolCall("convert", {}), "rehearsal")
    for rewards, calls, expected in (
        ([0.0, 0.0, 0.0, 0.0], [[malformed]] * 4, "its 4 call(s) were all malformed or invalid"),
        ([0.0, 1.0, 0.5, 0.5], [[rehearsed]] * 4, None),
    ):
        batch = _played(ids, rewards, calls)
        monkeypatch.setattr(rollout_module, "collect_rollouts", lambda *a, _b=batch, **k: _b)
        rollout = envace_trl.make_rollout_func("units")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rollout(ids, trainer)
            rollout(ids, trainer)  # a second step of the same run: no second warning
        found = no_learning_warnings(caught)
        if expected is None:
            assert found == []
        else:
            assert len(found) == 1 and found[0].startswith("make_rollout_func: no group") and expected in found[0]


def test_warm_start_is_refused_where_it_means_nothing(tmp_path):
    from envace_gym.recipes.train import TrainConfig

    with pytest.raises(ValueError, match="mode sft is that SFT already"):
        TrainConfig(mode="sft", warm_start="sft", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="warm_start must be one of"):
        TrainConfig(warm_start="rl", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="warm_start_steps must be at least 1"):
        TrainConfig(warm_start="sft", warm_start_steps=0, output_dir=str(tmp_path))


@pytest.mark.slow
def test_warm_start_runs_the_sft_first_and_grpo_starts_from_it(tiny_path, tmp_path, capsys):
    """The plumbing, cheaply (one SFT step on the tiny model): the SFT runs on the calendar domain's reference rows,
    GRPO trains the model it wrote, and a second run with the same settings reuses it."""
    out = tmp_path / "run"
    argv = ["train", "--mode", "rehearsal", "--model", tiny_path, "--domain", CALENDAR, "--output_dir", str(out),
            "--warm_start", "sft", "--warm_start_steps", "1", "--steps", "1", "--tasks_per_step", "1",
            "--group_size", "2", "--max_new_tokens", "8"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "envace train: warm start: 1 SFT steps (batches of 4 rows, lr 0.0002)" in printed
    assert "warm start step 1: loss" in printed
    settings = json.loads((out / "warm_start" / "warm_start.json").read_text())
    assert settings["domain"] == "calendar" and settings["steps"] == 1
    assert (out / "final" / "config.json").is_file()
    made = (out / "warm_start" / "model.safetensors").stat().st_mtime
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 0
    assert (out / "warm_start" / "model.safetensors").stat().st_mtime == made  # reused, not redone


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """Item 1's command as docs/training.md shows it, on the calendar domain (ours, not built in): the tiny model
    made for the domain, its warm start, two GRPO steps. Returns the folder, what it printed and its warnings."""
    out = tmp_path_factory.mktemp("quick") / "calendar"
    argv = ["train", "--mode", "rehearsal", "--domain", CALENDAR, "--model", "tiny", "--warm_start", "sft",
            "--steps", "2", "--output_dir", str(out)]  # fmt: skip
    printed = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
        warnings.simplefilter("always")
        assert main(argv) == 0
    return out, printed.getvalue(), no_learning_warnings(caught)


@pytest.mark.slow
def test_the_quick_run_trains_both_roles_on_a_domain_of_our_own(quick_run):
    """After the warm start the first GRPO steps log rows of both roles and a reward spread, and no
    NoLearningWarning (the same command without ``--warm_start`` warns: the test above)."""
    out, printed, warned = quick_run
    assert "warm start: 500 SFT steps (batches of 8 rows, lr 0.001)" in printed  # the from-scratch defaults
    assert "warm start step 500: loss" in printed and "warm start done in" in printed
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [entry for entry in logged if "reward" in entry]
    assert len(steps) == 2
    assert any(s["rows/act"] > 0 and s["rows/rehearse"] > 0 and s["frac_reward_zero_std"] < 1 for s in steps), steps
    assert all(s["grad_norm"] > 0 for s in steps), steps  # both steps moved the weights
    assert warned == []
    card = (out / "final" / "README.md").read_text()  # the start was built in process, and the card says so
    assert "envace-gym's `tiny` model, a random model built in process" in card


@pytest.mark.slow
def test_the_trl_quick_run_example_reuses_the_warm_start_and_its_groups_have_a_spread(quick_run):
    """examples/calendar_quick_run.py, TRL's own GRPOTrainer with make_rollout_func, in the CLI run's folder:
    the same layout, so the warm start is reused (not redone), and GRPO's groups have a reward spread."""
    import importlib.util

    out, _, _ = quick_run
    made = (out / "warm_start" / "model.safetensors").stat().st_mtime
    path = Path(__file__).resolve().parents[1] / "examples" / "calendar_quick_run.py"
    spec = importlib.util.spec_from_file_location("calendar_quick_run", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        steps = example.main(["--trainer", "rollout_func", "--steps", "2", "--output_dir", str(out)])
    assert (out / "warm_start" / "model.safetensors").stat().st_mtime == made
    assert len(steps) == 2 and any(s["frac_reward_zero_std"] < 1 for s in steps), steps
    assert no_learning_warnings(caught) == []
