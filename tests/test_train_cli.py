"""`envace train` / `envace eval` / `envace experiment` on the tiny model, and the TRL path on 2 CPU processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from envace_gym.cli import main
from envace_gym.policy.precision import dtype_name, resolve_dtype

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SMALL = ["--domain", "units", "--steps", "1", "--tasks_per_step", "1", "--group_size", "2", "--max_new_tokens", "8"]


@pytest.fixture(scope="module")
def carded_tiny(tiny_path, tmp_path_factory):
    """The tiny model in a folder whose model card names the model it came from, as a run's final/ does."""
    from huggingface_hub import ModelCard, ModelCardData

    path = tmp_path_factory.mktemp("carded") / "model"
    shutil.copytree(tiny_path, path)
    ModelCard.from_template(ModelCardData(base_model="org/base-model")).save(path / "README.md")
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sft", "rehearsal", "real-tools"])
def test_train_modes_write_model_metrics_and_curves(carded_tiny, tmp_path, mode):
    out = tmp_path / mode
    argv = ["train", "--mode", mode, "--model", carded_tiny, "--output_dir", str(out), *SMALL, "--sft_tasks", "2"]
    assert main(argv) == 0
    assert (out / "final" / "config.json").is_file() and (out / "metrics.jsonl").is_file()
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["num_processes"] == 1 and summary["last"]["step"] == 1
    assert summary["plot"] is None or Path(summary["plot"]).is_file()
    card = (out / "final" / "README.md").read_text()  # names the model the run started from, not "[None]"
    assert "fine-tuned version of [org/base-model]" in card and "[None]" not in card
    # `--dtype auto` (the default) resolved by capability, and named in every record of the run
    resolved = dtype_name(resolve_dtype("auto"))
    assert json.loads((out / "train_config.json").read_text())["resolved_dtype"] == resolved
    assert summary["dtype"] == resolved and summary["engine_dtype"] is None  # no vLLM engine here
    assert f"Trained in {resolved} (forward and backward" in card
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    if mode != "sft":  # both GRPO modes log task success (the curves' success panel)
        assert any("success" in entry for entry in history)


