"""Batched rollouts: the vector env and the collector agree with single envs, and their rows are token-exact."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import envace_gym  # noqa: F401
from envace_gym import RehearsalConfig, SamplingParams, make_domain
from envace_gym.env import RehearsalVectorEnv
from envace_gym.rollout import collect_rollouts
from envace_gym.testing import oracle_policy

GREEDY = SamplingParams(max_new_tokens=12, temperature=0)
REHEARSE_GREEDY = RehearsalConfig(max_new_tokens=12, temperature=0)
TASKS = ["bank/000", "bank/001", "travel/000"]


def single_env_reference_run(policy, task_id, mode):
    domain = task_id.split("/")[0]
    env = gym.make(
        "EnvACE-Rehearsal-v0", domain=domain, policy=policy, rehearsal_mode=mode, rehearsal=REHEARSE_GREEDY,
        act_sampling=GREEDY, on_invalid="feedback",
    )  # fmt: skip
    env.reset(options={"task": task_id})
    task = env.unwrapped.episode.task
    for turn in task.reference:
        obs, reward, terminated, truncated, info = env.step(turn.text)
        if terminated or truncated:
            break
    return info["messages"], reward


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["separate", "inline"])
def test_collector_matches_single_envs_under_greedy_decoding(tiny, mode):
    for domain in ("bank", "travel"):
        tasks = [t for t in TASKS if t.startswith(domain)]
        batch = collect_rollouts(
            tiny, domain, tasks, group_size=2, act="reference", rehearsal_mode=mode, rehearsal=REHEARSE_GREEDY,
            act_sampling=GREEDY, on_invalid="feedback",
        )  # fmt: skip
        assert len(batch.episodes) == 2 * len(tasks)
        for episode in batch.episodes:
            messages, reward = single_env_reference_run(tiny, episode.task_id, mode)
            assert episode.messages == messages and episode.reward == reward


def test_vector_env_matches_single_envs_with_the_policy_acting(tiny):
    kwargs = dict(domain="units", policy=tiny, rehearsal=REHEARSE_GREEDY, act_sampling=GREEDY, on_invalid="feedback")
    venv = gym.make_vec("EnvACE-Rehearsal-v0", num_envs=3, vectorization_mode="vector_entry_point", **kwargs)
    assert isinstance(venv, RehearsalVectorEnv)
    obs, infos = venv.reset(seed=10)
    singles = [gym.make("EnvACE-Rehearsal-v0", **kwargs) for _ in range(3)]
    single_obs = [env.reset(seed=10 + i)[0] for i, env in enumerate(singles)]
    assert list(obs) == single_obs
    actions = venv.act()
    assert list(actions) == [env.unwrapped.act() for env in singles]
    obs, rewards, terminated, truncated, infos = venv.step(actions)
    for i, env in enumerate(singles):
        o, r, te, tr, info = env.step(actions[i])
        assert (obs[i], rewards[i], terminated[i], truncated[i]) == (o, r, te, tr)
        assert infos["act"]["completion_ids"][i] == info["act"]["completion_ids"]


def test_vector_env_batches_rehearsals_into_one_call():
    domain = make_domain("bank")
    task = domain.tasks("train")[0]
    oracle = oracle_policy(domain, task)
    calls = []
    original = oracle.generate
    oracle.generate = lambda prompts, params: calls.append(len(prompts)) or original(prompts, params)
    venv = RehearsalVectorEnv(4, "bank", policy=oracle)
    venv.reset(options={"task": task.id})
    obs, rewards, terminated, truncated, infos = venv.step([task.reference[0].text] * 4)
    assert calls == [4]  # four rehearsals, one generate call
    assert all(len(r) == 1 and r[0]["accepted"] for r in infos["rehearsals"])


def test_vector_env_autoreset_modes(tiny):
    final = "Done."
    venv = RehearsalVectorEnv(2, "units", policy=tiny)
    venv.reset(seed=0)
    _, _, terminated, _, _ = venv.step([final, final])
    assert terminated.all()
    obs, rewards, terminated, truncated, infos = venv.step(["ignored", "ignored"])
    assert not terminated.any() and (rewards == 0).all() and "task" in infos  # the next step reset them
    same = RehearsalVectorEnv(2, "units", policy=tiny, autoreset_mode="SameStep")
    same.reset(seed=0)
    obs, rewards, terminated, truncated, infos = same.step([final, final])
    assert terminated.all() and infos["final_obs"][0].endswith("Done.<|im_end|>")
    assert obs[0] != infos["final_obs"][0]  # already the next episode's prompt


def test_partial_reset_and_task_options(tiny):
    venv = RehearsalVectorEnv(3, "units", policy=tiny)
    obs, infos = venv.reset(options={"task": ["units/001", "units/002", "units/003"]})
    assert list(infos["task_id"]) == ["units/train/001", "units/train/002", "units/train/003"]
    obs2, infos2 = venv.reset(options={"task": "units/009", "reset_mask": [False, True, False]})
    assert obs2[0] == obs[0] and obs2[2] == obs[2] and infos2["task_id"][1] == "units/train/009"


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_vector_infos_batch_when_sub_envs_differ_in_what_they_report(mode):
    """A clean step beside a malformed call: info["error"] is None in one sub-env, a dict in the other; Gymnasium's
    batching took the first one's type and broke on the second. A None is reported as absent (mask False)."""
    from envace_gym.testing import ScriptedPolicy

    for bad in (1, 0):  # in either order
        venv = RehearsalVectorEnv(2, "bank", policy=ScriptedPolicy(lambda prompt: "Done."), autoreset_mode=mode)
        venv.reset(seed=0)
        actions = ["Done.", "Done."]
        actions[bad] = "<tool_call>{oops</tool_call>"
        *_, infos = venv.step(actions)
        infos = infos["final_info"] if mode == "SameStep" else infos
        assert [bool(m) for m in infos["_error"]] == [i == bad for i in range(2)]
        assert infos["error"]["code"][bad] == "INVALID_TOOL_CALL_FORMAT"


