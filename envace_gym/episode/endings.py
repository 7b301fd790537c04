"""How an episode may end, as decisions: each kind of end is an :class:`Ending` built here, and
:meth:`Episode.end <envace_gym.episode.episode.Episode.end>` applies it (the one place an episode ends). Nothing here
changes an episode: :func:`next_ending` reads the limits and bounds an episode has reached after a turn, and
:func:`score` the reward of a trajectory (the domain's score or the reference reward; a verifier that fails masks
the episode, never a silent 0).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..domains.reward import RewardResult, as_reward_result, score_reference

if TYPE_CHECKING:
    from .episode import Episode

logger = logging.getLogger("envace_gym")

# Endings that cut an episode (gymnasium's truncated); the others terminate it.
TRUNCATIONS = ("max_turns", "max_user_turns", "context")


@dataclass(frozen=True)
class Ending:
    """Why an episode ends (``info["termination_reason"]``), whether it is cut (gymnasium's ``truncated``; else
    ``terminated``) and its reward: given, or ``None`` for the trajectory's score (where the episode and its user's
    protocol score it). ``cut``: a limit cut it (``info["truncation"]`` names the reason); ``user_error``: why the
    user's reply could not be used (``info["user_error"]``)."""

    reason: str
    truncated: bool = False
    reward: RewardResult | None = None
    cut: bool = False
    user_error: str | None = None


def finished(reason: str) -> Ending:
    """The end of a finished or cut episode (``reason`` in :data:`TRUNCATIONS` cuts it), scored over its whole
    trajectory."""
    cut = reason in TRUNCATIONS
    return Ending(reason, truncated=cut, cut=cut)


def invalid_call() -> Ending:
    """A turn with errors under ``on_invalid="terminate"``: the end at reward 0."""
    return Ending("invalid_call", reward=RewardResult(0.0, {"no_invalid_call": False}))


def at_bound(reason: str) -> Ending:
    """A message or error bound reached (``"max_steps"`` cuts the episode; ``"too_many_errors"`` terminates it):
    reward 0, whatever was done."""
    cut = reason == "max_steps"
    return Ending(reason, truncated=cut, reward=RewardResult(0.0, {}), cut=cut)


def user_failed(error: str) -> Ending:
    """The user's reply cannot be used: the end, masked (not the agent's fault; evaluation counts it as a failed
    run)."""
    return Ending("user_error", truncated=True, reward=RewardResult(None, {}), user_error=error)


def environment_failed() -> Ending:
    """The environment's own code failed during a turn (the turn is undone): the end, masked."""
    return Ending("environment_error", truncated=True, reward=RewardResult(None, {}))


def next_ending(episode: Episode) -> Ending | None:
    """After a turn: the end at a bound or limit the episode has reached (the message and error bounds first), else
    ``None``: the next turn."""
    bound = bound_reached(episode)
    if bound is not None:
        return at_bound(bound)
    if episode.max_turns is not None and episode.transcript.turn >= episode.max_turns:
        return finished("max_turns")
    if episode.max_user_turns is not None and episode.transcript.user_turns > episode.max_user_turns:
        return finished("max_user_turns")
    if episode.overflowed or len(episode.prompt_ids) + episode.act_max_new_tokens > episode.max_context:
        return finished("context")
    return None


def bound_reached(episode: Episode) -> str | None:
    """The message or error bound the episode has reached, checked in this order (errors last, so they win)."""
    reached = None
    if episode.max_messages is not None and episode.transcript.steps >= episode.max_messages:
        reached = "max_steps"
    if episode.max_errors is not None and episode.transcript.errors >= episode.max_errors:
        reached = "too_many_errors"
    return reached


def score(episode: Episode) -> tuple[RewardResult, str | None]:
    """The reward of the episode's trajectory, and why the verifier failed (the reward then masked), if it did."""
    try:
        if episode.config.reward == "reference":  # no tool runs: the reward an executor-free run trains on
            return score_reference(episode.task, episode.trajectory()), None
        scored = episode.domain.score(episode.task, episode.trajectory())
        return as_reward_result(scored, episode.domain.name), None
    except Exception as exc:  # a verifier that fails masks the episode (None), never a silent 0
        error = f"{type(exc).__name__}: {exc}"[:300]
        logger.warning("reward of %s masked: the verifier failed (%s)", episode.task.id, error)
        return RewardResult(None, {}), error
