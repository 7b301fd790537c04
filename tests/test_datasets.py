"""Dataset domains: conversations in three formats become tasks, played to a reward with no executor."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
from envace_gym import DomainError, ToolCall
from envace_gym.domains import DatasetDomain, make_domain, reference_call_reward
from envace_gym.testing import ScriptedPolicy

DATA = Path(__file__).resolve().parents[1] / "examples" / "data"
FILES = ["openai.jsonl", "envace.jsonl", "sharegpt.jsonl"]


@pytest.mark.parametrize("file", FILES)
def test_each_example_file_becomes_the_same_tasks(file):
    domain = make_domain(str(DATA / file))
    assert isinstance(domain, DatasetDomain) and not domain.skipped
    tasks = [*domain.tasks("train"), *domain.tasks("test")]
    assert len(tasks) == 10 and {t.id for t in tasks} == {f"desk/{k:03d}" for k in range(10)}
    two_turns = next(t for t in tasks if t.user_turns)
    assert two_turns.user_turns == ("And how is the weather in Lisbon?",)
    parallel = next(t for t in tasks if len(t.reference[0].calls) == 2)
    assert [c.name for c in parallel.reference[0].calls] == ["get_weather", "convert_currency"]
    assert parallel.reference[0].results[1] == {"amount": 86.4, "currency": "USD"}
    assert domain.tools_for(parallel).names == ["get_weather", "convert_currency", "book_table"]
    assert all(t.system_prompt.startswith("You are a travel-desk assistant") for t in tasks)


@pytest.mark.parametrize("file", FILES)
def test_the_reference_scores_one_and_a_corrupted_call_less(file):
    env = gym.make("EnvACE-Rehearsal-v0", domain=str(DATA / file), executor="cached", on_invalid="feedback",
                   policy=ScriptedPolicy(['{"city": "Lisbon", "temperature_c": 99}\n</execution_result>'] * 4))  # fmt: skip
    for task_id, corrupt in (("desk/000", False), ("desk/000", True)):
        env.reset(options={"task": task_id})
        episode = env.unwrapped.episode
        for turn in episode.task.reference:
            if corrupt and turn.calls:
                turn = type(turn)(turn.content, (ToolCall(turn.calls[0].name, {"city": "Paris"}),), turn.results)
            *_, reward, terminated, truncated, info = env.step(episode.reference_action(turn))
        assert terminated
        if corrupt:
            assert reward < 1.0 and info["calls"] == [] and episode.records[0].route == "rehearsal"
        else:
            assert reward == 1.0 and episode.records[0].route == "cache"


def test_the_envace_rows_keep_their_checklists():
    domain = make_domain(str(DATA / "envace.jsonl"))
    task = domain.task("desk/007")  # two user turns
    (checklist,) = task.expected["checklist_list"]
    assert len(task.user_turns) == 1 and len(checklist) == 2
    assert checklist[0][0]["question"].startswith("Did the assistant call book_table")


def test_datasets_objects_folders_and_parquet_load(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(line) for line in (DATA / "openai.jsonl").read_text().splitlines()]
    # nested messages of varying shapes go into Arrow columns as JSON text, as such datasets usually store them
    ds = datasets.Dataset.from_list([{k: v if k == "id" else json.dumps(v) for k, v in r.items()} for r in rows])
    ds.save_to_disk(tmp_path / "saved")
    ds.to_parquet(tmp_path / "rows.parquet")
    for source in (ds, str(tmp_path / "saved"), str(tmp_path / "rows.parquet")):
        domain = make_domain(source) if not isinstance(source, str) else make_domain(source, name="desk")
        assert len(domain.tasks("train")) + len(domain.tasks("test")) == 10 and not domain.skipped, source
        assert domain.task("desk/008").expected == {"answer_numbers": [86.4]}


def test_bad_rows_are_reported_and_skipped(caplog):
    good = json.loads((DATA / "openai.jsonl").read_text().splitlines()[0])
    bad_schema = {**good, "id": "bad/1", "tools": [{"name": "x", "parameters": {"type": "objekt"}}]}
    bad_call = {**good, "id": "bad/2"}
    bad_call["messages"] = [*good["messages"][:2], {"role": "assistant", "content": "",
                            "tool_calls": [{"function": {"name": "get_weather", "arguments": "{not json"}}]}]  # fmt: skip
    unknown_tool = {**good, "id": "bad/3"}
    unknown_tool["messages"] = [*good["messages"][:2], {"role": "assistant", "content": "",
                                "tool_calls": [{"function": {"name": "teleport", "arguments": {}}}]}]  # fmt: skip
    no_user = {"id": "bad/4", "messages": [{"role": "system", "content": "s"}], "tools": []}
    with caplog.at_level("WARNING", logger="envace_gym"):
        domain = DatasetDomain(
            [good, bad_schema, bad_call, unknown_tool, no_user, "not a row", {"messages": ["hi"]}], name="mixed"
        )
    assert [i for i, _ in domain.skipped] == [1, 2, 3, 4, 5, 6]
    reasons = dict(domain.skipped)
    assert "SchemaError" in reasons[1] and "does not parse" in reasons[2] and "'teleport'" in reasons[3]
    assert "no user turn" in reasons[4] and "must be an object" in reasons[5]
    assert "6 row(s) skipped" in caplog.text
    with pytest.raises(DomainError, match="no usable row"):
        DatasetDomain([bad_schema], name="none")
    with pytest.raises(DomainError, match="format must be one of"):
        DatasetDomain([good], format="alpaca")


def test_reference_call_reward_counts_order_and_answers():
    domain = make_domain(str(DATA / "openai.jsonl"))
    task = next(t for t in [*domain.tasks("train"), *domain.tasks("test")] if len(t.reference[0].calls) == 2)
    from envace_gym.domains import CallRecord, Trajectory

    def traj(calls, answer):
        records = tuple(CallRecord(1, c, "cache", {}, None, 1) for c in calls)
        return Trajectory(task, (), records, (answer,))

    w, c = task.reference[0].calls
    right = reference_call_reward(task, traj([w, c], "Rome is 18 °C; 80 EUR is 86.4 USD."))
    assert right.score == 1.0 and right.success
    swapped = reference_call_reward(task, traj([c, w], "86.4"))
    assert swapped.checks == {"reference_calls": True, "reference_order": False, "answer_numbers": True}
    missing = reference_call_reward(task, traj([w], "no idea"))
    assert missing.score == 0.0


def test_envace_eval_runs_on_a_dataset_file(capsys):
    from envace_gym.cli import main

    assert main(["eval", "--domain", str(DATA / "openai.jsonl"), "--model", "tiny", "--split", "train",
                 "--num-tasks", "2", "--max-new-tokens", "8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "openai / train: 2 episodes, cached execution" in out and "rehearsals" in out


def test_fidelity_on_a_dataset_compares_with_the_recorded_results():
    from envace_gym.evaluation import evaluate

    domain = make_domain(str(DATA / "openai.jsonl"))
    tasks = domain.tasks("train")[:2]
    calls = [c for t in tasks for turn in t.reference for c in turn.calls]
    answers = {json.dumps(c.arguments, sort_keys=True): r for t in tasks for c, r in t.reference_pairs()}

    def rehearse(prompt):  # a perfect simulator of the recorded results
        line = [x for x in prompt.splitlines() if x.startswith("call: ")][-1]
        call, _ = json.JSONDecoder().raw_decode(line[len("call: ") :])
        return json.dumps(answers[json.dumps(call["arguments"], sort_keys=True)]) + "\n</execution_result>"

    result = evaluate(ScriptedPolicy(lambda p: rehearse(p) if "call: " in p else "I cannot help."), domain, "train", 2)
    assert result.executor == "cached" and result.rehearsals == len(calls) and result.equal_to_real == 1.0


def test_sft_rows_replay_a_dataset_from_its_recorded_results(tokenizer):
    from envace_gym.training import sft_rows

    domain = make_domain(str(DATA / "openai.jsonl"))
    task = domain.task("desk/008")  # two parallel calls, then the answer
    rows = sft_rows(domain, tokenizer, [task])
    assert [r["role"] for r in rows] == ["act", "rehearse", "rehearse", "act"]
    rehearsed = tokenizer.decode(
        [t for t, m in zip(rows[2]["input_ids"], rows[2]["completion_mask"], strict=True) if m]
    )
    assert json.dumps({"amount": 86.4, "currency": "USD"}) in rehearsed


@pytest.mark.parametrize("mode", ["sft", "rehearsal"])
def test_envace_train_runs_on_a_dataset_file(tiny_path, tmp_path, mode):
    from envace_gym.cli import main

    out = tmp_path / mode
    argv = ["train", "--mode", mode, "--model", tiny_path, "--output_dir", str(out), "--domain", str(DATA / "sharegpt.jsonl"),
            "--steps", "1", "--tasks_per_step", "1", "--group_size", "2", "--max_new_tokens", "8", "--sft_tasks", "2"]  # fmt: skip
    assert main(argv) == 0
    assert (out / "final" / "config.json").is_file() and json.loads((out / "train_summary.json").read_text())["last"]


def _row(messages, **extra):
    tools = json.loads((DATA / "openai.jsonl").read_text().splitlines()[0])["tools"]
    return {"id": extra.pop("id", "r/1"), "messages": messages, "tools": tools, **extra}


def _call(name, args, call_id=None):
    return {**({"id": call_id} if call_id else {}), "type": "function", "function": {"name": name, "arguments": args}}


def test_rows_are_read_as_written_not_as_guessed():
    user = {"role": "user", "content": [{"type": "text", "text": "Weather in Lisbon and Oslo?"}]}  # content parts
    out_of_order = _row([
        user,
        {"role": "assistant", "content": "Let me check."},  # then a separate calling message: one turn
        {"role": "assistant", "content": None, "tool_calls": [_call("get_weather", {"city": "Lisbon"}, "a"),
                                                              _call("get_weather", {"city": "Oslo"}, "b")]},
        {"role": "tool", "tool_call_id": "b", "content": '{"city": "Oslo"}'},
        {"role": "tool", "tool_call_id": "a", "content": '{"city": "Lisbon"}'},
        {"role": "assistant", "content": "Done."},
    ])  # fmt: skip
    task = DatasetDomain([out_of_order], test_fraction=0.0).task("r/1")
    assert task.prompt == "Weather in Lisbon and Oslo?"
    first = task.reference[0]
    assert first.content == "Let me check." and [c.arguments["city"] for c in first.calls] == ["Lisbon", "Oslo"]
    assert [r["city"] for r in first.results] == ["Lisbon", "Oslo"]  # paired by tool_call_id
    hermes = {"id": "h/1", "conversations": [
        {"from": "system", "value": "Use <tools></tools> tags.\n<tools>\n" + json.dumps(_row([])["tools"][0]) + "\n"
                                    + json.dumps(_row([])["tools"][1]) + "\n</tools>"},
        {"from": "human", "value": "Lisbon and Oslo?"},
        {"from": "gpt", "value": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>\n'
                                 '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'},
        {"from": "tool", "value": '<tool_response>\n{"t": 21}\n</tool_response>\n<tool_response>\n{"t": 4}\n</tool_response>'},
        {"from": "gpt", "value": "21 and 4."}]}  # fmt: skip
    task = DatasetDomain([hermes], test_fraction=0.0).task("h/1")
    assert task.reference[0].results == ({"t": 21}, {"t": 4})  # two responses in one tool turn, one per call
    assert DatasetDomain([hermes], test_fraction=0.0).tools_for(task).names == ["get_weather", "convert_currency"]


def test_rows_that_could_not_teach_or_score_are_skipped_with_a_reason(tmp_path):
    base = [{"role": "user", "content": "Hi"}]
    bad_args = _row([*base, {"role": "assistant", "tool_calls": [_call("get_weather", {"town": "X"})]}], id="b/1")
    unknown_id = _row([*base, {"role": "assistant", "tool_calls": [_call("get_weather", {"city": "X"}, "a")]},
                       {"role": "tool", "tool_call_id": "zz", "content": "{}"}], id="b/2")  # fmt: skip
    checklist = {"id": "b/3", "messages": base, "extra_info": {"tools": json.dumps(_row([])["tools"]), "messages": base,
                 "interaction_kwargs": {"checklist_list": [[[{"weight": 1}]]]}}}  # fmt: skip
    turns = {**checklist, "id": "b/4"}
    turns["extra_info"] = {**checklist["extra_info"], "interaction_kwargs": {"checklist_list": [[[], []]]}}
    good = _row([*base, {"role": "assistant", "content": "Hello."}], id="g/1")
    domain = DatasetDomain([bad_args, unknown_id, checklist, turns, good], name="mixed")
    reasons = dict(domain.skipped)
    assert sorted(reasons) == [0, 1, 2, 3]
    assert "fails its schema" in reasons[0] and "tool_call_id 'zz'" in reasons[1]
    assert "needs a 'question'" in reasons[2] and "2 turn(s) of items; the conversation has 1" in reasons[3]
    lines = tmp_path / "lines.jsonl"
    lines.write_text(json.dumps(good) + "\n{not json\n" + "[" * 5000 + "\n")
    assert [i for i, _ in DatasetDomain(str(lines)).skipped] == [1, 2]  # a bad line is a skipped row, not a crash
    scalar = tmp_path / "scalar.json"
    scalar.write_text("3")
    with pytest.raises(DomainError, match="must hold a list of rows"):
        make_domain(str(scalar))


def test_cached_evaluation_rehearses_unmatched_calls_without_the_references():
    """The success pass answers a call the records do not hold by rehearsal, and that rehearsal enters the agent's
    conversation: its prompt holds no reference execution (test-time: nothing privileged), as the planner's."""
    from envace_gym.evaluation import evaluate

    domain = make_domain(str(DATA / "envace.jsonl"))
    unmatched = '<tool_call>{"name": "get_weather", "arguments": {"city": "Atlantis"}}</tool_call>'
    seen = []

    def respond(prompt):
        if "precise tool simulator" in prompt:
            seen.append(prompt)
            return '{"temp_c": 20}\n</execution_result>'
        return "Done." if "temp_c" in prompt else unmatched

    result = evaluate(ScriptedPolicy(respond), domain, "train", num_tasks=1, fidelity=False)
    assert result.executor == "cached" and seen and not any("Reference executions" in p for p in seen)


