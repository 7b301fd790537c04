"""What the learning study needs, each on its own: the executor-free reward, a frozen simulator, zero-variance
groups, resumable training, the settings every condition shares, and the `lights` domain."""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import pytest
import torch

import envace_gym  # noqa: F401
from envace_gym import make_domain
from envace_gym.domains.reward import score_reference
from envace_gym.domains.trajectory import Trajectory
from envace_gym.recipes.experiment import ExperimentConfig, _token_budget, command_line
from envace_gym.recipes.train import TrainConfig
from envace_gym.rollout.collector import collect_rollouts
from envace_gym.testing import ScriptedPolicy, tiny_policy
from envace_gym.tools.executor import ToolExecutor
from envace_gym.training.sft import sft_rows, sft_steps, tiny_start_model
from envace_gym.training.trainer import TrainerConfig, train


def reference_policy(domain, task, tokenizer=None):
    """Acts the task's reference turn by turn and rehearses each call with its recorded result."""
    turns = [t.text for t in task.reference]
    results = [json.dumps(r) for t in task.reference for r in t.results]

    def respond(prompt: str) -> str:
        if "precise tool simulator" in prompt:
            return f"{results.pop(0)}\n</execution_result>"
        return turns.pop(0)

    return ScriptedPolicy(respond, tokenizer)


# -- the executor-free reward ------------------------------------------------------------------------------
def test_reference_reward_runs_no_tool_and_agrees_with_the_domain_on_the_reference(monkeypatch):
    bank = make_domain("bank")
    task = bank.tasks("train")[3]
    executed = []
    original = ToolExecutor.execute
    monkeypatch.setattr(ToolExecutor, "execute", lambda self, call: executed.append(call) or original(self, call))
    batch = collect_rollouts(
        reference_policy(bank, task), bank, [task], executor="rehearsal", reward="reference", on_invalid="feedback"
    )
    (episode,) = batch.episodes
    assert executed == []  # nothing real ran: not the calls, not the reward
    assert episode.reward == 1.0 and episode.success and set(episode.checks) == {"calls", "answer_numbers"}
    # the same episode under bank's own reward: the ledger check replays the calls into the real tools
    batch = collect_rollouts(
        reference_policy(bank, task), bank, [task], executor="rehearsal", reward="domain", on_invalid="feedback"
    )
    assert executed and batch.episodes[0].reward == 1.0 and "state" in batch.episodes[0].checks


def test_reference_reward_fails_a_wrong_call_and_a_missing_fact():
    bank = make_domain("bank")
    task = bank.tasks("train")[3]
    nothing = score_reference(task, Trajectory(task, (), (), ("I cannot help.",)))
    assert nothing.score == 0.0 and not nothing.success and nothing.checks["calls"] is False


def test_reward_setting_is_checked():
    from envace_gym.episode.config import EpisodeConfig

    with pytest.raises(ValueError, match="reward must be one of"):
        EpisodeConfig(reward="judge")


# -- the frozen simulator ----------------------------------------------------------------------------------
def test_frozen_simulator_rehearses_and_only_act_rows_train():
    units = make_domain("units")
    task = units.tasks("train")[0]
    call = task.reference[0].text
    acting = ScriptedPolicy([call, "It is 1.00."])
    simulator = ScriptedPolicy(lambda prompt: '{"value": 1.0, "unit": "km"}\n</execution_result>')
    batch = collect_rollouts(acting, units, [task], simulator=simulator, on_invalid="feedback")
    assert len(simulator.prompts) == 1 and "precise tool simulator" in simulator.prompts[0]
    assert all("precise tool simulator" not in p for p in acting.prompts)
    with pytest.raises(ValueError, match="separate"):
        collect_rollouts(acting, units, [task], simulator=simulator, rehearsal_mode="inline")
    assert {s.role for s in batch.samples()} == {"act", "rehearse"}  # the trainer drops the rehearse rows


def test_trainer_with_a_frozen_simulator_keeps_it_frozen_and_trains_act_rows_only():
    policy = tiny_policy(seed=3)
    simulator = tiny_policy(seed=3)
    before = [p.detach().clone() for p in simulator.model.parameters()]
    config = TrainerConfig(
        domain="units", steps=1, tasks_per_step=1, group_size=2, max_new_tokens=8, frozen_simulator=True,
        on_invalid="feedback",
    )  # fmt: skip
    (metrics,) = train(policy, config, simulator=simulator)
    assert metrics["rows/rehearse"] == 0 and metrics["rows/act"] > 0
    assert all(torch.equal(a, b) for a, b in zip(before, simulator.model.parameters(), strict=True))


# -- zero-variance groups, refill, resume --------------------------------------------------------------------
def test_zero_variance_groups_are_counted_and_refilled():
    policy = tiny_policy(seed=4)  # an untrained model: every episode earns 0, so every group has no spread
    base = dict(domain="units", steps=1, tasks_per_step=2, group_size=2, max_new_tokens=6, on_invalid="feedback")
    (plain,) = train(policy, TrainerConfig(**base))
    assert (plain["frac_reward_zero_std"], plain["rollouts/groups"]) == (1.0, 2)
    assert plain["tokens/trained"] > 0 and plain["loss"] == 0.0
    (refilled,) = train(policy, TrainerConfig(**base, refill_zero_std=2))
    # 2 groups, then 2 rounds of 2 more, none with a spread
    assert (refilled["frac_reward_zero_std"], refilled["rollouts/groups"]) == (1.0, 6)
    assert refilled["tokens/trained"] == 0 and refilled["rows/act"] == 0  # nothing informative was kept


