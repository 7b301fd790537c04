"""Rehearsal fidelity: one rehearsed tool response against the real one, as ``envace eval`` and ``envace demo``
count it."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..domains.trajectory import CallRecord
from ..errors import ErrorCode
from ..tools.canonical import canonical, canonical_json

# A rehearsed number within 1% of the real one counts as right in `fields`: 2.539 for 2.54 is arithmetic done
# (rounding aside), 41 or a copied input is not.
NUMBER_TOLERANCE = 0.01

# The codes of a rehearsal that broke the <execution_result> contract (or its bounds): it did not parse.
UNPARSED = (ErrorCode.INVALID_REHEARSAL, ErrorCode.LIMIT_EXCEEDED)


@dataclass(frozen=True)
class RehearsalCheck:
    """How one rehearsed response compares with the real executor's for the same call in the same state.

    Attributes:
        parsed: The answer kept the ``<execution_result>`` contract, with JSON.
        schema_ok: It was accepted as the call's result: no error at all (it passed the tool's ``returns`` schema).
        equal: It is accepted and equals the real response (canonical JSON).
        fields: The share of the real response's fields (its leaves, by path) that the accepted rehearsal gets
            right: text, flags and nulls equal, numbers within ``NUMBER_TOLERANCE`` of the real one. A graded
            ``equal``: it moves when a simulator learns the shape and the easy fields before the arithmetic.
    """

    parsed: bool
    schema_ok: bool
    equal: bool
    fields: float


def check_rehearsal(record: CallRecord, real: Any) -> RehearsalCheck:
    """Compare a rehearsed call (an entry of ``episode.calls`` whose ``route`` is ``"rehearsal"``) with ``real``,
    what the real executor (or, without one, the recorded reference result) returns for that call."""
    code = record.error.code if record.error is not None else None
    accepted = code is None
    equal = accepted and canonical_json(record.result) == canonical_json(real)
    return RehearsalCheck(
        parsed=code not in UNPARSED,
        schema_ok=accepted,
        equal=equal,
        fields=1.0 if equal else field_share(record.result, real) if accepted else 0.0,
    )


def field_share(rehearsed: Any, real: Any) -> float:
    """The share of ``real``'s leaves that ``rehearsed`` holds at the same path, numbers within
    ``NUMBER_TOLERANCE`` (relative); 1.0 or 0.0 for a leafless ``real`` (``{}``, ``[]``), by equality."""
    truth = dict(_leaves(canonical(real)))
    if not truth:
        return float(canonical_json(rehearsed) == canonical_json(real))
    guess = dict(_leaves(canonical(rehearsed)))
    return sum(path in guess and _same(guess[path], value) for path, value in truth.items()) / len(truth)


def _leaves(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path, value


def _same(guess: Any, truth: Any) -> bool:
    numbers = (int, float)
    if isinstance(truth, numbers) and not isinstance(truth, bool):
        return (
            isinstance(guess, numbers)
            and not isinstance(guess, bool)
            and math.isclose(guess, truth, rel_tol=NUMBER_TOLERANCE, abs_tol=1e-9)
        )
    return type(guess) is type(truth) and guess == truth


__all__ = ["NUMBER_TOLERANCE", "RehearsalCheck", "check_rehearsal", "field_share"]
