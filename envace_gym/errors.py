"""Typed errors.

Two kinds live here and they never mix:

* :class:`ToolError` is a *value*: what a bad tool call or a bad simulation becomes inside an episode.
  Model text never raises; it gets one of the :class:`ErrorCode` codes, which the environment turns
  into an ``{"error_tool_call": ...}`` payload (docs/method.md, "Roll-out") and either ends the episode or feeds back.
* :class:`EnvACEError` and its subclasses are *exceptions* for mistakes of the programmer using the
  package: a malformed schema, an unknown domain, a missing default model.
"""

from __future__ import annotations

import enum
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parent


class ErrorCode(str, enum.Enum):
    """Why a tool call (or its simulation) failed. The first three are the paper's own codes."""

    INVALID_TOOL_CALL_FORMAT = "INVALID_TOOL_CALL_FORMAT"
    """The Act turn's ``<tool_call>`` block is not a well-formed call."""
    TOOL_NOT_AVAILABLE = "TOOL_NOT_AVAILABLE"
    """The tool is unknown, or not in this task's whitelist."""
    INVALID_PARAMETERS = "INVALID_PARAMETERS"
    """The arguments do not satisfy the tool's JSON Schema."""
    INVALID_REHEARSAL = "INVALID_REHEARSAL"
    """The rehearse role's output breaks the ``<execution_result>`` contract."""
    REHEARSED_ERROR = "REHEARSED_ERROR"
    """The rehearse role answered with an ``error_tool_call`` of its own."""
    RESULT_SCHEMA_MISMATCH = "RESULT_SCHEMA_MISMATCH"
    """A rehearsed result failed the tool's ``returns`` schema on every attempt."""
    EXECUTION_ERROR = "EXECUTION_ERROR"
    """The real executor crashed on a call that had passed validation."""
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    """The input broke one of the documented bounds (length, number of calls, JSON depth)."""
    ENVIRONMENT_ERROR = "ENVIRONMENT_ERROR"
    """A part of the environment itself (a tokenizer, a registry, a domain's code) raised during a turn; the
    turn was undone and the episode ended, its reward masked."""


@dataclass(frozen=True)
class ToolError:
    """A failed tool call, as data.

    Attributes:
        code: One of :class:`ErrorCode`.
        message: One human-readable sentence; names the JSON path and the expectation when relevant.
        details: Machine-readable context (JSON-serialisable).
        source: Which layer produced it: ``"parser"``, ``"registry"``, ``"rehearsal"``, ``"executor"`` or
            ``"environment"``.
        origin: For a bug in a domain's own code (a tool that raised), ``file:line (function)`` where it raised:
            for the domain's author, in :meth:`to_dict` (``info``), never in the payload the agent sees.
    """

    code: ErrorCode
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    source: str = "parser"
    origin: str | None = None

    def to_payload(self) -> dict[str, Any]:
        """The ``{"error_tool_call": {...}}`` object the conversation shows as the tool's response."""
        return {"error_tool_call": {"code": self.code.value, "message": self.message, "details": self.details}}

    def to_dict(self) -> dict[str, Any]:
        out = {"code": self.code.value, "message": self.message, "details": self.details, "source": self.source}
        return out if self.origin is None else {**out, "origin": self.origin}


def raised_at(exc: BaseException) -> str | None:
    """``file:line (function)`` of the last frame of ``exc``'s traceback outside this package: where the domain
    author's own code raised; ``None`` when it did not pass through such code."""
    frames = traceback.extract_tb(exc.__traceback__)
    theirs = [f for f in frames if not Path(f.filename).resolve().is_relative_to(_PACKAGE)]
    return f"{theirs[-1].filename}:{theirs[-1].lineno} ({theirs[-1].name})" if theirs else None


class EnvACEError(Exception):
    """Base class of the exceptions this package raises for API misuse."""


class SchemaError(EnvACEError, ValueError):
    """A tool schema is malformed (fails the JSON Schema metaschema or our naming rules)."""


class UnknownToolError(EnvACEError, KeyError):
    """A registry was asked for a tool it does not hold."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the sentence readable
        return str(self.args[0]) if self.args else ""


class DomainError(EnvACEError, ValueError):
    """A domain is unknown, malformed, or asked for something it cannot do."""


class TaskNotFoundError(DomainError, KeyError):
    """No task with that id exists in the domain."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TaskTooLongError(EnvACEError, ValueError):
    """A task's opening prompt does not fit the policy's context (with room for one Act turn), or is longer than
    the environment's observation space: it cannot be played, so it is never handed out."""

    def __init__(self, task_id: str, message: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class TrainingConfigError(EnvACEError, ValueError):
    """A trainer was given settings it cannot apply (it refuses them rather than silently ignoring them)."""


class PolicyError(EnvACEError, RuntimeError):
    """The policy cannot be built or cannot generate what was asked."""


class ServerError(PolicyError):
    """A generation server (``vllm_mode="server"``) did not answer, or answered with an error: ``url`` names it."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url


class DefaultModelNotInstalledError(PolicyError, ImportError):
    """The package holding the embedded default model is missing."""
