"""The simulated user's turns inside an episode: it answers each final answer of the agent (a message, a stop, or a
reply that cannot be used), and may call tools of its own first (τ²-Bench's telecom user holds the phone), which
are answered as the agent's are but shown to the user only. Who the user is lives in
:mod:`envace_gym.episode.users`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Generator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..domains.reward import RewardResult
from ..domains.trajectory import CallRecord
from ..policy.protocol import Generation
from ..tools.schema import ToolRegistry
from . import separate
from .endings import bound_reached, continue_or_end, end_at_bound, finish, outcome
from .responses import payload, tool_message
from .routes import answer_without_model
from .types import CallState, GenerationRequest, Role, Row, StepOutcome
from .users import UserReply, UserRequest, UserSimulator

if TYPE_CHECKING:
    from .episode import Episode

logger = logging.getLogger("envace_gym")


def user_turn(
    episode: Episode, user: UserSimulator, info: dict[str, Any]
) -> Generator[list[UserRequest], list[UserReply], StepOutcome]:
    """The simulated user answers the agent's final answer: a message (context, never trained as the agent's), a
    stop marker (the end: the reward is scored), or a reply that cannot be used (the end, masked: not the agent's
    fault). A user with tools of its own may first call them, as often as it likes: each time the results go
    back to it (:func:`_user_tool_turn`) and it is asked again."""
    if episode.max_user_turns is not None and episode.transcript.user_turns >= episode.max_user_turns:
        return finish(episode, info, "max_user_turns")
    while True:
        bound = bound_reached(episode)  # τ² checks its bounds before the user answers, too
        if bound is not None:
            return end_at_bound(episode, bound, info)
        (reply,) = yield [UserRequest(user, episode.task, tuple(episode.user_view), episode.user_tools)]
        episode.transcript.steps += 1
        info["user"] = _user_info(reply)
        keep_user_row(episode, reply)
        if reply.error is not None:
            return user_failed(episode, reply.error, info)
        if not reply.calls:
            break
        yield from _user_tool_turn(episode, reply, info)
    if reply.stop is not None:
        bound = bound_reached(episode)  # τ²'s bound check follows the stop and overrides it
        return end_at_bound(episode, bound, info) if bound is not None else finish(episode, info, "user_stop")
    episode.add_messages([{"role": "user", "content": reply.text}])
    episode.user_view.append({"role": "user", "content": reply.text})
    episode.transcript.user_turns += 1
    return continue_or_end(episode, info)


def user_failed(episode: Episode, error: str, info: dict[str, Any]) -> StepOutcome:
    """The user's reply cannot be used: the end, masked (not the agent's fault; evaluation counts it as a
    failed run, as τ² does)."""
    logger.warning("episode of %s masked: %s", episode.task.id, error)
    episode.done, episode.reward_result, episode.termination_reason = True, RewardResult(None, {}), "user_error"
    episode.user_error = info["user_error"] = error
    return outcome(episode, 0.0, False, True, info)


def _user_tool_turn(
    episode: Episode, reply: UserReply, info: dict[str, Any]
) -> Generator[list[GenerationRequest], list[Generation], None]:
    """Answer the user's calls of its own tools, as the agent's are answered: each checked against the user's
    tools, then routed (the real executor's user side, or the Rehearse role: under ``executor="rehearsal"``
    the policy rehearses the user's tools too). The calls and their results join the user's view only; a
    refused or failed call counts as a tool error (``max_errors``), as in τ²."""
    calls = [replace(c, id=f"user_call_{episode.transcript.steps}_{i}") for i, c in enumerate(reply.calls)]
    states = [CallState(call) for call in calls]
    registry = episode.user_registry or ToolRegistry()  # a user offered no tools has none to call
    with episode.budget:
        for state in states:
            state.error = registry.validate(state.call).error
    episode.transcript.steps += 1  # the tool responses: one message, as τ² counts them
    failures = getattr(episode.executor, "failures", 0)
    for state in states:
        if state.error is None:
            answer_without_model(episode, state, user=True)
    episode.transcript.errors += getattr(episode.executor, "failures", 0) - failures
    pending = [s for s in states if s.route == "rehearsal"]
    if pending:
        text = "The user's own call(s) on their side: " + json.dumps([c.to_json() for c in calls])
        yield from separate.rehearse(episode, pending, text, info, user=True)
    episode.transcript.errors += sum(s.error is not None for s in states)
    t = episode.transcript
    records = [CallRecord(t.turn, s.call, s.route, s.response, s.error, t.user_turns, requestor="user") for s in states]
    episode.records.extend(records)
    info.setdefault("user_calls", []).extend(r.to_dict() for r in records)
    episode.user_view.append({"role": "user", "content": reply.text, "tool_calls": [c.to_openai() for c in calls]})
    episode.user_view += [tool_message(s.call, payload(s)) for s in states]


def keep_user_row(episode: Episode, reply: UserReply) -> None:
    """A trained user's generation (``user="rehearse"``) is a training row of role :attr:`~.types.Role.USER`."""
    gen = reply.generation
    if episode.user is not None and episode.user.trained and gen is not None and gen.completion_ids:
        episode.rows.append(
            Row(Role.USER, gen.prompt_ids, gen.completion_ids, gen.logprobs, (1,) * len(gen.completion_ids))
        )


def _user_info(reply: UserReply) -> dict[str, Any]:
    """``info["user"]``: what the simulated user said, and the ids of a policy-backed user's generation."""
    gen = reply.generation
    return {
        "text": gen.text if gen is not None else reply.text,
        "stop": reply.stop,
        "error": reply.error,
        "prompt_ids": list(gen.prompt_ids) if gen is not None else [],
        "completion_ids": list(gen.completion_ids) if gen is not None else [],
    }
