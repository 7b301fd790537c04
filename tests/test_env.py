from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envace_gym
from envace_gym import (
    EnvACEError,
    GeneratedDomain,
    RehearsalConfig,
    RehearsalEnv,
    SamplingParams,
    Task,
    TaskNotFoundError,
    ToolCall,
    ToolExecutor,
    make_domain,
    tool,
)
from envace_gym.parsing import RESULT_CLOSE
from envace_gym.testing import ScriptedPolicy, oracle_policy


def make(domain="bank", policy=None, **kwargs):
    return gym.make("EnvACE-Rehearsal-v0", domain=domain, policy=policy, **kwargs)


def play_reference(env, task_id):
    env.reset(options={"task": task_id})
    task = env.unwrapped.episode.task
    steps = []
    for turn in task.reference:
        steps.append(env.step(turn.text))
        if steps[-1][2] or steps[-1][3]:
            break
    return task, steps


def test_registered_ids_make_the_env(tiny):
    assert isinstance(gym.make("envace_gym:EnvACE-Rehearsal-v0", policy=tiny).unwrapped, RehearsalEnv)
    env = make("units", tiny)
    assert env.unwrapped.domain.name == "units" and env.spec.id == "EnvACE-Rehearsal-v0"


# Benchmark families are checked on one member each (their data comes from `make benchmarks`, as in CI).
FAMILY_MEMBERS = {"bfcl": ("bfcl_eval", "bfcl:simple_python"), "tau2": ("tau2", "tau2:retail")}
# τ²'s prompt (its written policy and 15 tool schemas, ~18k bytes) outgrows the tiny model's 8192 positions
# under its byte-level tokenizer, so every episode would end at once on the context: a scripted policy (no
# context limit) rehearses there instead.
NEEDS_LONG_CONTEXT = {"tau2"}


@pytest.mark.parametrize(
    "name",  # tau2's: seconds of benchmark data and its user; make test runs it
    [pytest.param(n, marks=pytest.mark.slow) if n.rpartition("-v")[0] in NEEDS_LONG_CONTEXT else n
     for n in envace_gym.list_domains()],  # fmt: skip
)
def test_check_env_passes(tiny, name):
    """Gymnasium's own checker on every registered domain (reset/step API, spaces, seeding determinism)."""
    family = name.rpartition("-v")[0]  # "bfcl-v0": checked on one of its members
    package, domain = FAMILY_MEMBERS.get(family, (None, name))
    if package is not None:
        pytest.importorskip(package, reason=f"{name}: benchmark data not installed (make benchmarks)")
    policy = ScriptedPolicy(lambda prompt: '{"status": "ok"}') if family in NEEDS_LONG_CONTEXT else tiny
    env = make(domain, policy, rehearsal=RehearsalConfig(max_new_tokens=8))
    check_env(env.unwrapped)


def test_random_actions_get_typed_errors(tiny):
    env = make("bank", tiny, rehearsal=RehearsalConfig(max_new_tokens=8), on_invalid="feedback")
    env.reset(seed=0)
    env.unwrapped.action_space.seed(0)
    codes = set()
    for _ in range(40):
        action = env.unwrapped.action_space.sample()
        assert env.unwrapped.action_space.contains(action)
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["error"] is not None, action
        codes.add(info["error"]["code"])
        if terminated or truncated:
            env.reset()
    assert {"INVALID_TOOL_CALL_FORMAT", "TOOL_NOT_AVAILABLE"} <= codes


def test_spaces_admit_any_text(tiny):
    env = make("units", tiny)
    for text in ["", "plain", '{"json": [1, 2]}', "unicode é 中 😀 \x00 \u202e"]:
        assert env.observation_space.contains(text) and env.action_space.contains(text)
    assert not env.action_space.contains(b"bytes")
    assert not env.action_space.contains("x" * (env.unwrapped.config.limits.max_action_chars + 1))


def test_reset_seeded_draw_and_explicit_tasks(tiny):
    env = make("units", tiny)
    obs_a, info_a = env.reset(seed=5)
    obs_b, info_b = env.reset(seed=5)
    assert obs_a == obs_b and info_a["task_id"] == info_b["task_id"]
    assert env.reset(options={"task": "units/003"})[1]["task_id"] == "units/train/003"
    test_env = make("units", tiny, split="test")
    assert test_env.reset(options={"task": "units/003"})[1]["task_id"] == "units/test/003"
    task = make_domain("units").tasks("test")[1]
    assert env.reset(options={"task": task})[1]["task_id"] == task.id
    with pytest.raises(TaskNotFoundError):
        env.reset(options={"task": "units/train/5000"})
    with pytest.raises(EnvACEError, match="task id or a Task"):
        env.reset(options={"task": 3})


