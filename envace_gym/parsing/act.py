"""Reading model text: the contract every reader keeps (:class:`Limits`, :func:`loads_json`, :class:`ParsedAct`)
and the Rehearse turn's ``<execution_result>``. The Act turn's tool calls are read in :mod:`.formats` (Hermes's
``<tool_call>`` blocks by :func:`~envace_gym.parsing.formats.parse_act`, the other families' beside it).

Every function here takes untrusted text and returns data or a typed :class:`~envace_gym.errors.ToolError`;
none raises on model output and none evaluates it (JSON only, with ``NaN``/``Infinity`` refused).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ErrorCode, ToolError
from ..text import strict_loads
from ..tools.schema import ToolCall

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<execution_result>", "</execution_result>"
_THINK_RE = re.compile(r"^\s*<think>.*?</think>", re.S)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one turn may contain; inputs past them get ``LIMIT_EXCEEDED``, in bounded time.

    Attributes:
        max_action_chars: Longest Act turn accepted.
        max_calls_per_turn: Most tool calls in one Act turn.
        max_json_chars: Longest single JSON document (a call block or a result).
        max_json_depth: Deepest nesting of arrays/objects in a call or a result.
        max_check_seconds: Most seconds one step spends parsing, validating and routing its calls and checking
            rehearsed results (generations and real executors aside); a check still running then ends in
            ``LIMIT_EXCEEDED`` (:mod:`envace_gym.tools.budget`). ``None``: no bound.
    """

    max_action_chars: int = 32_768
    max_calls_per_turn: int = 16
    max_json_chars: int = 16_384
    max_json_depth: int = 32
    max_check_seconds: float | None = 1.0

    def __post_init__(self) -> None:
        for name in ("max_action_chars", "max_calls_per_turn", "max_json_chars", "max_json_depth"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.max_check_seconds is not None and not self.max_check_seconds > 0:
            raise ValueError(f"Limits.max_check_seconds must be positive or None, got {self.max_check_seconds!r}")


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class ParsedAct:
    """An Act turn, read.

    ``calls`` empty and ``error`` ``None`` means a final answer (``content``). ``error`` set means the
    turn is malformed; ``calls`` then holds the calls read before the fault, for the record.
    """

    raw: str
    content: str
    calls: tuple[ToolCall, ...] = ()
    error: ToolError | None = None

    @property
    def is_final_answer(self) -> bool:
        return not self.calls and self.error is None


def _nesting_depth(text: str) -> int:
    """Deepest bracket nesting outside strings: a cheap pre-check so deep input never reaches the recursion."""
    depth = best = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def loads_json(text: str, limits: Limits = DEFAULT_LIMITS) -> tuple[Any, ToolError | None]:
    """Strict JSON with bounds: ``(value, None)`` or ``(None, error)``. Duplicate keys are an error; lone
    surrogates that escapes such as ``"\\ud800"`` decode to are replaced (U+FFFD)."""
    if len(text) > limits.max_json_chars:
        return None, ToolError(
            ErrorCode.LIMIT_EXCEEDED,
            f"JSON of {len(text)} characters exceeds the limit of {limits.max_json_chars}",
            {"limit": "max_json_chars", "value": len(text)},
        )
    depth = _nesting_depth(text)
    if depth > limits.max_json_depth:
        return None, ToolError(
            ErrorCode.LIMIT_EXCEEDED,
            f"JSON nested {depth} deep exceeds the limit of {limits.max_json_depth}",
            {"limit": "max_json_depth", "value": depth},
        )
    try:
        return strict_loads(text), None
    except (ValueError, RecursionError) as exc:
        return None, ToolError(ErrorCode.INVALID_TOOL_CALL_FORMAT, f"invalid JSON: {exc}"[:300])


def format_act(content: str, calls: tuple[ToolCall, ...] | list[ToolCall] = ()) -> str:
    """The Act text that writes ``content`` then ``calls``: the inverse of :func:`~envace_gym.parsing.parse_act`."""
    parts = [content.strip()] if content.strip() else []
    parts += [c.to_text() for c in calls]
    return "\n".join(parts)


@dataclass(frozen=True)
class ParsedResult:
    """A Rehearse turn, read: the simulated ``result`` or a typed ``error``."""

    result: Any = None
    error: ToolError | None = None
    thought: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


def parse_execution_result(text: str, limits: Limits = DEFAULT_LIMITS) -> ParsedResult:
    """Read the rehearse role's output: optional ``<think>…</think>``, then exactly one
    ``<execution_result>`` block holding non-empty JSON, then nothing but whitespace.

    A result of the form ``{"error_tool_call": {...}}`` is the simulator declaring the call invalid;
    it comes back as an error (``REHEARSED_ERROR``, or the paper's code the simulator named).
    """

    def bad(message: str, code: ErrorCode = ErrorCode.INVALID_REHEARSAL) -> ParsedResult:
        return ParsedResult(error=ToolError(code, message, {"output": text[:300]}, source="rehearsal"))

    if not isinstance(text, str):
        return bad("a rehearsal must be text")
    thought = ""
    match = _THINK_RE.match(text)
    rest = text
    if match:
        thought = match.group(0).strip()[len("<think>") : -len("</think>")].strip()
        rest = text[match.end() :]
    rest = rest.strip()
    if not rest.startswith(RESULT_OPEN):
        return bad(f"expected {RESULT_OPEN} at the start of the rehearsal")
    end = rest.find(RESULT_CLOSE)
    if end == -1:
        return bad(f"{RESULT_OPEN} is never closed by {RESULT_CLOSE}")
    if rest[end + len(RESULT_CLOSE) :].strip():
        return bad(f"unexpected text after {RESULT_CLOSE}")
    read = parse_result_json(rest[len(RESULT_OPEN) : end], limits)
    return ParsedResult(read.result, read.error, thought)


def parse_result_json(body: str, limits: Limits = DEFAULT_LIMITS) -> ParsedResult:
    """Read a rehearsed tool response body: non-empty JSON; ``{"error_tool_call": ...}`` is an error.

    This is the whole contract of an ``inline`` rehearsal (the chat template supplies the tags).
    """

    def bad(message: str, code: ErrorCode = ErrorCode.INVALID_REHEARSAL) -> ParsedResult:
        return ParsedResult(error=ToolError(code, message, {"output": body[:300]}, source="rehearsal"))

    body = body.strip()
    if not body:
        return bad("empty execution result")
    value, error = loads_json(body, limits)
    if error is not None:
        code = error.code if error.code is ErrorCode.LIMIT_EXCEEDED else ErrorCode.INVALID_REHEARSAL
        return bad(f"execution result: {error.message}", code)
    if value in ({}, [], "", None):
        return bad("execution result is empty JSON")
    if isinstance(value, Mapping) and "error_tool_call" in value:
        return ParsedResult(error=_rehearsed_error(value["error_tool_call"]))
    return ParsedResult(result=value)


def _rehearsed_error(payload: Any) -> ToolError:
    details = payload if isinstance(payload, Mapping) else {"raw": payload}
    named = details.get("code")
    known = {
        c.value
        for c in (ErrorCode.INVALID_TOOL_CALL_FORMAT, ErrorCode.TOOL_NOT_AVAILABLE, ErrorCode.INVALID_PARAMETERS)
    }
    code = ErrorCode(named) if isinstance(named, str) and named in known else ErrorCode.REHEARSED_ERROR
    message = details.get("message") if isinstance(details.get("message"), str) else "the simulator rejected the call"
    return ToolError(code, message, {"rehearsed": json.loads(json.dumps(details, default=str))}, source="rehearsal")


__all__ = [
    "DEFAULT_LIMITS",
    "RESULT_CLOSE",
    "RESULT_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "Limits",
    "ParsedAct",
    "ParsedResult",
    "format_act",
    "loads_json",
    "parse_execution_result",
    "parse_result_json",
]
