"""Schemas nobody here wrote (a dataset's tools, an MCP server's, a benchmark's): their regexes run in linear
time, what cannot be checked that way is refused when the schema is built, nothing is ever retrieved for a
``$ref``, one step's checks stop when its time budget is spent, and no task or message takes an observation
outside its space (docs/reliability.md, "Untrusted schemas" and "Oversized inputs")."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import gymnasium as gym
import jsonschema
import numpy as np
import pytest
import referencing.exceptions
from gymnasium.utils.env_checker import check_env

from envace_gym import Limits, ToolCall, ToolSchema, make_domain
from envace_gym.domains.dataset import DatasetDomain
from envace_gym.episode import Episode, EpisodeConfig, EpisodeDriver
from envace_gym.errors import ErrorCode, SchemaError, TaskTooLongError
from envace_gym.evaluation.evaluate import evaluate
from envace_gym.rollout import collect_rollouts
from envace_gym.testing import ScriptedPolicy
from envace_gym.tools.budget import StepBudget
from envace_gym.tools.patterns import LOCAL_REFERENCES, linear_time
from envace_gym.training.sft import sft_rows

CATASTROPHIC = "^(a+)+$"  # Python's re backtracks exponentially on "aaa...a!"
HOSTILE = "a" * 34 + "!"
BOUND_S = 60.0  # a hang, not a speed target: each check takes well under a millisecond (plus the interpreter's start)
ROOT = Path(__file__).resolve().parents[1]


def _runs_within(seconds: float, code: str) -> str:
    """Run ``code`` in a fresh interpreter and return what it printed; fail if it has not finished after
    ``seconds`` (a backtracking match holds the GIL, so only a separate process can be stopped)."""
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=seconds, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {seconds} s")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _dataset_row(parameters: dict) -> dict:
    """A dataset row whose one tool has ``parameters``; its reference call ``spell(word="aaa")`` passes them."""
    call = {"id": "c0", "type": "function", "function": {"name": "spell", "arguments": {"word": "aaa"}}}
    return {
        "id": "evil/000",
        "messages": [
            {"role": "system", "content": "Spell words."},
            {"role": "user", "content": "Spell aaa."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "name": "spell", "content": '{"ok": true}'},
            {"role": "assistant", "content": "Done."},
        ],
        "tools": [{"type": "function", "function": {"name": "spell", "description": "", "parameters": parameters}}],
    }


@pytest.mark.slow
def test_a_catastrophic_pattern_in_a_dataset_tool_ends_the_step_in_a_typed_error():
    """The reported case: a dataset tool with "pattern": "^(a+)+$" and an Act turn whose argument is 34 a's and
    a "!": env.step had not returned after 20 s (Python's re); now INVALID_PARAMETERS at once."""
    parameters = {"type": "object", "properties": {"word": {"type": "string", "pattern": CATASTROPHIC}}, "required": ["word"]}
    code = f"""
import json, gymnasium as gym, envace_gym
from envace_gym import ToolCall
from envace_gym.domains.dataset import DatasetDomain
from envace_gym.testing import ScriptedPolicy
domain = DatasetDomain([json.loads({json.dumps(json.dumps(_dataset_row(parameters)))})], name="evil")
env = gym.make("EnvACE-Rehearsal-v0", domain=domain, policy=ScriptedPolicy([]), executor="cached")
env.reset(seed=0, options={{"task": "evil/000"}})
_, _, _, _, info = env.step(ToolCall("spell", {{"word": {HOSTILE!r}}}).to_text())
print(json.dumps(info["calls"][0]["error"]))
"""
    error = json.loads(_runs_within(BOUND_S, code).strip().splitlines()[-1])
    assert error["code"] == "INVALID_PARAMETERS" and "does not match" in error["message"]


@pytest.mark.parametrize(
    ("parameters", "hostile", "harmless"),
    [
        ({"properties": {"w": {"type": "string", "pattern": CATASTROPHIC}}}, {"w": HOSTILE}, {"w": "aaa"}),
        ({"patternProperties": {CATASTROPHIC: {"type": "integer"}}, "additionalProperties": False},
         {HOSTILE: 1}, {"aaa": 1}),
        ({"properties": {"w": {"type": "object", "patternProperties": {CATASTROPHIC: {"type": "integer"}}}}},
         {"w": {"aaa": "one"}}, {"w": {HOSTILE: "one", "aaa": 1}}),
        ({"properties": {"w": {"type": "array", "items": {"type": "string", "pattern": CATASTROPHIC}}}},
         {"w": ["aaa", HOSTILE]}, {"w": ["aaa"]}),
        ({"properties": {"w": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": CATASTROPHIC}]}}},
         {"w": HOSTILE}, {"w": "aaa"}),
        ({"propertyNames": {"pattern": CATASTROPHIC}}, {HOSTILE: 1}, {"aaa": 1}),
    ],
    ids=["pattern", "patternProperties", "nested patternProperties", "items", "anyOf", "propertyNames"],
)  # fmt: skip
def test_every_place_a_pattern_can_sit_matches_in_linear_time(parameters, hostile, harmless):
    code = f"""
import json
from envace_gym import ToolSchema
schema = ToolSchema("t", "", {{"type": "object", **json.loads({json.dumps(json.dumps(parameters))})}})
error = schema.validate_arguments(json.loads({json.dumps(json.dumps(hostile))}))
print(json.dumps([None if error is None else error.code.value,
                  schema.validate_arguments(json.loads({json.dumps(json.dumps(harmless))}))]))
"""
    verdicts = json.loads(_runs_within(BOUND_S, code).strip().splitlines()[-1])
    assert verdicts == ["INVALID_PARAMETERS", None]


def test_matching_agrees_with_jsonschema_where_both_are_fast():
    """RE2 decides like jsonschema's own ``re`` on patterns both engines run (search, not full match)."""
    cases = [("^[A-Z]{3}$", ["EUR", "eur", "EURO"]), (r"\d{4}-\d{2}", ["x2024-01y", "24-1"]), ("b", ["abc", "ac"]),
             ("^(GET|POST)$", ["GET", "PUT"])]  # fmt: skip
    for pattern, values in cases:
        ours = ToolSchema("t", "", {"type": "object", "properties": {"v": {"type": "string", "pattern": pattern}}})
        plain = jsonschema.Draft202012Validator({"type": "string", "pattern": pattern})
        for value in values:
            assert (ours.validate_arguments({"v": value}) is None) == plain.is_valid(value), (pattern, value)


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [(r"^(a)\1$", "backreference"), (r"^(?=a)a", "lookahead"), (r"(?<!x)y", "lookbehind")],
)
def test_a_pattern_only_a_backtracking_engine_runs_is_refused_naming_tool_and_parameter(pattern, reason):
    with pytest.raises(SchemaError, match=r"tool 'lookup': parameters at /properties/code/pattern: .*linear time"):
        ToolSchema("lookup", "", {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}})


@pytest.mark.parametrize("ref", ["https://example.com/schemas/address.json", "file:///etc/passwd", "other.json#/x"])
def test_a_reference_outside_the_schema_is_refused_and_never_retrieved(ref, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("a $ref was retrieved")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    with pytest.raises(SchemaError, match=r"tool 'ship': parameters at /properties/to/\$ref: .*nothing is retrieved"):
        ToolSchema("ship", "", {"type": "object", "properties": {"to": {"$ref": ref}}})
    # Even a validator built around the check resolves against the local registry only.
    validator = linear_time(jsonschema.Draft202012Validator)({"$ref": ref}, registry=LOCAL_REFERENCES)
    with pytest.raises(referencing.exceptions.Unresolvable):
        validator.is_valid({})


def test_references_inside_the_schema_still_resolve():
    parameters = {
        "type": "object",
        "properties": {"to": {"$ref": "#/$defs/address"}},
        "$defs": {"address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}},
    }
    schema = ToolSchema("ship", "", parameters)
    assert schema.validate_arguments({"to": {"zip": "75001"}}) is None
    assert schema.validate_arguments({"to": {"zip": "7500"}}).code.value == "INVALID_PARAMETERS"


def test_unevaluated_properties_beside_pattern_properties_is_refused():
    with pytest.raises(SchemaError, match="unevaluatedProperties.*not supported beside patternProperties"):
        ToolSchema("t", "", {"type": "object", "patternProperties": {"^x": {}}, "unevaluatedProperties": False})


# -- one step's checks in bounded time (Limits.max_check_seconds) -------------------------------------------
RECURSING = {  # a $ref recursing through anyOf: every branch at every level, exponential in the argument's depth
    "type": "object",
    "properties": {"word": {"$ref": "#/$defs/r"}},
    "$defs": {"r": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/r"}},
                              {"type": "array", "items": {"$ref": "#/$defs/r"}, "minItems": 0}, {"type": "string"}]}},
}  # fmt: skip


@pytest.mark.slow
def test_a_schema_that_recurses_through_anyof_ends_the_step_within_the_check_budget():
    """Unbounded, checking a 14-deep list against this schema took 16 s here (2^14 branches); 28 deep, hours. The
    step ends in LIMIT_EXCEEDED once the default budget (1 s) is spent, in a fresh process in case it does not."""
    code = f"""
import json, time, gymnasium as gym, envace_gym
from envace_gym import ToolCall
from envace_gym.domains.dataset import DatasetDomain
from envace_gym.testing import ScriptedPolicy
domain = DatasetDomain([json.loads({json.dumps(json.dumps(_dataset_row(RECURSING)))})], name="evil")
env = gym.make("EnvACE-Rehearsal-v0", domain=domain, policy=ScriptedPolicy([]), executor="cached")
env.reset(seed=0, options={{"task": "evil/000"}})
deep = 1.5
for _ in range(28):
    deep = [deep]
started, cpu = time.perf_counter(), time.process_time()
_, reward, terminated, _, info = env.step(ToolCall("spell", {{"word": deep}}).to_text())
print(json.dumps([time.perf_counter() - started, time.process_time() - cpu, reward, terminated, info["calls"][0]["error"]]))
"""
    seconds, cpu, reward, terminated, error = json.loads(_runs_within(BOUND_S, code).strip().splitlines()[-1])
    assert error["code"] == "LIMIT_EXCEEDED" and error["details"]["limit"] == "max_check_seconds"
    assert "ran past the step's budget of 1 s" in error["message"] and (reward, terminated) == (0.0, True)
    # the budget (wall-clock, by design) was spent, and the step's CPU work stayed near it: a loaded machine
    # lengthens the first, never the second
    assert seconds >= 1.0 and cpu < 2.0, (seconds, cpu)


def test_unique_items_is_checked_in_linear_time():
    """jsonschema compares items that do not sort (objects, mixed types) pairwise: 1,500 distinct objects took
    5.5 s here (quadratic), past the default budget, so such a check would end in LIMIT_EXCEEDED; hashed, it is a
    verdict (1,200 objects: the most that fit max_json_chars)."""
    schema = ToolSchema("t", "", {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}})
    distinct = [{"a": i} for i in range(1200)]
    with StepBudget(1.0):
        assert schema.validate_arguments({"xs": distinct}) is None
        assert schema.validate_arguments({"xs": [*distinct, {"a": 7}]}).code is ErrorCode.INVALID_PARAMETERS
    plain = jsonschema.Draft202012Validator({"type": "array", "uniqueItems": True})
    for items in ([1, 1.0], [1, True], [0, False], [{"a": [1]}, {"a": [1.0]}], [{"a": 1}, {"a": 1, "b": 2}],
                  [[1, 2], [2, 1]], [None, "null"], ["a", "a"]):  # fmt: skip
        assert (schema.validate_arguments({"xs": items}) is None) == plain.is_valid(items), items


