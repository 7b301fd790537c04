"""Test-time private rehearsal: privacy (no real calls), the memory reaches the committed turn, N=0 is plain acting."""

from __future__ import annotations

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
from envace_gym import SamplingParams, ToolCall, make_domain
from envace_gym.rollout import ASSESS_SYSTEM, PlannerConfig, PrivateRehearsal, RehearsalPlanner, collect_rollouts
from envace_gym.testing import ScriptedPolicy

TASK = make_domain("bank").tasks("train")[0]
OWNER = TASK.reference[0].calls[0].arguments["owner"]


def responder(prompt: str) -> str:
    """Acts: one call, then a final answer once a tool has answered. Rehearses and assesses on cue."""
    if "precise tool simulator" in prompt:
        return '{"owner": "someone", "accounts": []}\n</execution_result>'
    if ASSESS_SYSTEM[:40] in prompt:
        return "The lookup found nothing; ask again with the full name. Verdict: revise"
    if "<tool_response>" in prompt:
        return "Your accounts are listed above."
    return ToolCall("find_accounts", {"owner": OWNER}).to_text()


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
@pytest.mark.parametrize("budget", [0, 1, 2, 3])
def test_the_real_executor_runs_each_committed_call_once(mode, budget):
    policy = ScriptedPolicy(responder)
    env = gym.make("EnvACE-Rehearsal-v0", domain="bank", policy=policy, executor="real")
    agent = PrivateRehearsal(env, PlannerConfig(budget=budget, mode=mode, horizon=2))
    agent.reset(options={"task": TASK.id})
    committed_calls, done = 0, False
    while not done:
        action = agent.act()
        committed_calls += action.count("<tool_call>")
        _, _, terminated, truncated, info = agent.step(action)
        done = terminated or truncated
    accounting = info["private_rehearsal"]
    assert committed_calls == 1 and accounting["real_calls"] == 1  # rehearsals added no real call
    assert env.unwrapped.episode.executor.calls_executed == 1
    assert (accounting["rehearsal_tokens"] > 0) == (budget > 0)
    assert agent.planner.stats["rehearsals"] == 2 * budget  # two committed turns, N rehearsals each


def test_the_memory_reaches_the_committed_prompt():
    policy = ScriptedPolicy(responder)
    env = gym.make("EnvACE-Rehearsal-v0", domain="bank", policy=policy, executor="real")
    agent = PrivateRehearsal(env, PlannerConfig(budget=2, mode="sequential", horizon=2))
    agent.reset(options={"task": TASK.id})
    agent.act()
    committed = policy.prompts[-1]
    assert "Rehearsal memory (private" in committed and "Verdict: revise" in committed
    assert "Rehearsal 1:" in committed and "Rehearsal 2:" in committed
    assert f'find_accounts({{"owner": "{OWNER}"}})' in committed
    second = [p for p in policy.prompts if "Rehearsal 1:" in p and ASSESS_SYSTEM[:40] not in p]
    assert second, "in sequential mode, rehearsal 2 starts from rehearsal 1 and its assessment"
    # the memory is private: the real conversation never holds it
    assert "Rehearsal memory" not in env.unwrapped.episode.prompt_text
    # and imagined rehearsals never see the task's reference results
    rehearse_prompts = [p for p in policy.prompts if "precise tool simulator" in p]
    assert rehearse_prompts and all("Reference executions" not in p for p in rehearse_prompts)


def test_the_assessment_tells_the_real_conversation_from_the_imagined_attempt():
    policy = ScriptedPolicy(responder)
    env = gym.make("EnvACE-Rehearsal-v0", domain="bank", policy=policy, executor="real")
    agent = PrivateRehearsal(env, PlannerConfig(budget=1, horizon=1))
    agent.reset(options={"task": TASK.id})
    agent.step(agent.act())  # the real call and its real result: the conversation the second turn's forks copy
    agent.act()
    assessed = [p for p in policy.prompts if ASSESS_SYSTEM[:40] in p]
    first, second = assessed[0], assessed[-1]
    assert "So far (real):" not in first  # nothing real yet before the first committed turn
    real, imagined = second.split("So far (real):")[1].split("Imagined attempt:")
    assert "[tool find_accounts]" in real and "[tool find_accounts]" not in imagined  # the real result, as such


def test_planner_settings_are_checked():
    with pytest.raises(ValueError, match="horizon must be at least 1, got 0"):
        PlannerConfig(horizon=0)  # it would fall back to the episode's whole turn limit
    with pytest.raises(ValueError, match="budget must be >= 0"):
        PlannerConfig(budget=-1)


