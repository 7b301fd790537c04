"""One episode of world rehearsal, as token ids that only grow, and the driver that answers its generations.

:mod:`.chat` lays the conversation out in the model's chat template; :mod:`.episode` plays one Act turn
(parse, validate, route, rehearse, reward); :mod:`.driver` runs many episodes' turns against one policy.
"""

from __future__ import annotations

from .chat import ChatFormat
from .driver import StepCoroutine, fulfil, generate_batched, open_session, run_lockstep
from .episode import Episode, render_for_model
from .types import ON_INVALID, REHEARSAL_MODES, EpisodeConfig, GenerationRequest, Row, StepOutcome

__all__ = [
    "ChatFormat",
    "Episode",
    "EpisodeConfig",
    "GenerationRequest",
    "ON_INVALID",
    "REHEARSAL_MODES",
    "Row",
    "StepCoroutine",
    "StepOutcome",
    "fulfil",
    "generate_batched",
    "open_session",
    "render_for_model",
    "run_lockstep",
]
