"""Simulated users (envace_gym.episode.users): τ²-Bench's protocol, stop markers, bounds, bad replies masked,
token-exact observations after simulated turns, batched generation, the tiny model playing the user."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401  (registers the ids)
from envace_gym.endpoint import ChatEndpoint
from envace_gym.episode.chat import ChatFormat
from envace_gym.domains.user_protocol import OPENING, STOP_MARKERS, USER_SAMPLING, EpisodeRules, UserProtocol
from envace_gym.episode.users import UserSimulator, check_user, make_user, task_scenario
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


def test_a_domain_brings_its_own_user_protocol():
    """A benchmark's user rules are a UserProtocol of its own (in its envs/ folder): its stop markers, its bounds and
    how a cut run scores reach the episode with no change to envace_gym/episode."""

    class Strict(UserProtocol):
        name = "strict"
        stop_markers = ("<<BYE>>",)
        scores_cut_runs = False

        def rules(self, asked: EpisodeRules, domain_max_turns: int) -> EpisodeRules:
            return replace(super().rules(asked, domain_max_turns), max_turns=2)

    env = _env(UserSimulator(ScriptedPolicy(["Thanks <<BYE>>"]), protocol=Strict()))
    env.reset(options={"task": "travel/000"})
    *_, terminated, truncated, info = env.step("Done.")
    assert terminated and info["user"]["stop"] == "<<BYE>>" and info["termination_reason"] == "user_stop"
    env = _env(UserSimulator(ScriptedPolicy(lambda prompt: "###STOP### is not my word."), protocol=Strict()))
    env.reset(options={"task": "travel/000"})
    assert env.episode.max_turns == 2
    outcomes = [env.step("Anything else?") for _ in range(2)]
    reward, info = outcomes[-1][1], outcomes[-1][4]
    assert outcomes[-1][3] and info["truncation"] == "max_turns" and reward == 0.0 and info["reward_checks"] == {}


def test_a_user_that_never_stops_ends_at_max_user_turns():
    env = _env(UserSimulator(ScriptedPolicy(lambda prompt: "One more thing, please.")), max_user_turns=3)
    env.reset(options={"task": "travel/000"})
    outcomes = [env.step("Anything else?") for _ in range(3)]
    assert [o[3] for o in outcomes] == [False, False, True] and outcomes[-1][4]["truncation"] == "max_user_turns"
    assert env.episode.transcript.user_turns == 3 and not outcomes[-1][4]["reward_masked"]  # scored: the agent's own run


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
    with pytest.raises(ValueError, match="user_model names the model behind a user endpoint URL; user='llm'"):
        _env("llm", user_model="a-model")  # a name that would otherwise go nowhere


def test_a_trained_user_samples_as_the_policy_acts():
    """The trainers recompute every trained row's log-probs at the rollout's temperature: a user="rehearse" turn is
    sampled at the Act role's settings (a "llm" user keeps its own), and a trained user sampling otherwise is
    refused."""
    act = SamplingParams(max_new_tokens=64, temperature=0.9, top_p=0.95)
    own = lambda: ScriptedPolicy([])  # noqa: E731
    rehearsed = make_user("rehearse", own, act=act).sampling
    assert (rehearsed.temperature, rehearsed.top_p, rehearsed.top_k) == (0.9, 0.95, 0)
    assert make_user("llm", own, act=act).sampling == USER_SAMPLING
    with pytest.raises(ValueError, match="a trained user samples as the policy acts"):
        make_user(UserSimulator(own(), trained=True), own, act=act)
    env = _env("rehearse", act_sampling=act)
    assert env.user.trained and env.user.sampling.temperature == 0.9


def test_a_tau2_retail_episode_with_an_llm_user():
    """τ²'s protocol with the tiny model as the user, in process: it holds τ²'s own scenario text (persona, reason for
    the call, known and unknown info) and writes the first message after the agent's greeting (τ²'s long prompt
    outgrows the tiny model's context as the agent: a scripted agent). The untrained tiny model never stops: its
    opening runs past its budget (32 tokens here, to keep the test short), a reply τ² cannot use, so the first step
    ends the run as the user's failure."""
    pytest.importorskip("tau2", reason="benchmark data not installed (make benchmarks)")
    user = tiny_policy(seed=5)
    env = gym.make("EnvACE-Rehearsal-v0", domain="tau2:retail", policy=ScriptedPolicy([]), executor="real",
                   user=user, user_max_tokens=32).unwrapped  # fmt: skip
    _, info = env.reset(seed=0, options={"task": env.domain.tasks("train")[0].id})
    task = env.episode.task
    scenario = task.expected["user_scenario"]
    assert "Known info" in scenario
    assert env.episode.messages[1] == {"role": "assistant", "content": OPENING}  # τ²: the greeting opens both views
    assert info["user_opening_error"] == "the user's reply ran past its 32-token budget"
    assert env.episode.messages[2]["content"] == task.prompt  # in its place, the task's own opening
    view = [*env.episode.user_view, {"role": "assistant", "content": "Could you give me your order number?"}]
    seen = user.tokenizer.decode(env.user.prompt_ids(task, view))  # what it would be asked next
    assert scenario.splitlines()[1].strip() in seen and "Could you give me your order number?" in seen
    *_, truncated, info = env.step("Could you give me your order number?")
    assert truncated and info["reward_masked"] and info["termination_reason"] == "user_error"