def test_format_regex_asks_re2_whether_the_argument_compiles():
    schema = ToolSchema("t", "", {"type": "object", "properties": {"re": {"type": "string", "format": "regex"}}})
    assert schema.validate_arguments({"re": "^[a-z]+(-[a-z]+)*$"}) is None
    for text in ("(a", "(?=a)a", r"(a)\1"):  # not a regex, or one only a backtracking engine runs
        assert schema.validate_arguments({"re": text}).code is ErrorCode.INVALID_PARAMETERS


class _SlowPolicy(ScriptedPolicy):
    def generate(self, prompts, params):
        time.sleep(0.5)
        return super().generate(prompts, params)


def test_generations_do_not_spend_the_check_budget():
    """The budget covers the environment's own work: a rehearsal that takes longer than the whole budget still
    has its result checked against the tool's returns schema."""
    row = _dataset_row({"type": "object", "properties": {"word": {"type": "string"}}})
    row["tools"][0]["function"]["returns"] = {"type": "object", "required": ["ok"]}
    domain = DatasetDomain([row], name="slow")
    policy = _SlowPolicy(['{"ok": true}\n</execution_result>', "Done."])  # the prompt opens the result
    env = gym.make("EnvACE-Rehearsal-v0", domain=domain, policy=policy, limits=Limits(max_check_seconds=0.2))
    env.reset(seed=0, options={"task": "evil/000"})
    _, _, terminated, _, info = env.step(ToolCall("spell", {"word": "aaa"}).to_text())
    assert not terminated and info["calls"][0]["error"] is None and info["calls"][0]["result"] == {"ok": True}


