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
:class:`~envace_gym.judge.ChecklistJudge`) to use another.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .domains import SPLITS, Domain, ReferenceTurn, RewardResult, Task, Trajectory, score_expected, stable_hash
from .errors import DomainError, EnvACEError
from .formats import FORMATS
from .parsing import call_key
from .text import strict_loads
from .tools import ToolCall, ToolRegistry, call_from_json

logger = logging.getLogger("envace_gym")
DATASET_FORMATS = ("openai", "envace", "sharegpt")
DATASET_SUFFIXES = (".jsonl", ".json", ".parquet")
Reward = Callable[[Task, Trajectory], RewardResult]


class _RowError(ValueError):
    """Why one row cannot become a task."""


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
            return data if isinstance(data, list) else data.get("rows", data.get("data", [data]))
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise DomainError(f"{path}:{n}: not a JSON line ({exc})") from exc
        return rows
    except (OSError, ValueError) as exc:
        if isinstance(exc, DomainError):
            raise
        raise DomainError(f"cannot read dataset {path}: {exc}") from exc


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
        except ValueError as exc:
            raise _RowError(f"{what} is a string that is not JSON ({exc})") from exc
    return value


def _result(content: Any) -> Any:
    """A tool message's content as the reference result: JSON when it is JSON, else the text."""
    if isinstance(content, str):
        text = re.sub(r"^\s*<tool_response>\s*|\s*</tool_response>\s*$", "", content)
        try:
            return strict_loads(text)
        except ValueError:
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


def _from_messages(messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """OpenAI-style messages → system prompt, opening prompt, later user turns, reference turns."""
    system, prompt, users, turns = None, None, [], []
    pending: list[Any] | None = None  # results of the last assistant turn's calls, as they arrive
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        content = content if isinstance(content, str) else "" if content is None else json.dumps(content)
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
            turns.append([content, _calls(m.get("tool_calls"), f"message {i}"), []])
            pending = turns[-1][2]
        elif role in ("tool", "function", "ipython"):
            if pending is None:
                raise _RowError(f"message {i}: a tool result with no assistant call before it")
            pending.append(_result(m.get("content")))
    if prompt is None:
        raise _RowError("no user turn")
    reference = []
    for content, calls, results in turns:
        if len(results) > len(calls):
            raise _RowError(f"{len(results)} tool results for {len(calls)} calls in one assistant turn")
        results += [None] * (len(calls) - len(results))  # an unanswered call: known call, unknown result
        reference.append(ReferenceTurn(content.strip() if calls else content, calls, tuple(results)))
    return {"system": system, "prompt": prompt, "user_turns": users, "reference": reference}


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
        parsed["expected"] = {"checklist_list": checklists}
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
        else:
            messages.append({"role": role, "content": value})
    if messages and messages[0]["role"] == "system":
        system = system or messages.pop(0)["content"]
    tools = row.get("tools")
    if tools is None and system and "<tools>" in system:  # Hermes function-calling: schemas in the system prompt
        block = system.split("<tools>", 1)[1].split("</tools>", 1)[0]
        tools = _json_field(block.strip(), "the <tools> block of the system prompt")
        system = system.split("<tools>", 1)[0].strip() or None
    parsed = _from_messages(messages)
    parsed["system"] = system
    parsed["tools"] = _json_field(tools or [], "'tools'")
    return parsed


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
        test_fraction: Share of tasks in the ``test`` split (a stable hash of the id decides).
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
        self._test_cut = int(test_fraction * 10_000)
        self._registries: dict[str, ToolRegistry] = {}
        self._splits: dict[str, list[Task]] = {s: [] for s in SPLITS}
        self.skipped: list[tuple[int, str]] = []  # (row index, reason) of every row left out
        for index, row in enumerate(load_rows(source)):
            try:
                task, registry = self._task(index, row, format)
            except (ValueError, EnvACEError, KeyError, TypeError, AttributeError) as exc:  # the row's fault, reported
                self.skipped.append((index, f"{type(exc).__name__}: {exc}"[:300]))
                continue
            if task.id in self._registries:
                self.skipped.append((index, f"duplicate task id {task.id!r}"))
                continue
            self._registries[task.id] = registry
            self._splits[task.split].append(task)
        if self.skipped:
            reasons = "; ".join(f"row {i}: {why}" for i, why in self.skipped[:3])
            logger.warning("dataset %s: %d row(s) skipped (%s%s)", self.name, len(self.skipped), reasons,
                           "; ..." if len(self.skipped) > 3 else "")  # fmt: skip
        if not self._registries:
            raise DomainError(f"dataset {self.name!r} has no usable row ({len(self.skipped)} skipped: "
                              f"{self.skipped[:3]})")  # fmt: skip

    def _task(self, index: int, row: Any, format: str | None) -> tuple[Task, ToolRegistry]:
        if not isinstance(row, Mapping):
            raise _RowError(f"a row must be an object, got {type(row).__name__}")
        parsed = _READERS[format or detect_row_format(row)](row)
        tools = parsed["tools"]
        if not isinstance(tools, list):
            raise _RowError("the tools must be a list of schemas")
        registry = ToolRegistry(tools)  # a schema that does not compile raises SchemaError here
        for turn in parsed["reference"]:
            for call in turn.calls:
                if call.name not in registry:
                    raise _RowError(f"the reference calls {call.name!r}, which the row's tools do not define")
        task_id = str(row.get("id") or parsed.get("id") or f"{self.name}/{index:04d}")
        split = "test" if stable_hash(task_id) % 10_000 < self._test_cut else "train"
        task = Task(
            id=task_id,
            domain=self.name,
            prompt=parsed["prompt"],
            split=split,
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
        if split not in SPLITS:
            raise DomainError(f"unknown split {split!r}; use one of {SPLITS}")
        return self._splits[split]

    def score(self, task: Task, trajectory: Trajectory) -> RewardResult:
        if self._reward is not None:
            return self._reward(task, trajectory)
        return reference_call_reward(task, trajectory)


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
