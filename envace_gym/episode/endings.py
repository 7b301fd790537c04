"""How an episode ends: the limits and bounds checked after every turn, τ²-Bench's premature ends, and the reward
(the domain's score or the reference reward; a verifier that fails masks the episode, never a silent 0).

``rules`` resolves an episode's limits from its config, its domain and its user's protocol; ``abort`` ends an episode
whose turn the environment's own code failed (the turn undone).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..domains.reward import RewardResult, as_reward_result, score_reference
from ..errors import ErrorCode, ToolError
from .config import MAX_USER_TURNS, TAU2_MAX_ERRORS, TAU2_MAX_STEPS, EpisodeConfig
from .types import StepOutcome

if TYPE_CHECKING:
    from .episode import Episode
    from .transcript import Mark

logger = logging.getLogger("envace_gym")

# Endings that cut an episode (gymnasium's truncated); the others terminate it.
TRUNCATIONS = ("max_turns", "max_user_turns", "context")


def after_errors(episode: Episode, errors: list[ToolError], info: dict[str, Any]) -> StepOutcome:
    """A turn with errors: the end under ``on_invalid="terminate"`` (reward 0), else the episode goes on."""
    info["error"] = errors[0].to_dict()
    episode.transcript.errors += len(errors)
    if episode.on_invalid == "terminate":
        episode.done, episode.termination_reason = True, "invalid_call"
        episode.reward_result = RewardResult(0.0, {"no_invalid_call": False})
        return outcome(episode, 0.0, True, False, info)
    return continue_or_end(episode, info)


def continue_or_end(episode: Episode, info: dict[str, Any]) -> StepOutcome:
    """After a turn: the end at a bound or limit the episode has reached (τ²'s bounds first), else the next turn."""
    bound = bound_reached(episode)
    if bound is not None:
        return end_at_bound(episode, bound, info)
    if episode.max_turns is not None and episode.transcript.turn >= episode.max_turns:
        return finish(episode, info, "max_turns")
    if episode.max_user_turns is not None and episode.transcript.user_turns > episode.max_user_turns:
        return finish(episode, info, "max_user_turns")
    if episode.overflowed or len(episode.prompt_ids) + episode.act_max_new_tokens > episode.max_context:
        return finish(episode, info, "context")
    return outcome(episode, 0.0, False, False, info)


def bound_reached(episode: Episode) -> str | None:
    """τ²-Bench's bound the episode has reached, as its orchestrator checks them (errors last, so they win)."""
    reached = None
    if episode.max_messages is not None and episode.transcript.steps >= episode.max_messages:
        reached = "max_steps"
    if episode.max_errors is not None and episode.transcript.errors >= episode.max_errors:
        reached = "too_many_errors"
    return reached


def end_at_bound(episode: Episode, reason: str, info: dict[str, Any]) -> StepOutcome:
    """τ²'s premature end: reward 0, whatever was done (a step bound truncates; too many errors terminate)."""
    episode.done, episode.termination_reason = True, reason
    episode.reward_result = RewardResult(0.0, {})
    if reason == "max_steps":
        info["truncation"] = reason
    return outcome(episode, 0.0, reason != "max_steps", reason == "max_steps", info)


def finish(episode: Episode, info: dict[str, Any], reason: str) -> StepOutcome:
    """The end: the domain's reward over the whole trajectory, also when truncated (``reason`` is one of
    :data:`TRUNCATIONS`), except under the τ² protocol, which gives any end but a stop 0, as τ² does."""
    episode.done, episode.termination_reason = True, reason
    terminated = reason not in TRUNCATIONS
    if not terminated:
        info["truncation"] = reason
    if not episode.scored:
        episode.reward_result = RewardResult(None, {})
        return outcome(episode, 0.0, terminated, not terminated, info)
    if episode.protocol == "tau2" and not terminated:
        episode.reward_result = RewardResult(0.0, {})
        return outcome(episode, 0.0, terminated, not terminated, info)
    try:
        if episode.config.reward == "reference":  # no tool runs: the reward an executor-free run trains on
            episode.reward_result = score_reference(episode.task, episode.trajectory())
        else:
            scored = episode.domain.score(episode.task, episode.trajectory())
            episode.reward_result = as_reward_result(scored, episode.domain.name)
    except Exception as exc:  # a verifier that fails masks the episode (None), never a silent 0
        episode.reward_result = RewardResult(None, {})
        info["reward_error"] = f"{type(exc).__name__}: {exc}"[:300]
        logger.warning("reward of %s masked: the verifier failed (%s)", episode.task.id, info["reward_error"])
    score = episode.reward_result.score
    return outcome(episode, 0.0 if score is None else float(score), terminated, not terminated, info)


def outcome(
    episode: Episode, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]
) -> StepOutcome:
    """The step's outcome, with what ``info`` says of every step (and of the end, once there is one)."""
    info.update(episode.base_info())
    if episode.done:
        info["termination_reason"] = episode.termination_reason
    if episode.done and episode.reward_result is not None:
        info["reward_checks"] = dict(episode.reward_result.checks)
        info["reward_masked"] = episode.reward_result.score is None
        if episode.reward_result.note:
            info["reward_note"] = episode.reward_result.note
        info["success"] = episode.reward_result.success
    return StepOutcome(episode.prompt_text, reward, terminated, truncated, info)


def rules(
    config: EpisodeConfig, domain_max_turns: int, protocol: str
) -> tuple[str, int | None, int | None, int | None, int | None]:
    """``on_invalid``, ``max_turns``, ``max_user_turns``, ``max_messages`` and ``max_errors`` of an episode: the
    config's where it sets them, else the protocol's (τ²'s: its error feedback and its two bounds, and no turn
    bound of its own)."""
    tau2 = protocol == "tau2"
    on_invalid = config.on_invalid or ("feedback" if tau2 else "terminate")
    if tau2 and on_invalid != "feedback":
        raise ValueError(
            "under the τ² protocol a tool error is answered and the episode goes on (its max_errors ends it): "
            "on_invalid='terminate' is not τ²'s; use on_invalid='feedback' (or None), or a user with protocol='envace'"
        )
    if tau2:
        return on_invalid, config.max_turns, config.max_user_turns, config.max_messages or TAU2_MAX_STEPS, (
            config.max_errors or TAU2_MAX_ERRORS)  # fmt: skip
    max_user_turns = config.max_user_turns if config.max_user_turns is not None else MAX_USER_TURNS
    return on_invalid, config.max_turns or domain_max_turns, max_user_turns, config.max_messages, config.max_errors


def abort(episode: Episode, mark: Mark, exc: Exception) -> StepOutcome:
    """The environment's own code failed during a turn: the turn undone back to ``mark``, the episode ended as
    truncated with its reward masked and an ``ENVIRONMENT_ERROR``."""
    episode.transcript.rollback(mark)
    error = ToolError(
        ErrorCode.ENVIRONMENT_ERROR,
        f"the environment failed during this turn ({type(exc).__name__}: {exc}); the turn was undone"[:300],
        {"exception": type(exc).__name__},
        source="environment",
    )
    logger.warning("episode of %s ended: %s", episode.task.id, error.message, exc_info=exc)
    episode.done, episode.reward_result, episode.termination_reason = True, RewardResult(None, {}), "environment_error"
    info = {"tool_calls": [], "calls": [], "rehearsals": [], "error": error.to_dict(), "act": None}
    return outcome(episode, 0.0, False, True, info)
