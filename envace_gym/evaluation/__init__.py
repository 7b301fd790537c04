"""Evaluation: task success with the real executor, and how faithfully the policy rehearses."""

from __future__ import annotations

from .evaluate import EvalResult, ToolFidelity, evaluate, pass_hat_k
from .fidelity import RehearsalCheck, check_rehearsal, field_share

__all__ = [
    "EvalResult",
    "RehearsalCheck",
    "ToolFidelity",
    "check_rehearsal",
    "evaluate",
    "field_share",
    "pass_hat_k",
]
