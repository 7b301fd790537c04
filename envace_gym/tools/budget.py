"""A bound on the time one step spends checking its calls.

Parsing reads at most ``Limits.max_action_chars`` in linear scans and regexes run in linear time
(:mod:`.patterns`), yet a schema can still ask for work that grows faster than its arguments: a ``$ref`` that
recurses through ``anyOf`` tries every branch at every level (exponential in the arguments' depth), and
jsonschema's ``uniqueItems`` compares items that do not sort pairwise (quadratic). So:

* :func:`bounded` gives a jsonschema validator class that checks a deadline at every keyword it evaluates, and
  whose ``uniqueItems`` hashes items (linear);
* :class:`StepBudget` sets that deadline for the parts of a step it is entered in (parsing, validation,
  routing), so model generations and real executors, which have bounds of their own, do not spend it;
* a check still running when the budget is spent raises :class:`BudgetExceeded`, which
  :class:`~envace_gym.tools.ToolSchema` turns into a ``LIMIT_EXCEEDED`` error for the call.

The deadline lives in a :class:`~contextvars.ContextVar`: each thread (a vector env's, a trainer's) has its own.
A region must not span a ``yield`` of the episode's generator (the caller would run inside it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from functools import cache
from typing import Any

import jsonschema

# (deadline on time.monotonic(), the budget's size in seconds, for the error message)
_DEADLINE: ContextVar[tuple[float, float] | None] = ContextVar("envace_check_deadline", default=None)


class BudgetExceeded(Exception):
    """The step's time budget for checks ran out while a check was running."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the step's checks ran past their budget of {seconds:g} s")
        self.seconds = seconds


def check_deadline() -> None:
    """Raise :class:`BudgetExceeded` if a budget is running and spent; nothing otherwise."""
    bound = _DEADLINE.get()
    if bound is not None and time.monotonic() > bound[0]:
        raise BudgetExceeded(bound[1])


class StepBudget:
    """``seconds`` of checking for one step, spent across every ``with budget:`` region (``None``: unbounded)."""

    def __init__(self, seconds: float | None) -> None:
        if seconds is not None and not seconds > 0:
            raise ValueError(f"a step's check budget must be a positive number of seconds or None, got {seconds!r}")
        self.seconds = seconds
        self.spent = 0.0
        self._entered: list[tuple[float, Token[Any] | None]] = []

    def __enter__(self) -> StepBudget:
        start = time.monotonic()
        token = None if self.seconds is None else _DEADLINE.set((start + self.seconds - self.spent, self.seconds))
        self._entered.append((start, token))
        return self

    def __exit__(self, *exc: object) -> None:
        start, token = self._entered.pop()
        self.spent += time.monotonic() - start
        if token is not None:
            _DEADLINE.reset(token)


def _timed(keyword: Any) -> Any:
    def check(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        check_deadline()
        return keyword(validator, value, instance, schema)

    return check


def _identity(value: Any) -> Any:
    """A hashable stand-in that is equal exactly when jsonschema's ``equal`` says so (``1 == 1.0``, ``True != 1``,
    objects by content, arrays in order)."""
    if isinstance(value, bool) or value is None:
        return (type(value).__name__, value)
    if isinstance(value, (int, float)):
        return ("number", value)  # Python hashes 1 and 1.0 alike
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, Mapping):
        return ("object", frozenset((key, _identity(item)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(_identity(item) for item in value))
    return ("other", repr(value))


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if unique and validator.is_type(instance, "array"):
        seen: set[Any] = set()
        for item in instance:
            key = _identity(item)
            if key in seen:
                yield jsonschema.ValidationError(f"{instance!r} has non-unique elements")
                return
            seen.add(key)


@cache
def bounded(cls: type) -> type:
    """``cls`` (a jsonschema validator class) checking the running budget at each keyword, ``uniqueItems`` linear."""
    keywords = {name: _timed(fn) for name, fn in cls.VALIDATORS.items()}
    if "uniqueItems" in keywords:
        keywords["uniqueItems"] = _timed(_unique_items)
    return jsonschema.validators.extend(cls, keywords)


__all__ = ["BudgetExceeded", "StepBudget", "bounded", "check_deadline"]
