from __future__ import annotations

from typing import Literal

import jsonschema
import pytest

from envace_gym import ErrorCode, SchemaError, ToolCall, ToolRegistry, ToolSchema, UnknownToolError
from envace_gym.envs.bfcl.schemas import from_bfcl, normalize_bfcl_schema
from envace_gym.tools.budget import bounded
from envace_gym.tools.patterns import linear_time


def get_weather(city: str, unit: Literal["C", "F"] = "C", days: int = 1) -> dict:
    """Get the weather forecast.

    Args:
        city: City name.
        unit: Temperature unit.
        days: How many days to forecast.

    Returns:
        The forecast.
    """
    return {}


OPENAI = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
            "required": ["query"],
        },
    },
}
MCP = {
    "name": "read_file",
    "description": "Read a file.",
    "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    "outputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}
BFCL = {
    "name": "math.triangle_area",
    "description": "Area of a triangle.",
    "parameters": {
        "type": "dict",
        "properties": {
            "base": {"type": "float", "description": "Base."},
            "height": {"type": "integer"},
            "corners": {"type": "tuple", "items": {"type": "float"}},
            "meta": {"type": "any"},
            "options": {"type": "dict", "properties": {"exact": {"type": "boolean"}}},
        },
        "required": ["base", "height", "not_a_property"],
    },
}


def test_from_function_uses_transformers_schema():
    schema = ToolSchema.from_function(get_weather)
    assert schema.name == "get_weather"
    assert schema.parameters["properties"]["unit"]["enum"] == ["C", "F"]
    assert schema.parameters["required"] == ["city"]
    assert schema.returns == {"type": "object", "description": "The forecast."}


def test_from_function_without_docs_is_a_schema_error():
    def bad(x):
        return x

    with pytest.raises(SchemaError, match="cannot build a schema"):
        ToolSchema.from_function(bad)


def test_openai_mcp_bfcl_forms():
    assert ToolSchema.from_openai(OPENAI).parameters["required"] == ["query"]
    assert ToolSchema.from_openai(OPENAI["function"]).name == "search"
    mcp = ToolSchema.from_mcp(MCP)
    assert mcp.returns["required"] == ["text"]
    bfcl = from_bfcl(BFCL)  # BFCL's doc format is its domain's to read (envs/bfcl)
    props = bfcl.parameters["properties"]
    assert bfcl.parameters["type"] == "object"
    assert props["base"]["type"] == "number" and props["corners"]["type"] == "array"
    assert props["corners"]["items"]["type"] == "number"
    assert "type" not in props["meta"]  # "any" drops the constraint
    assert props["options"]["type"] == "object"
    assert bfcl.parameters["required"] == ["base", "height"]  # names of absent properties dropped
    for form in (OPENAI, MCP, get_weather):
        assert isinstance(ToolSchema.coerce(form), ToolSchema)


def test_bfcl_normaliser_is_pure_and_recursive():
    source = {
        "type": "dict",
        "properties": {"xs": {"type": "array", "items": {"type": "dict", "properties": {"v": {"type": "float"}}}}},
    }
    out = normalize_bfcl_schema(source)
    assert out["properties"]["xs"]["items"]["properties"]["v"]["type"] == "number"
    assert source["type"] == "dict"  # input untouched


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"name": "x", "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}},
            "not a valid JSON Schema",
        ),
        ({"name": "x", "parameters": {"type": "object", "required": "a"}}, "not a valid JSON Schema"),
        ({"name": "x", "parameters": {"type": "array"}}, "must describe an object"),
        ({"name": "bad name!", "parameters": {"type": "object"}}, "invalid"),
        ({"name": "x", "parameters": {"type": "object"}, "returns": {"type": 3}}, "returns is not a valid"),
    ],
)
def test_malformed_schemas_are_rejected_with_a_clear_message(spec, message):
    with pytest.raises(SchemaError, match=message):
        ToolSchema.from_openai(spec)


def registry():
    return ToolRegistry([get_weather, OPENAI, MCP])


def test_validate_ok_and_codes():
    reg = registry()
    assert reg.validate({"name": "get_weather", "arguments": {"city": "Paris"}}).ok
    assert reg.validate(ToolCall("search", {"query": "x", "limit": 3})).ok
    fmt = reg.validate({"arguments": {}})
    assert fmt.code is ErrorCode.INVALID_TOOL_CALL_FORMAT and not fmt.ok
    assert reg.validate(["not", "a", "call"]).code is ErrorCode.INVALID_TOOL_CALL_FORMAT
    missing = reg.validate({"name": "nope", "arguments": {}})
    assert missing.code is ErrorCode.TOOL_NOT_AVAILABLE and "nope" in missing.message


def test_whitelist_restricts_availability():
    reg = registry()
    call = {"name": "search", "arguments": {"query": "x"}}
    assert reg.validate(call, whitelist=["search"]).ok
    blocked = reg.validate(call, whitelist=["get_weather"])
    assert blocked.code is ErrorCode.TOOL_NOT_AVAILABLE
    assert blocked.error.details["available"] == ["get_weather"]


