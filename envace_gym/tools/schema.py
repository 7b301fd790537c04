"""Tool schemas and the registry that validates every call.

A :class:`ToolSchema` is a name, a description, a JSON Schema for the arguments and an optional JSON
Schema for the result. It can be built from a typed Python function (through
``transformers.utils.get_json_schema``), an OpenAI tool dict or an MCP tool dict (a benchmark's own
doc format is read by its domain, under ``envs/``).
Schemas are checked against their metaschema once, and each compiles its validator once.

A :class:`ToolRegistry` holds the schemas of a domain, answers ``validate(call, whitelist)`` with a
typed :class:`ValidationResult`, and exports the OpenAI tool list that
``tokenizer.apply_chat_template(tools=...)`` expects.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from ..errors import ErrorCode, SchemaError, ToolError, UnknownToolError
from ..text import strict_loads
from .budget import BudgetExceeded, bounded, check_deadline
from .patterns import LOCAL_REFERENCES, PatternError, check_patterns, linear_time

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")
_DEFAULT_VALIDATOR = jsonschema.Draft202012Validator

@dataclass(frozen=True)
class ToolCall:
    """One call the agent asked for: a tool name and its argument object."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI/transformers ``tool_calls`` entry (arguments as an object, as chat templates want)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": dict(self.arguments)}}

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments)}

    def to_text(self) -> str:
        """The Hermes/Qwen ``<tool_call>`` block that writes this call."""
        return "<tool_call>\n" + json.dumps(self.to_json(), ensure_ascii=False) + "\n</tool_call>"


def _check_schema(schema: Any, what: str, tool: str) -> None:
    if not isinstance(schema, Mapping):
        raise SchemaError(f"tool {tool!r}: {what} must be a JSON Schema object, got {type(schema).__name__}")
    cls = jsonschema.validators.validator_for(schema, default=_DEFAULT_VALIDATOR)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        path = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise SchemaError(f"tool {tool!r}: {what} is not a valid JSON Schema at {path}: {exc.message}") from None
    try:
        check_patterns(schema)  # untrusted schemas: every check must run in bounded time (tools/patterns.py)
    except PatternError as exc:
        raise SchemaError(f"tool {tool!r}: {what} {exc}") from None


def _compile(schema: Mapping[str, Any]) -> jsonschema.protocols.Validator:
    """A validator whose regexes run on RE2, whose ``$ref`` never leaves the schema (tools/patterns.py) and which
    stops when the step's check budget is spent (tools/budget.py)."""
    cls = bounded(linear_time(jsonschema.validators.validator_for(schema, default=_DEFAULT_VALIDATOR)))
    return cls(schema, format_checker=cls.FORMAT_CHECKER, registry=LOCAL_REFERENCES)


# Keywords that never affect validity (unknown keywords are annotations in JSON Schema 2019-09+).
_ANNOTATIONS = frozenset(
    {"description", "title", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly", "nullable"}
)
_FAST_TYPES = frozenset({"string", "number", "integer", "boolean", "null"})


def _fast_object_check(schema: Mapping[str, Any], cls: type) -> Callable[[Any], bool] | None:
    """An exact ``is_valid`` for the commonest tool-schema shape, several times faster than the generic walk.

    The shape: an object with ``properties`` whose schemas are a primitive ``type`` (or list of them) and an
    optional all-string ``enum``, plus ``required`` and a boolean ``additionalProperties``. Types are decided
    by the validator class's own ``TYPE_CHECKER``, so ``1.0`` is an integer exactly when jsonschema says so.
    Any other schema returns ``None`` and keeps jsonschema's walk. (A differential property test checks the
    two agree.)
    """
    if set(schema) - {"type", "properties", "required", "additionalProperties"} - _ANNOTATIONS:
        return None
    extra, required = schema.get("additionalProperties", True), schema.get("required", [])
    if schema.get("type") != "object" or not isinstance(extra, bool) or not isinstance(required, list):
        return None
    is_type = cls.TYPE_CHECKER.is_type
    checks: dict[str, Callable[[Any], bool]] = {}
    for name, sub in (schema.get("properties") or {}).items():
        if not isinstance(sub, Mapping) or set(sub) - {"type", "enum"} - _ANNOTATIONS:
            return None
        types = sub.get("type")
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list) or not types or not set(types) <= _FAST_TYPES:
            return None
        enum = sub.get("enum")
        if enum is not None and not (isinstance(enum, list) and all(isinstance(e, str) for e in enum)):
            return None
        allowed = frozenset(enum) if enum is not None else None
        checks[name] = lambda v, t=tuple(types), a=allowed: (
            any(is_type(v, x) for x in t) and (a is None or (isinstance(v, str) and v in a))
        )
    needed = tuple(required)

    def check(instance: Any) -> bool:
        if not is_type(instance, "object") or any(r not in instance for r in needed):
            return False
        for key, value in instance.items():
            ok = checks.get(key)
            if ok is None:
                if not extra:
                    return False
            elif not ok(value):
                return False
        return True

    return check


