"""Simulated users (envace_gym.episode.users): τ²-Bench's protocol, stop markers, bounds, bad replies masked,
token-exact observations after simulated turns, batched generation, the tiny model playing the user."""

from __future__ import annotations

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401  (registers the ids)
from envace_gym.endpoint import ChatEndpoint
from envace_gym.episode.chat import ChatFormat
from envace_gym.episode.users import OPENING, STOP_MARKERS, UserSimulator, check_user, task_scenario
from envace_gym.policy.protocol import SamplingParams
from envace_gym.rollout import collect_rollouts
from envace_gym.testing import ScriptedPolicy, tiny_policy


def _env(user, **kwargs):
    return gym.make("EnvACE-Rehearsal-v0", domain="travel", policy=ScriptedPolicy([]), executor="real", user=user,
                    **kwargs).unwrapped  # fmt: skip


@pytest.mark.parametrize("rehearsal_mode", ["separate", "inline"])
def test_the_user_sees_its_scenario_and_the_agents_text_turns_only(rehearsal_mode):
    user = ScriptedPolicy(["I'd like to fly on 2026-12-08.", "###STOP###"])
    env = _env(UserSimulator(user), rehearsal_mode=rehearsal_mode)
    env.reset(options={"task": "travel/000"})
    task = env.episode.task
    _, reward, terminated, truncated, info = env.step("Sure. On which date would you like to travel?")
    assert not (terminated or truncated) and info["user"]["text"] == "I'd like to fly on 2026-12-08."
    assert env.episode.messages[-1] == {"role": "user", "content": "I'd like to fly on 2026-12-08."}
    # the agent's observation is its conversation, token for token: the simulated turn is context
    chat = ChatFormat.of(env.policy.tokenizer)
    assert chat.encode(env.episode.observation()) == env.episode.prompt_ids
    assert env.episode.episode_row().mask[-3:] == (0, 0, 0)  # never trained as the agent's
    seen = user.prompts[0]
    assert task_scenario(task) in seen and OPENING in seen and "Sure. On which date" in seen
    assert env.episode.messages[0]["content"] not in seen  # the agent's system prompt is not the user's
    assert "2026-12-08" in task_scenario(task)  # what the scripted turns would have said is what the user knows
    # a tool call and its result never reach the user
    *_, info = env.step(env.episode.reference_act())  # the reference's search_flights call
    assert info["calls"][0]["name"] == "search_flights" and info["calls"][0]["error"] is None
    *_, reward, terminated, truncated, info = env.step("Booked.")
    assert terminated and not truncated and info["user"]["stop"] == "###STOP###" and not info["reward_masked"]
    assert "search_flights" not in user.prompts[1] and "EA1360" not in user.prompts[1]


@pytest.mark.parametrize("marker", STOP_MARKERS)
def test_every_stop_marker_ends_the_conversation(marker):
    env = _env(UserSimulator(ScriptedPolicy([f"Thanks. {marker}"])))
    env.reset(options={"task": "travel/000"})
    *_, terminated, truncated, info = env.step("Done.")
    assert terminated and info["user"]["stop"] == marker and "reward_checks" in info


def test_a_user_that_never_stops_ends_at_max_user_turns():
    env = _env(UserSimulator(ScriptedPolicy(lambda prompt: "One more thing, please.")), max_user_turns=3)
    env.reset(options={"task": "travel/000"})
    outcomes = [env.step("Anything else?") for _ in range(3)]
    assert [o[3] for o in outcomes] == [False, False, True] and outcomes[-1][4]["truncation"] == "max_user_turns"
    assert env.episode.user_turns == 3 and not outcomes[-1][4]["reward_masked"]  # scored: the agent's own run


@pytest.mark.parametrize(
    ("reply", "sampling", "says"),
    [("", None, "the user's reply is empty"), ("   ", None, "the user's reply is empty"),
     ("word " * 40, SamplingParams(max_new_tokens=8), "ran past its 8-token budget"),
     ("Sure.<|endoftext|> And more", None, "holds special tokens")],
)  # fmt: skip
def test_a_reply_that_cannot_be_used_masks_the_episode(reply, sampling, says):
    user = UserSimulator(ScriptedPolicy([reply]), **({"sampling": sampling} if sampling else {}))
    env = _env(user)
    env.reset(options={"task": "travel/000"})
    before = list(env.episode.messages)
    *_, reward, terminated, truncated, info = env.step("Which date?")
    assert truncated and not terminated and info["reward_masked"] and reward == 0.0 and says in info["user_error"]
    assert env.episode.messages == before + [{"role": "assistant", "content": "Which date?"}]  # nothing of it kept