def test_splits_honour_test_fraction_on_small_files(tmp_path):
    """A 5-row file at the default test_fraction=0.1 keeps all 5 for training (a per-row hash once split it
    2 train / 3 test); the rule is floor(n * test_fraction) test rows, at least one train row left."""
    rows = (DATA / "openai.jsonl").read_text().splitlines()
    small = tmp_path / "five.jsonl"
    small.write_text("\n".join(rows[:5]) + "\n")
    domain = make_domain(str(small))
    assert (len(domain.tasks("train")), len(domain.tasks("test"))) == (5, 0)
    for fraction, test in ((0.1, 1), (0.3, 3), (0.5, 5), (0.99, 9)):  # 10 rows; never all of them
        domain = DatasetDomain(DATA / "openai.jsonl", test_fraction=fraction)
        assert (len(domain.tasks("train")), len(domain.tasks("test"))) == (10 - test, test), fraction
        assert all(t.split == "test" for t in domain.tasks("test"))
    assert len(DatasetDomain([json.loads(rows[0])], test_fraction=0.9).tasks("train")) == 1
    # the same file splits the same way in every process (ids ranked by a stable hash)
    assert [t.id for t in DatasetDomain(DATA / "openai.jsonl", test_fraction=0.3).tasks("test")] == [
        t.id for t in DatasetDomain(DATA / "openai.jsonl", test_fraction=0.3).tasks("test")
    ]