def _describe(error: jsonschema.ValidationError) -> str:
    expected = error.validator_value
    if error.validator in ("properties", "items", "$ref"):
        expected = "see schema"
    return (
        f"at {error.json_path}: {error.message} (expected {error.validator}: {json.dumps(expected, default=str)[:200]})"
    )


def _schema_error(error: jsonschema.ValidationError, code: ErrorCode, tool: str, all_errors: list) -> ToolError:
    return ToolError(
        code,
        f"{tool}: {_describe(error)}",
        {
            "tool": tool,
            "path": error.json_path,
            "validator": error.validator,
            "expected": error.validator_value if error.validator not in ("properties", "items", "$ref") else None,
            "errors": [f"{e.json_path}: {e.message}" for e in all_errors[:5]],
        },
        source="registry",
    )


@dataclass(frozen=True)
class ToolSchema:
    """A tool the agent may call.

    Attributes:
        name: Tool name as the agent writes it (letters, digits, ``_ . -``; at most 128 characters).
        description: What the tool does, shown to the agent.
        parameters: JSON Schema of the argument object (``{"type": "object", ...}``).
        returns: Optional JSON Schema of the result; rehearsed results are checked against it.
        strict: Reject arguments the schema does not name (adds ``additionalProperties: false``
            when the schema lists ``properties`` and says nothing about extra ones).
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    returns: Mapping[str, Any] | None = None
    strict: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise SchemaError(
                f"tool name {self.name!r} is invalid: use letters, digits, '_', '.', '-' (start with a letter or '_')"
            )
        if not isinstance(self.description, str):
            raise SchemaError(f"tool {self.name!r}: description must be a string")
        _check_schema(self.parameters, "parameters", self.name)
        if self.parameters.get("type", "object") != "object":
            raise SchemaError(
                f"tool {self.name!r}: parameters must describe an object, got type {self.parameters.get('type')!r}"
            )
        if self.returns is not None:
            _check_schema(self.returns, "returns", self.name)

    # -- compiled once ------------------------------------------------------------------------------
    @cached_property
    def _arguments_validator(self) -> jsonschema.protocols.Validator:
        schema = dict(self.parameters)
        schema.setdefault("type", "object")
        if self.strict and "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        return _compile(schema)

    @cached_property
    def _arguments_fast_check(self) -> Callable[[Any], bool]:
        validator = self._arguments_validator
        return _fast_object_check(validator.schema, type(validator)) or validator.is_valid

    @cached_property
    def _returns_validator(self) -> jsonschema.protocols.Validator | None:
        return None if self.returns is None else _compile(self.returns)

    @cached_property
    def _compact_parameters(self) -> dict[str, Any]:
        """The parameters without ``title`` annotations: computed once, as every episode's Act prompt shows them."""
        return _without_titles(self.parameters)

    def compile(self) -> ToolSchema:
        """Build the validators now (they are otherwise built on first use); returns the schema."""
        _ = self._arguments_fast_check, self._returns_validator
        return self

    def validate_arguments(self, arguments: Any) -> ToolError | None:
        """``None`` when ``arguments`` satisfies the schema, else an ``INVALID_PARAMETERS`` error (a
        ``LIMIT_EXCEEDED`` one when the step's check budget runs out first: :mod:`envace_gym.tools.budget`)."""
        try:
            check_deadline()
            if self._arguments_fast_check(arguments):  # no error objects built on the common path
                return None
            errors = sorted(self._arguments_validator.iter_errors(arguments), key=lambda e: list(e.path))
        except BudgetExceeded as exc:
            return self._over_budget("arguments", exc)
        if not errors:  # the fast check is never laxer than jsonschema; never stricter either, but be safe
            return None
        return _schema_error(best_match(errors), ErrorCode.INVALID_PARAMETERS, self.name, errors)

    def validate_result(self, result: Any) -> ToolError | None:
        """``None`` when there is no ``returns`` schema or ``result`` satisfies it."""
        validator = self._returns_validator
        try:
            if validator is None or validator.is_valid(result):
                return None
            errors = list(validator.iter_errors(result))
        except BudgetExceeded as exc:
            return self._over_budget("result", exc)
        return _schema_error(best_match(errors), ErrorCode.RESULT_SCHEMA_MISMATCH, self.name, errors)

    def _over_budget(self, what: str, exc: BudgetExceeded) -> ToolError:
        return ToolError(
            ErrorCode.LIMIT_EXCEEDED,
            f"checking the {what} of {self.name!r} against its schema ran past the step's budget of "
            f"{exc.seconds:g} s (Limits.max_check_seconds)",
            {"tool": self.name, "limit": "max_check_seconds", "value": exc.seconds},
            source="registry",
        )

    # -- constructors -------------------------------------------------------------------------------
    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, returns: Mapping[str, Any] | None = None) -> ToolSchema:
        """From a typed function with a Google-style docstring (via ``transformers.utils.get_json_schema``).

        ``returns`` overrides the (coarse) result schema derived from the return annotation.
        """
        try:
            from transformers.utils import get_json_schema  # transformers (and torch) only when asked

            spec = get_json_schema(fn)
        except Exception as exc:  # transformers raises its own DocstringParsingException/TypeHintParsingException
            raise SchemaError(f"cannot build a schema from {getattr(fn, '__qualname__', fn)!r}: {exc}") from exc
        if returns is not None:
            spec["function"]["return"] = dict(returns)
        return cls.from_openai(spec)

    @classmethod
    def from_openai(cls, spec: Mapping[str, Any]) -> ToolSchema:
        """From ``{"type": "function", "function": {...}}`` or the inner ``{"name", "parameters", ...}``."""
        if not isinstance(spec, Mapping):
            raise SchemaError(f"an OpenAI tool must be a dict, got {type(spec).__name__}")
        fn = spec.get("function", spec) if spec.get("type", "function") == "function" else None
        if not isinstance(fn, Mapping) or "name" not in fn:
            raise SchemaError(f"not an OpenAI function tool: {json.dumps(spec, default=str)[:200]}")
        _refuse_misspelt_keys(fn, _OPENAI_KEYS)
        returns = fn.get("returns", fn.get("return"))
        return cls(
            name=fn["name"],
            description=fn.get("description", "") or "",
            parameters=fn.get("parameters") or {"type": "object", "properties": {}},
            returns=returns,
        )

    @classmethod
    def from_mcp(cls, spec: Mapping[str, Any]) -> ToolSchema:
        """From an MCP tool: ``{"name", "description", "inputSchema", "outputSchema"?}``."""
        if not isinstance(spec, Mapping) or "name" not in spec or "inputSchema" not in spec:
            raise SchemaError("an MCP tool needs 'name' and 'inputSchema'")
        _refuse_misspelt_keys(spec, _MCP_KEYS)
        return cls(
            name=spec["name"],
            description=spec.get("description", "") or "",
            parameters=spec["inputSchema"],
            returns=spec.get("outputSchema"),
        )

    @classmethod
    def coerce(cls, obj: Any) -> ToolSchema:
        """Accept any supported form: a ToolSchema, a function, an OpenAI or MCP dict."""
        if isinstance(obj, ToolSchema):
            return obj
        if callable(obj):
            return cls.from_function(obj)
        if isinstance(obj, Mapping):
            if "inputSchema" in obj:
                return cls.from_mcp(obj)
            if obj.get("type") == "function" or "function" in obj:
                return cls.from_openai(obj)
            return cls.from_openai(obj)
        raise SchemaError(f"cannot make a tool schema from {type(obj).__name__}")

    # -- export -------------------------------------------------------------------------------------
    def to_openai(self, compact: bool = False) -> dict[str, Any]:
        """The entry ``apply_chat_template(tools=[...])`` expects.

        ``compact`` leaves out what the Act role need not read, to keep prompts short: the ``returns`` schema
        (the Rehearse role's prompt shows it) and JSON Schema ``title`` annotations (pydantic writes one per
        property, repeating its name)."""
        parameters = dict(self._compact_parameters if compact else self.parameters)
        fn: dict[str, Any] = {"name": self.name, "description": self.description, "parameters": parameters}
        if self.returns is not None and not compact:
            fn["returns"] = dict(self.returns)
        return {"type": "function", "function": fn}


