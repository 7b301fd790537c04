"""Routing: which executor answers a call (real, cached reference, or the Rehearse role)."""

from __future__ import annotations

import numpy as np

EXECUTORS = ("rehearsal", "real", "cached", "mixed")


def choose_route(executor: str, rng: np.random.Generator, p_real: float, cached: bool) -> str:
    """Where one validated call is answered: ``"real"``, ``"cache"`` or ``"rehearsal"``.

    ``rehearsal``: always the policy. ``real``: always the domain's executor. ``cached``: the ground-truth
    result when the call matches a reference call, else the policy. ``mixed``: the real executor with
    probability ``p_real`` (one draw from the env's ``np_random`` per call), else the policy.
    """
    if executor == "real":
        return "real"
    if executor == "cached":
        return "cache" if cached else "rehearsal"
    if executor == "mixed":
        return "real" if rng.random() < p_real else "rehearsal"
    return "rehearsal"
