"""Every Gymnasium id this package provides, registered in one place."""

from __future__ import annotations

import gymnasium as gym

REHEARSAL_ENV_ID = "EnvACE-Rehearsal-v0"


def register_envs() -> None:
    """Register the ids (idempotent: importing the package twice registers once)."""
    if REHEARSAL_ENV_ID not in gym.registry:
        gym.register(
            id=REHEARSAL_ENV_ID,
            entry_point="envace_gym.env.rehearsal_env:RehearsalEnv",
            vector_entry_point="envace_gym.env.vector:RehearsalVectorEnv",
        )
