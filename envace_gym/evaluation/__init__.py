"""Evaluation: task success with the real executor, and how faithfully the policy rehearses."""

from __future__ import annotations

from .evaluate import EvalResult, evaluate

__all__ = [
    "EvalResult",
    "evaluate",
]
