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
def test_trl_rollout_func_example_trains_a_step(capsys, tmp_path):
    """examples/trl_rollout_func.py: plain GRPOTrainer, the task-id dataset, make_rollout_func and envace_reward."""
    run("trl_rollout_func.py", "--steps", "1", "--output_dir", str(tmp_path / "run"))
    out = capsys.readouterr().out
    assert "step 1: reward 0.000" in out  # the random tiny model solves no units task


@pytest.mark.slow
def test_rehearsal_format_benchmark_counts_every_rehearsed_call(capsys):
    run("rehearsal_format.py", "--model", "tiny", "--tasks", "2", "--setting", "0:1")
    out = capsys.readouterr().out
    (row,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["temperature"] == 0 and row["calls"] >= 2  # both tasks' calls were rehearsed
    assert row["well_formed"] <= row["calls"] and sum(row["codes"].values()) == row["calls"]


@pytest.mark.parametrize("recipe", ["envace_8b.yaml", "server.yaml"])
def test_the_scale_recipes_build_their_trainer_config(recipe, capsys):
    """examples/scale: each settings file builds an EnvACEGRPOConfig (its accelerator settings turned off for
    the check: this machine has none), with the sharding and vLLM settings it names."""
    run("scale/train.py", "--config", str(EXAMPLES / "scale" / recipe), "--dry_run")
    out = capsys.readouterr().out
    assert "model Qwen/Qwen3-8B, domain bank, 470 steps, G=4" in out and "the config builds" in out
    if recipe == "server.yaml":
        assert "vllm_mode server ['http://gpu-node-2:8000', 'http://gpu-node-3:8000']" in out


@pytest.mark.parametrize("launch", ["fsdp2.yaml", "zero3.yaml"])
def test_the_scale_launch_configs_are_accelerates(launch):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(EXAMPLES / "scale" / launch))
    assert config.num_processes == 8 and config.mixed_precision == "bf16"
    if launch == "fsdp2.yaml":
        assert config.distributed_type == "FSDP" and config.fsdp_config["fsdp_version"] == 2
    else:
        assert config.distributed_type == "DEEPSPEED" and config.deepspeed_config["zero_stage"] == 3


def test_the_withheld_forms_benchmark_prints_both_forms(capsys, tmp_path):
    out = str(tmp_path / "w.json")
    run("withheld_forms.py", "--model", "tiny", "--num-tasks", "1", "--max-new-tokens", "8", "--out", out)
    out = capsys.readouterr().out
    assert "bare: withheld 1 rehearsals" in out and "format example: withheld 1 rehearsals" in out
    record = json.loads((tmp_path / "w.json").read_text())
    assert set(record["forms"]) == {"bare", "format example"} and record["domain"] == "units-v0"


@pytest.mark.slow
def test_the_withheld_agreement_benchmark_compares_models_call_by_call(capsys, tmp_path):
    import shutil

    from envace_gym.training.sft import tiny_start_model

    one = tiny_start_model("units-v0", tmp_path / "one")
    shutil.copytree(one, tmp_path / "copy")
    other = tiny_start_model("units-v0", tmp_path / "other", seed=1)
    models = [str(one), str(tmp_path / "copy"), str(other)]
    run("withheld_agreement.py", "--domain", "units-v0", "--models", *models, "--num-tasks", "2",
        "--max-new-tokens", "8", "--out", str(tmp_path / "a.json"))  # fmt: skip
    record = json.loads((tmp_path / "a.json").read_text())
    rehearsed = len(record["rehearsals"][str(one)])
    assert rehearsed >= 2 and all(len(rows) == rehearsed for rows in record["rehearsals"].values())
    # the same weights rehearse the same calls alike (greedy); every pair compares every call
    assert record["same_by_pair"][f"{one} | {tmp_path / 'copy'}"] == {"compared": rehearsed, "same": rehearsed}
    assert record["same_by_pair"][f"{one} | {other}"]["compared"] == rehearsed
    assert f"{rehearsed} of {rehearsed} rehearsals the same" in capsys.readouterr().out
