"""Rehearsal fidelity: one rehearsed tool response against the real one, as ``envace eval`` and ``envace demo``
count it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ErrorCode
from ..tools.canonical import canonical_json

# The codes of a rehearsal that broke the <execution_result> contract (or its bounds): it did not parse.
UNPARSED = (ErrorCode.INVALID_REHEARSAL.value, ErrorCode.LIMIT_EXCEEDED.value)


@dataclass(frozen=True)
class RehearsalCheck:
    """How one rehearsed response compares with the real executor's for the same call in the same state.

    Attributes:
        parsed: The answer kept the ``<execution_result>`` contract, with JSON.
        schema_ok: It was accepted as the call's result: no error at all (it passed the tool's ``returns`` schema).
        equal: It is accepted and equals the real response (canonical JSON).
    """

    parsed: bool
    schema_ok: bool
    equal: bool


def check_rehearsal(record: Mapping[str, Any], real: Any) -> RehearsalCheck:
    """Compare a rehearsed call (an entry of ``episode.calls`` whose ``route`` is ``"rehearsal"``) with ``real``,
    what the real executor (or, without one, the recorded reference result) returns for that call."""
    error = record["error"]
    code = error["code"] if error else None
    accepted = code is None
    return RehearsalCheck(
        parsed=code not in UNPARSED,
        schema_ok=accepted,
        equal=accepted and canonical_json(record["result"]) == canonical_json(real),
    )


__all__ = ["RehearsalCheck", "check_rehearsal"]
