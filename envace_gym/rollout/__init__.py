"""Rollouts: many episodes to the end, batched, for training (:mod:`.collector`), and test-time private
rehearsal before one committed real execution (:mod:`.planner`).
"""

from __future__ import annotations

from .collector import ACT_SOURCES, EpisodeResult, RolloutBatch, RolloutStats, collect_rollouts
from .planner import ASSESS_SYSTEM, PlannerConfig, PrivateRehearsal, RehearsalPlanner

__all__ = [
    "ACT_SOURCES",
    "ASSESS_SYSTEM",
    "EpisodeResult",
    "PlannerConfig",
    "PrivateRehearsal",
    "RehearsalPlanner",
    "RolloutBatch",
    "RolloutStats",
    "collect_rollouts",
]