def test_reward_spread_tells_groups_with_different_rewards_and_leaves_masked_episodes_out():
    import dataclasses

    units = make_domain("units")
    batch = collect_rollouts(tiny_policy(seed=4), units, units.tasks("train")[:2], 2, on_invalid="feedback")
    rewards = {(0, 0): 0.0, (0, 1): 1.0, (1, 0): None, (1, 1): 1.0}  # (group, place in group) -> reward
    places: dict[int, int] = {}
    episodes = []
    for e in batch.episodes:
        place = places[e.group] = places.get(e.group, -1) + 1
        episodes.append(dataclasses.replace(e, reward=rewards[e.group, place]))
    assert type(batch)(episodes).reward_spread() == {0: True, 1: False}


def test_training_resumes_from_its_checkpoint(tmp_path):
    config = TrainerConfig(domain="units", steps=3, tasks_per_step=1, group_size=2, max_new_tokens=6, seed=5)
    whole = tiny_policy(seed=6)
    train(whole, config)
    cut = tiny_policy(seed=6)
    seen = []
    train(cut, TrainerConfig(**{**config.__dict__, "steps": 2}), checkpoint=tmp_path / "state.pt", checkpoint_every=1,
          on_checkpoint=seen.append)  # fmt: skip
    resumed = tiny_policy(seed=6)
    history = train(resumed, config, checkpoint=tmp_path / "state.pt", checkpoint_every=1)
    assert seen == [1, 2] and [h["step"] for h in history] == [1, 2, 3]
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    # without checkpoint_every, the state is still saved at the end
    (first,) = train(tiny_policy(seed=6), TrainerConfig(**{**config.__dict__, "steps": 1}), checkpoint=tmp_path / "end.pt")
    later = train(tiny_policy(seed=6), config, checkpoint=tmp_path / "end.pt")
    assert (tmp_path / "end.pt").exists() and later[0] == first  # step 1 was loaded, not played again


def test_sft_steps_resume_where_they_stopped(tmp_path):
    start = tiny_start_model("lights", tmp_path / "start")
    common = dict(tasks=4, batch_size=2, learning_rate=1e-3, seed=0, checkpoint_every=1)
    whole = sft_steps(start, "lights", tmp_path / "whole", steps=3, **common)
    sft_steps(start, "lights", tmp_path / "cut", steps=2, checkpoint=tmp_path / "s.pt", **common)
    resumed = sft_steps(start, "lights", tmp_path / "cut", steps=3, checkpoint=tmp_path / "s.pt", **common)
    assert [h["step"] for h in resumed] == [1, 2, 3]
    assert [h["loss"] for h in resumed] == pytest.approx([h["loss"] for h in whole], abs=1e-5)


# -- settings every condition shares -----------------------------------------------------------------------
def test_train_config_on_invalid_and_reward():
    assert TrainConfig(mode="rehearsal").on_invalid is None  # the episode's: terminate, feedback under tau2
    assert TrainConfig(mode="real-tools").on_invalid == "feedback"
    # an episode setting a mode cannot honour is refused by name, not dropped
    with pytest.raises(ValueError, match="cannot honour max_errors, user"):
        TrainConfig(mode="real-tools", user="llm", max_errors=3)
    with pytest.raises(ValueError, match="max_turns set how rollouts are played"):
        TrainConfig(mode="sft", max_turns=2)
    with pytest.raises(ValueError, match="the conditions choose .*: drop rehearsal_mode"):
        ExperimentConfig(rehearsal_mode="inline")
    with pytest.raises(ValueError, match="real-tools answers a schema error"):
        TrainConfig(mode="real-tools", on_invalid="terminate")
    with pytest.raises(ValueError, match="reward must be one of"):
        TrainConfig(reward="state")
    assert TrainConfig(lr_scheduler_type="constant").lr_scheduler_type == "constant"
    with pytest.raises(ValueError, match="mode sft plays none"):
        TrainConfig(mode="sft", reward="reference")
    # what TRL would refuse with a traceback after the output folder is written, refused with the config
    for bad, says in (({"group_size": 1}, "group_size must be at least 2"), ({"tasks_per_step": 0}, "tasks_per_step"),
                      ({"save_steps": 0}, "save_steps must be at least 1"),
                      ({"warmup_steps": 1.5}, "a whole number of steps, got 1.5"),
                      ({"lr_scheduler_type": "bogus"}, "lr_scheduler_type must be one of")):  # fmt: skip
        with pytest.raises(ValueError, match=says):
            TrainConfig(**bad)
    assert TrainConfig(warmup_steps=0.1).warmup_steps == 0.1 and TrainConfig(warmup_steps=3).warmup_steps == 3


