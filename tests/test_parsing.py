from __future__ import annotations

import json

import pytest

from envace_gym import ErrorCode, Limits, ToolCall, parse_act, parse_execution_result
from envace_gym.parsing import format_act
from envace_gym.tools import call_key, canonical_json


def block(obj) -> str:
    return f"<tool_call>\n{json.dumps(obj)}\n</tool_call>"


def test_text_without_calls_is_a_final_answer():
    parsed = parse_act("  The balance is 12.00 USD.  ")
    assert parsed.is_final_answer and parsed.content == "The balance is 12.00 USD." and parsed.error is None


def test_one_call_with_surrounding_text():
    parsed = parse_act("Let me check.\n" + block({"name": "f", "arguments": {"x": 1}}))
    assert parsed.calls == (ToolCall("f", {"x": 1}),)
    assert parsed.content == "Let me check." and not parsed.is_final_answer


def test_several_blocks_a_list_and_the_parameters_alias():
    text = block({"name": "a", "arguments": {}}) + block([{"name": "b", "parameters": {"y": 2}}, {"name": "c"}])
    parsed = parse_act(text)
    assert [c.name for c in parsed.calls] == ["a", "b", "c"]
    assert parsed.calls[1].arguments == {"y": 2} and parsed.calls[2].arguments == {}


def test_openai_nesting_and_string_arguments_are_read():
    parsed = parse_act(block({"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}))
    assert parsed.calls == (ToolCall("f", {"x": 1}),)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("<tool_call>\n{not json}\n</tool_call>", "invalid JSON"),
        ('<tool_call>{"name": "f"}', "never closed"),
        ("oops </tool_call>", "without a matching"),
        ("<tool_call>\n\n</tool_call>", "empty"),
        (block({"arguments": {}}), "name"),
        (block({"name": "f", "arguments": [1]}), "JSON object"),
        (block({"name": "f", "arguments": "not json"}), "not JSON"),
        (block({"name": "f", "arguments": {}, "parameters": {}}), "both"),
        (block({"name": "f", "args": {}}), "unexpected keys"),
        (block([]), "empty list"),
        (block(["f"]), "JSON object"),
        ('<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>', "invalid JSON"),
        ("<tool_call><tool_call>{}</tool_call></tool_call>", "nested"),
    ],
)
def test_malformed_calls_are_typed_errors_not_exceptions(text, fragment):
    parsed = parse_act(text)
    assert parsed.error is not None and parsed.error.code is ErrorCode.INVALID_TOOL_CALL_FORMAT
    assert fragment in parsed.error.message


def test_limits_are_enforced_in_bounded_time(monkeypatch):
    limits = Limits(max_action_chars=1000, max_calls_per_turn=2, max_json_depth=8)
    assert parse_act("x" * 1001, limits).error.code is ErrorCode.LIMIT_EXCEEDED
    calls = block([{"name": "f"}] * 3)
    assert parse_act(calls, limits).error.code is ErrorCode.LIMIT_EXCEEDED
    deep = "<tool_call>" + "[" * 10_000 + "]" * 10_000 + "</tool_call>"
    import envace_gym.parsing.act

    decoded = []  # bounded as work: the linear depth scan refuses it before the (recursive) JSON decoder runs
    strict_loads = envace_gym.parsing.act.strict_loads
    monkeypatch.setattr(envace_gym.parsing.act, "strict_loads", lambda text: decoded.append(text) or strict_loads(text))
    parsed = parse_act(deep, Limits(max_action_chars=50_000, max_json_chars=50_000))
    assert parsed.error.code is ErrorCode.LIMIT_EXCEEDED and "deep" in parsed.error.message
    assert decoded == []


def test_non_string_action_is_an_error():
    assert parse_act(None).error.code is ErrorCode.INVALID_TOOL_CALL_FORMAT  # type: ignore[arg-type]


def test_format_act_round_trips():
    calls = (ToolCall("a", {"x": [1, 2]}), ToolCall("b", {"é": "ü"}))
    parsed = parse_act(format_act("thinking", calls))
    assert parsed.calls == calls and parsed.content == "thinking"


def test_execution_result_contract():
    ok = parse_execution_result('<think>easy</think>\n<execution_result>\n{"balance": 3}\n</execution_result>\n')
    assert ok.ok and ok.result == {"balance": 3} and ok.thought == "easy"
    assert parse_execution_result("<execution_result>[1]</execution_result>").result == [1]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('{"balance": 3}', "at the start"),
        ("<execution_result>\n{}\n</execution_result>", "empty JSON"),
        ("<execution_result>\n\n</execution_result>", "empty execution result"),
        ('<execution_result>\n{"a": 1}', "never closed"),
        ('<execution_result>{"a": 1}</execution_result> and more', "after"),
        ("<execution_result>{'a': 1}</execution_result>", "invalid JSON"),
    ],
)
def test_broken_rehearsals_are_invalid_rehearsal(text, fragment):
    result = parse_execution_result(text)
    assert result.error.code is ErrorCode.INVALID_REHEARSAL and fragment in result.error.message
    assert result.error.source == "rehearsal"


def test_rehearsed_error_tool_call_is_an_error_with_its_code():
    payload = {"error_tool_call": {"code": "INVALID_PARAMETERS", "message": "amount must be positive", "details": {}}}
    result = parse_execution_result(f"<execution_result>{json.dumps(payload)}</execution_result>")
    assert result.error.code is ErrorCode.INVALID_PARAMETERS and result.error.message == "amount must be positive"
    other = parse_execution_result('<execution_result>{"error_tool_call": {"code": "WHATEVER"}}</execution_result>')
    assert other.error.code is ErrorCode.REHEARSED_ERROR


def test_canonical_forms():
    assert canonical_json({"b": 1.0, "a": [2.0, 2.5]}) == canonical_json({"a": [2, 2.5], "b": 1})
    assert call_key(ToolCall("f", {"x": 1, "y": 2})) == call_key(ToolCall("f", {"y": 2.0, "x": 1}))
    assert call_key(ToolCall("f", {"x": True})) != call_key(ToolCall("f", {"x": 1}))
