"""Every episode setting is declared once (``EpisodeSettings``) and reaches every entry point: the flat configs
inherit it with its help, hand it on through ``episode_config()``, and the command lines offer it."""

from __future__ import annotations

import argparse
import contextlib
import io
from dataclasses import fields

import pytest

from envace_gym.episode import EpisodeConfig, EpisodeSettings
from envace_gym.recipes.experiment import CONDITION_SETS

SETTINGS = [f for f in fields(EpisodeSettings)]
# a value other than the default for every setting, each one accepted on its own
CHANGED = {
    "executor": "real", "rehearsal_mode": "inline", "p_real": 0.25, "on_invalid": "feedback", "max_turns": 3,
    "max_user_turns": 4, "max_messages": 40, "max_errors": 5, "tool_call_format": "hermes", "reward": "reference",
    "user": "llm", "user_model": None, "user_temperature": 0.5, "user_max_tokens": 64,
}  # fmt: skip


def _flat_configs(tmp_path):
    from envace_gym.integrations.trl import EnvACEGRPOConfig
    from envace_gym.recipes.experiment import ExperimentConfig
    from envace_gym.recipes.train import TrainConfig
    from envace_gym.training.trainer import TrainerConfig

    cpu = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    return {
        TrainerConfig: {}, TrainConfig: {}, ExperimentConfig: {}, EnvACEGRPOConfig: cpu,
    }  # fmt: skip


def test_every_setting_is_tested_here():
    assert set(CHANGED) == {f.name for f in SETTINGS}


def test_the_flat_configs_inherit_every_setting_with_its_help_and_hand_it_on(tmp_path):
    for cls, required in _flat_configs(tmp_path).items():
        declared = cls.__dataclass_fields__
        for f in SETTINGS:
            assert declared[f.name].metadata["help"] == f.metadata["help"], (cls.__name__, f.name)
        for name, value in CHANGED.items():
            if name == "user_model" or (cls.__name__ == "ExperimentConfig" and name in CONDITION_SETS):
                continue  # user_model goes with an endpoint URL; the conditions choose the others (refused)
            kwargs = {**required, name: value}
            if name in ("user_temperature", "user_max_tokens"):
                kwargs["user"] = "llm"  # a simulated user's sampling
            config = cls(**kwargs)
            assert getattr(config.episode_config(), name) == value, (cls.__name__, name)


def test_a_setting_given_to_the_env_or_the_collector_is_the_episodes():
    import gymnasium as gym

    from envace_gym.testing import ScriptedPolicy

    env = gym.make("EnvACE-Rehearsal-v0", domain="units", policy=ScriptedPolicy([]), max_errors=2, executor="real")
    assert env.unwrapped.config.max_errors == 2
    env.reset(seed=0)
    assert env.unwrapped.episode.max_errors == 2
    base = EpisodeConfig.build(max_turns=2)
    vec = gym.make_vec("EnvACE-Rehearsal-v0", num_envs=2, vectorization_mode="vector_entry_point", domain="units",
                       policy=ScriptedPolicy([]), config=base, max_errors=3)  # fmt: skip
    assert [(e.config.max_turns, e.config.max_errors) for e in vec.unwrapped.envs] == [(2, 3), (2, 3)]
    with pytest.raises(TypeError, match="config must be an EpisodeConfig"):
        EpisodeConfig.build("real")  # the old third positional argument of RehearsalEnv
    with pytest.raises(TypeError, match="unknown episode setting"):
        gym.make("EnvACE-Rehearsal-v0", domain="units", policy=ScriptedPolicy([]), max_turnz=2)


def test_the_command_lines_offer_every_setting():
    from envace_gym.cli.main import build_parser
    from envace_gym.evaluation.evaluate import EVALUATION_SETS

    from envace_gym.cli.main import parse_command

    evaluate = build_parser()._subparsers._group_actions[0].choices["eval"]
    offered = {a.dest for a in evaluate._actions if a.help != argparse.SUPPRESS}
    assert {f.name for f in SETTINGS} - offered == set(EVALUATION_SETS) & {f.name for f in SETTINGS}
    _, config = parse_command(["eval", "--max-errors", "4", "--user", "llm"])
    assert (config.max_errors, config.user) == (4, "llm") and config.max_turns is None
    assert config.given_settings() == {"max_errors": 4, "user": "llm"}  # what evaluate() is handed: the changed ones
    for command in ("train", "experiment"):
        from envace_gym.cli.main import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            main([command, "--help"])
        offered = {f.name for f in SETTINGS if f"--{f.name}" in out.getvalue()}
        chosen = set(CONDITION_SETS) if command == "experiment" else set()
        assert {f.name for f in SETTINGS} - offered <= chosen, command