@pytest.mark.slow
def test_a_tau2_episode_with_a_simulated_user_is_scored_by_tau2s_evaluators():
    """The user opens and stops (τ²'s protocol); the agent plays τ²'s gold actions and tells what it must: DB and
    COMMUNICATE, τ²'s reward basis for retail, both pass, whether it tells it in its final answer or in a call turn's
    prose (τ² reads every assistant message). Without the information told, COMMUNICATE fails."""
    pytest.importorskip("tau2", reason="benchmark data not installed (make benchmarks)")
    for tell, expected in (("answer", 1.0), ("call turn", 1.0), (None, 0.0)):
        user = ScriptedPolicy(lambda prompt: "###STOP###" if prompt.count("<|im_start|>user") > 1 else
                              "Hi, I need help with an order of mine.")  # fmt: skip
        env = gym.make("EnvACE-Rehearsal-v0", domain="tau2:retail", policy=ScriptedPolicy([]), executor="real",
                       user=UserSimulator(user)).unwrapped  # fmt: skip
        task = next(t for t in env.domain.tasks("train") if t.expected["communicate_info"])
        env.reset(seed=0, options={"task": task.id})
        assert env.episode.messages[2]["content"] == "Hi, I need help with an order of mine."
        assert task.expected["reward_basis"] == ["DB", "COMMUNICATE"] or sorted(task.expected["reward_basis"]) == [
            "COMMUNICATE", "DB"]  # fmt: skip
        told = " ".join(turn.content for turn in task.reference if not turn.calls)
        done = False
        while not done:
            action = env.episode.reference_act()
            if not env.episode.task.reference[env.episode.turn].calls and tell != "answer":
                action = "Everything is done."
            elif env.episode.turn == 0 and tell == "call turn":
                action = f"{told}\n{action}"  # said before the first call, in the same message
            *_, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        assert terminated and info["user"]["stop"] == "###STOP###"
        checks = {"db": True, "communicate": tell is not None}
        assert reward == expected and info["reward_checks"] == checks, (tell, info["reward_checks"])


@pytest.mark.parametrize("setting", ["llm", "simulator"])
def test_the_vector_env_batches_its_users_too(setting):
    """One batch per round for the sub-envs' users, whether ``user=`` names one ("llm": the shared policy plays it)
    or gives it."""
    user = CountingUser(lambda prompt: "I'd like to fly on 2026-12-08.")
    policy, given = (user, "llm") if setting == "llm" else (ScriptedPolicy([]), UserSimulator(user))
    envs = gym.make_vec("EnvACE-Rehearsal-v0", num_envs=3, vectorization_mode="vector_entry_point", domain="travel",
                        policy=policy, executor="real", user=given)  # fmt: skip
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


# -- the policy rehearses its users: a third role ------------------------------------------------------------
USER_TURN = "You are playing a user"  # how a scripted policy tells the user's prompts from the agent's


def _judged_travel():
    """travel, scored by the agent's last answer: 1 where it says "alpha" (so the test sets every reward)."""
    from envs.travel import TravelDomain

    class LastAnswer(TravelDomain):
        def score(self, task, trajectory):
            return 1.0 if trajectory.answers and "alpha" in trajectory.answers[-1] else 0.0

    return LastAnswer()


def _two_episodes_policy(call_text):
    """One group of two episodes, played in lockstep (the agent's turns of a round come in episode order):
    episode 0 calls a tool, then answers "alpha" and its user stops: 2 Act rows, 1 user row, reward 1;
    episode 1 answers "beta", its user asks again, it answers "beta" and its user stops: 2 + 2 rows, reward 0."""
    agent = [call_text, "beta", "alpha", "beta"]
    users = ["Try again, please.", "###STOP###", "###STOP###"]
    return ScriptedPolicy(lambda prompt: (users if USER_TURN in prompt else agent).pop(0))


