"""The Gymnasium face: :class:`RehearsalEnv`, :class:`RehearsalVectorEnv`, their text spaces and ids.

The env classes load on first use (they import torch); the ids and spaces do not need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .registration import REHEARSAL_ENV_ID, register_envs
from .spaces import ActText, AnyText

__getattr__ = lazy_exports(
    __name__,
    {
        "DEFAULT_DOMAIN": ".rehearsal_env",
        "MAX_OBSERVATION_CHARS": ".rehearsal_env",
        "RehearsalEnv": ".rehearsal_env",
        "RehearsalVectorEnv": ".vector",
    },
)

if TYPE_CHECKING:
    from .rehearsal_env import DEFAULT_DOMAIN, MAX_OBSERVATION_CHARS, RehearsalEnv
    from .vector import RehearsalVectorEnv

__all__ = [
    "DEFAULT_DOMAIN",
    "MAX_OBSERVATION_CHARS",
    "REHEARSAL_ENV_ID",
    "ActText",
    "AnyText",
    "RehearsalEnv",
    "RehearsalVectorEnv",
    "register_envs",
]