@pytest.mark.slow
def test_the_quick_look_with_dashed_flags_says_its_model_was_built_in_process(tmp_path, capsys):
    """``envace train --mode rehearsal --model tiny`` in the dashed spelling (``--group-size``, as ``envace
    eval`` takes them; both spellings work in every command): the card says the run started from the tiny model
    built in process, not "a fine-tuned version of [None]", and its pipeline loads the trained folder."""
    out = tmp_path / "quick"
    argv = ["train", "--mode", "rehearsal", "--model", "tiny", "--output-dir", str(out), "--domain", "units",
            "--steps", "1", "--tasks-per-step", "1", "--group-size", "2", "--max-new-tokens", "8"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"final model: {out / 'final'}" in printed and "curves: None" not in printed
    card = (out / "final" / "README.md").read_text()
    assert "This model was trained from envace-gym's `tiny` model, a random model built in process." in card
    assert "[None]" not in card and f'model="{out / "final"}"' in card


def test_curves_have_integer_steps_and_fixed_reward_range(tmp_path):
    pytest.importorskip("matplotlib")
    from envace_gym.recipes.train import curves_figure, plot_curves

    history = [{"step": s, "reward": 0.5 + 1e-4 * s, "success": 0.0, "loss": 1e-3 * s} for s in (1, 2, 3)]
    assert plot_curves(history, tmp_path / "curves.png", title="t") == str(tmp_path / "curves.png")
    fig = curves_figure(history, title="t")
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert all(float(t).is_integer() for t in ticks), ticks
        assert ax.yaxis.get_major_formatter().get_offset() == ""  # no "+5e-1" offset notation
    assert [ax.get_title() for ax in fig.axes] == ["reward", "success", "loss"]
    assert fig.axes[0].get_ylim() == (-0.05, 1.05) and fig.axes[1].get_ylim() == (-0.05, 1.05)


@pytest.mark.slow
def test_train_reads_a_yaml_config_and_flags_win(tiny_path, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(
        f"mode: rehearsal\nmodel: {tiny_path}\ndomain: units\nsteps: 3\ngroup_size: 2\ntasks_per_step: 1\nmax_new_tokens: 8\nrehearsal_mode: inline\n"
    )
    out = tmp_path / "yaml"
    assert main(["train", "--config", str(config), "--steps", "1", "--output_dir", str(out)]) == 0
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["steps"] == 1 and saved["rehearsal_mode"] == "inline" and saved["domain"] == "units"


@pytest.mark.slow
def test_resume_continues_from_the_last_checkpoint(tiny_path, tmp_path):
    out = tmp_path / "resume"
    base = [
        "train",
        "--mode",
        "rehearsal",
        "--model",
        tiny_path,
        "--output_dir",
        str(out),
        *SMALL[:2],
        "--group_size",
        "2",
        "--tasks_per_step",
        "1",
        "--max_new_tokens",
        "8",
        "--save_steps",
        "1",
    ]
    assert main([*base, "--steps", "1"]) == 0
    assert (out / "checkpoint-1").is_dir()
    assert main([*base, "--steps", "2", "--resume", "true"]) == 0
    steps = [json.loads(line).get("step") for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(s for s in steps if s) == 2


@pytest.mark.slow
def test_eval_and_experiment_commands(tiny_path, tmp_path, capsys):
    assert (
        main(
            [
                "eval",
                "--domain",
                "units",
                "--model",
                tiny_path,
                "--num-tasks",
                "2",
                "--max-new-tokens",
                "8",
                "--out",
                str(tmp_path / "eval.json"),
            ]
        )
        == 0
    )
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["episodes"] == 2 and 0.0 <= result["success_rate"] <= 1.0 and result["rehearsals"] >= 1
    results = tmp_path / "results.md"
    argv = [
        "experiment", "--domain", "lights", "--output_dir", str(tmp_path / "exp"), "--seeds", "1",
        "--conditions", "sft", "sft+grpo-real-tools", "sft+envace-separate", "--sft_tasks", "4",
        "--sft_steps", "2", "--rl_steps", "2", "--eval_every", "1", "--tasks_per_step", "1", "--group_size", "2",
        "--eval_tasks", "2", "--results_file", str(results),
    ]  # fmt: skip
    assert main(argv) == 0
    table = results.read_text()
    assert "| sft+envace-separate |" in table and "envace experiment --domain lights" in table
    summary = json.loads((tmp_path / "exp" / "experiment.json").read_text())
    records = {(r["condition"], r["seed"]): r for r in summary["records"]}
    assert len(records) == 3 and summary["command"].startswith("envace experiment")
    assert summary["dtype"] == "float32" and "--dtype float32" in summary["command"]  # the default, resolved
    envace = records[("sft+envace-separate", 1)]
    assert envace["real_tool_executions"] == 0 and [p["step"] for p in envace["curve"]] == [0, 1, 2]
    assert records[("sft", 1)]["train_seconds"] > 0 and (tmp_path / "curve-lights.png").is_file()
    assert main(argv) == 0  # resumes: every stage is already done
    assert "done before, skipped" in capsys.readouterr().out
    assert results.read_text() == table  # same figures, training times included, from what the stages stored
    # An RL stage cut off after its first checkpoint goes on from it, not from step 0.
    stage = tmp_path / "exp" / "seed-1" / "sft+envace-separate"
    (stage / "record.json").unlink()
    state = torch.load(stage / "checkpoint.pt", weights_only=False)
    state["history"] = state["history"][:1]
    torch.save(state, stage / "checkpoint.pt")
    assert main(argv) == 0
    assert "[seed 1] sft+envace-separate: step 2:" in capsys.readouterr().out
    assert len(json.loads((stage / "metrics.jsonl").read_text().splitlines()[-1])) > 0


@pytest.mark.skipif(
    shutil.which("accelerate") is None and not Path(sys.executable).with_name("accelerate").exists(),
    reason="accelerate CLI missing",
)
@pytest.mark.slow
def test_trl_path_under_accelerate_with_two_cpu_processes(tiny_path, tmp_path):
    accelerate = shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))
    out = tmp_path / "ddp"
    cmd = [
        accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "-m", "envace_gym.cli", "train", "--mode", "rehearsal", "--model", tiny_path,
        "--output_dir", str(out), *SMALL,
    ]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("final model:") == 1 and done.stdout.count("curves:") == 1  # rank 0 prints them
    assert "curves: None" not in done.stdout
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["num_processes"] == 2
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "episodes" in line]
    assert [s["episodes"] for s in steps] == [1 * 2]  # --tasks_per_step 1 x --group_size 2, over both processes


