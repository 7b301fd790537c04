"""The dataset TRL's trainers take for world-rehearsal rollouts: one row per task, its id as the prompt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...domains.domain import Domain
from ...domains.registry import make_domain


def task_dataset(domain: str | Domain, split: str = "train", size: int | None = None, conversational: bool = False):
    """A ``datasets.Dataset`` with one row per task: ``prompt`` (the task id, or with ``conversational`` the
    task's system and first user message, as TRL's tool loop needs) and ``task_id``."""
    from datasets import Dataset

    dom = make_domain(domain)
    tasks = dom.tasks(split)
    tasks = tasks[: size if size is not None else len(tasks)]
    rows = []
    for task in tasks:
        prompt: Any = task.id
        if conversational:
            prompt = [
                {"role": "system", "content": task.system_prompt or dom.system_prompt},
                {"role": "user", "content": task.prompt},
            ]
        rows.append({"prompt": prompt, "task_id": task.id})
    return Dataset.from_list(rows)


def task_ids(prompts: Sequence[Any]) -> list[str]:
    ids = []
    for p in prompts:
        if not isinstance(p, str):
            raise ValueError("world-rehearsal rollouts need task ids as prompts: build the dataset with task_dataset()")
        ids.append(p)
    return ids