def test_the_budget_is_a_setting():
    with pytest.raises(ValueError, match="max_check_seconds must be positive or None"):
        Limits(max_check_seconds=0)
    unbounded = ToolSchema("t", "", RECURSING)
    with StepBudget(None):
        assert unbounded.validate_arguments({"word": [[[1.5]]]}).code is ErrorCode.INVALID_PARAMETERS
    budget = StepBudget(0.05)
    with budget:
        time.sleep(0.06)
    with budget:  # spent across regions: a later region starts with nothing left
        assert unbounded.validate_arguments({"word": [1]}).code is ErrorCode.LIMIT_EXCEEDED


# -- oversized inputs: observations always inside observation_space -------------------------------------------
def _two_tasks(big_chars: int) -> DatasetDomain:
    """A dataset whose task "evil/000" is ordinary and "evil/001" opens with a user message of ``big_chars``."""
    small, big = _dataset_row({"type": "object", "properties": {"word": {"type": "string"}}}), None
    big = json.loads(json.dumps(small))
    big["id"], big["messages"][1]["content"] = "evil/001", "Spell " + "a" * big_chars
    return DatasetDomain([small, big], name="evil", test_fraction=0.0)


def test_a_task_whose_opening_prompt_is_past_the_observation_space_is_refused_at_reset():
    """The reported case: a 5,000,000-character user message gave reset() an observation of 5,000,728
    characters while observation_space holds 1,000,000, and the first step then truncated for context."""
    env = gym.make("EnvACE-Rehearsal-v0", domain=_two_tasks(5_000_000), policy=ScriptedPolicy([]), executor="cached")
    with pytest.raises(TaskTooLongError, match=r"task 'evil/001' cannot be played: .*5000\d+ characters") as raised:
        env.reset(seed=0, options={"task": "evil/001"})
    assert raised.value.task_id == "evil/001"
    observation, info = env.reset(seed=0, options={"task": "evil/000"})  # the env is still usable
    assert env.observation_space.contains(observation) and info["task"]["id"] == "evil/000"


