"""Tools: JSON-Schema tool definitions, the registry that validates every call, and real executors.

No torch here: the first stage of the pipeline (tools → parsing → domains → rehearsal → episode → env →
rollout → training) is plain data and validation.
"""

from __future__ import annotations

from .canonical import call_key, canonical, canonical_json
from .executor import ReferenceCache, ToolExecutor, ToolFailure, replay, tool
from .schema import ToolCall, ToolRegistry, ToolSchema, ValidationResult, call_from_json

__all__ = [
    "ReferenceCache",
    "ToolCall",
    "ToolExecutor",
    "ToolFailure",
    "ToolRegistry",
    "ToolSchema",
    "ValidationResult",
    "call_from_json",
    "call_key",
    "canonical",
    "canonical_json",
    "replay",
    "tool",
]