def test_observation_and_messages(tiny):
    env = make("bank", tiny, executor="real")
    obs, info = env.reset(options={"task": "bank/000"})
    assert obs.endswith("<|im_start|>assistant\n") and '"name": "transfer"' in obs
    assert '"name": "list_transactions"' not in obs  # not on this task's whitelist
    task = env.unwrapped.episode.task
    obs, reward, terminated, truncated, info = env.step(task.reference[0].text)
    assistant, tool_msg = info["messages"][-2:]
    assert assistant["role"] == "assistant" and assistant["content"] == task.reference[0].text
    assert assistant["tool_calls"][0]["function"]["name"] == "find_accounts"
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert json.loads(tool_msg["content"]) == task.reference[0].results[0]
    assert "<tool_response>" in obs and task.reference[0].text in obs  # the raw Act text, token-faithful
    assert info["calls"][0]["route"] == "real"


def test_rehearsal_mode_with_a_perfect_simulator_earns_full_reward():
    domain = make_domain("bank")
    task = domain.tasks("train")[2]
    oracle = oracle_policy(domain, task)
    env = make("bank", oracle)
    _, steps = play_reference(env, task.id)
    obs, reward, terminated, truncated, info = steps[-1]
    assert terminated and reward == 1.0 and info["success"]
    first = steps[0][4]
    (rehearsal,) = first["rehearsals"]
    assert rehearsal["accepted"] and first["calls"][0]["route"] == "rehearsal"
    assert len(rehearsal["completion_ids"]) == len(rehearsal["logprobs"]) > 0 and rehearsal["prompt_ids"]
    prompt = oracle.prompts[0]
    assert "precise tool simulator" in prompt and "Reference executions" in prompt
    assert task.reference[0].text in prompt  # the agent's raw latest turn
    assert json.dumps(task.reference[0].results[0]) in prompt  # privileged ground truth


def test_a_broken_rehearsal_terminates_with_zero_or_feeds_back(tiny):
    env = make("units", tiny, rehearsal=RehearsalConfig(max_new_tokens=6))
    task, steps = play_reference(env, "units/000")
    obs, reward, terminated, truncated, info = steps[0]
    assert terminated and reward == 0.0 and info["error"]["code"] == "INVALID_REHEARSAL"
    assert info["rehearsals"][0]["accepted"] is False
    with pytest.raises(EnvACEError, match="episode is over"):
        env.step("more")
    env = make("units", tiny, rehearsal=RehearsalConfig(max_new_tokens=6), on_invalid="feedback")
    task, steps = play_reference(env, "units/000")
    assert not steps[0][2] and "error_tool_call" in steps[0][4]["messages"][-1]["content"]
    obs, reward, terminated, truncated, info = steps[-1]
    # the agent's valid call still counts for the reward: the failure was the simulator's
    assert terminated and info["reward_checks"] == {"calls": True, "answer_numbers": True}


@pytest.mark.parametrize(
    "action, code",
    [
        ('<tool_call>{"name": "transfer"</tool_call>', "INVALID_TOOL_CALL_FORMAT"),
        (ToolCall("list_transactions", {"account_id": "ACC-1"}).to_text(), "TOOL_NOT_AVAILABLE"),
        (
            ToolCall("transfer", {"from_account": "A", "to_account": "B", "amount": "10"}).to_text(),
            "INVALID_PARAMETERS",
        ),
    ],
)
def test_invalid_calls(action, code):
    env = make("bank", ScriptedPolicy([]))
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and reward == 0.0 and info["error"]["code"] == code and info["rehearsals"] == []
    env = make("bank", ScriptedPolicy([]), on_invalid="feedback")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert not terminated and info["error"]["code"] == code
    assert json.loads(info["messages"][-1]["content"])["error_tool_call"]["code"] == code


def test_one_invalid_call_in_a_turn_stops_the_valid_ones_too():
    env = make("bank", ScriptedPolicy([]), executor="real")
    env.reset(options={"task": "bank/000"})
    good = ToolCall("get_balance", {"account_id": "ACC-1"}).to_text()
    bad = ToolCall("get_balance", {}).to_text()
    obs, reward, terminated, truncated, info = env.step(good + bad)
    assert terminated and [c["route"] for c in info["calls"]] == [None, None]
    assert all(not r.validated for r in env.unwrapped.episode.records)


