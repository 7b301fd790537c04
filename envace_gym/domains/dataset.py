"""Domains from datasets of tool-use conversations: no executable environment, only tasks and references.

Each row of a conversation dataset becomes a :class:`~envace_gym.domains.Task`: the opening user turn is the
prompt, later user turns are replayed (scripted), the row's tool schemas are the task's tools, and its assistant
turns with their tool results are the reference (the Rehearse role's privileged context and the SFT data).
Three row formats are read, detected per row or named with ``format=``:

* ``openai``: ``{"messages": [system/user/assistant(tool_calls)/tool ...], "tools": [OpenAI schemas]}``;
* ``envace``: ``{"messages": [opening turns], "extra_info": {"tools": "<JSON schemas>", "messages": [the whole
  reference trajectory], "interaction_kwargs": {"checklist_list": [[[items of turn 1], ...], ...]}}}``, the
  paper's training rows (its checklists go to ``task.expected["checklist_list"]``);
* ``sharegpt``: ``{"conversations": [{"from": "system"|"human"|"gpt"|"function_call"|"observation"|"tool",
  "value": ...}], "tools": ..., "system": ...}`` (APIGen-MT, Hermes function-calling, ToolACE-like); calls
  written as ``<tool_call>`` blocks or as ``function_call`` turns, tools given as a field or as ``<tools>`` in
  the system prompt.

Sources: a ``.jsonl``, ``.json`` or ``.parquet`` file, a folder written by ``datasets.Dataset.save_to_disk``, a
``datasets.Dataset`` or a list of rows. A row whose schemas do not compile or whose calls do not parse is
skipped and reported (:attr:`DatasetDomain.skipped`, and one warning with the count and the reasons), never
silently kept. The split is a stable hash of the task id. Nothing executes: ``executor="rehearsal"`` or
``"cached"``. The default reward is :func:`reference_call_reward`; pass ``reward=`` (for example a
:class:`~envace_gym.domains.judge.ChecklistJudge`) to use another.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import DomainError, EnvACEError
from ..parsing.formats import FORMATS
from ..text import strict_loads
from ..tools.canonical import call_key, canonical_json
from ..tools.schema import ToolCall, ToolRegistry, call_from_json
from .domain import Domain
from .reward import RewardResult, score_expected
from .task import SPLITS, ReferenceTurn, Task, check_split, stable_hash
from .trajectory import Trajectory

logger = logging.getLogger("envace_gym")
DATASET_FORMATS = ("openai", "envace", "sharegpt")
DATASET_SUFFIXES = (".jsonl", ".json", ".parquet")
Reward = Callable[[Task, Trajectory], RewardResult]


class _RowError(ValueError):
    """Why one row cannot become a task."""


class _Unreadable(str):
    """A line of a JSONL file that is not JSON: kept in its place so the row is reported, not the file refused."""


# ----------------------------------------------------------------------------------------------------
# Reading rows
# ----------------------------------------------------------------------------------------------------
def is_dataset_source(source: Any) -> bool:
    """Whether ``domain=`` names a conversation dataset rather than a domain."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        return (path.is_file() and path.suffix in DATASET_SUFFIXES) or (path / "dataset_info.json").is_file()
    return type(source).__name__ == "Dataset" or (
        isinstance(source, list) and all(isinstance(r, Mapping) for r in source)
    )


def load_rows(source: Any) -> list[Mapping[str, Any]]:
    """The rows of a dataset file, a ``save_to_disk`` folder, a ``datasets.Dataset`` or a list."""
    if isinstance(source, list):
        return source
    if not isinstance(source, (str, Path)):
        return list(source)  # a datasets.Dataset iterates as dict rows
    path = Path(source)
    try:
        if path.is_dir():
            from datasets import load_from_disk

            return list(load_from_disk(str(path)))
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
            rows = (
                data
                if isinstance(data, list)
                else data.get("rows", data.get("data", [data]))
                if isinstance(data, Mapping)
                else None
            )
            if not isinstance(rows, list):
                raise DomainError(f"{path}: a .json dataset must hold a list of rows (or an object with 'rows'/'data')")
            return rows
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except (ValueError, RecursionError) as exc:
                    rows.append(_Unreadable(f"line {n} is not JSON ({str(exc)[:120]})"))  # reported, skipped
        return rows
    except (OSError, ValueError, RecursionError) as exc:
        if isinstance(exc, DomainError):
            raise
        raise DomainError(f"cannot read dataset {path}: {str(exc)[:200]}") from exc