def _reference_call(task_id="travel/000"):
    """The Act text of the task's first reference tool call (its turn 1 asks the user for a date)."""
    env = _env("scripted")
    env.reset(options={"task": task_id})
    turn = next(t for t in env.episode.task.reference if t.calls)
    return env.episode.reference_action(turn)


@pytest.mark.slow
@pytest.mark.parametrize("rehearsal_mode", ["separate", "inline"])
def test_the_policy_rehearses_its_users_as_a_third_role_with_its_own_baseline(rehearsal_mode):
    from envace_gym.training import rolewise_advantages

    policy = _two_episodes_policy(_reference_call())
    batch = collect_rollouts(policy, _judged_travel(), ["travel/000"], group_size=2, executor="real",
                             rehearsal_mode=rehearsal_mode, user="rehearse")  # fmt: skip
    assert [e.reward for e in batch.episodes] == [1.0, 0.0]
    samples = batch.samples()
    agent_role = "act" if rehearsal_mode == "separate" else "episode"
    assert [(s.episode, s.role) for s in samples] == (
        [(0, "act"), (0, "act"), (0, "user"), (1, "act"), (1, "user"), (1, "act"), (1, "user")]
        if rehearsal_mode == "separate"
        else [(0, "episode"), (0, "user"), (1, "episode"), (1, "user"), (1, "user")]
    )
    users = [s for s in samples if s.role == "user"]
    decode = policy.tokenizer.decode
    assert [decode(s.completion_ids, skip_special_tokens=True) for s in users] == [
        "###STOP###", "Try again, please.", "###STOP###"]  # fmt: skip
    assert all(USER_TURN in decode(s.prompt_ids) and all(s.mask) for s in users)  # the user's own prompt, trained
    # By hand: each role's baseline is the mean reward of that role's rows in the group.
    # Agent rows: separate: rewards (1, 1, 0, 0), mean 1/2; inline: one row each, (1, 0), mean 1/2.
    # User rows: rewards (1, 0, 0) -> mean 1/3 -> advantages 2/3, -1/3, -1/3 (not the agent's 1/2, -1/2).
    got = rolewise_advantages([s.group for s in samples], [s.role for s in samples], [s.reward for s in samples])
    by_role = {role: [a for s, a in zip(samples, got, strict=True) if s.role == role] for role in (agent_role, "user")}
    assert by_role[agent_role] == pytest.approx([0.5, 0.5, -0.5, -0.5] if rehearsal_mode == "separate" else [0.5, -0.5])
    assert by_role["user"] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    # in the agent's own rows the user's turns are context: never trained as the agent's
    if rehearsal_mode == "inline":
        row = batch.episodes[1].episode_row
        said = policy.tokenizer.encode("Try again, please.", add_special_tokens=False)
        at = next(i for i in range(len(row.completion_ids)) if list(row.completion_ids[i : i + len(said)]) == said)
        assert set(row.mask[at : at + len(said)]) == {0}


def test_the_pure_torch_trainer_trains_the_users_rows_with_their_own_advantages(monkeypatch):
    """One step of envace_gym.training.train with user="rehearse": the rollouts are the scripted group above (its
    rewards set by hand), the weights are the tiny model's; the user rows enter the loss with the advantages worked
    out by hand."""
    import torch

    from envace_gym.training import trainer as trainer_module

    call = _reference_call()
    real_collect, real_advantages, seen = trainer_module.collect_rollouts, trainer_module.rolewise_advantages, {}

    def scripted_rollouts(policy, domain, tasks, group_size, config, **kwargs):  # played under the trainer's settings
        assert config.user == "rehearse" and config.executor == "real"
        return real_collect(_two_episodes_policy(call), domain, tasks, group_size, config, **kwargs)

    def recording(groups, roles, rewards):
        advantages = real_advantages(groups, roles, rewards)
        seen["pairs"] = list(zip(roles, advantages, strict=True))
        return advantages

    monkeypatch.setattr(trainer_module, "collect_rollouts", scripted_rollouts)
    monkeypatch.setattr(trainer_module, "rolewise_advantages", recording)
    policy = tiny_policy(seed=4)
    before = [p.detach().clone() for p in policy.model.parameters()]
    (step,) = trainer_module.train(policy, trainer_module.TrainerConfig(
        domain=_judged_travel(), executor="real", user="rehearse", steps=1, tasks_per_step=1, group_size=2,
        max_new_tokens=128, learning_rate=1e-3))  # fmt: skip
    assert step["rows/user"] == 3 and step["rows/act"] == 4
    user_advantages = [a for role, a in seen["pairs"] if role == "user"]
    assert user_advantages == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters(), strict=True))