def test_experiment_defaults_write_under_the_output_folder_and_print_their_command(tmp_path):
    config = ExperimentConfig(output_dir=str(tmp_path / "exp"))
    assert config.results_path == tmp_path / "exp" / "results.md"
    assert ExperimentConfig(results_file="docs/x.md").results_path.as_posix() == "docs/x.md"
    assert command_line(config).startswith("envace experiment --domain lights:easy --model tiny")
    with pytest.raises(ValueError, match="unknown conditions"):
        ExperimentConfig(conditions=["sft", "magic"])
    # the RL conditions run after the SFT they start from, whatever the order given; None is spelled "default"
    assert ExperimentConfig(conditions=["sft+envace-separate", "sft", "base"]).conditions == [
        "base", "sft", "sft+envace-separate"]  # fmt: skip
    assert "--model default" in command_line(ExperimentConfig(model=None))


def test_experiment_refuses_a_run_it_cannot_finish_or_would_mix_before_loading_anything(tmp_path):
    from envace_gym.errors import EnvACEError
    from envace_gym.recipes.experiment import run_experiment

    out = tmp_path / "exp"
    with pytest.raises(EnvACEError, match=r"SFT model, which .* does not hold for seeds \[0, 1\]: add the 'sft'"):
        run_experiment(ExperimentConfig(output_dir=str(out), seeds=[0, 1], conditions=["sft+envace-separate"]))
    assert not out.exists()  # refused before anything was written
    base = dict(output_dir=str(out), seeds=[0], conditions=["base"], eval_tasks=2, sft_tasks=4)
    run_experiment(ExperimentConfig(**base), log=lambda *a: None)
    assert json.loads((out / "settings.json").read_text())["eval_tasks"] == 2
    with pytest.raises(EnvACEError, match=r"other settings \(eval_tasks: 2 then, 3 now\)"):
        run_experiment(ExperimentConfig(**{**base, "eval_tasks": 3}))
    run_experiment(ExperimentConfig(**{**base, "seeds": [0, 1], "threads": 1}), log=lambda *a: None)  # not measured
    # one domain by its registered id: a folder written with a bare name resumes under the versioned id
    assert json.loads((out / "settings.json").read_text())["domain"] == "lights:easy-v0"
    (out / "settings.json").write_text((out / "settings.json").read_text().replace("lights:easy-v0", "lights:easy"))
    run_experiment(ExperimentConfig(**{**base, "domain": "lights:easy-v0"}), log=lambda *a: None)
    (out / "settings.json").write_text((out / "settings.json").read_text().replace("lights:easy-v0", "lights"))
    with pytest.raises(EnvACEError, match=r"other settings \(domain: 'lights-v0' then, 'lights:easy-v0' now\)"):
        run_experiment(ExperimentConfig(**base))  # another domain ("lights" is the whole family's latest)


def test_report_only_runs_no_stage_and_reports_the_finished_ones(tmp_path, monkeypatch):
    from envace_gym.errors import EnvACEError
    from envace_gym.recipes import experiment
    from envace_gym.recipes.experiment import run_experiment

    out = tmp_path / "exp"
    base = dict(output_dir=str(out), seeds=[0], conditions=["base"], eval_tasks=2, sft_tasks=4)
    with pytest.raises(EnvACEError, match=r"holds no finished stage of seeds \[0\]"):
        run_experiment(ExperimentConfig(**base, report_only=True), log=lambda *a: None)
    run_experiment(ExperimentConfig(**base), log=lambda *a: None)
    monkeypatch.setattr(experiment, "_run_stage", lambda *a: pytest.fail("report_only ran a stage"))
    said: list[str] = []
    cut = {**base, "seeds": [0, 1], "conditions": ["base", "sft", "sft+envace-separate"]}
    run_experiment(ExperimentConfig(**cut, report_only=True), log=said.append)  # no SFT model, and none refused
    assert said[-2] == (
        "not finished, left out: seed 0 sft, seed 0 sft+envace-separate, seed 1 base, seed 1 sft, "
        "seed 1 sft+envace-separate"
    )
    written = json.loads((out / "experiment.json").read_text())
    assert [(r["condition"], r["seed"]) for r in written["records"]] == [("base", 0)]
    assert written["config"]["seeds"] == [0, 1] and "report_only" not in written["config"]
    assert "--report_only" not in written["command"]  # the file the whole run writes
    rows = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| base ")]
    assert len(rows) == 1 and rows[0].startswith("| base | 0 | ")  # the seeds a row averages


