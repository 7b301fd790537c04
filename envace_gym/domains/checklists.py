"""Checklists from reference trajectories, for datasets that have none (``envace checklists``).

For every user turn of a task: one item per call the reference makes in that turn (the call, with its canonical
arguments, must be made), and one item per fact the reference's answer tells the user, the facts listed by a judge
model as a strict JSON list of strings. When the judge's list cannot be read, the turn gets one item asking that
the answer agree with the reference's, and the fallback is counted. Weights are equal within a turn and sum to 1.
The result is written as EnvACE-format rows (``extra_info.interaction_kwargs.checklist_list``), so it can be
reviewed, edited and loaded back as a dataset domain.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..endpoint import ChatBackend
from ..progress import Progress, ProgressReporter
from ..text import strict_loads
from .domain import Domain
from .task import Task

FACTS_SYSTEM = (
    "You list the facts an assistant's answer tells the user. Reply with a JSON list of short strings only, one "
    'fact each, e.g. ["the table is booked for 4 at 20:00", "the confirmation is BK-420"].'
)


@dataclass
class ChecklistReport:
    """What :func:`derive_checklists` did: tasks written, items made, turns whose facts fell back."""

    tasks: int = 0
    call_items: int = 0
    fact_items: int = 0
    fallbacks: list[str] = field(default_factory=list)  # "task id, turn n" where the judge's list was unreadable


def _turns(task: Task) -> list[tuple[list[Any], str]]:
    """The reference split by user turn: (calls made in the turn, the turn's final answer)."""
    turns: list[tuple[list[Any], str]] = [([], "")]
    for ref in task.reference:
        turns[-1][0].extend(ref.calls)
        if not ref.calls:
            turns[-1] = (turns[-1][0], ref.content)
            turns.append(([], ""))
    return [t for t in turns if t[0] or t[1]]


def _facts(text: str | None) -> list[str] | None:
    try:
        value = strict_loads((text or "").strip())
    except ValueError:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        return None
    return [v.strip() for v in value[:8]]


def derive_checklists(tasks: Sequence[Task], backend: ChatBackend, report: ChecklistReport) -> list[list[list[dict]]]:
    """One checklist per task: ``[turn][item]`` dicts with the paper's fields."""
    turns = [_turns(t) for t in tasks]
    asks = [(i, k, answer) for i, task_turns in enumerate(turns) for k, (_, answer) in enumerate(task_turns) if answer]
    replies = backend.complete(
        [
            [{"role": "system", "content": FACTS_SYSTEM}, {"role": "user", "content": f"Answer: {answer}"}]
            for _, _, answer in asks
        ]  # fmt: skip
    )
    facts = {(i, k): _facts(text) for (i, k, _), text in zip(asks, replies, strict=True)}
    out = []
    for i, (task, task_turns) in enumerate(zip(tasks, turns, strict=True)):
        checklist = []
        for k, (calls, answer) in enumerate(task_turns):
            items = [
                {"question": f"Did the assistant call {c.name} with {json.dumps(c.arguments, ensure_ascii=False)}?",
                 "focus_on": "tool calls", "pass_condition": f"a {c.name} call with these arguments (values may be "
                 "written differently but must mean the same)", "required_for_next_turn": False}
                for c in calls
            ]  # fmt: skip
            report.call_items += len(items)
            if answer:
                listed = facts[(i, k)]
                if listed is None:
                    report.fallbacks.append(f"{task.id}, turn {k + 1}")
                    listed = []
                    items.append({"question": "Does the final answer agree with the reference answer?",
                                  "focus_on": "final answer", "pass_condition": f"it agrees with: {answer}",
                                  "required_for_next_turn": False})  # fmt: skip
                for fact in listed:
                    items.append({"question": f"Does the assistant tell the user that {fact}?",
                                  "focus_on": "final answer", "pass_condition": fact,
                                  "required_for_next_turn": False})  # fmt: skip
                report.fact_items += len(listed)
            for item in items:
                item["weight"] = 1.0 / len(items)
            checklist.append(items)
        out.append([checklist])
        report.tasks += 1
    return out


def task_messages(task: Task) -> list[dict[str, Any]]:
    """The task's reference as an OpenAI-style conversation: opening, calls, results, answers, later users."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": task.system_prompt}] if task.system_prompt else []
    messages.append({"role": "user", "content": task.prompt})
    users = iter(task.user_turns)
    n = 0
    for ref in task.reference:
        if ref.calls:
            ids = [f"call_{n + j}" for j in range(len(ref.calls))]
            n += len(ids)
            messages.append({"role": "assistant", "content": ref.content, "tool_calls": [
                {"id": i, "type": "function", "function": c.to_json()} for i, c in zip(ids, ref.calls, strict=True)]})  # fmt: skip
            for i, c, r in zip(ids, ref.calls, ref.results, strict=True):
                content = r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)
                messages.append({"role": "tool", "tool_call_id": i, "name": c.name, "content": content})
        else:
            messages.append({"role": "assistant", "content": ref.content})
            user = next(users, None)
            if user is not None:
                messages.append({"role": "user", "content": user})
    return messages


def write_checklists(
    domain: Domain,
    backend: ChatBackend,
    out: str | Path,
    splits: Sequence[str] = ("train", "test"),
    batch: int = 16,
    progress: Progress = True,
) -> ChecklistReport:
    """Derive checklists for every task of ``splits`` and write them, with the tasks, as EnvACE-format rows."""
    tasks = [t for s in splits for t in domain.tasks(s)]
    report = ChecklistReport()
    bar = ProgressReporter(progress, len(tasks), "checklists", "task")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        for start in range(0, len(tasks), batch):
            chunk = tasks[start : start + batch]
            for task, checklist in zip(chunk, derive_checklists(chunk, backend, report), strict=True):
                messages = task_messages(task)
                opening = messages[: 2 if task.system_prompt else 1]
                extra: Mapping[str, Any] = {
                    "index": task.id,
                    "tools": json.dumps(domain.tools_for(task).to_openai(domain.whitelist(task)), ensure_ascii=False),
                    "messages": messages,
                    "interaction_kwargs": {"checklist_list": checklist},
                }
                kept = {k: v for k, v in task.expected.items() if k != "checklist_list"}  # the answer checks stay
                row = {"messages": opening, "extra_info": extra, **({"expected": kept} if kept else {})}
                file.write(json.dumps(row, ensure_ascii=False) + "\n")
                bar.update()
    bar.close()
    return report


__all__ = ["ChecklistReport", "derive_checklists", "task_messages", "write_checklists"]