_OPENAI_KEYS = ("name", "description", "parameters", "returns", "return", "strict")
_MCP_KEYS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")


def _refuse_misspelt_keys(spec: Mapping[str, Any], known: tuple[str, ...]) -> None:
    """A key one letter from a known one (``"paramaters"``) would be dropped silently, leaving a tool with no
    arguments: a :class:`SchemaError` instead. Other unknown keys are left alone (tool specs carry extras)."""
    for key in spec:
        close = difflib.get_close_matches(str(key), [k for k in known if k not in spec], n=1, cutoff=0.8)
        if key not in known and close:
            raise SchemaError(f"tool {spec.get('name')!r}: unknown key {key!r}; did you mean {close[0]!r}?")


def _without_titles(schema: Any) -> Any:
    """``schema`` without its ``title`` annotations (a property *named* ``title`` stays)."""
    if isinstance(schema, list):
        return [_without_titles(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, Mapping):
            out[key] = {name: _without_titles(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "contains", "anyOf", "oneOf", "allOf", "prefixItems"):
            out[key] = _without_titles(value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class ValidationResult:
    """What :meth:`ToolRegistry.validate` says of a call: ``ok``, else a typed ``error``."""

    call: ToolCall | None
    error: ToolError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def code(self) -> ErrorCode | None:
        return None if self.error is None else self.error.code

    @property
    def message(self) -> str:
        return "ok" if self.error is None else self.error.message


def call_from_json(
    obj: Any, loads: Callable[[str], tuple[Any, ToolError | None]] | None = None
) -> ToolCall | ToolError:
    """Read one call object (``{"name", "arguments"}``; ``"parameters"`` is an alias) or explain why not.

    Also accepts the OpenAI nesting ``{"type": "function", "function": {...}}`` and arguments written
    as a JSON string, which models often produce, read with ``loads`` (``(value, None)`` or ``(None, error)``: the
    parser's bounded reader, so a string's nesting counts against the same limits) or, without it, strict JSON.
    Never raises on model data.
    """
    if not isinstance(obj, Mapping):
        return ToolError(
            ErrorCode.INVALID_TOOL_CALL_FORMAT, f"a tool call must be a JSON object, got {type(obj).__name__}"
        )
    if isinstance(obj.get("function"), Mapping):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolError(ErrorCode.INVALID_TOOL_CALL_FORMAT, 'a tool call needs a non-empty string "name"')
    unknown = set(obj) - {"name", "arguments", "parameters", "id", "type"}
    if unknown:
        return ToolError(
            ErrorCode.INVALID_TOOL_CALL_FORMAT,
            f"unexpected keys in tool call {name!r}: {sorted(unknown)}; expected name and arguments",
            {"tool": name},
        )
    if "arguments" in obj and "parameters" in obj:
        return ToolError(
            ErrorCode.INVALID_TOOL_CALL_FORMAT,
            f'tool call {name!r} has both "arguments" and "parameters"',
            {"tool": name},
        )
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str) and loads is not None and args.strip():
        args, error = loads(args)
        if error is not None:
            what = "are a string that is not JSON" if error.code is ErrorCode.INVALID_TOOL_CALL_FORMAT else "exceed a limit"
            return ToolError(error.code, f"arguments of {name!r} {what}: {error.message}", {"tool": name, **error.details})
    elif isinstance(args, str):
        try:
            args = strict_loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return ToolError(
                ErrorCode.INVALID_TOOL_CALL_FORMAT,
                f"arguments of {name!r} are a string that is not JSON",
                {"tool": name},
            )
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        return ToolError(
            ErrorCode.INVALID_TOOL_CALL_FORMAT,
            f"arguments of {name!r} must be a JSON object, got {type(args).__name__}",
            {"tool": name},
        )
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else ""
    return ToolCall(name=name, arguments=dict(args), id=call_id)


class ToolRegistry:
    """The tools of a domain, each validated and compiled once.

    Example:
        >>> registry = ToolRegistry([get_weather])          # functions, dicts or ToolSchemas
        >>> registry.validate({"name": "get_weather", "arguments": {"city": "Paris"}}).ok
        True
        >>> registry.to_openai()                             # for apply_chat_template(tools=...)
    """

    def __init__(self, tools: Iterable[Any] = ()) -> None:
        self._tools: dict[str, ToolSchema] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Any) -> ToolSchema:
        """Register a tool in any form :meth:`ToolSchema.coerce` accepts; names must be unique."""
        schema = ToolSchema.coerce(tool)
        if schema.name in self._tools:
            raise SchemaError(f"a tool named {schema.name!r} is already registered")
        self._tools[schema.name] = schema
        return schema

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> ToolSchema:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownToolError(f"no tool named {name!r}; registered: {sorted(self._tools)}") from None

    def __iter__(self) -> Iterator[ToolSchema]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def subset(self, names: Iterable[str]) -> ToolRegistry:
        """A registry holding only ``names`` (a task's whitelist), sharing the compiled schemas."""
        sub = ToolRegistry()
        for name in names:
            sub._tools[name] = self[name]
        return sub

    def validate(
        self, call: ToolCall | Mapping[str, Any], whitelist: Collection[str] | None = None
    ) -> ValidationResult:
        """Check, in the paper's order: format, availability (registry and whitelist), arguments."""
        parsed = call if isinstance(call, ToolCall) else call_from_json(call)
        if isinstance(parsed, ToolError):
            return ValidationResult(None, parsed)
        schema = self._tools.get(parsed.name)
        if schema is None or (whitelist is not None and parsed.name not in whitelist):
            offered = sorted(whitelist) if whitelist is not None else sorted(self._tools)
            return ValidationResult(
                parsed,
                ToolError(
                    ErrorCode.TOOL_NOT_AVAILABLE,
                    f"tool {parsed.name!r} is not available; available tools: {offered}",
                    {"tool": parsed.name, "available": offered},
                    source="registry",
                ),
            )
        return ValidationResult(parsed, schema.validate_arguments(parsed.arguments))

    def to_openai(self, names: Iterable[str] | None = None, compact: bool = False) -> list[dict[str, Any]]:
        """OpenAI tool list for ``apply_chat_template(tools=...)``, restricted to ``names`` if given
        (``compact``: see :meth:`ToolSchema.to_openai`)."""
        return [self[n].to_openai(compact) for n in (self._tools if names is None else names)]