def test_the_report_takes_differences_seed_by_seed_on_the_seeds_both_conditions_hold():
    from envace_gym.recipes.experiment import CONDITIONS
    from envace_gym.recipes.experiment_report import _FIRST, paired_differences

    assert sorted(_FIRST) == sorted(CONDITIONS)  # every condition has its place in a difference

    def record(greedy: float, sampled: float, reward: float) -> dict[str, float]:
        return {"success": greedy, "success_sampled": sampled, "mean_reward": reward}

    records = {
        "sft": {0: record(0.2, 0.3, 0.5), 1: record(0.4, 0.4, 0.5)},
        "sft+grpo-real-tools": {0: {"success": 0.5, "mean_reward": 0.6}},  # from before sampled success existed
        "sft+envace-separate": {0: record(0.6, 0.4, 0.7), 1: record(0.8, 0.6, 0.9)},
    }
    rows = [line for line in paired_differences(records) if line.startswith("| sft")]
    assert rows == [
        "| sft+envace-separate − sft+grpo-real-tools | 0 | +0.100 ± 0.000 (±0.000) [+0.100] | n/a [n/a] "
        "| +0.100 ± 0.000 (±0.000) [+0.100] |",
        "| sft+envace-separate − sft | 0, 1 | +0.400 ± 0.000 (±0.000) [+0.400, +0.400] "
        "| +0.150 ± 0.071 (±0.050) [+0.100, +0.200] | +0.300 ± 0.141 (±0.100) [+0.200, +0.400] |",
        "| sft+grpo-real-tools − sft | 0 | +0.300 ± 0.000 (±0.000) [+0.300] | n/a [n/a] "
        "| +0.100 ± 0.000 (±0.000) [+0.100] |",
    ]
    no_seed_in_common = {"sft": records["sft"], "sft+envace-separate": {2: record(0, 0, 0)}}
    assert paired_differences(no_seed_in_common) == []


def test_the_report_splits_fidelity_by_tool_over_the_seeds_that_measured_it():
    from envace_gym.recipes.experiment_report import fidelity_by_tool

    def measured(equal: float, fields: float, rehearsals: int) -> dict[str, float]:
        return {"rehearsals": rehearsals, "parsed": 1.0, "equal": equal, "fields": fields}

    def record(fields: float) -> dict[str, object]:
        return {"rehearsal_by_tool": {"copying": {"transfer": measured(1.0, 1.0, 3)},
                                      "own_calls": {"get_balance": measured(0.0, fields, 4)}}}  # fmt: skip

    records = {"sft": {0: {"success": 0.0}, 1: record(0.5)}, "sft+envace-separate": {0: record(0.2), 1: record(0.4)}}
    assert fidelity_by_tool(records)[2:] == [
        "| pass | tool | sft (1) | sft+envace-separate (0, 1) |",  # seed 0's sft record is from before the split
        "|---|---|---|---|",
        "| rehearsal = real, own result in prompt (copying) | `transfer` | 1.000 | 1.000 |",
        "| fields right, the policy's own calls (rehearsals) | `get_balance` | 0.500 (4) | 0.300 (8) |",
    ]
    assert fidelity_by_tool({"sft": {0: {"success": 0.0}}}) == []


@pytest.mark.default_model
@pytest.mark.parametrize(("study", "records", "stages"), [("units", "units-135m", 12), ("bank", "bank-135m", 9)])
def test_the_documented_study_command_regenerates_its_committed_json(study, records, stages, tmp_path, monkeypatch):
    """docs/results.md's study command (its last: the one over the stages that finished, with --report_only where
    some did not), run over the committed stage records (no stage runs, only the default model's tokenizer is read
    for the token budget), writes the committed experiment json."""
    import shlex
    import shutil
    from pathlib import Path

    from envace_gym.cli.main import _parse_settings
    from envace_gym.recipes.experiment import run_experiment

    docs = Path(__file__).resolve().parents[1] / "docs"
    command = [line for line in (docs / "results.md").read_text().splitlines()
               if line.startswith("envace experiment ") and f"--output_dir runs/study-{study} " in line][-1]  # fmt: skip
    shutil.copytree(docs / "results" / f"study-{records}", tmp_path / "runs" / f"study-{study}")
    monkeypatch.chdir(tmp_path)
    config = _parse_settings(ExperimentConfig, "envace experiment", shlex.split(command)[2:])
    run_experiment(config, log=lambda *a: None)
    written = json.loads((tmp_path / "runs" / f"study-{study}" / "experiment.json").read_text())
    committed = json.loads((docs / "results" / f"experiment-{records}.json").read_text())
    assert len(written["records"]) == stages  # seeds x conditions
    for key in ("command", "config", "dtype", "backend", "max_new_tokens", "records"):
        assert written[key] == committed[key], key
    if any(r.get("curve") for r in written["records"]):  # a curve needs an RL stage
        assert (tmp_path / "runs" / f"study-{study}" / f"curve-{study}.png").is_file()


def test_token_budget_fits_every_reference_turn_and_result(tmp_path):
    start = tiny_start_model("lights", tmp_path / "start")
    from transformers import AutoTokenizer

    rows = sft_rows("lights", AutoTokenizer.from_pretrained(start), make_domain("lights").tasks("train")[:10])
    budget = _token_budget(make_domain("lights"), str(start), 10)
    assert budget >= max(sum(r["completion_mask"]) for r in rows) + 8


