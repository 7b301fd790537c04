"""BFCL function docs as schemas no stricter than BFCL: what BFCL's checker accepts, validation accepts.

A doc is first read as JSON Schema (:func:`from_bfcl`, :func:`normalize_bfcl_schema`): BFCL writes Python type
names (``dict``, ``float``, ``tuple``, ``any``) where JSON Schema has its own, and keywords its checker ignores are
dropped. Then it is relaxed (:func:`lenient`).

BFCL's docs say more than BFCL checks. Its AST checker never looks at ``enum``, checks the doc's ``required``
list and nothing nested, and accepts a value of the *possible answer's own type* where the doc names another
(bools or ints for a string parameter, ``None``, a string for an array); its multi-turn harness runs calls on
Python backends that check no types at all. A JSON Schema validator applying the docs as written would refuse
calls that BFCL scores as correct. So, per function:

* ``enum`` lists are moved into the description (the model still reads them; nothing enforces them);
* nested ``required`` and ``additionalProperties`` are dropped (the checker compares nested values with the
  possible answers, not with the doc); the top-level ones stay, as BFCL checks them;
* every ``type`` is widened with the JSON types of the values the benchmark's answers give there (the possible
  answers of the entry; for multi-turn, the gold calls of the category), recursively through ``items`` and
  ``properties``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from envace_gym.errors import SchemaError
from envace_gym.tools import ToolCall, ToolSchema

# BFCL writes Python type names where JSON Schema expects its own (see its function docs).
_BFCL_TYPES = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "list": "array",
    "int": "integer",
    "str": "string",
    "bool": "boolean",
    "String": "string",
    "Boolean": "boolean",
    "Array": "array",
    "ArrayList": "array",
    "HashMap": "object",
    "long": "integer",
    "double": "number",
    "char": "string",
}
# Keywords BFCL's checker does not enforce; kept out so that validation is never stricter than the benchmark.
_BFCL_DROPPED = {
    "optional",
    "format",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
}

_JSON_TYPES = (
    (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
    (list, "array"), (tuple, "array"), (dict, "object"), (type(None), "null"),
)  # fmt: skip


def from_bfcl(spec: Mapping[str, Any], language: str = "python") -> ToolSchema:
    """From a BFCL function doc, normalising its Python-style types (``dict``, ``float``, ``tuple``, ``any``).

    For ``language="java"`` or ``"javascript"`` every parameter is a string, as BFCL itself presents them
    (values are written in that language's syntax).
    """
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise SchemaError("a BFCL function doc needs 'name'")
    params = normalize_bfcl_schema(spec.get("parameters") or {"type": "object", "properties": {}})
    if language != "python":
        hint = f" (a {language.capitalize()} value, written as a string)"
        props = {
            k: {"type": "string", "description": str(v.get("description", "")) + hint}
            for k, v in params.get("properties", {}).items()
        }
        params = {**params, "properties": props}
    returns = spec.get("response")
    return ToolSchema(
        name=spec["name"],
        description=spec.get("description", "") or "",
        parameters=params,
        returns=normalize_bfcl_schema(returns) if isinstance(returns, Mapping) else None,
    )


def normalize_bfcl_schema(schema: Any) -> Any:
    """Rewrite a BFCL parameter schema into standard JSON Schema.

    ``dict``→``object``, ``float``→``number``, ``tuple``/``list``→``array``, ``any`` drops the type
    constraint; nested ``properties``, ``items`` and ``additionalProperties`` are rewritten too. BFCL's
    ``optional`` flags and ``required`` lists naming absent properties are reconciled.
    """
    if isinstance(schema, list):
        return [normalize_bfcl_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            if isinstance(value, list):
                mapped = [_BFCL_TYPES.get(v, v) for v in value if v != "any"]
                if mapped and "any" not in value:
                    out["type"] = mapped
            elif value in ("any", ""):
                continue
            else:
                out["type"] = _BFCL_TYPES.get(value, value)
        elif key == "properties" and isinstance(value, Mapping):
            out["properties"] = {k: normalize_bfcl_schema(v) for k, v in value.items()}
        elif key == "items" and isinstance(value, list):  # the old tuple form of `items`
            out["prefixItems"] = normalize_bfcl_schema(value)
        elif key in ("items", "additionalProperties", "not", "contains") and isinstance(value, (Mapping, list)):
            out[key] = normalize_bfcl_schema(value)
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            out[key] = [normalize_bfcl_schema(v) for v in value]
        elif key in _BFCL_DROPPED:
            continue  # `optional` is BFCL's own flag (optionality is what `required` says); the rest it ignores
        else:
            out[key] = value
    if "required" in out and isinstance(out.get("properties"), Mapping):
        out["required"] = [r for r in out["required"] if r in out["properties"]]
    return out


def json_type(value: Any) -> str:
    """The JSON Schema type of a Python value (``bool`` before ``int``, as JSON tells them apart)."""
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "string")


def lenient(schema: ToolSchema, examples: Mapping[str, list[Any]], alternatives: bool) -> ToolSchema:
    """``schema`` relaxed as the module says; ``examples`` maps a parameter to values that must pass.

    ``alternatives``: the examples are BFCL possible answers, whose dicts hold a list of allowed values per
    key (one level deep); otherwise they are concrete values (gold calls)."""
    parameters = copy.deepcopy(dict(schema.parameters))
    _strip(parameters, top=True)
    properties = parameters.get("properties") or {}
    for name, values in examples.items():
        if isinstance(properties.get(name), dict):
            _widen(properties[name], values, alternatives)
    return ToolSchema(name=schema.name, description=schema.description, parameters=parameters, returns=schema.returns)


def possible_answer_examples(answer: Iterable[Mapping[str, Mapping[str, list]]]) -> dict[str, dict[str, list]]:
    """Single-turn possible answers as ``{function: {parameter: allowed values}}``."""
    out: dict[str, dict[str, list]] = {}
    for expected in answer or ():
        for function, params in expected.items():
            for param, allowed in params.items():
                out.setdefault(function, {}).setdefault(param, []).extend(allowed)
    return out


def call_examples(calls: Iterable[ToolCall]) -> dict[str, dict[str, list]]:
    """Gold calls as ``{function: {parameter: values}}``."""
    out: dict[str, dict[str, list]] = {}
    for call in calls:
        for param, value in call.arguments.items():
            out.setdefault(call.name, {}).setdefault(param, []).append(value)
    return out


def _strip(schema: Any, top: bool) -> None:
    if isinstance(schema, list):
        for item in schema:
            _strip(item, top=False)
        return
    if not isinstance(schema, dict):
        return
    if "enum" in schema:
        allowed = ", ".join(repr(v) if isinstance(v, str) else str(v) for v in schema.pop("enum"))
        schema["description"] = f"{schema.get('description', '')} (one of: {allowed})".strip()
    if not top:
        schema.pop("required", None)
        schema.pop("additionalProperties", None)
    for key in ("properties", "$defs", "definitions"):
        for sub in (schema.get(key) or {}).values():
            _strip(sub, top=False)
    for key in ("items", "prefixItems", "anyOf", "oneOf", "allOf"):
        if key in schema:
            _strip(schema[key], top=False)


def _widen(schema: dict[str, Any], values: list[Any], alternatives: bool) -> None:
    values = [v for v in values if not (isinstance(v, str) and v == "")]  # "" marks an omittable parameter
    if not values:
        return
    declared = schema.get("type")
    if declared is not None:
        types = [declared] if isinstance(declared, str) else list(declared)
        for value in values:
            kind = json_type(value)
            if kind not in types and not (kind == "integer" and "number" in types):
                types.append(kind)
        schema["type"] = types[0] if len(types) == 1 else types
    items = [x for v in values if isinstance(v, (list, tuple)) for x in v]
    if items and isinstance(schema.get("items"), dict):
        _widen(schema["items"], items, alternatives)
    dicts = [v for v in values if isinstance(v, dict)]
    for key, sub in (schema.get("properties") or {}).items():
        nested = [d[key] for d in dicts if key in d]
        if alternatives:  # a possible answer's dict holds the allowed values of each key
            nested = [x for n in nested for x in (n if isinstance(n, list) else [n])]
        if isinstance(sub, dict):
            _widen(sub, nested, alternatives)
