"""Schemas nobody here wrote (a dataset's tools, an MCP server's, a benchmark's): their regexes run in linear
time, what cannot be checked that way is refused when the schema is built, and nothing is ever retrieved for a
``$ref`` (docs/reliability.md, "Untrusted schemas")."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import referencing.exceptions

from envace_gym import ToolSchema
from envace_gym.errors import SchemaError
from envace_gym.tools.patterns import LOCAL_REFERENCES, linear_time

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
