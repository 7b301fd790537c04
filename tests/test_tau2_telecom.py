"""``tau2:telecom``, τ²-Bench's dual-control domain: the user holds the phone and has tools of its own. Gold replays
earn full reward, the simulated user's calls run on its side of the world (real or rehearsed) and only it sees
them, τ²'s guidelines for users with tools, and our score equals τ²'s ``evaluate_simulation``."""

from __future__ import annotations

import functools
import importlib.util
import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401  (registers the ids)
from envace_gym.domains import ReferenceTurn
from envace_gym.domains.check import reference_trajectory
from envace_gym.domains.trajectory import Trajectory
from envace_gym.episode.chat import ChatFormat
from envace_gym.testing import ScriptedPolicy, tiny_tokenizer
from envace_gym.tools import ToolCall

pytest.importorskip("tau2", reason="τ²-Bench not installed: make benchmarks")
TAU2 = Path(next(iter(importlib.util.find_spec("tau2").submodule_search_locations)))
# gold: the user turns airplane mode off, then roaming on (the line allows roaming: the agent need do nothing)
ROAMING = "tau2:telecom/[mobile_data_issue]airplane_mode_on|user_abroad_roaming_enabled_off[PERSONA:None]"


@functools.cache
def _chat():
    return ChatFormat.of(tiny_tokenizer())


def _call_text(name, arguments=None):
    """A call written as the tiny model writes one (the agent's and the user's format alike)."""
    return _chat().strip_end(_chat().act_text("", [ToolCall(name, arguments or {}).to_openai()]))


def _env(user, executor="real", **kwargs):
    return gym.make("EnvACE-Rehearsal-v0", domain="tau2:telecom", policy=kwargs.pop("policy", ScriptedPolicy([])),
                    executor=executor, user=user, **kwargs).unwrapped  # fmt: skip


@pytest.fixture(scope="module")
def domain():
    from envace_gym.domains.registry import make_domain

    return make_domain("tau2:telecom")


@pytest.mark.slow
def test_gold_replays_earn_full_reward_on_every_telecom_task_and_doing_nothing_earns_0(domain):
    """The reference solution (the agent's calls and the user's own, in τ²'s order) earns 1 on all 114 tasks; the
    agent's calls alone, or nothing at all, earn 0 wherever the user has something to do."""
    tasks = [*domain.tasks("train"), *domain.tasks("test")]
    assert len(tasks) == 114  # τ²'s base split: 74 train, 40 test
    users_part = 0
    for task in tasks:
        gold = reference_trajectory(task)
        assert [(r.requestor, r.call.name) for r in gold.calls] == [
            (a["requestor"], a["name"]) for a in task.expected["gold_sequence"]]  # fmt: skip
        assert domain.score(task, gold).score == 1.0, task.id
        assert domain.score(task, Trajectory(task, (), (), ())).score == 0.0, task.id
        if any(r.requestor == "user" for r in gold.calls):
            agent_only = tuple(r for r in gold.calls if r.requestor == "assistant")
            assert domain.score(task, Trajectory(task, (), agent_only, ())).score == 0.0, task.id
            users_part += 1
    assert users_part >= 90  # most of telecom's gold actions are the user's
    assert "toggle_roaming" in domain.user_tools_for(tasks[0]).names


def test_a_reference_turn_keeps_the_users_own_calls_through_its_dict():
    turn = ReferenceTurn("", (ToolCall("refuel_data", {"gb_amount": 2.0}),), ("ok",),
                         (ToolCall("toggle_roaming"),), ("Data Roaming is now ON.",))  # fmt: skip
    assert ReferenceTurn.from_dict(json.loads(json.dumps(turn.to_dict()))) == turn
    assert "user_calls" not in ReferenceTurn("done").to_dict()  # other domains' references stay as they were