# -- the lights domain --------------------------------------------------------------------------------------
def test_lights_domain_plays_and_holds_out_pairs():
    from gymnasium.utils.env_checker import check_env

    lights = make_domain("lights")
    train_pairs = {(t.expected["calls"][0]["arguments"]["room"], t.expected["calls"][0]["arguments"]["color"])
                   for t in lights.tasks("train")[:300]}  # fmt: skip
    test_pairs = {(t.expected["calls"][0]["arguments"]["room"], t.expected["calls"][0]["arguments"]["color"])
                  for t in lights.tasks("test")[:100]}  # fmt: skip
    assert test_pairs and not test_pairs & train_pairs
    env = gym.make("EnvACE-Rehearsal-v0", domain="lights", policy=tiny_policy(), executor="real")
    check_env(env.unwrapped, skip_render_check=True)
    task = lights.tasks("test")[0]
    env.reset(seed=0, options={"task": task})
    _, _, _, _, info = env.step(task.reference[0].text)
    assert info["calls"][0]["result"]["lamp_id"] == task.expected["answer_contains"][0]
    _, reward, terminated, _, info = env.step(task.reference[1].text)
    assert terminated and reward == 1.0 and info["success"]
    with pytest.raises(ValueError, match="rooms must be in"):
        type(lights)(rooms=9)


def test_lights_favorite_asks_for_a_color_it_never_names():
    """The learning test's domain: the request names no color; the reference (and so the reward) uses the
    household's usual one, which another household sets otherwise."""
    red, green = make_domain("lights:favorite"), make_domain("lights", rooms=1, report_id=False, favorite="green")
    for domain, color in ((red, "red"), (green, "green")):
        tasks = domain.tasks("train")[:20] + domain.tasks("test")[:20]
        assert {t.expected["calls"][0]["arguments"]["color"] for t in tasks} == {color}
        assert {t.expected["answer_contains"][0] for t in tasks} == {color}
        assert not any(c in t.prompt for t in tasks for c in ("red", "green"))
    assert len({t.prompt for t in red.tasks("train")[:20]}) == 3  # the three phrasings, the same in both
    assert {t.prompt for t in red.tasks("train")[:20]} == {t.prompt for t in green.tasks("train")[:20]}
    with pytest.raises(ValueError, match="favorite must be one of"):
        type(red)(favorite="teal")


def test_trainer_config_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="on_invalid must be one of"):
        TrainerConfig(on_invalid="ignore")
    with pytest.raises(ValueError, match="frozen_simulator rehearses"):
        TrainerConfig(frozen_simulator=True, rehearsal_mode="inline")
    with pytest.raises(ValueError, match="frozen_simulator rehearses"):
        TrainerConfig(frozen_simulator=True, executor="real")
    with pytest.raises(ValueError, match="epsilon \\(the clip range\\) must be positive"):
        TrainerConfig(epsilon=0.0)
    with pytest.raises(ValueError, match="delta \\(the dual-clip bound\\) must exceed 1 \\+ epsilon = 1.2, got 1.1"):
        TrainerConfig(delta=1.1)  # PPO's clip keeps ratios up to 1.2: a bound under it would stop their gradient
    TrainerConfig(delta=None), TrainerConfig(delta=3.0)


def test_fidelity_tells_copying_from_simulation():
    """A rehearser that can only copy a result shown in its prompt: perfect with its own result there, never
    right once it is withheld."""
    from envace_gym.evaluation import evaluate

    def copier(prompt: str) -> str:
        if "precise tool simulator" not in prompt:
            return "I cannot tell."  # its Act turns: the evaluation's first pass
        lines = prompt.splitlines()
        last = max(i for i, x in enumerate(lines) if x.startswith("call: "))  # the call to simulate
        target = lines[last].removesuffix("<|im_end|>")
        for i in range(last):
            if lines[i] == target and lines[i + 1] == "<execution_result>":  # a reference of the same call
                return f"{lines[i + 2]}\n</execution_result>"
        return '{"unknown": true}\n</execution_result>'

    result = evaluate(ScriptedPolicy(copier), "units", "test", num_tasks=3)
    assert result.rehearsals == 3
    assert result.equal_to_real == 1.0 and result.parsed_withheld == 1.0 and result.equal_to_real_withheld == 0.0
    assert result.own_calls == 0  # its Act turns call nothing: no own call to rehearse


def test_the_withheld_pass_keeps_the_answers_format_from_another_task():
    """On a single-call domain, withholding a call's own result left its rehearse prompt with no execution at
    all, so a rehearser that follows the format it is shown could not parse; with another task's execution of
    the same tool shown in its place it writes the format (parse 1.0) and still cannot copy the answer."""
    from envace_gym.evaluation import evaluate

    prompts = []

    def follower(prompt: str) -> str:
        if "precise tool simulator" not in prompt:
            return "I cannot tell."
        prompts.append(prompt)
        lines = prompt.splitlines()
        shown = [lines[i + 1] for i in range(len(lines) - 1) if lines[i] == "<execution_result>"]
        if not shown:
            return "no idea\n</execution_result>"
        return json.dumps(dict.fromkeys(json.loads(shown[0]), 0)) + "\n</execution_result>"  # the format, no data

    bare = evaluate(ScriptedPolicy(follower), "units", "test", num_tasks=3, format_example=False)
    assert bare.parsed == 1.0 and bare.parsed_withheld == 0.0  # nothing shown: nothing parsable
    prompts.clear()
    kept = evaluate(ScriptedPolicy(follower), "units", "test", num_tasks=3)
    assert kept.parsed_withheld == 1.0 and kept.equal_to_real_withheld == 0.0 and kept.fields_withheld < 1.0
    withheld = [p for p in prompts if "from another task" in p]
    assert len(withheld) == 3  # the withheld pass's three rehearsals, one example each
    assert all("Reference executions" not in p for p in withheld)  # the task's own result is still withheld