def test_vector_reset_options_are_checked_and_a_list_of_seeds_seeds_the_generations(tiny):
    runs = []
    for _ in range(2):
        venv = RehearsalVectorEnv(2, "units", policy=tiny)
        venv.reset(seed=[3, 11])
        runs.append(int(venv.np_random.integers(2**31)))  # what seeds the next batched generation
    assert runs[0] == runs[1]
    with pytest.raises(ValueError, match="reset_mask'] must be 2 booleans, at least one True"):
        venv.reset(options={"reset_mask": [True]})
    with pytest.raises(ValueError, match="reset_mask'] must be 2 booleans, at least one True"):
        venv.reset(options={"reset_mask": [False, False]})
    with pytest.raises(ValueError, match="must be one task or 2, got 3"):
        venv.reset(options={"task": ["units/001", "units/002", "units/003"]})
    _, infos = venv.reset(options={"task": np.array(["units/001", "units/002"])})
    assert list(infos["task_id"]) == ["units/train/001", "units/train/002"]
    with pytest.raises(ValueError, match="does not render"):
        RehearsalVectorEnv(2, "units", policy=tiny, render_mode="human")


def forward_logprobs(model, prompt, completion, temperature):
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / scale, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


@pytest.mark.parametrize("mode", ["separate", "inline"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_rows_line_up_with_a_fresh_forward_pass(tiny, mode, temperature):
    params = SamplingParams(max_new_tokens=10, temperature=temperature)
    batch = collect_rollouts(
        tiny, "bank", ["bank/002"], group_size=2, rehearsal_mode=mode, act_sampling=params,
        rehearsal=RehearsalConfig(max_new_tokens=10, temperature=temperature), on_invalid="feedback", max_turns=3,
        seed=1,
    )  # fmt: skip
    samples = batch.samples()
    assert samples and {s.role for s in samples} <= ({"act", "rehearse"} if mode == "separate" else {"episode"})
    for s in samples:
        assert len(s.completion_ids) == len(s.logprobs) == len(s.mask)
        expected = forward_logprobs(tiny.model, s.prompt_ids, s.completion_ids, temperature)
        trained = torch.tensor(s.mask, dtype=torch.bool)
        assert trained.any()
        diff = (expected[trained] - torch.tensor(s.logprobs)[trained]).abs().max().item()
        assert diff < 1e-4, (s.role, diff)
        assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.mask, strict=True) if not m)


def test_act_prompts_grow_by_appending(tiny):
    batch = collect_rollouts(
        tiny, "bank", ["bank/000"], act="reference", rehearsal=RehearsalConfig(max_new_tokens=6), on_invalid="feedback"
    )
    # reference acting: the env tokenizes the text; the Act prompts still only grow
    episode = batch.episodes[0]
    assert episode.turns == 4
    domain = make_domain("bank")
    from envace_gym.episode import Episode, EpisodeConfig

    replay = Episode(domain, domain.task("bank/000"), EpisodeConfig(on_invalid="feedback"), tiny.tokenizer, None)
    prompts = []
    for turn in domain.task("bank/000").reference:
        prompts.append(list(replay.prompt_ids))
        step = replay.play_turn(turn.text)
        try:
            requests = next(step)
            while True:
                requests = step.send(tiny.generate([r.prompt_ids for r in requests], SamplingParams(max_new_tokens=4)))
        except StopIteration:
            pass
    for before, after in zip(prompts, prompts[1:], strict=False):
        assert after[: len(before)] == before and len(after) > len(before)
    # and the text the ids decode to is the observation, i.e. the chat template's own rendering
    rendered = tiny.tokenizer.apply_chat_template(
        [{k: v for k, v in m.items() if k != "tool_calls"} for m in replay.messages],
        tools=replay.tools_openai, add_generation_prompt=False, tokenize=False,
    )  # fmt: skip
    assert tiny.tokenizer.decode(replay.prompt_ids[: len(prompts[-1])]) in rendered + "<|im_start|>assistant\n"