@pytest.mark.slow
def test_trls_envace_trainer_trains_the_users_rows_with_their_own_advantages(tmp_path, monkeypatch):
    """EnvACEGRPOTrainer with user="rehearse": the scripted group's rows reach TRL's loss with the advantages worked
    out by hand (user rows 2/3, -1/3, -1/3), and one optimizer step changes the weights."""
    import torch
    from transformers import AutoTokenizer

    from envace_gym.domains.registry import register_domain
    from envace_gym.integrations import trl as envace_trl
    from envace_gym.integrations.trl import trainer_policy

    register_domain("travel-last-answer", _judged_travel, overwrite=True)
    call = _reference_call()
    monkeypatch.setattr(trainer_policy, "trainer_policy", lambda trainer: _two_episodes_policy(call))
    path = tmp_path / "tiny"
    policy = tiny_policy(seed=4)
    policy.model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)
    args = envace_trl.EnvACEGRPOConfig(
        output_dir=str(tmp_path / "out"), domain="travel-last-answer", executor="real", user="rehearse",
        per_device_train_batch_size=2, num_generations=2, max_completion_length=128, max_steps=1, learning_rate=1e-3,
        use_cpu=True, report_to="none", bf16=False, save_strategy="no",
    )  # fmt: skip
    trainer = envace_trl.EnvACEGRPOTrainer(model=str(path), args=args, processing_class=AutoTokenizer.from_pretrained(path))
    out = trainer._generate_and_score_completions([{"prompt": "travel/000"}] * 2)
    # rows in order: episode 0's act, act, user; episode 1's act, user, act, user
    assert out["advantages"].tolist() == pytest.approx([0.5, 0.5, 2 / 3, -0.5, -1 / 3, -0.5, -1 / 3])
    assert trainer._metrics["train" if trainer.model.training else "eval"]["rows/user"] == [3.0]
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


# -- a user behind an OpenAI-compatible endpoint -----------------------------------------------------------
def test_an_endpoint_that_does_not_answer_masks_the_episode():
    env = _env("http://127.0.0.1:9/v1", user_model="nobody")  # nothing listens on port 9
    env.user.model.timeout = 2
    env.reset(options={"task": "travel/000"})
    before = list(env.episode.messages)
    *_, reward, terminated, truncated, info = env.step("Which date?")
    assert truncated and info["reward_masked"] and "endpoint gave no reply" in info["user_error"]
    assert info["user"]["prompt_ids"] == [] and env.episode.messages == before + [
        {"role": "assistant", "content": "Which date?"}]  # fmt: skip


