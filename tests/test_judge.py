"""The checklist judge: scoring rules, masking, caching, and both backends (the endpoint one against a real
``transformers serve`` on a local port)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import envace_gym  # noqa: F401
from envace_gym.domains import CallRecord, DatasetDomain, Trajectory, register_domain
from envace_gym.domains.judge import ChecklistJudge, TransformersJudge, judge_prompt, read_verdict
from envace_gym.endpoint import ChatEndpoint
from envace_gym.errors import DomainError, ErrorCode, ToolError
from envace_gym.rollout import collect_rollouts
from envace_gym.testing import ScriptedPolicy, served, taught_model, tiny_policy

DATA = Path(__file__).resolve().parents[1] / "examples" / "data"
PASS, FAIL = '{"pass": true, "reason": "ok"}', '{"pass": false, "reason": "no"}'


class Scripted:
    """A judge backend answering by a rule on the prompt; records how many prompts it saw."""

    def __init__(self, answer):
        self.answer, self.seen = answer, 0

    def complete(self, prompts, attempt=0):
        self.seen += len(prompts)
        return [self.answer(p[1]["content"]) for p in prompts]


def desk_task(task_id="desk/007"):  # two user turns, one checklist
    return DatasetDomain(str(DATA / "envace.jsonl"), name="desk").task(task_id)


def trajectory(task, failed_turn=None, turns=2):
    """The reference played: its messages, its calls (one failed in ``failed_turn``)."""
    messages = [{"role": "system", "content": "s"}]
    records, users = [], iter([task.prompt, *task.user_turns])
    for n, turn in enumerate(task.reference):
        if not turn.calls:
            messages.append({"role": "assistant", "content": turn.content})
            continue
        if n == 0 or not task.reference[n - 1].calls:
            user_turn = sum(1 for m in messages if m["role"] == "user") + 1
            if user_turn > turns:
                break
            messages.append({"role": "user", "content": next(users)})
        messages.append({"role": "assistant", "content": "", "tool_calls": [c.to_openai() for c in turn.calls]})
        for call, result in zip(turn.calls, turn.results, strict=True):
            error = ToolError(ErrorCode.EXECUTION_ERROR, "boom") if user_turn == failed_turn else None
            records.append(CallRecord(n + 1, call, "cache", result, error, user_turn))
            messages.append({"role": "tool", "name": call.name, "content": json.dumps(result)})
    return Trajectory(task, tuple(messages), tuple(records), ())


def test_verdicts_are_read_strictly():
    assert read_verdict(PASS) is True and read_verdict(FAIL) is False
    assert read_verdict('```json\n{"pass": true}\n```') is True
    for bad in ['{"pass": "yes"}', "pass", '{"pass": true', None, "[true]", '{"pass": NaN}']:
        assert read_verdict(bad) is None, bad


def test_turn_scores_weights_tool_failures_and_unreached_turns():
    task = desk_task()
    (checklist,) = task.expected["checklist_list"]
    judge = ChecklistJudge(Scripted(lambda p: PASS if "item: Did the assistant call book_table" in p else FAIL))
    result = judge(task, trajectory(task))
    # turn 1: the book_table item passes (weight 1/2), the answer item fails; turn 2: both fail
    assert result.score == pytest.approx((checklist[0][0]["weight"] + 0.0) / 2)
    assert result.checks["c0.t1.0"] and not result.checks["c0.t1.1"]
    everything = ChecklistJudge(Scripted(lambda p: PASS))
    assert everything(task, trajectory(task)).score == pytest.approx(1.0)
    assert everything(task, trajectory(task, failed_turn=1)).score == pytest.approx(0.5)  # turn 1 zeroed
    assert everything(task, trajectory(task, turns=1)).score == pytest.approx(0.5)  # turn 2 never reached


def test_unreadable_verdicts_mask_the_episode_after_retries():
    task = desk_task()
    answers = iter(["nonsense", "still nonsense"] + [PASS] * 10)
    retried = ChecklistJudge(Scripted(lambda p: next(answers)), retries=2)
    assert retried(task, trajectory(task)).score is not None  # read on a resample
    broken = ChecklistJudge(Scripted(lambda p: "I think it passes"), retries=1)
    result = broken(task, trajectory(task))
    assert result.score is None and result.checks == {"judge_read": False} and broken.failures == 1
    assert not result.success  # a masked episode is never a success
    offline = ChecklistJudge(ChatEndpoint("http://127.0.0.1:9/v1", "judge", timeout=2), retries=0)
    assert offline(task, trajectory(task)).score is None and offline.failures == 1  # transport error: masked
    with pytest.raises(DomainError, match="envace checklists"):
        ChecklistJudge(Scripted(lambda p: PASS))(
            DatasetDomain(str(DATA / "openai.jsonl")).task("desk/000"), trajectory(task)
        )


def test_a_group_pays_once_for_the_same_judgment():
    task = desk_task()
    backend = Scripted(lambda p: PASS)
    judge = ChecklistJudge(backend)
    for _ in range(4):  # four episodes of a group that did the same thing
        judge(task, trajectory(task))
    items = sum(len(turn) for turn in task.expected["checklist_list"][0])
    assert backend.seen == items and judge.judged == items


@pytest.mark.slow
def test_the_in_process_backend_batches_an_episodes_items():
    task = desk_task()
    judged = ChecklistJudge(TransformersJudge(ScriptedPolicy(lambda prompt: PASS)))
    assert judged(task, trajectory(task)).score == pytest.approx(1.0)
    random_model = ChecklistJudge(TransformersJudge(tiny_policy()), retries=0)  # writes no JSON: masked
    assert random_model(task, trajectory(task)).score is None


@pytest.mark.slow
def test_a_failed_judge_is_masked_in_rollouts_and_both_trainers(tmp_path):
    from envace_gym.integrations import trl as envace_trl
    from envace_gym.training.trainer import TrainerConfig, train

    register_domain("desk-judged", lambda: DatasetDomain(
        str(DATA / "envace.jsonl"), name="desk", reward=ChecklistJudge(Scripted(lambda p: "?"), retries=0)),
        overwrite=True)  # fmt: skip
    policy = tiny_policy(seed=2)
    batch = collect_rollouts(policy, "desk-judged", ["desk/000", "desk/001"], group_size=2, act="reference",
                             executor="cached")  # fmt: skip
    assert all(e.reward is None for e in batch.episodes) and batch.stats.masked_episodes == 4
    before = [p.detach().clone() for p in policy.model.parameters()]
    (step,) = train(policy, TrainerConfig(domain="desk-judged", steps=1, tasks_per_step=2, group_size=2,
                                          max_new_tokens=8, executor="cached"))  # fmt: skip
    assert step["tokens/trained"] == 0 and step["episode/masked"] == 4
    assert all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters(), strict=True))

    path = tmp_path / "tiny"
    policy.model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)
    from transformers import AutoTokenizer

    args = envace_trl.EnvACEGRPOConfig(output_dir=str(tmp_path / "out"), domain="desk-judged", executor="cached",
                                       per_device_train_batch_size=4, num_generations=2, max_completion_length=8,
                                       max_steps=1, use_cpu=True, report_to="none", bf16=False, gradient_checkpointing=False, save_strategy="no")  # fmt: skip
    trainer = envace_trl.EnvACEGRPOTrainer(
        model=str(path), args=args, processing_class=AutoTokenizer.from_pretrained(path)
    )
    out = trainer._generate_and_score_completions([{"prompt": "desk/000"}] * 2 + [{"prompt": "desk/001"}] * 2)
    assert out["tool_mask"].sum() == 0 and out["advantages"].abs().sum() == 0


# -- the endpoint backend against a real server ------------------------------------------------------------
@pytest.mark.slow
def test_the_endpoint_backend_scores_through_a_real_local_server(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from envace_gym.domains.judge import checklists_of, turn_transcripts

    task = desk_task()
    transcripts = turn_transcripts(trajectory(task))
    prompts = [judge_prompt(i, transcripts[t]) for t, items in enumerate(checklists_of(task)[0]) for i in items]
    model_dir = tmp_path / "judge-model"
    taught_model(model_dir, prompts, PASS)  # a passing verdict for every judge prompt of the test
    with served(model_dir) as base_url:
        judge = ChecklistJudge(ChatEndpoint(base_url, str(model_dir), max_concurrency=4, timeout=60, temperature=0.0,
                                            max_tokens=24))  # fmt: skip
        result = judge(task, trajectory(task))
        assert result.score == pytest.approx(1.0), result
        assert judge.judged == sum(len(turn) for turn in task.expected["checklist_list"][0])


# -- checklists derived from references ----------------------------------------------------------------------
def test_checklists_are_derived_from_the_reference_and_load_back(tmp_path, capsys):
    from envace_gym.cli import main
    from envace_gym.domains.checklists import ChecklistReport, derive_checklists

    domain = DatasetDomain(str(DATA / "openai.jsonl"), name="desk")
    task = domain.task("desk/007")  # book_table, then get_weather after a second user turn
    facts = Scripted(lambda p: '["the booking is confirmed", "the confirmation is BK-420"]' if "BK-" in p else "?")
    report = ChecklistReport()
    ((checklist,),) = derive_checklists([task], facts, report)
    assert [len(turn) for turn in checklist] == [3, 2]  # turn 1: call + 2 facts; turn 2: call + fallback
    assert checklist[0][0]["question"].startswith("Did the assistant call book_table with")
    assert checklist[0][2]["pass_condition"] == "the confirmation is BK-420"
    assert checklist[1][1]["question"] == "Does the final answer agree with the reference answer?"
    assert report.fallbacks == ["desk/007, turn 2"] and sum(i["weight"] for i in checklist[0]) == pytest.approx(1)

    out = tmp_path / "checked.jsonl"
    assert main(["checklists", "--domain", str(DATA / "openai.jsonl"), "--out", str(out), "--model", "tiny"]) == 0
    assert "wrote 10 tasks" in capsys.readouterr().out
    loaded = DatasetDomain(str(out), name="desk")
    assert not loaded.skipped and len(loaded.tasks("train")) + len(loaded.tasks("test")) == 10
    again = loaded.task("desk/007")
    assert again.reference == task.reference and again.user_turns == task.user_turns
    judge = ChecklistJudge(Scripted(lambda p: PASS))
    assert judge(again, trajectory(again)).score == pytest.approx(1.0)
    assert main(["checklists", "--domain", str(DATA / "openai.jsonl"), "--out", str(out), "--base-url", "x"]) == 2


def test_judge_edges_mask_or_fail_never_pass():
    task = desk_task()
    everything = ChecklistJudge(Scripted(lambda p: PASS))
    assert not everything(task, trajectory(task, failed_turn=1)).success  # a zeroed turn is not a success
    assert not everything(task, trajectory(task, turns=1)).success  # nor is an unreached one
    assert everything(task, trajectory(task)).success

    class Raising:
        def complete(self, prompts, attempt=0):
            raise ConnectionError("reset by peer")

    raising = ChecklistJudge(Raising(), retries=1)
    assert raising(task, trajectory(task)).score is None and raising.failures == 1

    from envace_gym.domains.judge import turn_transcripts

    traj = trajectory(task)
    error = {"role": "user", "name": "", "content": '{"error_tool_call": {}}'}  # gpt-oss sends errors as user turns
    shifted = Trajectory(task, (*traj.messages[:3], error, *traj.messages[3:]), traj.calls, ())
    assert len(turn_transcripts(shifted)) == len(turn_transcripts(traj)) == 2


def test_checklists_keep_the_answer_checks(tmp_path):
    from envace_gym.domains.checklists import write_checklists

    out = tmp_path / "c.jsonl"
    write_checklists(DatasetDomain(str(DATA / "openai.jsonl")), Scripted(lambda p: '["a fact"]'), out, progress=False)
    again = DatasetDomain(str(out))
    assert again.task("desk/000").expected["answer_numbers"] == [21]