def test_cached_mode_answers_reference_calls_from_ground_truth():
    env = make("bank", ScriptedPolicy(lambda p: '{"from": "policy"}\n' + RESULT_CLOSE), executor="cached")
    env.reset(options={"task": "bank/000"})
    task = env.unwrapped.episode.task
    *_, info = env.step(task.reference[0].text)
    assert info["calls"][0]["route"] == "cache" and info["calls"][0]["result"] == task.reference[0].results[0]
    *_, info = env.step(ToolCall("get_balance", {"account_id": "ACC-0000"}).to_text())
    assert info["calls"][0]["route"] == "rehearsal" and info["calls"][0]["result"] == {"from": "policy"}


def test_mixed_mode_routes_by_p_real_from_the_env_rng():
    policy = ScriptedPolicy(lambda p: '{"rehearsed": true}\n' + RESULT_CLOSE)
    call = ToolCall("find_accounts", {"owner": "Nobody"}).to_text()

    def routes(p_real, seed):
        env = make("bank", policy, executor="mixed", p_real=p_real, max_turns=30)
        env.reset(seed=seed)
        return [env.step(call)[4]["calls"][0]["route"] for _ in range(20)]

    assert set(routes(1.0, 0)) == {"real"} and set(routes(0.0, 0)) == {"rehearsal"}
    mixed = routes(0.5, 1)
    assert {"real", "rehearsal"} == set(mixed) and mixed == routes(0.5, 1)


def test_scripted_user_turns_and_the_multi_turn_reward():
    env = make("travel", ScriptedPolicy([]), executor="real")
    task, steps = play_reference(env, "travel/004")
    user_turns = [m["content"] for m in steps[-1][4]["messages"] if m["role"] == "user"]
    assert user_turns == [task.prompt, *task.user_turns]
    assert not steps[0][2]  # the first final answer is followed by the next user turn
    assert steps[-1][1] == 1.0 and steps[-1][2]


def test_truncation_at_max_turns():
    env = make("bank", ScriptedPolicy([]), executor="real", max_turns=3)
    env.reset(seed=0)
    call = ToolCall("find_accounts", {"owner": "Nobody"}).to_text()
    results = [env.step(call) for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True] and results[-1][4]["truncation"] == "max_turns"
    assert results[-1][4]["reward_checks"]["state"] is True  # nothing changed the ledger...
    assert results[-1][1] == 0.5  # ...but no answer was given


def test_context_guard_truncates(tiny):
    probe = make("bank", tiny, executor="real")
    probe.reset(options={"task": "bank/000"})
    room = len(probe.unwrapped.episode.prompt_ids) + 64 + 8  # the opening prompt and one 64-token turn, barely
    small = type(tiny)(tiny.model, tiny.tokenizer, max_context=room)
    env = make("bank", small, executor="real", act_sampling=SamplingParams(max_new_tokens=64))
    env.reset(options={"task": "bank/000"})
    task = env.unwrapped.episode.task
    infos = [env.step(turn.text)[4] for turn in task.reference[:1]]
    assert infos[-1]["truncation"] == "context"


def test_text_turns_reserve_nothing_and_one_that_does_not_fit_ends_the_episode_whole():
    from envace_gym.episode import Episode, EpisodeConfig, EpisodeDriver
    from envace_gym.rollout import collect_rollouts

    domain = make_domain("bank")
    task = domain.task("bank/000")
    policy = ScriptedPolicy([])
    rng = np.random.default_rng(0)

    def episode(max_context):
        return Episode(domain, task, EpisodeConfig(executor="real"), policy.tokenizer, rng, max_context=max_context,
                       act_max_new_tokens=0)  # fmt: skip

    probe = episode(1_000_000)
    EpisodeDriver(policy, rng).drive([probe.play_turn(task.reference[0].text)])
    fits = len(probe.prompt_ids)  # exactly the first turn and its answer
    played = episode(fits)
    (first,) = EpisodeDriver(policy, rng).drive([played.play_turn(task.reference[0].text)])
    assert not (first.terminated or first.truncated) and played.prompt_ids == probe.prompt_ids
    before = (list(played.prompt_ids), list(played.messages))
    (second,) = EpisodeDriver(policy, rng).drive([played.play_turn(task.reference[1].text)])
    assert second.truncated and second.info["truncation"] == "context" and played.turn == 1
    assert (played.prompt_ids, played.messages) == before  # nothing of the turn that did not fit was kept
    # a replay reserves nothing for Act turns it does not generate: two turns fit exactly, both are played
    EpisodeDriver(policy, rng).drive([probe.play_turn(task.reference[1].text)])
    policy.max_context = len(probe.prompt_ids)
    (result,) = collect_rollouts(policy, domain, [task], executor="real", act="reference").episodes
    assert result.turns >= 2