@pytest.mark.parametrize(
    "arguments, path, expected",
    [
        ({}, "$", "required"),
        ({"city": 3}, "$.city", "type"),
        ({"city": "Paris", "unit": "K"}, "$.unit", "enum"),
        ({"city": "Paris", "days": "two"}, "$.days", "type"),
        ({"city": "Paris", "extra": 1}, "$", "additionalProperties"),
    ],
)
def test_invalid_parameters_name_the_path_and_the_expectation(arguments, path, expected):
    result = registry().validate({"name": "get_weather", "arguments": arguments})
    assert result.code is ErrorCode.INVALID_PARAMETERS
    assert result.error.details["path"] == path
    assert result.error.details["validator"] == expected
    assert f"at {path}" in result.message and f"expected {expected}" in result.message


def test_non_strict_schema_accepts_extra_arguments():
    loose = ToolSchema("t", "", {"type": "object", "properties": {"a": {"type": "string"}}}, strict=False)
    assert loose.validate_arguments({"a": "x", "b": 1}) is None


def test_returns_schema_checks_results():
    reg = registry()
    assert reg["read_file"].validate_result({"text": "hi"}) is None
    error = reg["read_file"].validate_result({"txt": "hi"})
    assert error.code is ErrorCode.RESULT_SCHEMA_MISMATCH and "text" in error.message
    assert reg["search"].validate_result(["anything"]) is None  # no returns schema


def test_validators_are_compiled_once():
    schema = registry()["get_weather"]
    assert schema._arguments_validator is schema._arguments_validator
    # Draft 2020-12, its regex keywords on RE2 (tools/patterns.py), stopping when the step's budget is spent (tools/budget.py)
    assert type(schema._arguments_validator) is bounded(linear_time(jsonschema.Draft202012Validator))


def test_registry_errors_and_export(tokenizer):
    reg = registry()
    with pytest.raises(SchemaError, match="already registered"):
        reg.add(get_weather)
    with pytest.raises(UnknownToolError, match="no tool named"):
        reg["missing"]
    tools = reg.to_openai(["search", "read_file"])
    assert [t["function"]["name"] for t in tools] == ["search", "read_file"]
    assert reg.subset(["search"]).names == ["search"]
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], tools=tools, tokenize=False
    )
    assert '"name": "search"' in rendered and "<tools>" in rendered


def test_compact_export_leaves_out_returns_and_title_annotations():
    schema = ToolSchema.from_openai(
        {
            "name": "note",
            "description": "Write a note.",
            "parameters": {
                "title": "parameters",
                "type": "object",
                "properties": {
                    "title": {"title": "Title", "type": "string"},  # a property named "title" stays
                    "tags": {"title": "Tags", "type": "array", "items": {"title": "Tag", "type": "string"}},
                },
            },
            "returns": {"type": "object"},
        }
    )
    full, compact = schema.to_openai()["function"], schema.to_openai(compact=True)["function"]
    assert full["returns"] == {"type": "object"} and "returns" not in compact
    assert compact["parameters"] == {
        "type": "object",
        "properties": {"title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    }
    assert full["parameters"]["properties"]["title"]["title"] == "Title"  # the schema itself is unchanged


# -- the fast path agrees with jsonschema -----------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from envace_gym import make_domain  # noqa: E402

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
SYNTHETIC = ToolSchema(
    "synthetic",
    "",
    {
        "type": "object",
        "properties": {
            "i": {"type": "integer"},
            "n": {"type": "number", "description": "x"},
            "b": {"type": "boolean"},
            "z": {"type": "null"},
            "e": {"type": "string", "enum": ["a", "b"]},
            "u": {"type": ["string", "integer"]},
        },
        "required": ["i", "e"],
    },
)
SCHEMAS = [SYNTHETIC, *(t for name in ("units", "bank", "travel") for t in make_domain(name).tools)]


@settings(max_examples=600, deadline=None)
@given(
    schema=st.sampled_from(SCHEMAS),
    values=st.dictionaries(
        st.sampled_from(
            [
                "i",
                "n",
                "b",
                "z",
                "e",
                "u",
                "value",
                "from_unit",
                "to_unit",
                "amount",
                "owner",
                "account_id",
                "date",
                "cabin",
                "extra",
            ]
        ),
        json_values | st.sampled_from(["a", "b", "m", "km", "C", "economy", 1.0, 2, True]),
    ),
)
@pytest.mark.slow
def test_fast_check_agrees_with_jsonschema(schema, values):
    assert schema._arguments_fast_check is not schema._arguments_validator.is_valid  # the fast path is in use
    assert schema._arguments_fast_check(values) == schema._arguments_validator.is_valid(values)
    assert (schema.validate_arguments(values) is None) == schema._arguments_validator.is_valid(values)


def test_schemas_outside_the_fast_shape_use_jsonschema():
    nested = ToolSchema(
        "n", "", {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}}}}
    )
    assert nested._arguments_fast_check == nested._arguments_validator.is_valid
    assert nested.validate_arguments({"xs": [1, "2"]}).code is ErrorCode.INVALID_PARAMETERS