@pytest.mark.parametrize(("word", "plain_turns"), [("keep", 0), ("revise", 1)])
def test_select_commits_a_kept_rehearsals_first_turn_else_acts_plainly(word, plain_turns):
    """commit="select": a rehearsal the policy kept gives the committed turn as it was imagined (no generation
    after the assessments); none kept, one plain generation. No prompt ever holds a memory."""

    def assessing(prompt: str) -> str:
        return f"It looked up the owner. Verdict: {word}" if ASSESS_SYSTEM[:40] in prompt else responder(prompt)

    policy = ScriptedPolicy(assessing)
    env = gym.make("EnvACE-Rehearsal-v0", domain="bank", policy=policy, executor="real")
    agent = PrivateRehearsal(env, PlannerConfig(budget=2, mode="parallel", horizon=2, commit="select"))
    agent.reset(options={"task": TASK.id})
    action = agent.act()
    assert action.strip() == ToolCall("find_accounts", {"owner": OWNER}).to_text().strip()
    last_assessment = max(i for i, p in enumerate(policy.prompts) if ASSESS_SYSTEM[:40] in p)
    assert len(policy.prompts) - 1 - last_assessment == plain_turns
    assert not any("Rehearsal memory" in p for p in policy.prompts)
    assert agent.planner.stats["kept_turns"] == 1 - plain_turns
    _, _, _, _, info = agent.step(action)
    assert info["private_rehearsal"]["real_calls"] == 1


@pytest.mark.parametrize("good_first", [True, False])
def test_outcome_commits_the_first_turn_of_the_best_imagined_outcome_and_writes_no_assessment(good_first):
    """commit="outcome": of N=2 parallel rehearsals, one calls a tool that does not exist (an error, then an
    answer a turn later), the other answers at once; the committed turn is the clean one's first turn, whichever
    was imagined first, with no self-assessment asked for and no plain generation after the rehearsals."""
    firsts = [ToolCall("no_such_tool", {}).to_text(), "Your balance is 120 dollars."]
    firsts = firsts[::-1] if good_first else firsts

    def acting(prompt: str) -> str:
        if "precise tool simulator" in prompt or "<tool_response>" in prompt:
            return responder(prompt)
        return firsts.pop(0) if firsts else "unused"

    policy = ScriptedPolicy(acting)
    env = gym.make("EnvACE-Rehearsal-v0", domain="bank", policy=policy, executor="real")
    agent = PrivateRehearsal(env, PlannerConfig(budget=2, mode="parallel", horizon=2, commit="outcome"))
    agent.reset(options={"task": TASK.id})
    assert agent.act().strip() == "Your balance is 120 dollars."
    assert not firsts and not any(ASSESS_SYSTEM[:40] in p for p in policy.prompts)
    assert not any("Rehearsal memory" in p for p in policy.prompts)
    assert agent.planner.stats["kept_turns"] == 1


def test_verdicts_are_read_from_the_last_line_that_gives_one():
    from envace_gym.rollout.planner import verdict

    assert verdict("Wrong owner. Verdict: revise") == "revise"
    assert verdict("verdict - Keep") == "keep"
    assert verdict("First I thought Verdict: revise, but Verdict: keep") == "keep"
    assert verdict("no verdict given") is None
    with pytest.raises(ValueError, match="commit must be one of"):
        PlannerConfig(commit="best")


def test_budget_zero_is_plain_acting(tiny):
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    kwargs = dict(executor="real", act_sampling=params, seed=4)
    plain = collect_rollouts(tiny, "bank", ["bank/000", "bank/001"], **kwargs)
    planned = collect_rollouts(
        tiny, "bank", ["bank/000", "bank/001"], actor=RehearsalPlanner(tiny, PlannerConfig(budget=0), params), **kwargs
    )
    assert [e.messages for e in plain.episodes] == [e.messages for e in planned.episodes]


def test_rehearsals_of_many_episodes_are_batched():
    policy = ScriptedPolicy(responder)
    sizes = []
    original = policy.generate
    policy.generate = lambda prompts, params: sizes.append(len(prompts)) or original(prompts, params)
    planner = RehearsalPlanner(policy, PlannerConfig(budget=2, mode="parallel", horizon=2))
    batch = collect_rollouts(policy, "bank", [TASK.id] * 3, executor="real", actor=planner)
    assert all(e.turns == 2 for e in batch.episodes)
    # per committed turn: imagined Act turns of 3 episodes x 2 rehearsals in one call, their rehearsals in one,
    # the assessments in one, the committed turns in one; never one call per episode
    assert max(sizes) == 6 and sizes.count(1) == 0