def detect_row_format(row: Mapping[str, Any]) -> str:
    if "extra_info" in row:
        return "envace"
    if "conversations" in row:
        return "sharegpt"
    if "messages" in row:
        return "openai"
    raise _RowError(f"a row needs 'messages', 'extra_info' or 'conversations'; it has {sorted(row)[:8]}")


def _json_field(value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return strict_loads(value)
        except (ValueError, RecursionError) as exc:
            raise _RowError(f"{what} is a string that is not JSON ({str(exc)[:120]})") from exc
    return value


def _result(content: Any) -> Any:
    """A tool message's content as the reference result: JSON when it is JSON, else the text."""
    if isinstance(content, str):
        text = re.sub(r"^\s*<tool_response>\s*|\s*</tool_response>\s*$", "", content)
        try:
            return strict_loads(text)
        except (ValueError, RecursionError):
            return text
    return content


def _calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    calls = []
    for i, item in enumerate(raw or ()):
        call = call_from_json(item)
        if not isinstance(call, ToolCall):
            raise _RowError(f"{where}: tool call {i} does not parse: {call.message}")
        calls.append(call)
    return tuple(calls)


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, nothing, or OpenAI content parts of type text."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise _RowError(f"{where}: content must be text or text parts, got {str(content)[:80]}")


def _from_messages(messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """OpenAI-style messages → system prompt, opening prompt, later user turns, reference turns. Tool results
    are paired with their calls by ``tool_call_id`` where the calls have ids, else in order."""
    system, prompt, users, turns = None, None, [], []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise _RowError(f"message {i} is not an object")
        role, content = m.get("role"), _text(m.get("content"), f"message {i}")
        if role == "system" and prompt is None:
            system = content
        elif role == "user":
            if prompt is None:
                prompt = content
            else:
                users.append(content)
        elif role == "assistant":
            if prompt is None:
                raise _RowError(f"message {i}: an assistant turn before any user turn")
            raw = m.get("tool_calls") or []
            calls = _calls(raw, f"message {i}")
            ids = [c.get("id") if isinstance(c, Mapping) else None for c in raw]
            previous = turns[-1] if turns else None
            if calls and previous and not previous["calls"] and not previous["closed"]:
                # "Let me check." then a separate calling message: one turn, as a model writes it
                previous.update(
                    calls=calls,
                    ids=ids,
                    results=[None] * len(calls),
                    content=(previous["content"] + "\n" + content).strip(),
                )
            else:
                turns.append({"content": content, "calls": calls, "ids": ids, "results": [None] * len(calls),
                              "answered": 0, "closed": False})  # fmt: skip
        elif role in ("tool", "function", "ipython"):
            turn = turns[-1] if turns else None
            if turn is None or not turn["calls"]:
                raise _RowError(f"message {i}: a tool result with no assistant call before it")
            call_id = m.get("tool_call_id")
            if call_id is not None and any(turn["ids"]):
                if call_id not in turn["ids"]:
                    raise _RowError(f"message {i}: tool_call_id {call_id!r} names no call of the turn before it")
                slot = turn["ids"].index(call_id)
            else:
                slot = turn["answered"]
            if slot >= len(turn["calls"]) or turn["results"][slot] is not None:
                raise _RowError(f"message {i}: more tool results than calls, or one call answered twice")
            turn["results"][slot] = _result(m.get("content"))
            turn["answered"] += 1
        if role in ("user", "tool", "function", "ipython") and turns:
            turns[-1]["closed"] = role == "user" or turns[-1]["closed"]
    if prompt is None:
        raise _RowError("no user turn")
    reference = [  # a call left unanswered keeps a None result: a known call, an unknown result
        ReferenceTurn(t["content"].strip() if t["calls"] else t["content"], t["calls"], tuple(t["results"]))
        for t in turns
    ]
    return {"system": system, "prompt": prompt, "user_turns": users, "reference": reference}


def _checklists(raw: Any, turns: int) -> list[Any]:
    """``checklist_list`` checked now, not at reward time: ``[checklist][user turn][item]``, one list of items per
    user turn, every item readable (see :class:`envace_gym.domains.judge.ChecklistItem`)."""
    from .judge import ChecklistItem

    raw = _json_field(raw, "'checklist_list'")
    if not isinstance(raw, list) or not all(isinstance(c, list) for c in raw):
        raise _RowError("'checklist_list' must be a list of checklists, each a list of per-turn item lists")
    for n, checklist in enumerate(raw):
        if len(checklist) != turns:
            raise _RowError(f"checklist {n} has {len(checklist)} turn(s) of items; the conversation has {turns}")
        for turn in checklist:
            if not isinstance(turn, list):
                raise _RowError(f"checklist {n}: each turn must be a list of items")
            for item in turn:
                ChecklistItem.from_dict(item)  # a DomainError names the bad item
    return raw


def _openai_row(row: Mapping[str, Any]) -> dict[str, Any]:
    parsed = _from_messages(_json_field(row["messages"], "'messages'"))  # parquet files often store JSON text
    parsed["tools"] = _json_field(row.get("tools", []), "'tools'")
    return parsed


def _envace_row(row: Mapping[str, Any]) -> dict[str, Any]:
    extra = _json_field(row["extra_info"], "'extra_info'")
    if not isinstance(extra, Mapping):
        raise _RowError("'extra_info' must be an object")
    trajectory = extra.get("messages") or row.get("messages")
    parsed = _from_messages(_json_field(trajectory, "'extra_info.messages'"))
    parsed["tools"] = _json_field(extra.get("tools", []), "'extra_info.tools'")
    kwargs = _json_field(extra.get("interaction_kwargs") or {}, "'extra_info.interaction_kwargs'")
    checklists = kwargs.get("checklist_list") if isinstance(kwargs, Mapping) else None
    if checklists:
        parsed["expected"] = {"checklist_list": _checklists(checklists, 1 + len(parsed["user_turns"]))}
    if extra.get("index") is not None:
        parsed["id"] = str(extra["index"])
    return parsed


_SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "function_call": "call", "tool_call": "call", "observation": "tool", "tool": "tool",
                   "function_response": "tool", "function": "tool"}  # fmt: skip


def _sharegpt_row(row: Mapping[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    system = row.get("system")
    for i, turn in enumerate(_json_field(row["conversations"], "'conversations'")):
        role = _SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        value = turn.get("value", "")
        if role is None:
            raise _RowError(f"conversation turn {i}: unknown speaker {turn.get('from')!r}")
        if role == "assistant":
            parsed = FORMATS["hermes"].parse(value)  # <tool_call> blocks, as Hermes/ToolACE write them
            if parsed.error is not None:
                raise _RowError(f"conversation turn {i}: {parsed.error.message}")
            calls = [c.to_json() for c in parsed.calls]
            messages.append({"role": "assistant", "content": parsed.content, "tool_calls": calls or None})
        elif role == "call":  # APIGen-MT / xLAM: the call is its own turn, JSON
            calls = _json_field(value, f"conversation turn {i}")
            calls = calls if isinstance(calls, list) else [calls]
            if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"] = calls
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        elif role == "tool" and isinstance(value, str) and value.count("<tool_response>") > 1:
            for block in re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", value, re.S):
                messages.append({"role": "tool", "content": block})  # Hermes answers parallel calls in one turn
        else:
            messages.append({"role": role, "content": value})
    if messages and messages[0]["role"] == "system":
        system = system or messages.pop(0)["content"]
    tools = row.get("tools")
    if tools is None and system and "<tools>" in system:  # Hermes function-calling: schemas in the system prompt
        tools = _tools_block(system)
    parsed = _from_messages(messages)
    parsed["system"] = system
    parsed["tools"] = _json_field(tools or [], "'tools'")
    return parsed


def _tools_block(system: str) -> list[Any]:
    """The tool schemas a Hermes/Qwen system prompt holds in its last non-empty ``<tools>…</tools>`` block (the
    prompt's own instructions mention an empty one first): a JSON list, or one JSON object per line."""
    blocks = [b.strip() for b in re.findall(r"<tools>(.*?)</tools>", system, re.S) if b.strip()]
    if not blocks:
        raise _RowError("the system prompt's <tools> block is empty")
    try:
        value = strict_loads(blocks[-1])
    except (ValueError, RecursionError):
        value = [_json_field(line, "a line of the <tools> block") for line in blocks[-1].splitlines() if line.strip()]
    return value if isinstance(value, list) else [value]


_READERS = {"openai": _openai_row, "envace": _envace_row, "sharegpt": _sharegpt_row}


# ----------------------------------------------------------------------------------------------------
# The domain
# ----------------------------------------------------------------------------------------------------
class DatasetDomain(Domain):
    """A domain whose tasks are the rows of a tool-use conversation dataset (see the module docstring).

    Args:
        source: A file (``.jsonl``/``.json``/``.parquet``), a ``save_to_disk`` folder, a ``datasets.Dataset``
            or a list of rows.
        format: ``"openai"``, ``"envace"``, ``"sharegpt"``, or ``None`` to detect it per row.
        name: The domain's name (default: the file's stem, or ``"dataset"``).
        test_fraction: Share of tasks in the ``test`` split: of ``n`` usable rows, ``floor(n * test_fraction)``
            go to ``test`` (at most ``n - 1``: at least one ``train`` row), those whose ids hash lowest.
        reward: ``(task, trajectory) -> RewardResult``; default :func:`reference_call_reward`.
        system_prompt: Used where a row brings none.
    """

    def __init__(
        self,
        source: Any,
        format: str | None = None,
        *,
        name: str | None = None,
        test_fraction: float = 0.1,
        reward: Reward | None = None,
        system_prompt: str | None = None,
    ) -> None:
        if format is not None and format not in DATASET_FORMATS:
            raise DomainError(f"format must be one of {DATASET_FORMATS} or None, got {format!r}")
        if not 0.0 <= test_fraction < 1.0:
            raise DomainError(f"test_fraction must be in [0, 1), got {test_fraction}")
        self.source = source
        self.name = name or (Path(source).stem if isinstance(source, (str, Path)) else "dataset")
        self.description = (
            f"tasks from the conversations of {source if isinstance(source, (str, Path)) else 'a dataset'}"
        )
        self.system_prompt = system_prompt or Domain.system_prompt
        self._reward = reward
        self._registries: dict[str, ToolRegistry] = {}
        self._compiled: dict[str, ToolRegistry] = {}  # tool list (canonical JSON) → its registry
        self._splits: dict[str, list[Task]] = {s: [] for s in SPLITS}
        loaded: list[Task] = []
        self.skipped: list[tuple[int, str]] = []  # (row index, reason) of every row left out
        for index, row in enumerate(load_rows(source)):
            try:
                task, registry = self._task(index, row, format)
            except (ValueError, EnvACEError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # the row's
                self.skipped.append((index, f"{type(exc).__name__}: {exc}"[:300]))
                continue
            if task.id in self._registries:
                self.skipped.append((index, f"duplicate task id {task.id!r}"))
                continue
            self._registries[task.id] = registry
            loaded.append(task)
        if self.skipped:
            reasons = "; ".join(f"row {i}: {why}" for i, why in self.skipped[:3])
            logger.warning("dataset %s: %d row(s) skipped (%s%s)", self.name, len(self.skipped), reasons,
                           "; ..." if len(self.skipped) > 3 else "")  # fmt: skip
        if not self._registries:
            raise DomainError(f"dataset {self.name!r} has no usable row ({len(self.skipped)} skipped: "
                              f"{self.skipped[:3]})")  # fmt: skip
        # a count, not a per-row coin: a 5-row file at 0.1 has no test row (a per-row hash once gave it 3 of 5)
        ranked = sorted(loaded, key=lambda t: (stable_hash(t.id), t.id))
        held_out = {t.id for t in ranked[: test_rows(len(loaded), test_fraction)]}
        for task in loaded:
            split = "test" if task.id in held_out else "train"
            self._splits[split].append(task if task.split == split else replace(task, split=split))

    def _task(self, index: int, row: Any, format: str | None) -> tuple[Task, ToolRegistry]:
        if isinstance(row, _Unreadable):
            raise _RowError(str(row))
        if not isinstance(row, Mapping):
            raise _RowError(f"a row must be an object, got {type(row).__name__}")
        parsed = _READERS[format or detect_row_format(row)](row)
        tools = parsed["tools"]
        if not isinstance(tools, list):
            raise _RowError("the tools must be a list of schemas")
        # Rows of one dataset mostly share their tool list: compile each distinct list once (a schema that does not
        # compile raises SchemaError here).
        key = canonical_json(tools)
        registry = self._compiled.get(key) or self._compiled.setdefault(key, ToolRegistry(tools))
        for turn in parsed["reference"]:
            for call in turn.calls:
                if call.name not in registry:
                    raise _RowError(f"the reference calls {call.name!r}, which the row's tools do not define")
                check = registry.validate(call)
                if not check.ok:  # the reference would fail its own schema: it could not teach or score anything
                    raise _RowError(f"the reference call {call.name!r} fails its schema: {check.error.message}")
        task_id = str(row.get("id") or parsed.get("id") or f"{self.name}/{index:04d}")
        task = Task(
            id=task_id,
            domain=self.name,
            prompt=parsed["prompt"],
            split="train",  # the domain decides, once every row is read (test_rows)
            user_turns=tuple(parsed["user_turns"]),
            tools=tuple(registry.names),
            reference=tuple(parsed["reference"]),
            expected={**dict(_json_field(row.get("expected") or {}, "'expected'")), **parsed.get("expected", {})},
            system_prompt=parsed["system"],
        )
        return task, registry

    @property
    def tools(self) -> ToolRegistry:
        raise DomainError("dataset tasks bring their own tools: use tools_for(task)")

    def tools_for(self, task: Task) -> ToolRegistry:
        return self._registries[task.id]

    def tool_names(self) -> list[str]:
        return sorted({n for r in self._registries.values() for n in r.names})

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return self._splits[check_split(split)]

    def locate(self, task: Task | None = None) -> str:
        origin = str(self.source) if isinstance(self.source, (str, Path)) else f"dataset {self.name!r}"
        return origin if task is None else f"{origin}: task {task.id!r}"

    def score(self, task: Task, trajectory: Trajectory) -> RewardResult:
        if self._reward is not None:
            return self._reward(task, trajectory)
        return reference_call_reward(task, trajectory)


def test_rows(n: int, test_fraction: float) -> int:
    """How many of ``n`` tasks a dataset puts in ``test``: ``floor(n * test_fraction)``, leaving at least one for
    ``train`` (the small epsilon keeps ``0.3 * 10`` at 3 in binary floating point)."""
    return max(0, min(math.floor(n * test_fraction + 1e-9), n - 1))


def reference_call_reward(task: Task, trajectory: Trajectory) -> RewardResult:
    """The reward of a dataset task without a judge: the reference's calls were made (canonical name and
    arguments, each as often as the reference makes it), in the reference's order, and the row's own answer
    checks (``expected``'s ``answer_numbers`` / ``answer_contains``) hold. A task whose reference makes no call
    is judged by its answer checks alone (masked, ``None``, when it has none)."""
    needed = [call_key(c) for turn in task.reference for c in turn.calls]
    made = [call_key(c) for c in trajectory.valid_calls]
    checks: dict[str, bool] = {}
    if needed:
        remaining = list(made)
        checks["reference_calls"] = all(k in remaining and not remaining.remove(k) for k in needed)
        it = iter(made)
        checks["reference_order"] = all(any(k == m for m in it) for k in needed)  # a subsequence of what was made
    answers = {k: v for k, v in task.expected.items() if k in ("answer_numbers", "answer_contains")}
    if answers:
        checks.update(
            score_expected(Task(task.id, task.domain, task.prompt, expected=answers), trajectory, None).checks
        )
    return RewardResult.from_checks(checks)


__all__ = ["DATASET_FORMATS", "DatasetDomain", "detect_row_format", "is_dataset_source", "load_rows",
           "reference_call_reward"]  # fmt: skip
