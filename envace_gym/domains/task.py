"""Tasks: the user turn(s), the tool whitelist, the reference trajectory and what the reward checks."""

from __future__ import annotations

import copy
import difflib
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import DomainError
from ..parsing.act import format_act
from ..tools.executor import ToolExecutor
from ..tools.schema import ToolCall

SPLITS = ("train", "test")


def check_split(split: str, where: str = "") -> str:
    """``split`` itself if it is one of :data:`SPLITS`; else a :class:`~envace_gym.errors.DomainError` naming
    them, after ``where`` (what held the split: a file and line) when given."""
    if split not in SPLITS:
        raise DomainError(f"{where + ': ' if where else ''}split {split!r} must be one of {list(SPLITS)}")
    return split


# ----------------------------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReferenceTurn:
    """One assistant turn of a reference solution: tool calls with their real results, or an answer. Where the user
    acts on the world too (τ²-Bench's telecom user holds the phone), ``user_calls`` are the calls the user makes on
    its own tools just before this turn, with their real results: part of the solution, never the agent's."""

    content: str = ""
    calls: tuple[ToolCall, ...] = ()
    results: tuple[Any, ...] = ()
    user_calls: tuple[ToolCall, ...] = ()
    user_results: tuple[Any, ...] = ()

    @property
    def text(self) -> str:
        """The Act text that writes this turn."""
        return format_act(self.content, self.calls)

    def to_dict(self) -> dict[str, Any]:
        out = {"content": self.content, "calls": [c.to_json() for c in self.calls], "results": list(self.results)}
        if self.user_calls:
            out.update(user_calls=[c.to_json() for c in self.user_calls], user_results=list(self.user_results))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReferenceTurn:
        def calls(key: str) -> tuple[ToolCall, ...]:
            return tuple(ToolCall(c["name"], dict(c.get("arguments", {}))) for c in data.get(key, ()))

        return cls(data.get("content", ""), calls("calls"), tuple(data.get("results", ())), calls("user_calls"),
                   tuple(data.get("user_results", ())))  # fmt: skip


@dataclass(frozen=True)
class Task:
    """One episode's worth of work.

    Attributes:
        id: ``"<domain>/<split>/<index>"`` for generated tasks; any unique string otherwise.
        domain: Name of the domain it belongs to.
        prompt: The first user message.
        split: ``"train"`` or ``"test"``.
        user_turns: Scripted follow-up user messages, each sent after the agent's next final answer.
        tools: The whitelist: names of the tools this task offers (empty: every tool of the domain).
        reference: The reference solution as assistant turns, with the real results of its calls.
        initial_state: The real executor's starting state.
        expected: What the reward checks (see :func:`score_expected`).
        system_prompt: Overrides the domain's system prompt for this task.
    """

    id: str
    domain: str
    prompt: str
    split: str = "train"
    user_turns: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    reference: tuple[ReferenceTurn, ...] = ()
    initial_state: Mapping[str, Any] = field(default_factory=dict)
    expected: Mapping[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None

    def reference_pairs(self, user: bool = False) -> list[tuple[ToolCall, Any]]:
        """Every reference call with its real result, in order (calls whose result is unknown, ``None``, as
        in benchmarks that only judge the calls, are left out); ``user``: the user's own calls instead."""
        made = ((t.user_calls, t.user_results) if user else (t.calls, t.results) for t in self.reference)
        return [(c, r) for calls, results in made for c, r in zip(calls, results, strict=True) if r is not None]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (nothing shared with the task)."""
        return copy.deepcopy(
            {
                "id": self.id,
                "domain": self.domain,
                "prompt": self.prompt,
                "split": self.split,
                "user_turns": list(self.user_turns),
                "tools": list(self.tools),
                "reference": [t.to_dict() for t in self.reference],
                "initial_state": dict(self.initial_state),
                "expected": dict(self.expected),
                "system_prompt": self.system_prompt,
            }
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], domain: str = "") -> Task:
        try:
            return cls(
                id=str(data["id"]),
                domain=data.get("domain", domain),
                prompt=data["prompt"],
                split=data.get("split", "train"),
                user_turns=tuple(data.get("user_turns", ())),
                tools=tuple(data.get("tools", ())),
                reference=tuple(ReferenceTurn.from_dict(t) for t in data.get("reference", ())),
                initial_state=data.get("initial_state", {}),
                expected=data.get("expected", {}),
                system_prompt=data.get("system_prompt"),
            )
        except (KeyError, TypeError) as exc:
            raise DomainError(f"malformed task record {str(data)[:120]}: missing or bad {exc}") from exc


class LazyTasks(Sequence[Task]):
    """A split's tasks, each built on first access by ``build(index)`` and kept: building a task can be costly
    (it runs the reference solution on a real executor), and most runs use a few of them."""

    def __init__(self, size: int, build: Callable[[int], Task]) -> None:
        self._size, self._build = size, build
        self._built: dict[int, Task] = {}

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError(index)
        if index not in self._built:
            self._built[index] = self._build(index)
        return self._built[index]


class ReferenceRecorder:
    """Writes a reference solution by running it on the real executor, so recorded results are real.

    Example:
        >>> rec = ReferenceRecorder(BankTools(state))
        >>> acct = rec.call("find_account", owner="Ana Lima")        # runs it, records call + result
        >>> rec.answer(f"Your balance is {acct['balance']:.2f} USD.")
        >>> rec.turns                                                  # -> tuple of ReferenceTurn
    """

    def __init__(self, executor: ToolExecutor) -> None:
        self.executor = executor
        self._turns: list[ReferenceTurn] = []
        self._pending: list[tuple[ToolCall, Any]] = []

    def call(self, tool: str, /, *, same_turn: bool = False, **arguments: Any) -> Any:
        """Run and record one call of ``tool``. Each call is its own Act turn unless ``same_turn`` (parallel
        calls). The tool's name is positional-only, so a tool may have a parameter called ``name`` or ``tool``."""
        known = type(self.executor).tool_functions
        if tool not in known:  # a typo in a reference solution: named where the domain loads, not at some reset
            close = difflib.get_close_matches(tool, list(known), n=1)
            raise DomainError(
                f"the reference solution calls {tool!r}, which {type(self.executor).__name__} does not define"
                f"{f'; did you mean {close[0]!r}?' if close else ''} (its tools: {sorted(known)})"
            )
        if not same_turn:
            self.end_turn()
        call = ToolCall(tool, arguments)
        result = self.executor.execute(call)
        self._pending.append((call, result))
        return result

    def end_turn(self) -> None:
        """Close the current turn of calls."""
        if self._pending:
            calls, results = zip(*self._pending, strict=True)
            self._turns.append(ReferenceTurn("", tuple(calls), tuple(results)))
            self._pending = []

    def answer(self, text: str) -> None:
        self.end_turn()
        self._turns.append(ReferenceTurn(content=text))

    @property
    def turns(self) -> tuple[ReferenceTurn, ...]:
        self.end_turn()
        return tuple(self._turns)


def stable_hash(text: str) -> int:
    """A process-independent hash (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
