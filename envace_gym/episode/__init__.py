"""One episode of world rehearsal, as token ids that only grow, and the driver that answers its generations.

:mod:`.config` holds how an episode is played; :mod:`.chat` lays the conversation out in the model's chat template; :mod:`.transcript` keeps what an episode
accumulates (messages, ids, log-probs, masks, rows, records) with mark/rollback; :mod:`.episode` plays one Act turn
(parse, validate, route, rehearse, reward); :mod:`.users` simulates users; :class:`~.driver.EpisodeDriver` runs
many episodes against one policy (the episode loop: :meth:`~.driver.EpisodeDriver.run`).
"""

from __future__ import annotations

from .chat import ChatFormat, render_for_model
from .config import MAX_USER_TURNS, ON_INVALID, REHEARSAL_MODES, EpisodeConfig, EpisodeSettings
from .driver import EpisodeDriver, NoGeneration, generate_batched, open_session
from .episode import NOTHING_MORE, Episode, TurnCoroutine
from .transcript import Transcript
from .types import CallState, GenerationRequest, Role, Row, StepOutcome
from .users import UserReply, UserRequest, UserSimulator

__all__ = [
    "CallState",
    "ChatFormat",
    "Episode",
    "EpisodeConfig",
    "EpisodeDriver",
    "EpisodeSettings",
    "GenerationRequest",
    "MAX_USER_TURNS",
    "NOTHING_MORE",
    "NoGeneration",
    "ON_INVALID",
    "REHEARSAL_MODES",
    "Role",
    "Row",
    "StepOutcome",
    "TurnCoroutine",
    "Transcript",
    "UserReply",
    "UserRequest",
    "UserSimulator",
    "generate_batched",
    "open_session",
    "render_for_model",
]