def test_returns_schema_failures_are_resampled():
    answers = iter(['{"val": 1}\n' + RESULT_CLOSE, '{"value": 3}\n' + RESULT_CLOSE])
    policy = ScriptedPolicy(lambda p: next(answers))
    env = make(CounterDomain(), policy, rehearsal=RehearsalConfig(returns_resamples=1))
    env.reset(seed=0)
    *_, info = env.step(ToolCall("increment", {"by": 3}).to_text())
    assert [r["accepted"] for r in info["rehearsals"]] == [False, True]
    assert info["rehearsals"][0]["error"]["code"] == "RESULT_SCHEMA_MISMATCH"
    assert info["calls"][0]["result"] == {"value": 3}


def test_an_executor_crash_is_a_typed_error():
    env = make(CounterDomain(), ScriptedPolicy([]), executor="real", on_invalid="feedback")
    env.reset(seed=0)
    *_, info = env.step(ToolCall("increment", {"by": 13}).to_text())
    assert info["error"]["code"] == "EXECUTION_ERROR" and "ZeroDivisionError" in info["error"]["message"]


def test_act_records_generated_ids_and_logprobs(tiny):
    env = make(
        "units", tiny, rehearsal=RehearsalConfig(max_new_tokens=4), act_sampling=SamplingParams(max_new_tokens=8)
    )
    obs, _ = env.reset(seed=0)
    text = env.unwrapped.act()
    *_, info = env.step(text)
    act = info["act"]
    assert act["generated"] and len(act["completion_ids"]) == len(act["logprobs"])
    assert act["prompt_ids"] == tiny.tokenizer(obs, add_special_tokens=False)["input_ids"]
    env.reset(seed=0)
    *_, info = env.step("A final answer.")
    act = info["act"]
    assert not act["generated"] and act["logprobs"] is None
    assert env.unwrapped.policy.tokenizer.decode(act["completion_ids"], skip_special_tokens=True) == "A final answer."


