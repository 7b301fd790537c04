"""What an episode leaves for the reward: its messages, one record per call, its final answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ToolError
from ..tools.schema import ToolCall
from .task import Task


@dataclass(frozen=True)
class CallRecord:
    """One tool call as the episode handled it."""

    turn: int
    call: ToolCall | None
    route: str | None  # "real", "cache", "rehearsal"; None when it failed before routing
    result: Any = None
    error: ToolError | None = None
    user_turn: int = 1  # which user turn the call answers (multi-turn rewards check turn by turn)
    requestor: str = "assistant"  # who made it: the agent, or a user with tools of its own ("user")

    @property
    def validated(self) -> bool:
        """The call passed format, whitelist and schema checks (its *answer* may still have failed)."""
        return self.route is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "id": self.call.id if self.call else None,
            "name": self.call.name if self.call else None,
            "arguments": dict(self.call.arguments) if self.call else None,
            "route": self.route,
            "result": self.result,
            "error": self.error.to_dict() if self.error else None,
            "validated": self.validated,
            "user_turn": self.user_turn,
            "requestor": self.requestor,
        }


@dataclass(frozen=True)
class Trajectory:
    """What a reward sees: the task, the conversation, every call made, every final answer, and everything the agent
    wrote outside its calls (``said``: its final answers and the prose of its call turns, in order)."""

    task: Task
    messages: tuple[Mapping[str, Any], ...]
    calls: tuple[CallRecord, ...]
    answers: tuple[str, ...]
    said: tuple[str, ...] = ()

    @property
    def valid_calls(self) -> list[ToolCall]:
        """The calls the agent validly made, in order: what a verifier replays. A call counts even when
        its rehearsal failed: that failure is the simulator's, not the agent's action."""
        return [r.call for r in self.calls if r.call is not None and r.validated and r.requestor == "assistant"]

    @property
    def valid_actions(self) -> list[tuple[str, ToolCall]]:
        """Every valid call with who made it (``"assistant"`` or ``"user"``), in the order they were made: what a
        verifier replays where the user acts on the world too (τ²-Bench's telecom)."""
        return [(r.requestor, r.call) for r in self.calls if r.call is not None and r.validated]
