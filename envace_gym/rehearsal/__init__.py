"""The Rehearse role (``separate`` mode, as in the paper) and the routing of calls.

:mod:`.prompt` writes the fresh prompt a call is rehearsed from; :mod:`.routing` decides who answers a call.
"""

from __future__ import annotations

from .prompt import REHEARSE_SYSTEM_PROMPT, RehearsalConfig, rehearsal_messages, rehearsal_prompt, rollout_sampling
from .routing import EXECUTORS, choose_route

__all__ = [
    "EXECUTORS",
    "REHEARSE_SYSTEM_PROMPT",
    "RehearsalConfig",
    "choose_route",
    "rehearsal_messages",
    "rehearsal_prompt",
    "rollout_sampling",
]