class _FakeEndpoint(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint whose every reply is cut at max_tokens; it keeps the requests' headers."""

    seen: list[dict[str, str]] = []

    def do_POST(self):  # noqa: N802  (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append(dict(self.headers))
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "I would like to fly on"},
                                        "finish_reason": "length"}]}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_endpoint_reply_cut_at_max_tokens_masks_the_episode(monkeypatch):
    """A half-written user message never enters the conversation, as an in-process user's cut reply does not; the
    key in ENVACE_API_KEY goes with the requests."""
    server = HTTPServer(("127.0.0.1", 0), _FakeEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("ENVACE_API_KEY", "sk-test")
    try:
        env = _env(f"http://127.0.0.1:{server.server_port}/v1", user_model="cut")
        env.reset(options={"task": "travel/000"})
        before = list(env.episode.messages)
        *_, truncated, info = env.step("Which date?")
    finally:
        server.shutdown()
    assert truncated and info["reward_masked"] and "cut at max_tokens" in info["user_error"]
    assert env.episode.messages == before + [{"role": "assistant", "content": "Which date?"}]
    assert _FakeEndpoint.seen[-1]["Authorization"] == "Bearer sk-test"


@pytest.mark.slow
def test_a_user_served_by_transformers_serve_answers_and_stops(tmp_path):
    """The user is a tiny model behind ``transformers serve`` (user=URL, user_model=its name), taught to say it is
    done: the episode ends at its stop marker and is scored."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from envace_gym.testing import served, taught_model

    probe = UserSimulator(ScriptedPolicy([]))  # the user's view of the one turn it will answer
    env = _env("scripted")
    env.reset(options={"task": "travel/000"})
    conversation = [*env.episode.messages, {"role": "assistant", "content": "Your flight is booked."}]
    prompt = probe.messages(env.episode.task, conversation)
    model_dir = tmp_path / "user-model"
    taught_model(model_dir, [prompt], "###STOP###")
    with served(model_dir) as base_url:
        env = _env(base_url, user_model=str(model_dir))
        env.reset(options={"task": "travel/000"})
        *_, reward, terminated, truncated, info = env.step("Your flight is booked.")
    assert terminated and info["user"]["stop"] == "###STOP###" and not info["reward_masked"], info.get("user_error")


def test_a_seed_gives_the_same_task_and_stream_once_a_task_is_known_too_long():
    """The user writes each τ²-style opening from a generator of its own, drawn once per task drawn: an env that
    already knows a task is too long skips it and still ends a seeded reset where a fresh env does."""
    from envace_gym.domains.dataset import DatasetDomain

    def row(i, system="Help."):
        return {"id": f"talk/{i:03d}", "messages": [{"role": "system", "content": system},
                                                    {"role": "user", "content": "Hi."},
                                                    {"role": "assistant", "content": "Done."}],  # fmt: skip
                "expected": {"user_scenario": f"You want help with order #{i}."}}

    rows = [row(0), row(1, "Help. " + "x " * 20_000), row(2), row(3)]  # task 1's system prompt cannot fit
    policy = ScriptedPolicy(lambda prompt: "Done.")
    policy.max_context = 2048

    def env():
        user = UserSimulator(ScriptedPolicy(lambda prompt: "Hello, I need help with an order."))
        return gym.make("EnvACE-Rehearsal-v0", domain=DatasetDomain(rows, name="talk", test_fraction=0.0),
                        policy=policy, executor="rehearsal", user=user).unwrapped  # fmt: skip

    knows = env()
    for seed in range(20):
        knows.reset(seed=seed)
    assert knows.unfit_tasks == {"talk/001"}
    for seed in range(20):
        fresh = env()
        _, fresh_info = fresh.reset(seed=seed)
        _, info = knows.reset(seed=seed)
        assert info["task"]["id"] == fresh_info["task"]["id"] != "talk/001"
        assert knows.np_random.integers(2**31) == fresh.np_random.integers(2**31)


def test_evaluation_counts_a_run_its_user_could_not_carry_on_as_failed_not_masked():
    """τ²-Bench scores such a run 0; training masks it (not the agent's fault), evaluation must not drop it."""
    from envace_gym.evaluation import evaluate

    user = UserSimulator(ScriptedPolicy(lambda prompt: ""))  # an empty reply: unusable
    agent = ScriptedPolicy(lambda prompt: "Which date?")
    result = evaluate(agent, "travel", "test", num_tasks=2, fidelity=False, user=user)
    assert (result.episodes, result.user_failures, result.masked_episodes) == (2, 2, 0)
    assert result.success_rate == 0.0 and result.mean_reward == 0.0  # failures, not NaN from an empty denominator
    assert all("the user's reply is empty" in r["user_error"] and r["reward"] == 0.0 for r in result.per_task)
    batch = collect_rollouts(agent, "travel", ["travel/000"], user=user)  # training: masked
    assert batch.episodes[0].reward is None and batch.episodes[0].user_error


def test_the_user_sees_the_agents_answers_only_not_its_reasoning_calls_or_errors():
    """τ²-Bench shows its user the agent's message content: no <think> text, no malformed call's raw text, no tool
    result and no error payload."""
    user_model = ScriptedPolicy(lambda prompt: "###STOP###")
    agent = ScriptedPolicy([
        '<tool_call>{"name": "search_flights", "arguments": ',  # a malformed call: its text and error stay private
        "<think>private plan</think>Which date would you like?",
    ])  # fmt: skip
    env = _env(UserSimulator(user_model), on_invalid="feedback")
    env.reset(options={"task": "travel/000"})
    env.step(agent.generate([()], SamplingParams())[0].text)
    env.step(agent.generate([()], SamplingParams())[0].text)
    (seen,) = user_model.prompts
    assert "Which date would you like?" in seen
    assert not any(s in seen for s in ("private plan", "search_flights", "INVALID_TOOL_CALL_FORMAT", "<think>"))
    assert "search_flights" in json.dumps(env.episode.messages)  # the agent's own history keeps all of it