def test_fidelity_rehearses_the_policys_own_calls():
    """The third pass rehearses the calls the policy itself makes (here 7 grams to kilograms, which no
    reference makes): a copier has nothing to copy, a simulator that runs the tool gets them right."""
    from envace_gym.evaluation import evaluate
    from envace_gym.tools import ToolCall

    units = make_domain("units")
    call = {"name": "convert_mass", "arguments": {"value": 7, "from_unit": "g", "to_unit": "kg"}}
    own = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    def policy(simulate: bool):
        def respond(prompt: str) -> str:
            if "precise tool simulator" not in prompt:
                return "Done." if "<tool_response>" in prompt else own  # Act: one own call, then an answer
            line = [x for x in prompt.splitlines() if x.startswith("call: ")][-1]
            call, _ = json.JSONDecoder().raw_decode(line[len("call: "):])
            result = units.make_executor(units.tasks("test")[0]).execute(ToolCall(call["name"], call["arguments"]))
            return (json.dumps(result) if simulate else '{"value": 0, "unit": "kg"}') + "\n</execution_result>"

        return ScriptedPolicy(respond)

    simulator, guesser = (evaluate(policy(s), "units", "test", num_tasks=2) for s in (True, False))
    assert simulator.own_calls == guesser.own_calls == 2
    assert simulator.parsed_own_calls == guesser.parsed_own_calls == 1.0
    assert (simulator.equal_to_real_own_calls, guesser.equal_to_real_own_calls) == (1.0, 0.0)
    assert (simulator.fields_own_calls, guesser.fields_own_calls) == (1.0, 0.5)  # the guesser gets the unit right


def test_fidelity_splits_by_tool_and_by_whether_the_world_had_changed():
    """On bank-v0 a simulator that answers every call from the task's opening ledger (it carries no state) gets
    find_accounts and the transfer right, and the balance read after the transfer wrong: the split by tool, with
    the calls made after a state change apart, shows where it fails; the pooled figure hides it."""
    from envace_gym.evaluation import evaluate
    from envace_gym.tools import ToolCall

    bank = make_domain("bank-v0")
    task = bank.tasks("test")[0]
    assert [c.name for c, _ in task.reference_pairs()] == ["find_accounts", "transfer", "get_balance"]

    def stateless(prompt: str) -> str:
        if "precise tool simulator" not in prompt:
            return "Done."
        line = [x for x in prompt.splitlines() if x.startswith("call: ")][-1]
        call, _ = json.JSONDecoder().raw_decode(line[len("call: "):])
        result = bank.make_executor(task).execute(ToolCall(call["name"], call["arguments"]))  # a fresh ledger
        return json.dumps(result) + "\n</execution_result>"

    result = evaluate(ScriptedPolicy(stateless), bank, tasks=[task])
    copying = result.fidelity_by_tool["copying"]
    assert list(copying) == ["find_accounts", "get_balance after a state change", "transfer"]
    assert copying["find_accounts"].equal == copying["transfer"].equal == 1.0
    assert copying["get_balance after a state change"].equal == 0.0
    assert copying["get_balance after a state change"].fields < 1.0  # the balance is stale, the account right
    assert result.equal_to_real == 2 / 3
    assert result.fidelity_by_tool["own_calls"] == {}  # the policy answered at once: no call of its own
    assert result.to_dict()["fidelity_by_tool"]["copying"]["transfer"]["rehearsals"] == 1


@pytest.mark.slow
def test_experiment_runs_the_inline_and_frozen_simulator_conditions(tmp_path):
    from envace_gym.recipes.experiment import run_experiment

    config = ExperimentConfig(
        domain="lights:easy", output_dir=str(tmp_path), seeds=[0], sft_tasks=4, sft_steps=2, rl_steps=1,
        tasks_per_step=1, group_size=2, eval_tasks=1, eval_every=1, max_new_tokens=12,
        conditions=["sft", "sft+envace-inline", "sft+envace-frozen-sim"],
    )  # fmt: skip
    records = run_experiment(config, log=lambda _: None)["records"]
    inline, frozen = records["sft+envace-inline"][0], records["sft+envace-frozen-sim"][0]
    assert inline["real_tool_executions"] == frozen["real_tool_executions"] == 0
    metrics = [json.loads(line) for line in (tmp_path / "seed-0" / "sft+envace-frozen-sim" / "metrics.jsonl").open()]
    assert metrics[0]["rows/rehearse"] == 0  # the frozen simulator's rows are not trained
    assert records["sft"][0]["real_tool_executions"] > 0  # SFT's rows are laid out by replaying the references


