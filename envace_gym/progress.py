"""Opt-in progress for long calls (``collect_rollouts``, ``evaluate``, ``RehearsalVectorEnv.step``).

``progress=`` takes ``False`` (silent, the default), ``True`` or a label (a tqdm bar on stderr), or a
callable ``callback(done, total)`` called each time a unit of work (an episode, a sub-env's turn) finishes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

Progress = bool | str | Callable[[int, int], None] | None


class ProgressReporter:
    """One long call's progress: ``update`` as units finish, ``note`` to show that work goes on between them."""

    def __init__(self, progress: Progress, total: int, label: str, unit: str) -> None:
        self.callback = progress if callable(progress) else None
        self.done, self.total = 0, total
        self.bar = tqdm(
            total=total,
            desc=progress if isinstance(progress, str) else label,
            unit=unit,
            disable=not progress or self.callback is not None,
        )

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.callback is not None:
            self.callback(self.done, self.total)
        self.bar.update(n)

    def note(self, **fields: Any) -> None:
        """Refresh the bar with these fields (e.g. the generation round), so a long wait is not silent."""
        if not self.bar.disable:
            self.bar.set_postfix(fields, refresh=True)

    def close(self) -> None:
        self.bar.close()