@pytest.mark.slow
def test_training_killed_by_sigkill_resumes_from_its_last_checkpoint(tiny_path, tmp_path):
    import signal
    import time

    import torch
    from transformers import AutoModelForCausalLM

    def command(out):
        return [
            sys.executable, "-m", "envace_gym.cli", "train", "--mode", "rehearsal", "--model", tiny_path, "--domain",
            "units", "--steps", "4", "--save_steps", "1", "--tasks_per_step", "1", "--group_size", "2",
            "--max_new_tokens", "8", "--learning_rate", "1e-3", "--seed", "3", "--output_dir", str(out),
        ]  # fmt: skip

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    killed = tmp_path / "killed"
    proc = subprocess.Popen(command(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (killed / "checkpoint-2" / "trainer_state.json").is_file():
        assert proc.poll() is None and time.time() < deadline, "training ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = sorted(
        int(p.name.split("-")[1]) for p in killed.glob("checkpoint-*") if (p / "trainer_state.json").is_file()
    )
    last = saved[-1]
    assert last < 4 and (killed / f"checkpoint-{last}" / "optimizer.pt").is_file()
    assert (killed / f"checkpoint-{last}" / "rng_state.pth").is_file()

    done = subprocess.run([*command(killed), "--resume", "true"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {killed / f'checkpoint-{last}'}" in done.stdout
    history = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    batches = {h["step"]: h["rollouts/batches_this_run"] for h in history if "rollouts/batches_this_run" in h}
    assert batches[last + 1] == 1 and max(batches) == 4  # the resumed run began right after the checkpoint

    # Model, optimizer and RNG states came back: the result equals an uninterrupted run's.
    straight = tmp_path / "straight"
    subprocess.run(command(straight), env=env, check=True, capture_output=True, timeout=900)
    a = AutoModelForCausalLM.from_pretrained(killed / "final")
    b = AutoModelForCausalLM.from_pretrained(straight / "final")
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.slow
def test_eval_with_private_rehearsal_prints_a_table(tiny_path, tmp_path, capsys):
    out = tmp_path / "planning.json"
    argv = [
        "eval", "--domain", "units", "--model", tiny_path, "--num-tasks", "2", "--max-new-tokens", "8", "--no-fidelity",
        "--rehearse", "parallel", "sequential", "--budget", "0", "1", "--horizon", "1", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| plain acting |" in table and "| parallel, N=1 |" in table and "| sequential, N=1 |" in table
    records = json.loads(out.read_text())
    assert [r["setting"] for r in records] == ["plain acting", "parallel, N=1", "sequential, N=1"]
    assert records[0]["rehearsal_tokens"] == 0 < records[1]["rehearsal_tokens"]

    argv[argv.index("sequential")] = "--commit"
    argv[argv.index("--commit") + 1 : argv.index("--commit") + 1] = ["memory", "select"]
    assert main(argv) == 0
    assert "turns from a kept rehearsal |" in capsys.readouterr().out
    assert [r["setting"] for r in json.loads(out.read_text())] == [
        "plain acting", "parallel, N=1, commit=memory", "parallel, N=1, commit=select",
    ]  # fmt: skip


@pytest.mark.slow
def test_lora_and_tensorboard(tiny_path, tmp_path):
    out = tmp_path / "lora"
    argv = ["train", "--mode", "sft", "--model", tiny_path, "--output_dir", str(out), "--domain", "units", "--sft_tasks", "2",
            "--steps", "2", "--lora", "true", "--lora_r", "4", "--report_to", "tensorboard"]  # fmt: skip
    assert main(argv) == 0
    config = json.loads((out / "final" / "config.json").read_text())
    assert "quantization_config" not in config and not (out / "final" / "adapter_config.json").exists()  # merged
    assert list(out.rglob("events.out.tfevents.*")), "tensorboard wrote no event file"


@pytest.mark.slow
def test_sft_epochs_rule_unless_steps_is_set(tiny_path, tmp_path, capsys):
    from envace_gym.testing import tiny_tokenizer
    from envace_gym.training import sft_dataset

    rows = len(sft_dataset("units", tiny_tokenizer(), "train", 2))
    base = [
        "train",
        "--mode",
        "sft",
        "--model",
        tiny_path,
        "--domain",
        "units",
        "--sft_tasks",
        "2",
        "--sft_batch_size",
        "4",
    ]
    out = tmp_path / "epochs"
    assert main([*base, "--sft_epochs", "2", "--output_dir", str(out)]) == 0
    planned = 2 * -(-rows // 4)
    assert f"2 epochs = {planned} optimizer steps" in capsys.readouterr().out
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["last"]["epoch"] == 2 and summary["last"]["step"] == planned
    out = tmp_path / "limited"
    assert main([*base, "--sft_epochs", "2", "--steps", "1", "--output_dir", str(out)]) == 0
    assert "1 optimizer steps (--steps" in capsys.readouterr().out
    assert json.loads((out / "train_summary.json").read_text())["last"]["step"] == 1


def test_model_card_names_the_embedded_default_and_passes_a_card_on(tmp_path, monkeypatch, carded_tiny):
    from envace_gym.policy.default_model import default_model_dir
    from envace_gym.integrations.trl.model_card import DEFAULT_MODEL_HUB_ID, base_model_name

    monkeypatch.setenv("ENVACE_CACHE_DIR", str(tmp_path / "cache"))
    default_model_dir().mkdir(parents=True)
    assert base_model_name(str(default_model_dir())) == DEFAULT_MODEL_HUB_ID  # the converted GGUF's cache
    assert base_model_name(carded_tiny) == "org/base-model"  # an earlier run's final/: its card's base model
    assert base_model_name("org/some-model") == "org/some-model"  # a hub id names itself
    assert base_model_name(str(tmp_path)) is None  # a folder that says nothing of its origin


def test_tasks_per_step_is_the_global_batch(monkeypatch):
    from envace_gym.recipes.train import TrainConfig, _episodes_per_process

    config = TrainConfig(tasks_per_step=4, group_size=4)
    assert _episodes_per_process(config) == 16
    monkeypatch.setenv("WORLD_SIZE", "2")  # what accelerate launch sets
    assert _episodes_per_process(config) == 8
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="cannot be shared by 3 processes"):
        _episodes_per_process(config)


@pytest.mark.slow
def test_fsdp_under_accelerate_is_refused_in_one_line(tiny_path, tmp_path):
    """As far as a CPU goes with FSDP: accelerate starts both processes, and each refuses before loading."""
    accelerate = shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))
    cmd = [
        accelerate, "launch", "--use_fsdp", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "-m", "envace_gym.cli", "train", "--mode", "rehearsal", "--model", tiny_path,
        "--output_dir", str(tmp_path / "fsdp"), *SMALL,
    ]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "envace: error: EnvACEGRPOTrainer cannot generate from sharded parameters (FSDP)" in done.stderr
    assert "no available devices" not in done.stderr  # refused before accelerate tried to shard anything


def test_reward_panel_widens_for_rewards_outside_zero_one():
    pytest.importorskip("matplotlib")
    from envace_gym.recipes.train import curves_figure

    fig = curves_figure([{"step": 1, "reward": 1.8}, {"step": 2, "reward": -0.4}])
    low, high = fig.axes[0].get_ylim()
    assert low <= -0.4 and high >= 1.8  # weighted rewards are not clipped off the plot


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["rehearsal", "real-tools"])
def test_a_run_whose_every_reward_is_masked_ends_with_its_plot_and_summary(tiny_path, tmp_path, mode):
    """A verifier that fails on every episode masks them all (reward None): the run still writes its model, a
    plot that says so, and train_summary.json with the count (it crashed while drawing the plot before), in
    the EnvACE trainer and in TRL's own tool loop alike."""
    from envace_gym.domains.registry import make_domain, register_domain
    from envace_gym.recipes.train import curves_figure

    class VerifierDown(type(make_domain("units"))):
        name = "verifier-down"

        def score(self, task, trajectory):
            raise RuntimeError("the verifier is down")

    register_domain("verifier-down", VerifierDown, overwrite=True)
    out = tmp_path / "masked"
    argv = ["train", "--mode", mode, "--model", tiny_path, "--output_dir", str(out), *SMALL[2:],
            "--steps", "2", "--domain", "verifier-down"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["masked_episodes"] == 2 * 1 * 2  # steps x tasks x group size: every episode
    assert (out / "final" / "config.json").is_file()
    assert summary["plot"] is None or Path(summary["plot"]).is_file()
    # the figure copes with whatever a masked step logs for its reward: NaN, None or nothing
    history = [{"step": 1, "reward": None, "loss": 0.0}, {"step": 2, "reward": float("nan"), "success": 0.0}]
    pytest.importorskip("matplotlib")
    figure = curves_figure(history, "masked")
    assert "every episode's reward" in " ".join(t.get_text() for ax in figure.axes for t in ax.texts)


def test_real_tools_mode_bounds_tool_calling_rounds_as_rehearsal_mode_bounds_act_turns(tmp_path):
    """TRL's tool loop has no bound of its own (max_tool_calling_iterations unset): the baseline gets max_turns, and
    a whole episode's completion budget."""
    from envace_gym.recipes.train import TrainConfig, trl_args

    config = TrainConfig(mode="real-tools", domain="units", max_turns=3, max_new_tokens=8, output_dir=str(tmp_path))
    args = trl_args(config, config.max_turns, "float32")
    assert (args.max_tool_calling_iterations, args.max_completion_length) == (3, 24)


def test_one_function_builds_the_trl_args_and_both_grpo_modes_train_the_papers_objective(tmp_path):
    """trl_args builds every mode's TRL config; the paper's objective is declared once (EnvACEGRPOConfig's
    defaults) and the real-tools baseline trains with it too, a user's delta over the paper's."""
    from envace_gym.integrations.trl import EnvACEGRPOConfig, PackedGRPOConfig, PackedSFTConfig, paper_objective
    from envace_gym.recipes.train import TrainConfig, trl_args
    from envace_gym.training.trainer import TrainerConfig

    assert paper_objective() == {"scale_rewards": "none", "delta": 3.0, "loss_type": "dapo",
                                 "use_bias_correction_kl": False}  # fmt: skip
    built = {mode: trl_args(TrainConfig(mode=mode, domain="units", output_dir=str(tmp_path), delta=2.5), 2, "float32")
             for mode in ("sft", "rehearsal", "real-tools")}  # fmt: skip
    assert type(built["sft"]) is PackedSFTConfig and type(built["rehearsal"]) is EnvACEGRPOConfig
    assert type(built["real-tools"]) is PackedGRPOConfig
    for mode in ("rehearsal", "real-tools"):
        args = built[mode]
        assert {**paper_objective(), "delta": 2.5} == {k: getattr(args, k) for k in paper_objective()}, mode
    # envace train's settings shared with the pure-torch trainer take their defaults from TrainerConfig
    for name in ("tasks_per_step", "group_size", "learning_rate", "epsilon", "delta", "beta", "pack_tokens"):
        assert TrainConfig.__dataclass_fields__[name].default == TrainerConfig.__dataclass_fields__[name].default


def test_envace_train_takes_vllm_servers_as_the_trl_configs_name_them(tmp_path, monkeypatch):
    """--vllm_mode server reaches TRL's config with the servers: mode rehearsal's EnvACEGRPOConfig takes the
    package's list of servers and weights folder, real-tools' PackedGRPOConfig TRL's one server; the real-tools
    baseline in server mode is refused on a CPU (TRL's server client moves weights over NCCL), where it could
    only fail after connecting."""
    from envace_gym.recipes import train as train_recipe
    from envace_gym.recipes.train import TrainConfig, trl_args

    urls = ["http://host-a:8000", "http://host-b:8000"]
    config = TrainConfig(domain="units", output_dir=str(tmp_path), use_vllm=True, vllm_mode="server",
                         vllm_server_base_urls=urls, vllm_server_weights_dir=str(tmp_path / "w"))  # fmt: skip
    args = trl_args(config, 2, "float32")
    assert (args.use_vllm, args.vllm_mode, args.vllm_server_base_urls) == (True, "server", urls)
    assert args.vllm_server_weights_dir == str(tmp_path / "w")
    assert trl_args(TrainConfig(domain="units", output_dir=str(tmp_path)), 2, "float32").vllm_mode == "colocate"

    monkeypatch.setattr(train_recipe, "use_cpu", lambda: True)  # as on this machine
    with pytest.raises(ValueError, match="on a CPU use vllm_mode colocate"):
        TrainConfig(mode="real-tools", domain="units", output_dir=str(tmp_path), use_vllm=True, vllm_mode="server")
    monkeypatch.setattr(train_recipe, "use_cpu", lambda: False)  # as on a CUDA machine
    config = TrainConfig(mode="real-tools", domain="units", output_dir=str(tmp_path), use_vllm=True,
                         vllm_mode="server", vllm_server_base_urls=urls[:1])  # fmt: skip
    monkeypatch.undo()  # TRL's config is built for the machine it runs on
    args = trl_args(config, 2, "float32")
    assert (args.vllm_mode, args.vllm_server_base_url) == ("server", urls[0])


def test_resume_point_sets_aside_checkpoints_cut_short_and_never_twice_onto_one_name(tmp_path, monkeypatch):
    from envace_gym.recipes.train import _resume_point

    def checkpoint(step, complete):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if complete:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")

    checkpoint(10, True), checkpoint(20, False)
    (tmp_path / "incomplete-checkpoint-20").mkdir()  # a crash at step 20 before this one
    (tmp_path / "incomplete-checkpoint-20" / "x").write_text("kept")
    monkeypatch.setenv("RANK", "1")  # not the first process: it only skips the cut checkpoint
    assert _resume_point(tmp_path) == str(tmp_path / "checkpoint-10") and (tmp_path / "checkpoint-20").is_dir()
    monkeypatch.setenv("RANK", "0")
    assert _resume_point(tmp_path) == str(tmp_path / "checkpoint-10")
    assert not (tmp_path / "checkpoint-20").exists() and (tmp_path / "incomplete-checkpoint-20-2").is_dir()
    assert (tmp_path / "incomplete-checkpoint-20" / "x").read_text() == "kept"