def test_the_user_calls_its_own_tools_with_tau2s_guidelines_for_users_with_tools_and_the_agent_never_sees_them():
    user = ScriptedPolicy([])
    env = _env(user)
    user._responses = ["My mobile data does not work.", _call_text("toggle_airplane_mode"),
                       _call_text("toggle_roaming"), "Done, it works now.", "###STOP###"]  # fmt: skip
    env.reset(seed=0, options={"task": ROAMING})
    # the opening is written without tools; every later user prompt offers them, under τ²'s tools guidelines
    tools_guidelines = (TAU2 / "data/tau2/user_simulator/simulation_guidelines_tools.md").read_text().strip()
    plain_guidelines = (TAU2 / "data/tau2/user_simulator/simulation_guidelines.md").read_text().strip()
    assert plain_guidelines in user.prompts[0] and "toggle_roaming" not in user.prompts[0]
    *_, terminated, truncated, info = env.step("Please turn airplane mode off, then data roaming on.")
    assert tools_guidelines in user.prompts[1] and "toggle_roaming" in user.prompts[1]
    airplane, roaming = info["user_calls"]
    assert (airplane["name"], roaming["name"]) == ("toggle_airplane_mode", "toggle_roaming")
    assert all(c["requestor"] == "user" and c["route"] == "real" for c in (airplane, roaming))
    assert roaming["result"].startswith("Data Roaming is now ON.")  # the phone's own answer, in τ²'s words
    assert roaming["result"] in user.prompts[3]  # the results went back to the user ...
    agent_text = json.dumps(env.episode.messages[1:])  # (the system prompt, τ²'s policy, names the phone's tools)
    assert "Roaming is now ON" not in agent_text and "toggle_" not in agent_text  # ... never to the agent,
    assert "Done, it works now." in agent_text  # which gets the user's message
    assert env.episode.transcript.steps == 7  # τ²'s count: opening 1, agent 2, call 3, result 4, call 5, result 6, message 7
    *_, reward, terminated, truncated, info = env.step("Glad it works now.")
    assert terminated and info["termination_reason"] == "user_stop" and reward == 1.0  # τ²'s env assertions hold

    # the same run without the user's calls: the assertions fail
    user._responses = ["My mobile data does not work.", "Done.", "###STOP###"]
    env.reset(seed=0, options={"task": ROAMING})
    env.step("Please turn airplane mode off, then data roaming on.")
    *_, reward, terminated, truncated, info = env.step("Glad it works now.")
    assert terminated and reward == 0.0 and info["reward_checks"] == {"environment": False}


def test_under_rehearsal_the_policy_rehearses_the_users_tools_too():
    rehearsed = '{"status": "Roaming is now ON"}\n</execution_result>'  # after the prefilled opening tag
    policy = ScriptedPolicy(lambda prompt: rehearsed)
    user = ScriptedPolicy([])
    env = _env(user, executor="rehearsal", policy=policy)
    user._responses = ["No data abroad.", _call_text("toggle_roaming"), "Roaming is on.", "###STOP###"]
    env.reset(seed=0, options={"task": ROAMING})
    *_, info = env.step("Please turn data roaming on.")
    (call,) = info["user_calls"]
    assert call["route"] == "rehearsal" and call["result"] == {"status": "Roaming is now ON"}
    (prompt,) = [p for p in policy.prompts if "toggle_roaming" in p]
    assert "check_status_bar" in prompt and "enable_roaming" not in prompt  # the user's tools are the candidates
    assert "Please turn data roaming on." in prompt  # after the whole conversation
    assert "Data Roaming is now ON" in prompt  # the reference's own user calls are its reference executions
    assert [r.role for r in env.episode.rows] == ["rehearse"]  # a training row of the Rehearse role
    assert env.episode.executor is None or env.episode.executor.calls_executed == 0  # nothing ran for real


def test_a_user_call_that_is_not_one_of_its_tools_is_answered_with_an_error_and_counts_as_one(domain):
    user = ScriptedPolicy([])
    env = _env(user, max_errors=1)
    user._responses = ["No data.", _call_text("enable_roaming", {"customer_id": "C1001", "line_id": "L1002"})]
    env.reset(seed=0, options={"task": ROAMING})
    *_, reward, terminated, truncated, info = env.step("Please check your phone.")
    (call,) = info["user_calls"]
    assert call["error"]["code"] == "TOOL_NOT_AVAILABLE"  # an agent tool is not the user's
    assert terminated and info["termination_reason"] == "too_many_errors" and reward == 0.0


def _as_tau2_run(episode):
    """The τ² messages of a telecom episode: each valid call (the agent's and the user's, in their order) and its
    recorded result; the texts do not enter τ²'s environment and action checks."""
    from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage
    from tau2.data_model.message import ToolCall as Tau2Call

    out = []
    for i, record in enumerate(r for r in episode.records if r.validated):
        call = Tau2Call(id=f"c{i}", name=record.call.name, arguments=dict(record.call.arguments),
                        requestor=record.requestor)  # fmt: skip
        speaker = UserMessage if record.requestor == "user" else AssistantMessage
        result = record.result if isinstance(record.result, str) else json.dumps(record.result)
        out += [speaker(role=record.requestor, tool_calls=[call]),
                ToolMessage(id=f"c{i}", role="tool", content=result, requestor=record.requestor)]  # fmt: skip
    return out