def test_inline_rows_mask_the_scaffolding():
    domain = make_domain("bank")
    task = domain.tasks("train")[0]
    tok = oracle_policy(domain, task).tokenizer

    # an inline oracle: answers with the real result, then closes the tool response as the template does
    executor = domain.make_executor(task)
    pending = [c for c, _ in task.reference_pairs()]

    def respond(prompt: str) -> str:
        return envace_gym.episode.responses.dump(executor.execute(pending.pop(0))) + "\n</tool_response>"

    from envace_gym.testing import ScriptedPolicy

    batch = collect_rollouts(ScriptedPolicy(respond, tok), "bank", [task], act="reference", rehearsal_mode="inline")
    (episode,) = batch.episodes
    assert episode.reward == 1.0
    (row,) = episode.rows
    trained = tok.decode([t for t, m in zip(row.completion_ids, row.mask, strict=True) if m])
    masked = tok.decode([t for t, m in zip(row.completion_ids, row.mask, strict=True) if not m])
    assert "<tool_response>" in masked and "<|im_start|>assistant" in masked
    assert "<tool_response>" not in trained and "</tool_response>" in trained  # the model closes its response
    for _call, result in task.reference_pairs():
        assert envace_gym.episode.responses.dump(result) in trained


def test_progress_callbacks_count_every_unit_of_work(tiny):
    from envace_gym.evaluation import evaluate

    seen = []
    collect_rollouts(
        tiny, "bank", TASKS[:2], group_size=2, act="reference", rehearsal=REHEARSE_GREEDY,
        progress=lambda done, total: seen.append((done, total)),
    )  # fmt: skip
    assert seen == [(k, 4) for k in range(1, 5)]  # one call per finished episode, in order

    seen.clear()
    venv = RehearsalVectorEnv(
        3, "bank", policy=tiny, rehearsal=REHEARSE_GREEDY, act_sampling=GREEDY, on_invalid="feedback",
        progress=lambda done, total: seen.append((done, total)),
    )  # fmt: skip
    venv.reset(seed=0)
    venv.step(['<tool_call>\n{"name": "get_balance", "arguments": {"account_id": "ACC-1"}}\n</tool_call>'] * 3)
    assert seen == [(1, 3), (2, 3), (3, 3)]  # each sub-env's turn, rehearsal included

    seen.clear()
    evaluate(tiny, "bank", num_tasks=2, max_new_tokens=4, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(k, 8) for k in range(1, 9)]  # the four passes (real execution, fidelity thrice) as one count


def test_progress_bar_is_opt_in(tiny, capsys):
    from envace_gym.evaluation.evaluate import _pass_progress

    assert _pass_progress("my eval", 0, 6, "episodes (real execution)") == "my eval: episodes (real execution)"
    collect_rollouts(tiny, "units", ["units/000"], act="reference", rehearsal=REHEARSE_GREEDY)
    assert "episodes" not in capsys.readouterr().err  # silent unless asked
    collect_rollouts(tiny, "units", ["units/000"], act="reference", rehearsal=REHEARSE_GREEDY, progress="my pass")
    assert "my pass" in capsys.readouterr().err


def test_collect_rollouts_honours_max_user_turns():
    # travel/004 has scripted user turns: a reference replay answers, then the next user turn comes
    from envace_gym.testing import ScriptedPolicy

    kwargs = dict(executor="real", act="reference")
    (played,) = collect_rollouts(ScriptedPolicy([]), "travel", ["travel/004"], **kwargs).episodes
    assert played.terminated and played.reward == 1.0
    (cut,) = collect_rollouts(ScriptedPolicy([]), "travel", ["travel/004"], max_user_turns=1, **kwargs).episodes
    assert cut.truncated and not cut.terminated and cut.termination_reason == "max_user_turns"
    assert sum(m["role"] == "user" for m in cut.messages) == 2  # the second user turn arrived, then the cut


