"""Reading model text: the Act turn's tool calls, in each model family's format, and the Rehearse turn's result.

No torch here. :mod:`.act` holds the contract every reader keeps (limits, strict JSON, :class:`ParsedAct`) and
reads ``<execution_result>``; :mod:`.formats` holds one :class:`ToolCallFormat` per model family, the default
(Hermes) one's reader being :func:`parse_act`.
"""

from __future__ import annotations

from .act import (
    DEFAULT_LIMITS,
    RESULT_CLOSE,
    RESULT_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    Limits,
    ParsedAct,
    ParsedResult,
    format_act,
    loads_json,
    parse_execution_result,
    parse_result_json,
)
from .formats import FORMATS, ToolCallFormat, detect_format, parse_act, tool_call_format

__all__ = [
    "DEFAULT_LIMITS",
    "FORMATS",
    "Limits",
    "ParsedAct",
    "ParsedResult",
    "RESULT_CLOSE",
    "RESULT_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ToolCallFormat",
    "detect_format",
    "format_act",
    "loads_json",
    "parse_act",
    "parse_execution_result",
    "parse_result_json",
    "tool_call_format",
]