@pytest.mark.slow
def test_our_score_equals_tau2s_evaluate_simulation_on_twelve_telecom_tasks(domain):
    """Twelve tasks, each played three ways by a scripted agent and user: the gold actions in order (the user's
    after the agent asks for them), the last action left out, and a stray airplane-mode toggle at the end. Our
    reward equals τ²'s ``evaluate_simulation`` of the same calls; a run cut by ``max_steps`` earns 0 in both."""
    pytest.importorskip("litellm", reason="τ²'s evaluator imports LiteLLM (make benchmarks)")
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    user = ScriptedPolicy([])
    env = _env(user)

    def tau2_reward(task, reason):
        run = SimulationRun(id="run", task_id=task.id, start_time="", end_time="", duration=0.0,
                            termination_reason=reason, messages=_as_tau2_run(env.episode))  # fmt: skip
        return evaluate_simulation(run, domain._raw_by_id[task.id], EvaluationType.ALL, solo_mode=False,
                                   domain="telecom").reward  # fmt: skip

    tasks = [
        t for t in domain.tasks("train") if any(a["requestor"] == "assistant" for a in t.expected["gold_sequence"])
    ]
    tasks = (tasks + [t for t in domain.tasks("train") if t not in tasks])[:12]
    pairs = []
    for task in tasks:
        for variant in ("gold", "last action left out", "stray toggle"):
            sequence = list(task.expected["gold_sequence"])
            if variant == "last action left out":
                sequence = sequence[:-1]
            elif variant == "stray toggle":
                sequence.append({"requestor": "user", "name": "toggle_airplane_mode", "arguments": {}})
            agent, answers = [], ["My phone has a problem."]
            for action in sequence:  # consecutive user actions: one request by the agent, then the user's calls
                if action["requestor"] == "assistant":
                    agent.append(_call_text(action["name"], action["arguments"]))
                else:
                    if not agent or agent[-1] != "Please do this on your phone.":
                        agent.append("Please do this on your phone.")
                        answers.append("Done.")
                    answers.insert(len(answers) - 1, _call_text(action["name"], action["arguments"]))
            agent.append("That should fix it.")
            answers.append("###STOP###")
            user._responses = answers
            env.reset(seed=0, options={"task": task.id})
            for action in agent:
                *_, reward, terminated, truncated, info = env.step(action)
            assert terminated and info["termination_reason"] == "user_stop", (task.id, variant, info)
            pairs.append((task.id, variant, reward, tau2_reward(task, TerminationReason.USER_STOP)))
    assert all(ours == theirs for _, _, ours, theirs in pairs), [p for p in pairs if p[2] != p[3]]
    assert {p[2] for p in pairs} == {0.0, 1.0}  # both outcomes occur: the check can fail
    assert all(p[2] == 1.0 for p in pairs if p[1] == "gold")
    env.config = replace(env.config, max_messages=3)
    user._responses = ["My phone has a problem.", _call_text("toggle_roaming"), "Done."]
    env.reset(seed=0, options={"task": ROAMING})
    *_, reward, terminated, truncated, info = env.step("Please turn roaming on.")
    assert info["termination_reason"] == "max_steps" and reward == 0.0
    assert tau2_reward(domain.task(ROAMING), TerminationReason.MAX_STEPS) == 0.0


class _ToolEndpoint(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint playing a telecom user: its replies in order (a text, or a call as
    ``(name, arguments)``); it keeps the request bodies."""

    replies: list = []
    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802  (http.server's name)
        type(self).bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        reply = type(self).replies.pop(0)
        if isinstance(reply, str):
            message = {"role": "assistant", "content": reply}
        else:
            name, arguments = reply
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "abc", "type": "function", "function": {"name": name, "arguments": arguments}}]}  # fmt: skip
        body = json.dumps({"choices": [{"message": message, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_user_behind_an_endpoint_is_offered_its_tools_and_gets_its_calls_back_in_the_openai_wire_format():
    _ToolEndpoint.replies = ["My data is off.", ("toggle_airplane_mode", "{}"), ("toggle_roaming", ""), "Done.",
                             "###STOP###"]  # fmt: skip
    _ToolEndpoint.bodies = []
    server = HTTPServer(("127.0.0.1", 0), _ToolEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = _env(f"http://127.0.0.1:{server.server_port}/v1", user_model="user")
        env.reset(seed=0, options={"task": ROAMING})
        *_, info = env.step("Please turn airplane mode off, then data roaming on.")
        *_, reward, terminated, truncated, last = env.step("Glad it works now.")
    finally:
        server.shutdown()
    opening, first_call, second_call, message, stop = _ToolEndpoint.bodies
    assert "tools" not in opening and {t["function"]["name"] for t in first_call["tools"]} >= {"toggle_roaming"}
    own_call, result = second_call["messages"][-2:]  # its own call (arguments as a JSON text) and the phone's answer
    assert own_call["role"] == "assistant" and own_call["tool_calls"][0]["function"] == {
        "name": "toggle_airplane_mode", "arguments": "{}"}  # fmt: skip
    assert result["role"] == "tool" and result["tool_call_id"] == own_call["tool_calls"][0]["id"]
    assert result["content"].startswith("Airplane Mode is now OFF.")
    assert [c["name"] for c in info["user_calls"]] == ["toggle_airplane_mode", "toggle_roaming"]
    assert terminated and last["termination_reason"] == "user_stop" and reward == 1.0
