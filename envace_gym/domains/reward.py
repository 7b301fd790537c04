"""Rewards: a score in [0, 1] with its named checks, and the expected-answer checks tasks declare."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import DomainError
from ..tools.canonical import call_key, canonical_json
from ..tools.executor import ToolExecutor, replay
from ..tools.schema import ToolCall
from .task import Task
from .trajectory import Trajectory


@dataclass(frozen=True)
class RewardResult:
    """A reward with its reasons. ``score`` ``None`` means the verifier could not judge (masked, not 0); ``note``
    says why, where the verifier knows (``info["reward_note"]``)."""

    score: float | None
    checks: Mapping[str, bool] = field(default_factory=dict)
    note: str | None = None

    @property
    def success(self) -> bool:
        """Every check passed, and the episode was scored (a masked one is never a success)."""
        return self.score is not None and bool(self.checks) and all(self.checks.values())

    @classmethod
    def from_checks(cls, checks: Mapping[str, bool], weights: Mapping[str, float] | None = None) -> RewardResult:
        """Checklist reward (docs/method.md): ``sum(weight * passed) / sum(weight)``."""
        if not checks:
            return cls(None, {})
        w = {k: (weights or {}).get(k, 1.0) for k in checks}
        total = sum(w.values())
        return cls(sum(w[k] for k, ok in checks.items() if ok) / total if total else 0.0, dict(checks))


def as_reward_result(value: Any, domain: str) -> RewardResult:
    """What a domain's ``score`` returned, as a :class:`RewardResult`: one as it is, a number in [0, 1] wrapped
    (its one check, ``"full_marks"``, passes at 1, so success means full marks), ``None`` masked (the verifier
    could not judge). Anything else is the domain's bug: a :class:`~envace_gym.errors.DomainError` naming it."""
    if isinstance(value, RewardResult):
        if value.score is not None and not _in_unit_interval(value.score):
            raise DomainError(f"domain {domain!r}: score() returned a RewardResult with score {value.score!r}; "
                              "a score is a number in [0, 1], or None to mask the episode")  # fmt: skip
        return value
    if value is None:
        return RewardResult(None, {})
    if _in_unit_interval(value):
        return RewardResult(float(value), {"full_marks": float(value) == 1.0})
    raise DomainError(
        f"domain {domain!r}: score() returned {type(value).__name__} {str(value)[:80]!r}; return a RewardResult "
        "(a score in [0, 1] with its named checks), a number in [0, 1], or None to mask the episode"
    )


def _in_unit_interval(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value <= 1


_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def numbers_in(text: str) -> list[float]:
    """Numbers written in ``text`` (``1,234.50`` → 1234.5)."""
    out = []
    for m in _NUMBER_RE.findall(text):
        try:
            out.append(float(m.replace(",", "")))
        except ValueError:
            continue
    return out


def score_expected(task: Task, trajectory: Trajectory, executor: ToolExecutor | None) -> RewardResult:
    """The programmatic checklist every built-in domain uses, driven by ``task.expected``:

    * ``"state"``: replaying the trajectory's valid calls into a fresh real executor ends in this state
      (τ²-Bench's database check; rehearsed calls are replayed too, so rehearsal mode is scored on what
      the agent *did*);
    * ``"calls"``: these calls (canonical name + arguments) were all made;
    * ``"answer_numbers"``: these numbers appear in the final answers (to 2 decimals);
    * ``"answer_contains"``: these strings appear in the final answers (case-insensitive).
    """
    expected = task.expected
    checks: dict[str, bool] = {}
    if "state" in expected:
        if executor is None:
            raise DomainError(f"task {task.id} checks a final state but its domain has no real executor")
        final = replay(executor, trajectory.valid_calls).snapshot()
        checks["state"] = canonical_json(final) == canonical_json(expected["state"])
    if "calls" in expected:
        made = {call_key(c) for c in trajectory.valid_calls}
        needed = [call_key(ToolCall(c["name"], c.get("arguments", {}))) for c in expected["calls"]]
        checks["calls"] = all(k in made for k in needed)
    answer = "\n".join(trajectory.answers)
    if "answer_numbers" in expected:
        found = [round(x, 2) for x in numbers_in(answer)]
        checks["answer_numbers"] = all(
            any(abs(f - round(float(n), 2)) <= 0.011 for f in found) for n in expected["answer_numbers"]
        )
    if "answer_contains" in expected:
        low = answer.lower()
        checks["answer_contains"] = all(str(s).lower() in low for s in expected["answer_contains"])
    return RewardResult.from_checks(checks, expected.get("weights"))


def score_reference(task: Task, trajectory: Trajectory) -> RewardResult:
    """A checklist from the task's reference, scored without running any tool (the paper trains on a checklist
    judged against the reference, never on the real environment):

    * ``"calls"``: every call of the reference solution (canonical name + arguments) was made and passed
      validation;
    * the answer checks of ``task.expected`` (``"answer_numbers"``, ``"answer_contains"``).

    A final-state check (``"state"``) is left out: it needs the real executor. A task with neither reference
    calls nor answer checks cannot be scored this way (masked).
    """
    expected = {k: v for k, v in task.expected.items() if k in ("answer_numbers", "answer_contains", "weights")}
    calls = [c.to_json() for turn in task.reference for c in turn.calls]
    if calls:
        expected["calls"] = calls
    return score_expected(dataclasses.replace(task, expected=expected), trajectory, None)