def test_a_task_past_the_policys_context_is_refused_and_never_drawn():
    policy = ScriptedPolicy(["Done."] * 200)
    policy.max_context = 2048
    env = gym.make("EnvACE-Rehearsal-v0", domain=_two_tasks(20_000), policy=policy, executor="cached")
    with pytest.raises(TaskTooLongError, match=r"tokens and the policy's context holds 2048, 512 of them kept"):
        env.reset(seed=0, options={"task": "evil/001"})
    drawn = {env.reset(seed=seed)[1]["task"]["id"] for seed in range(12)}
    assert drawn == {"evil/000"} and env.unwrapped.unfit_tasks == {"evil/001"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Gymnasium warns when an observation is outside its space
        check_env(gym.make("EnvACE-Rehearsal-v0", domain=_two_tasks(20_000), policy=policy, executor="cached").unwrapped)


def test_collector_sft_and_evaluation_skip_tasks_too_long_and_count_them(caplog):
    domain = _two_tasks(2_000_000)
    policy = ScriptedPolicy(lambda prompt: "Done.")
    batch = collect_rollouts(policy, domain, ["evil/000", "evil/001"], group_size=2, executor="cached", act="reference")
    assert batch.stats.skipped_tasks == 1 and [e.task_id for e in batch.episodes] == ["evil/000"] * 2
    assert {e.group for e in batch.episodes} == {0}  # a group is the task's place in the list given
    with pytest.raises(TaskTooLongError):
        collect_rollouts(policy, domain, ["evil/001"], executor="cached", act="reference", unfit="raise")
    with caplog.at_level(logging.WARNING, logger="envace_gym"):
        rows = sft_rows(domain, policy.tokenizer, ["evil/000", "evil/001"])
    assert rows and {r["task_id"] for r in rows} == {"evil/000"}
    assert "1 task(s) skipped, their opening prompt too long to play: ['evil/001']" in caplog.text
    result = evaluate(policy, domain, split="train", num_tasks=2, fidelity=False)
    assert (result.episodes, result.skipped_tasks) == (1, 1)


def test_a_message_that_would_take_the_observation_past_its_space_is_not_kept():
    """A real executor's response (or a scripted user turn) of any size: the episode ends for context, the
    observation stays inside its bound, and messages and ids still describe the same conversation."""
    domain = make_domain("bank")
    task = domain.task("bank/000")
    policy = ScriptedPolicy([])
    probe = Episode(domain, task, EpisodeConfig(executor="real"), policy.tokenizer, np.random.default_rng(0))
    bound = len(probe.prompt_text) + 200  # room for the Act turn, not for its answer
    episode = Episode(domain, task, EpisodeConfig(executor="real"), policy.tokenizer, np.random.default_rng(0),
                      max_observation_chars=bound)  # fmt: skip
    (outcome,) = EpisodeDriver(policy, episode.rng).drive([episode.play_turn(ToolCall("find_accounts", {"owner": "Ana"}).to_text())])
    assert outcome.truncated and outcome.info["truncation"] == "context"
    assert len(outcome.observation) <= bound and [m["role"] for m in episode.messages] == ["system", "user", "assistant"]
    assert episode.records and episode.records[-1].call.name == "find_accounts"  # the call itself was made


def test_the_pure_torch_trainer_counts_the_tasks_it_skips():
    from envace_gym.testing import tiny_policy
    from envace_gym.training.trainer import TrainerConfig, train

    config = TrainerConfig(domain=_two_tasks(20_000), executor="cached", steps=1, tasks_per_step=2, group_size=2,
                           max_new_tokens=8)  # fmt: skip
    (step,) = train(tiny_policy(seed=0, max_context=2048), config)
    assert step["rollouts/skipped_tasks"] == 1 and step["rows/act"] >= 2  # the other task's episodes still train


@pytest.mark.slow
def test_trls_envace_trainer_counts_the_tasks_it_skips_and_says_why_a_batch_has_no_rows(tmp_path):
    from transformers import AutoTokenizer

    from envace_gym.domains.registry import register_domain
    from envace_gym.integrations import trl as envace_trl
    from envace_gym.testing import tiny_policy

    register_domain("evil-two-tasks", lambda: _two_tasks(20_000), overwrite=True)
    policy = tiny_policy(seed=0)
    policy.model.config.max_position_embeddings = 2048
    policy.model.save_pretrained(tmp_path / "tiny")
    policy.tokenizer.save_pretrained(tmp_path / "tiny")
    args = envace_trl.EnvACEGRPOConfig(
        output_dir=str(tmp_path / "out"), domain="evil-two-tasks", executor="cached", per_device_train_batch_size=2,
        num_generations=2, max_completion_length=8, max_steps=1, use_cpu=True, report_to="none", bf16=False,
        save_strategy="no",
    )  # fmt: skip
    trainer = envace_trl.EnvACEGRPOTrainer(
        model=str(tmp_path / "tiny"), args=args, processing_class=AutoTokenizer.from_pretrained(tmp_path / "tiny")
    )
    trainer._generate_and_score_completions([{"prompt": "evil/000"}, {"prompt": "evil/001"}])
    assert trainer._metrics["train" if trainer.model.training else "eval"]["rollouts/skipped_tasks"] == [1.0]
    with pytest.raises(RuntimeError, match=r"no training rows; skipped here: 2 of its 2 task\(s\) too long to play"):
        trainer._generate_and_score_completions([{"prompt": "evil/001"}] * 2)