class CountingUser(ScriptedPolicy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    def generate(self, prompts, params):
        self.batches.append(len(prompts))
        return super().generate(prompts, params)


def test_simulated_users_of_a_round_are_generated_in_one_batch():
    user = CountingUser(lambda prompt: "###STOP###")
    agent = ScriptedPolicy(lambda prompt: "All done.")
    batch = collect_rollouts(agent, "travel", ["travel/000", "travel/001", "travel/002"], group_size=2,
                             executor="real", user=UserSimulator(user))  # fmt: skip
    assert user.batches == [6] and all(e.terminated for e in batch.episodes)


def test_the_policy_itself_can_play_the_user():
    """The tiny model as the agent and as its own user, in process: whatever it writes, every episode ends in a
    typed outcome, and only the agent's own turns are trained."""
    policy = tiny_policy(seed=3)
    batch = collect_rollouts(policy, "travel", ["travel/000", "travel/001"], group_size=2, executor="real",
                             act_sampling=SamplingParams(max_new_tokens=12), max_user_turns=3, user="llm")  # fmt: skip
    assert len(batch.episodes) == 4
    for episode in batch.episodes:
        assert episode.terminated or episode.truncated
        assert all(row.role in ("act", "rehearse") for row in episode.rows)


def test_user_settings_are_checked():
    check_user("scripted"), check_user("llm"), check_user("rehearse"), check_user(None)
    check_user("http://127.0.0.1:9/v1", "a-model")
    with pytest.raises(ValueError, match="user must be 'scripted', 'llm'"):
        _env("policy")
    with pytest.raises(ValueError, match="needs its model's name"):
        _env("http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="played by the policy itself"):
        UserSimulator(ChatEndpoint("http://127.0.0.1:9/v1", "m"), trained=True)
    with pytest.raises(ValueError, match="instructions must hold '{scenario}'"):
        UserSimulator(ScriptedPolicy([]), instructions="Be a user.")


def test_a_tau2_retail_episode_with_an_llm_user():
    """τ²'s own scenario text (persona, reason for the call, known and unknown info) is what the user holds; the
    tiny model plays the user in process (τ²'s long prompt outgrows its context as the agent: a scripted agent)."""
    pytest.importorskip("tau2", reason="benchmark data not installed (make benchmarks)")
    user = tiny_policy(seed=5)
    env = gym.make("EnvACE-Rehearsal-v0", domain="tau2:retail", policy=ScriptedPolicy([]), executor="real",
                   user=user, max_user_turns=2).unwrapped  # fmt: skip
    env.reset(seed=0, options={"task": env.domain.tasks("train")[0].id})
    scenario = env.episode.task.expected["user_scenario"]
    assert "Known info" in scenario
    outcomes = [env.step("Could you give me your order number?")]
    while not (outcomes[-1][2] or outcomes[-1][3]):
        outcomes.append(env.step("Anything else?"))
    seen = user.tokenizer.decode(outcomes[0][4]["user"]["prompt_ids"])
    assert scenario.splitlines()[1].strip() in seen and "Could you give me your order number?" in seen
    last = outcomes[-1][4]  # the user stopped, could not be used (masked), or the turn bound ended it
    assert last.get("truncation") == "max_user_turns" or last.get("user_error") or last["user"]["stop"], last


def test_the_vector_env_batches_its_users_too():
    user = CountingUser(lambda prompt: "I'd like to fly on 2026-12-08.")
    envs = gym.make_vec("EnvACE-Rehearsal-v0", num_envs=3, vectorization_mode="vector_entry_point", domain="travel",
                        policy=ScriptedPolicy([]), executor="real", user=UserSimulator(user))  # fmt: skip
    envs.reset(seed=0)
    _, _, terminated, truncated, infos = envs.step(["Which date?"] * 3)
    assert user.batches == [3] and not (terminated.any() or truncated.any())
    envs.close()


def test_a_conversation_past_the_users_context_masks_the_episode():
    small = ScriptedPolicy(["never asked"])
    small.max_context = 64  # the scenario alone is longer
    env = _env(UserSimulator(small))
    env.reset(options={"task": "travel/000"})
    *_, truncated, info = env.step("Which date?")
    assert truncated and info["reward_masked"] and "do not fit its model's context (64)" in info["user_error"]
    assert small.prompts == []  # nothing was generated
