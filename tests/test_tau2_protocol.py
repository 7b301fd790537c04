"""τ²-Bench as τ² runs it: the ``"tau2"`` user protocol of ``tau2:*`` domains. τ²'s own user system prompt (its
guidelines file, the scenario in tags), greedy replies with no budget, the greeting in both histories, tool errors
answered as τ² answers them, ``max_messages`` counted as τ²'s orchestrator counts it, ``max_errors``, and every end but
the user's stop scored 0, with its termination reason."""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401  (registers the ids)
from envace_gym.domains.user_protocol import ENVACE_PROTOCOL, NO_BUDGET, OPENING
from envace_gym.episode.users import UserSimulator, check_user, make_user
from envace_gym.testing import ScriptedPolicy

pytest.importorskip("tau2", reason="τ²-Bench not installed: make benchmarks")

from envace_gym.envs.tau2.protocol import TAU2_PROTOCOL, TAU2_USER_SAMPLING  # noqa: E402
TAU2 = Path(next(iter(importlib.util.find_spec("tau2").submodule_search_locations)))


def _tau2_constant(module: str, name: str) -> str:
    """A string constant of one of τ²'s modules, read from its source (those modules import LiteLLM)."""
    for node in ast.parse((TAU2 / module).read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            value = node.value
            return value.func.value.value.strip() if isinstance(value, ast.Call) else value.value
    raise LookupError(name)


class RecordingPolicy(ScriptedPolicy):
    """Records the sampling of every batch."""

    def __init__(self, responses):
        super().__init__(responses)
        self.params, self.lengths = [], []

    def generate(self, prompts, params):
        self.params.append(params)
        self.lengths.append(max(map(len, prompts)))
        return super().generate(prompts, params)


def _env(user, **kwargs):
    return gym.make("EnvACE-Rehearsal-v0", domain="tau2:retail", policy=ScriptedPolicy([]), executor="real", user=user,
                    **kwargs).unwrapped  # fmt: skip


def _user(opening="Hi, I need help with an order of mine.", then="Go ahead."):
    return RecordingPolicy(lambda prompt: opening if prompt.count("<|im_start|>user") == 1 else then)


def _task(env, calls: int, communicate: bool | None = None):
    """A training task with at least ``calls`` gold actions (and, if given, with or without information to tell)."""
    return next(
        t for t in env.domain.tasks("train")
        if len(t.expected["gold_actions"]) >= calls and communicate in (None, bool(t.expected["communicate_info"]))
    )  # fmt: skip


def test_the_user_gets_tau2s_system_prompt_word_for_word_and_replies_greedily_without_a_budget():
    model = _user()
    env = _env(model)  # a Policy as the user: it plays under the domain's protocol
    task = env.domain.tasks("train")[3]
    env.reset(seed=0, options={"task": task.id})
    assert env.user.protocol is TAU2_PROTOCOL and env.user.reply_sampling == TAU2_USER_SAMPLING
    # τ²'s UserSimulator.system_prompt: its template, its guidelines file, the scenario as τ² renders it
    guidelines = (TAU2 / "data/tau2/user_simulator/simulation_guidelines.md").read_text()
    template = _tau2_constant("user/user_simulator.py", "SYSTEM_PROMPT")
    expected = template.format(global_user_sim_guidelines=guidelines, instructions=task.expected["user_scenario"])
    assert env.user.messages(task, ())[0] == {"role": "system", "content": expected}
    assert "<scenario>" in expected and "###OUT-OF-SCOPE###" in expected
    # greedy, and bounded only by what the user's context leaves
    (params,) = model.params
    assert params.temperature == 0.0 and params.max_new_tokens == model.max_context - model.lengths[0]
    # the greeting the user answered opens the agent's history too
    assert env.episode.messages[1:3] == [
        {"role": "assistant", "content": OPENING},
        {"role": "user", "content": "Hi, I need help with an order of mine."},
    ]  # fmt: skip


def test_the_users_sampling_can_be_set_and_settings_that_would_not_apply_are_refused():
    policy = ScriptedPolicy([])
    user = make_user("llm", lambda: policy, protocol=TAU2_PROTOCOL, temperature=0.5, max_tokens=64)
    assert (user.reply_sampling.temperature, user.reply_sampling.max_new_tokens) == (0.5, 64)
    assert make_user("llm", lambda: policy).reply_sampling.temperature == 0.7  # the "envace" protocol's
    endpoint = make_user("http://localhost:1/v1", lambda: policy, "m", protocol=TAU2_PROTOCOL).model
    assert endpoint.params["temperature"] == 0.0 and "max_tokens" not in endpoint.params  # the server's own bound
    for user, kwargs, says in (
        ("scripted", {"temperature": 0.0}, "has none"),
        (UserSimulator(policy), {"max_tokens": 5}, "its own sampling"),
        ("rehearse", {"temperature": 0.3}, "policy's own temperature"),
        ("llm", {"max_tokens": -1}, "no budget"),
    ):
        with pytest.raises(ValueError, match=says):
            check_user(user, None, kwargs.get("temperature"), kwargs.get("max_tokens"))
    with pytest.raises(ValueError, match="has none"):
        _env("scripted", user_temperature=0.0)
    assert UserSimulator(policy).for_protocol(TAU2_PROTOCOL).protocol is TAU2_PROTOCOL  # none named: the domain's
    assert UserSimulator(policy, protocol=ENVACE_PROTOCOL).for_protocol(TAU2_PROTOCOL).protocol is ENVACE_PROTOCOL
    assert NO_BUDGET == 0


@pytest.mark.parametrize(("max_steps", "turns"), [(3, 1), (4, 2), (5, 2), (6, 3)])
def test_max_steps_ends_the_run_with_reward_0_where_tau2s_orchestrator_counts_it(max_steps, turns):
    """τ² counts each message (the user's opening 1, an agent's call 2, the tool responses 3, ...) and checks the bound
    only when the next message is not for the tools: after the responses, not after the call."""
    env = _env(_user(), max_messages=max_steps)
    env.reset(seed=0, options={"task": _task(env, calls=3).id})
    for turn in range(1, turns + 1):
        *_, reward, terminated, truncated, info = env.step(env.episode.reference_act())
        assert (terminated or truncated) == (turn == turns), turn
    assert truncated and not terminated and reward == 0.0 and not info["reward_masked"]
    assert info["termination_reason"] == "max_steps" and info["truncation"] == "max_steps"


def test_tool_errors_are_answered_as_tau2_answers_them_and_max_errors_ends_the_run_with_reward_0():
    from tau2.data_model.message import ToolCall as Tau2Call
    from tau2.domains.retail.environment import get_environment

    env = _env(_user(), max_errors=3)
    env.reset(seed=0, options={"task": env.domain.tasks("train")[0].id})
    missing = '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W0000000"}}</tool_call>'
    *_, terminated, truncated, info = env.step(missing)
    tau2 = get_environment().get_response(
        Tau2Call(id="1", name="get_order_details", arguments={"order_id": "#W0000000"}, requestor="assistant")
    )
    assert tau2.error and env.episode.messages[-1]["content"] == tau2.content  # "Error: ...", word for word
    assert not (terminated or truncated) and env.episode.transcript.errors == 1  # answered, and the run goes on
    *_, terminated, truncated, info = env.step('<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>')
    assert not (terminated or truncated) and env.episode.transcript.errors == 2  # an invalid call is answered too (feedback)
    *_, reward, terminated, truncated, info = env.step(missing)
    assert terminated and reward == 0.0 and info["termination_reason"] == "too_many_errors"


@pytest.mark.slow
def test_every_end_but_the_users_stop_scores_0_under_tau2_and_the_trajectory_under_envace():
    """All the gold actions done, the run cut by the turn bound: τ² gives 0 (a premature end); the "envace" protocol
    scores what was done."""
    for protocol, expected in ((TAU2_PROTOCOL, 0.0), (ENVACE_PROTOCOL, 1.0)):
        env = _env(UserSimulator(_user(), protocol=protocol), on_invalid="feedback", max_turns=1)
        task = next(t for t in env.domain.tasks("train")
                    if len(t.expected["gold_actions"]) == 1 and not t.expected["communicate_info"])  # fmt: skip
        env.reset(seed=0, options={"task": task.id})
        *_, reward, terminated, truncated, info = env.step(env.episode.reference_act())
        assert truncated and info["termination_reason"] == "max_turns" and reward == expected, protocol


def test_on_invalid_terminate_is_refused_under_tau2():
    env = _env(_user(), on_invalid="terminate")
    with pytest.raises(ValueError, match="not τ²'s"):
        env.reset(seed=0, options={"task": env.domain.tasks("train")[0].id})


@pytest.mark.slow
def test_a_stopped_run_is_scored_by_tau2s_evaluators_and_evaluation_counts_how_runs_ended():
    from envace_gym.evaluation import evaluate

    env = _env(_user(then="###STOP###"))
    task = _task(env, calls=1, communicate=False)
    env.reset(seed=0, options={"task": task.id})
    done = False
    while not done:
        *_, reward, terminated, truncated, info = env.step(env.episode.reference_act())
        done = terminated or truncated
    assert terminated and info["termination_reason"] == "user_stop" and reward == 1.0
    agent = ScriptedPolicy(lambda prompt: "How can I help?")
    result = evaluate(agent, "tau2:retail", "train", num_tasks=2, fidelity=False, user=_user(then="###STOP###"))
    assert result.terminations == {"user_stop": 2} and result.per_task[0]["termination_reason"] == "user_stop"


class FakeJudge:
    """A chat backend answering with the given replies, recording each prompt."""

    def __init__(self, *replies):
        self.replies, self.prompts = list(replies), []

    def complete(self, prompts, attempt=0):
        self.prompts += prompts
        return [self.replies.pop(0) for _ in prompts]


ASSERTIONS = ["The agent confirms the order details before acting.", "The agent does not share other users' data."]


def _verdict(*met):
    return json.dumps({"results": [{"expectedOutcome": a, "reasoning": "...", "metExpectation": m}
                                   for a, m in zip(ASSERTIONS, met, strict=True)]})  # fmt: skip


def _play_v1_task(judge):
    """A τ² v1.0-style task (DB and natural-language assertions), its gold actions replayed."""
    from envace_gym.envs.tau2 import Tau2Domain

    domain = Tau2Domain("retail", judge=judge)
    task = domain.tasks("train")[0]
    task = replace(task, expected={**task.expected, "reward_basis": ["DB", "NL_ASSERTION"], "nl_assertions": ASSERTIONS})
    env = gym.make("EnvACE-Rehearsal-v0", domain=domain, policy=ScriptedPolicy([]), executor="real").unwrapped
    env.reset(seed=0, options={"task": task})
    done = False
    while not done:
        *_, reward, terminated, truncated, info = env.step(env.episode.reference_act())
        done = terminated or truncated
    return reward, info


@pytest.mark.slow
def test_nl_assertions_are_judged_with_tau2s_judge_prompt_or_masked_with_a_reason():
    judge = FakeJudge(_verdict(True, True))
    reward, info = _play_v1_task(judge)
    assert reward == 1.0 and info["reward_checks"] == {"db": True, "nl_assertions": True}
    (prompt,) = judge.prompts
    system = next(n.value.value for n in ast.walk(ast.parse((TAU2 / "evaluator/evaluator_nl_assertions.py").read_text()))
                  if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "system_prompt")  # fmt: skip
    assert prompt[0] == {"role": "system", "content": system}  # τ²'s own judge prompt
    assert str(ASSERTIONS) in prompt[1]["content"] and "expectedOutcomes:" in prompt[1]["content"]
    assert "user: " in prompt[1]["content"] and "assistant: " in prompt[1]["content"]  # the conversation, by role
    reward, info = _play_v1_task(FakeJudge(_verdict(True, False)))
    assert reward == 0.0 and info["reward_checks"]["nl_assertions"] is False
    unreadable = FakeJudge("the agent did well", '{"results": []}')  # prose, then no verdict per assertion
    reward, info = _play_v1_task(unreadable)
    assert info["reward_masked"] and "could not be read" in info["reward_note"] and len(unreadable.prompts) == 2
    reward, info = _play_v1_task(None)
    assert info["reward_masked"] and "needs a judge" in info["reward_note"]


def _as_tau2(messages):
    """An episode's messages as τ²'s message objects (the agent's system prompt left out, as τ²'s trajectory)."""
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    out = []
    for m in messages:
        if m["role"] == "user":
            out.append(UserMessage(role="user", content=m["content"]))
        elif m["role"] == "assistant":
            calls = [ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                     for c in m.get("tool_calls", [])]  # fmt: skip
            out.append(AssistantMessage(role="assistant", content=None if calls else m["content"], tool_calls=calls or None))
        elif m["role"] == "tool":
            out.append(ToolMessage(id=m["tool_call_id"], role="tool", content=m["content"], requestor="assistant"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tau2:retail", "tau2:airline"])
def test_our_score_equals_tau2s_evaluate_simulation_on_the_same_messages(name):
    """Four tasks of each domain, each played three ways (the gold actions and what must be told; the last action
    dropped; the information withheld), stopped by the simulated user: our reward equals τ²'s
    ``evaluate_simulation`` of the same messages. A run cut by ``max_steps`` earns 0 in both."""
    pytest.importorskip("litellm", reason="τ²'s evaluator imports LiteLLM (make benchmarks)")
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    env = gym.make("EnvACE-Rehearsal-v0", domain=name, policy=ScriptedPolicy([]), executor="real",
                   user=_user(then="###STOP###")).unwrapped  # fmt: skip

    def tau2_reward(task, reason):
        run = SimulationRun(id="run", task_id=task.id, start_time="", end_time="", duration=0.0,
                            termination_reason=reason, messages=_as_tau2(env.episode.messages))  # fmt: skip
        raw = env.domain._raw_by_id[task.id]
        return evaluate_simulation(run, raw, EvaluationType.ALL, solo_mode=False, domain=env.domain.domain).reward

    tasks = [t for t in env.domain.tasks("train") if t.expected["gold_actions"]][:4]
    pairs = []
    for task in tasks:
        for variant in ("gold", "last action dropped", "information withheld"):
            env.reset(seed=0, options={"task": task.id})
            plan = [env.episode.reference_action(turn) for turn in task.reference]
            if variant == "last action dropped":
                del plan[-2]
            elif variant == "information withheld":
                plan[-1] = "Everything is done."
            for action in plan:
                *_, reward, terminated, truncated, info = env.step(action)
            assert terminated and info["termination_reason"] == "user_stop", (task.id, variant)
            pairs.append((task.id, variant, reward, tau2_reward(task, TerminationReason.USER_STOP)))
    assert all(ours == theirs for _, _, ours, theirs in pairs), [p for p in pairs if p[2] != p[3]]
    assert {p[2] for p in pairs} == {0.0, 1.0}  # both outcomes occur: the check can fail
    env.config = replace(env.config, max_messages=3)
    env.reset(seed=0, options={"task": tasks[0].id})
    *_, reward, terminated, truncated, info = env.step(env.episode.reference_act())
    assert info["termination_reason"] == "max_steps" and reward == 0.0
    assert tau2_reward(tasks[0], TerminationReason.MAX_STEPS) == 0.0


def test_a_user_who_cannot_open_the_conversation_fails_the_run_under_tau2():
    """τ² counts a run whose user could not write its first message as the user's failure: the first step ends it
    (masked in training, a failed run in evaluation), where the looser protocol goes on with the task's prompt."""
    env = _env(_user(opening=""))  # an empty first message cannot be used
    _, info = env.reset(seed=0, options={"task": env.domain.tasks("train")[0].id})
    assert "empty" in info["user_opening_error"]
    *_, reward, terminated, truncated, info = env.step("How can I help?")
    assert truncated and info["reward_masked"] and info["termination_reason"] == "user_error"
    env = _env(UserSimulator(_user(opening=""), protocol=ENVACE_PROTOCOL))
    env.reset(seed=0, options={"task": env.domain.tasks("train")[0].id})
    *_, terminated, truncated, info = env.step("How can I help?")
    assert not (terminated or truncated) and info["user"]["text"] == "Go ahead."