def test_an_rl_stage_saves_every_step_and_evaluates_every_eval_every(tmp_path, monkeypatch):
    from envace_gym.recipes import experiment
    from envace_gym.recipes.experiment import run_experiment
    from envace_gym.training import trainer

    saved, save_state = [], trainer.save_state
    monkeypatch.setattr(trainer, "save_state", lambda path, *a: saved.append(len(a[-1])) or save_state(path, *a))
    final = tmp_path / "seed-0" / "sft+envace-separate" / "final" / "config.json"
    model_there, evaluate = [], experiment._evaluate
    def spy(*args, **kwargs):  # the RL stage's evaluations name `fidelity`
        if "fidelity" in kwargs:
            model_there.append(final.is_file())
        return evaluate(*args, **kwargs)
    monkeypatch.setattr(experiment, "_evaluate", spy)
    config = ExperimentConfig(
        domain="lights:easy", output_dir=str(tmp_path), seeds=[0], sft_tasks=4, sft_steps=1, rl_steps=3,
        tasks_per_step=1, group_size=2, eval_tasks=1, eval_every=2, max_new_tokens=8,
        conditions=["sft", "sft+envace-separate"],
    )  # fmt: skip
    (record,) = run_experiment(config, log=lambda _: None)["records"]["sft+envace-separate"].values()
    assert saved == [1, 2, 3]  # a run cut off loses one step at most
    assert [p["step"] for p in record["curve"]] == [0, 2, 3]
    assert model_there == [False, True]  # the final model is saved before its (long) last evaluation


def test_an_sft_stage_kept_as_its_record_alone_has_its_model_trained_again_for_rl(tmp_path):
    """A study in pieces on fresh machines: only the finished stages' records are carried over."""
    import shutil

    from envace_gym.recipes.experiment import run_experiment

    config = dict(
        domain="lights:easy", output_dir=str(tmp_path), seeds=[0], sft_tasks=4, sft_steps=2, rl_steps=1,
        tasks_per_step=1, group_size=2, eval_tasks=1, eval_every=1, max_new_tokens=8,
    )  # fmt: skip
    run_experiment(ExperimentConfig(**config, conditions=["sft"]), log=lambda _: None)
    stage = tmp_path / "seed-0" / "sft"
    weights = (stage / "final" / "model.safetensors").read_bytes()
    kept = json.loads((stage / "record.json").read_text())
    for path in stage.iterdir():  # the machine is gone: only the record is left
        if path.name != "record.json":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    lines: list[str] = []
    records = run_experiment(ExperimentConfig(**config, conditions=["sft+envace-separate"]), log=lines.append)
    assert (stage / "final" / "model.safetensors").read_bytes() == weights  # seeded: the same model again
    record = json.loads((stage / "record.json").read_text())
    assert {k: record[k] for k in kept} == kept and record["rebuilt"][0]["sft_loss"] == kept["sft_loss"]
    assert any("trained again" in line for line in lines)
    rl = records["records"]["sft+envace-separate"][0]
    assert rl["curve"][0]["success"] == kept["success"]  # step 0 is the recorded SFT evaluation


@pytest.mark.slow
def test_experiment_runs_its_stages_in_worker_processes_each_after_what_it_starts_from(tmp_path):
    from envace_gym.recipes.experiment import run_experiment

    config = ExperimentConfig(
        domain="lights:easy", output_dir=str(tmp_path), seeds=[0, 1], sft_tasks=4, sft_steps=2, rl_steps=1,
        tasks_per_step=1, group_size=2, eval_tasks=1, eval_every=1, max_new_tokens=12, workers=2,
        conditions=["sft", "sft+envace-separate"],
    )  # fmt: skip
    records = run_experiment(config, log=lambda _: None)["records"]
    for seed in (0, 1):
        sft, rl = records["sft"][seed], records["sft+envace-separate"][seed]
        assert rl["started"] >= sft["ended"]  # the RL stage starts from its seed's SFT model
        assert rl["curve"][0]["success"] == sft["success"] and [p["step"] for p in rl["curve"]] == [0, 1]
        stored = json.loads((tmp_path / f"seed-{seed}" / "sft+envace-separate" / "record.json").read_text())
        assert json.dumps(stored, sort_keys=True) == json.dumps(rl, sort_keys=True)  # (NaN != NaN in a dict)
    assert len(json.loads((tmp_path / "experiment.json").read_text())["records"]) == 4


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the workers follow their parent on Linux only")
def test_stopping_an_experiment_stops_its_workers(tmp_path):
    """SIGKILL to ``envace experiment``: its worker processes end too (Linux), instead of training on."""
    import os
    import signal
    import subprocess
    import time

    script = (
        "from envace_gym.recipes.experiment import ExperimentConfig, run_experiment\n"
        "if __name__ == '__main__':\n"
        f"    run_experiment(ExperimentConfig(domain='lights:easy', output_dir={str(tmp_path)!r}, seeds=[0, 1], "
        "conditions=['sft'], sft_tasks=4, sft_steps=100000, max_new_tokens=8, workers=2))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def workers() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            try:
                stat = open(f"/proc/{entry}/stat").read()
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
            except (OSError, ValueError):
                continue
            if entry.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == parent.pid and b"spawn_main" in cmdline:
                found.append(int(entry))
        return found

    started: list[int] = []
    try:
        deadline = time.time() + 120
        while not all((tmp_path / f"seed-{s}" / "sft").is_dir() for s in (0, 1)):  # both workers in a stage
            assert parent.poll() is None and time.time() < deadline, "the experiment did not start its stages"
            time.sleep(0.5)
        started = workers()
        assert len(started) == 2
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 30
        while any(os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]
                  for pid in started):  # fmt: skip
            assert time.time() < deadline, "a worker went on after its experiment was killed"
            time.sleep(0.2)
    finally:
        parent.kill()
        for pid in started or workers():
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)


