"""Real executors: a domain's tools run over the domain's own in-memory state.

A domain writes its tools as methods of a :class:`ToolExecutor` subclass, marked with :func:`tool`.
The same methods give the schemas (typed signature + Google docstring → ``get_json_schema``) and the
behaviour, so the two cannot drift apart. Calls are dispatched by name through a table built at class
creation, never through ``getattr`` on model text, and never by evaluating anything.

A tool signals a domain-level failure ("insufficient funds") by raising :class:`ToolFailure`: the agent
then sees ``{"error": "..."}`` as the tool's response, a normal observation, and the executor counts it in
``failures`` (an episode's tool errors, which ``max_errors`` bounds). Any other exception is a
bug in the executor and becomes an ``EXECUTION_ERROR``.
"""

from __future__ import annotations

import copy
import json
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from .canonical import call_key
from .schema import ToolCall, ToolSchema

F = TypeVar("F", bound=Callable[..., Any])
_TOOL_MARK = "__envace_tool__"


def tool(fn: F | None = None, *, returns: Mapping[str, Any] | None = None) -> Any:
    """Mark a :class:`ToolExecutor` method as a tool; ``returns`` is an optional JSON Schema of its result."""

    def mark(f: F) -> F:
        setattr(f, _TOOL_MARK, {"returns": dict(returns) if returns is not None else None})
        return f

    return mark(fn) if fn is not None else mark


class ToolFailure(Exception):
    """Raised by a tool for a failure the agent should see as the tool's response."""


class ToolExecutor:
    """Base class of a domain's real executor.

    Subclasses define tools as methods decorated with :func:`tool`; ``self.state`` holds the episode's
    world (a deep copy of the task's initial state, so episodes never share it).
    """

    tool_functions: ClassVar[dict[str, Callable[..., Any]]] = {}
    _schemas: ClassVar[list[ToolSchema] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[str, Callable[..., Any]] = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                if callable(member) and hasattr(member, _TOOL_MARK):
                    table[name] = member
        cls.tool_functions = table
        cls._schemas = None

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        self.state: dict[str, Any] = copy.deepcopy(dict(state or {}))
        self.calls_executed = 0  # how many calls reached the real tools (accounting, e.g. for private rehearsal)
        self.failures = 0  # how many of them the tools refused (ToolFailure)

    @classmethod
    def tool_schemas(cls) -> list[ToolSchema]:
        """Schemas of this executor's tools, built once per class."""
        if cls._schemas is None:
            cls._schemas = [
                ToolSchema.from_function(fn, returns=getattr(fn, _TOOL_MARK)["returns"])
                for fn in cls.tool_functions.values()
            ]
        return list(cls._schemas)

    def execute(self, call: ToolCall) -> Any:
        """Run one (already validated) call; returns a JSON-serialisable result."""
        fn = self.tool_functions.get(call.name)
        if fn is None:
            raise KeyError(f"{type(self).__name__} has no tool {call.name!r}")
        self.calls_executed += 1
        try:  # a copy of the arguments, so state built from them never aliases the call's record
            result = fn(self, **copy.deepcopy(dict(call.arguments)))
        except ToolFailure as failure:
            self.failures += 1
            return {"error": str(failure)}
        # A round trip through JSON copies the result (no aliasing of self.state) and proves it serialisable.
        return json.loads(json.dumps(result))

    def execute_user(self, call: ToolCall) -> Any:
        """Run one (already validated) call of the user's own tools (a domain whose users have tools:
        ``Domain.user_tools_for``), on the same world as the agent's calls."""
        raise NotImplementedError(f"{type(self).__name__} runs no user tools (its domain's users have none)")

    def snapshot(self) -> Any:
        """The state a reward compares (a copy)."""
        return copy.deepcopy(self.state)


def replay(executor: ToolExecutor, calls: Iterable[ToolCall]) -> ToolExecutor:
    """Apply ``calls`` in order (failures included, as the real tools would see them) and return the executor."""
    for call in calls:
        try:
            executor.execute(call)
        except Exception:  # a crashing call changes nothing we can trust; the reward sees the state as it is
            continue
    return executor


class ReferenceCache:
    """Ground-truth results of a task's reference trajectory, looked up by canonical (name, arguments).

    A call that appears several times in the reference (e.g. a balance read before and after a
    transfer) answers with its recorded results in order, then keeps the last one.
    """

    def __init__(self, pairs: Iterable[tuple[ToolCall, Any]]) -> None:
        self._results: dict[str, deque[Any]] = defaultdict(deque)
        for call, result in pairs:
            self._results[call_key(call)].append(result)

    def lookup(self, call: ToolCall) -> tuple[bool, Any]:
        queue = self._results.get(call_key(call))
        if not queue:
            return False, None
        result = queue.popleft() if len(queue) > 1 else queue[0]
        return True, copy.deepcopy(result)
