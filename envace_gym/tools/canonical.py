"""Canonical JSON: the one way calls and results are compared (``1`` equals ``1.0``, key order is free)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .schema import ToolCall


def canonical(value: Any) -> Any:
    """JSON value with integral floats as ints, so ``1`` and ``1.0`` compare equal."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else value
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """Order-free, type-normalised JSON text: the key for comparing calls and results."""
    return json.dumps(canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def call_key(call: ToolCall) -> str:
    """Canonical identity of a call (name and arguments), as the reference cache matches them."""
    return canonical_json({"name": call.name, "arguments": call.arguments})