def test_render_ansi(tiny):
    env = make("units", tiny, render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert text.startswith("=== units/") and "[user]" in text


def test_render_human_prints_each_message_once(tiny, capsys):
    """Gymnasium's check_env makes a "human" env, resets it (which renders) and calls render(): the
    conversation is printed once, not twice; a step prints only its new messages."""
    check_env(make("units", tiny, rehearsal=RehearsalConfig(max_new_tokens=8)).unwrapped)
    printed = capsys.readouterr().out
    assert printed.count("=== units/") == 1 and printed.count("[user]") == 1, printed
    env = make("units", tiny, render_mode="human", rehearsal=RehearsalConfig(max_new_tokens=8))
    env.reset(seed=0)
    assert env.render() is None and capsys.readouterr().out.count("[user]") == 1
    env.step("A final answer.")
    after = capsys.readouterr().out
    assert "[assistant] A final answer." in after and "[user]" not in after and "===" not in after


def test_bad_arguments_are_refused_early(tiny):
    with pytest.raises(ValueError, match="executor must be one of"):
        make("bank", tiny, executor="imaginary")
    with pytest.raises(ValueError, match="on_invalid"):
        make("bank", tiny, on_invalid="ignore")
    with pytest.raises(ValueError, match="p_real"):
        make("bank", tiny, p_real=2.0)
    with pytest.raises(ValueError, match="render_mode"):
        RehearsalEnv("bank", tiny, render_mode="rgb_array")


# -- a tiny custom domain used above ----------------------------------------------------------------
class CounterTools(ToolExecutor):
    @tool(returns={"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]})
    def increment(self, by: int) -> dict:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        if by == 13:
            return {"value": 1 // 0}  # a bug in the executor
        self.state["value"] = self.state.get("value", 0) + by
        return {"value": self.state["value"]}


class CounterDomain(GeneratedDomain):
    name = "counter"
    executor_class = CounterTools
    num_tasks = {"train": 5, "test": 5}
    test_fraction = 0.5

    def sample_params(self, rng: np.random.Generator):
        return {"by": int(rng.integers(1, 100))}

    def build_task(self, params, task_id, split):
        return Task(task_id, self.name, f"Add {params['by']}.", split, expected={"state": {"value": params["by"]}})


def test_episode_config_build_coerces_and_validates():
    from envace_gym.episode import MAX_USER_TURNS, EpisodeConfig
    from envace_gym.parsing import Limits

    config = EpisodeConfig.build(executor="real", rehearsal={"max_new_tokens": 7}, limits={"max_calls_per_turn": 2})
    assert config.rehearsal == RehearsalConfig(max_new_tokens=7) and config.limits == Limits(max_calls_per_turn=2)
    assert EpisodeConfig.build() == EpisodeConfig() and EpisodeConfig().max_user_turns is None  # the protocol's
    env = gym.make("EnvACE-Rehearsal-v0", domain="units", policy=ScriptedPolicy([]), executor="real").unwrapped
    env.reset(seed=0)
    assert env.episode.max_user_turns == MAX_USER_TURNS and env.episode.on_invalid == "terminate"
    with pytest.raises(ValueError, match="max_messages must be at least 1"):
        EpisodeConfig.build(max_messages=0)
    assert EpisodeConfig.build(rehearsal=RehearsalConfig(prefill=False)).rehearsal.prefill is False
    with pytest.raises(TypeError, match="unknown episode setting"):
        EpisodeConfig.build(max_turnz=3)
    with pytest.raises(TypeError, match="unknown RehearsalConfig field"):
        EpisodeConfig.build(rehearsal={"max_tokens": 3})
    with pytest.raises(TypeError, match="limits must be a Limits"):
        EpisodeConfig.build(limits=5)
    with pytest.raises(ValueError, match="executor must be one of"):
        EpisodeConfig.build(executor="oracle")


def test_generation_requests_and_call_states_hold_only_what_is_read():
    import dataclasses

    from envace_gym.episode import CallState, GenerationRequest

    assert [f.name for f in dataclasses.fields(GenerationRequest)] == ["prompt_ids", "params", "key"]
    state = CallState(ToolCall("find_accounts", {"owner": "Dara"}))
    assert (state.route, state.response, state.error) == (None, None, None)


def test_the_env_hands_out_its_episode_step_and_keeps_an_actors_generation(tiny):
    from envace_gym.episode import EpisodeDriver

    env = make("bank", tiny, executor="real", act_sampling=SamplingParams(max_new_tokens=8, temperature=0))
    inner = env.unwrapped
    assert inner.current_episode is None
    env.reset(seed=0)
    assert inner.current_episode is inner.episode
    seen = []

    def actor(episodes, rng, session, keys):
        seen.append((list(episodes), list(keys)))
        return inner.driver().generate([e.prompt_ids for e in episodes], SamplingParams(max_new_tokens=8), keys)

    step = inner.turn_coroutine(ToolCall("find_accounts", {"owner": "Nobody"}).to_text())
    (outcome,) = EpisodeDriver.without_policy("the real executor answers").drive([step])
    assert not (outcome.terminated or outcome.truncated) and outcome.info["act"]["generated"] is False
    action = inner.act(actor=actor)
    assert seen == [([inner.episode], [inner.episode.key])]
    info = env.step(action)[4]
    assert info["act"]["generated"]  # the actor's generation was kept, ids and log-probs


def test_a_fork_with_a_note_starts_from_the_noted_prompt(tiny):
    import dataclasses

    env = make("bank", tiny, executor="real")
    env.reset(seed=0)
    episode = env.unwrapped.episode
    config = dataclasses.replace(episode.config, executor="rehearsal")
    plain = episode.fork(config, np.random.default_rng(0))
    assert plain.prompt_ids == episode.prompt_ids and plain.prompt_text == episode.prompt_text
    # what a simulated user would see: the fork's own copy, so its imagined answers never reach the real user
    assert plain.user_view == episode.user_view and plain.user_view is not episode.user_view
    noted = episode.fork(config, np.random.default_rng(0), note="Remember: look the account up first.")
    assert (noted.prompt_ids, noted.prompt_text) == episode.prompt_with_note("Remember: look the account up first.")
    assert episode.prompt_text.count("Remember") == 0  # the episode itself is unchanged