def test_the_driver_plays_a_turn_as_generate_then_lockstep_did(tiny):
    import numpy as np

    from envace_gym.episode import Episode, EpisodeConfig, EpisodeDriver, generate_batched

    domain = make_domain("bank")
    config = EpisodeConfig.build(on_invalid="feedback", rehearsal={"max_new_tokens": 8, "temperature": 1.0})
    params = SamplingParams(max_new_tokens=16, temperature=1.0)

    def episodes():
        return [
            Episode(domain, domain.task(f"bank/00{i}"), config, tiny.tokenizer, np.random.default_rng(i), key=i)
            for i in range(2)
        ]

    by_hand, rng = episodes(), np.random.default_rng(7)
    gens = generate_batched(tiny, [e.prompt_ids for e in by_hand], params, rng, None, [e.key for e in by_hand])
    manual = EpisodeDriver(tiny, rng).drive([e.play_turn(g.text, g) for e, g in zip(by_hand, gens, strict=True)])
    driven = episodes()
    done = []
    driver = EpisodeDriver(tiny, np.random.default_rng(7))
    outcomes = driver.play(driven, driver.act(driven, params), on_done=done.append)
    assert [o.info["messages"] for o in outcomes] == [o.info["messages"] for o in manual]
    assert [e.rows for e in driven] == [e.rows for e in by_hand] and sorted(done) == [0, 1]
    with pytest.raises(ValueError, match="one move per episode"):
        EpisodeDriver(tiny, rng).play(driven, ["hi"])


def test_a_driver_without_policy_refuses_to_generate(tiny):
    import numpy as np

    from envace_gym import DomainError
    from envace_gym.episode import Episode, EpisodeConfig, EpisodeDriver

    domain = make_domain("bank")
    task = domain.task("bank/000")
    replay = EpisodeDriver.without_policy("this replay may not generate")
    real = Episode(domain, task, EpisodeConfig.build(executor="real"), tiny.tokenizer, np.random.default_rng(0))
    (outcome,) = replay.play([real], [real.reference_act()])  # the real executor answers: nothing generated
    assert outcome.info["calls"] and outcome.info["calls"][0]["route"] == "real"
    rehearsed = Episode(domain, task, EpisodeConfig.build(), tiny.tokenizer, np.random.default_rng(0))
    with pytest.raises(DomainError, match="this replay may not generate"):
        replay.play([rehearsed], [rehearsed.reference_act()])


def test_reference_act_follows_the_reference_then_has_nothing_more_to_do(tiny):
    import numpy as np

    from envace_gym.episode import NOTHING_MORE, Episode, EpisodeConfig, EpisodeDriver

    domain = make_domain("bank")
    task = domain.task("bank/000")
    episode = Episode(domain, task, EpisodeConfig.build(executor="real"), tiny.tokenizer, np.random.default_rng(0))
    driver = EpisodeDriver.without_policy("no generation in a real replay")
    for turn in task.reference:
        assert episode.reference_act() == episode.reference_action(turn)
        (outcome,) = driver.play([episode], [episode.reference_act()])
    assert outcome.terminated and outcome.reward == 1.0 and episode.turn == len(task.reference)
    assert episode.reference_act() == NOTHING_MORE  # past the reference solution


def test_every_rehearsal_mode_has_its_tool_turn():
    """A rehearsal mode is a name in REHEARSAL_MODES (what configs accept) and a tool turn in TOOL_TURNS."""
    from envace_gym.episode.episode import TOOL_TURNS
    from envace_gym.episode.config import REHEARSAL_MODES

    assert tuple(TOOL_TURNS) == REHEARSAL_MODES


def test_an_episode_result_holds_the_records_and_the_ending_its_info_shows(tiny):
    """The collector's result is read from the episode (typed records), and says what the env's info says."""
    import numpy as np

    from envace_gym.domains import CallRecord
    from envace_gym.episode import Episode, EpisodeConfig, EpisodeDriver

    domain = make_domain("bank")
    task = domain.task("bank/000")
    (result,) = collect_rollouts(tiny, domain, [task], act="reference", executor="real").episodes
    episode = Episode(domain, task, EpisodeConfig.build(executor="real"), tiny.tokenizer, np.random.default_rng(0))
    replay, calls = EpisodeDriver.without_policy("a reference replay"), []
    while not episode.done:
        (outcome,) = replay.play([episode], [episode.reference_act()])
        calls += outcome.info["calls"]
    assert all(isinstance(c, CallRecord) for c in result.calls) and result.real_calls == len(result.calls) > 0
    assert [c.to_dict() for c in result.calls] == calls  # info's dicts are the records', for Gymnasium's API
    info = outcome.info
    assert (result.reward, result.success, result.checks, result.termination_reason, result.messages) == (
        outcome.reward, info["success"], info["reward_checks"], info["termination_reason"], info["messages"]
    )