def test_train_top_layers_leaves_the_top_layers_and_the_final_norm_trainable():
    from envace_gym.training.options import train_top_layers

    model = train_top_layers(tiny_policy(seed=7).model, 1)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("model.layers.1.", "model.norm.")) for n in trainable)
    assert any(n.startswith("model.norm.") for n in trainable)
    assert all(p.requires_grad for p in train_top_layers(tiny_policy(seed=7).model, None).parameters())


@pytest.mark.slow
def test_recomputing_layers_gives_the_same_gradients_and_the_experiment_asks_for_it(tmp_path, monkeypatch):
    from envace_gym.recipes.experiment import run_experiment
    from envace_gym.training import options
    from envace_gym.training.packing import checkpoints_layers
    from envace_gym.training.trainer import grpo_loss

    config = TrainerConfig(domain="units", max_new_tokens=6, dtype="float32", on_invalid="feedback")
    units = make_domain("units")
    batch = collect_rollouts(tiny_policy(seed=7), units, units.tasks("train")[:2], 2, on_invalid="feedback")
    rows = [s for s in batch.samples() if any(s.mask)]
    advantages = [(-1.0) ** i for i in range(len(rows))]  # any non-zero advantages: a gradient to compare
    grads = []
    for recompute in (False, True):
        model = tiny_policy(seed=7).model
        if recompute:
            options.enable_checkpointing(model)
        assert checkpoints_layers(model) == recompute
        model.train()
        loss, _ = grpo_loss(model, rows, advantages, config, sum(sum(r.mask) for r in rows))
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0 and torch.allclose(grads[0], grads[1], atol=1e-6)

    from envace_gym.training import sft

    asked = []
    for module in (options, sft):
        monkeypatch.setattr(module, "enable_checkpointing", lambda model: asked.append(model) or model)
    run_experiment(ExperimentConfig(
        domain="lights:easy", output_dir=str(tmp_path), seeds=[0], sft_tasks=4, sft_steps=1, rl_steps=1,
        tasks_per_step=1, group_size=2, eval_tasks=1, max_new_tokens=8, conditions=["sft", "sft+envace-separate"],
    ), log=lambda _: None)  # fmt: skip
    assert len(asked) == 2  # the SFT model and the RL stage's


# -- validation tasks -----------------------------------------------------------------------------------------
def test_evaluate_takes_its_tasks_and_names_their_split():
    from envace_gym.evaluation.evaluate import evaluate

    held_back = list(make_domain("units").tasks("train")[-3:])
    result = evaluate(ScriptedPolicy(lambda prompt: "I cannot say."), "units", "validation", tasks=held_back,
                      fidelity=False)  # fmt: skip
    assert result.split == "validation" and [t["task_id"] for t in result.per_task] == [t.id for t in held_back]


def test_rl_draws_only_from_the_first_train_tasks(monkeypatch):
    from envace_gym.training import trainer

    drawn = []

    def record(policy, domain, tasks, *args, **kwargs):
        drawn.extend(t.id for t in tasks)
        return collect_rollouts(policy, domain, tasks, *args, **kwargs)

    monkeypatch.setattr(trainer, "collect_rollouts", record)
    config = TrainerConfig(domain="units", steps=3, tasks_per_step=2, group_size=2, max_new_tokens=4, train_tasks=3)
    train(tiny_policy(seed=0), config)
    first = {t.id for t in make_domain("units").tasks("train")[:3]}
    assert len(drawn) == 6 and set(drawn) <= first
    with pytest.raises(ValueError, match="train_tasks"):
        TrainerConfig(train_tasks=1, tasks_per_step=2)


def test_experiment_evaluates_on_validation_tasks_it_never_trains_on(tmp_path):
    from envace_gym.errors import EnvACEError
    from envace_gym.recipes.experiment import run_experiment

    with pytest.raises(ValueError, match="val_tasks >= 1"):
        ExperimentConfig(eval_on="validation")
    with pytest.raises(EnvACEError, match=r"held back for validation, sft_tasks \(1000\)"):
        run_experiment(ExperimentConfig(domain="units", output_dir=str(tmp_path / "x"), sft_tasks=1000, val_tasks=5))
    config = ExperimentConfig(
        domain="lights:easy", output_dir=str(tmp_path / "exp"), seeds=[0], conditions=["base", "sft"], val_tasks=3,
        eval_on="validation", max_new_tokens=8, sft_tasks=4, sft_steps=1, group_size=2,
    )  # fmt: skip
    result = run_experiment(config, log=lambda _: None)
    (record,) = result["records"]["base"].values()
    assert record["evaluated_on"] == "validation" and record["eval_episodes"] == 3
    (sft,) = result["records"]["sft"].values()  # the start's reward spread, on the validation tasks
    assert sft["spread_groups"] == 3 and 0 <= sft["groups_with_spread"] <= 1 and "groups_with_spread" not in record
    assert "3 validation tasks (the last training tasks, never trained on)" in result["table"]
