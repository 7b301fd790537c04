"""What a simulated user's turn inside an episode computes, for the episode to apply
(:meth:`Episode._user_turn <envace_gym.episode.episode.Episode._user_turn>`): the calls it makes of tools of its own
(a user who holds a phone), answered as the agent's are but shown to the user only; a trained user's row; what
``info["user"]`` says of its reply. Who the user is lives in :mod:`envace_gym.episode.users`.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..policy.protocol import Generation
from ..tools.schema import ToolRegistry
from . import separate
from .routes import answer_without_model
from .types import CallState, GenerationRequest, Role, Row
from .users import UserReply, UserSimulator

if TYPE_CHECKING:
    from .episode import Episode


@dataclass(frozen=True)
class UserCalls:
    """The user's calls of its own tools as answered: each one's state (route, response or typed error), the
    training rows of their rehearsals, and how many the real executor reported as refused (tool errors)."""

    states: list[CallState]
    rows: list[Row]
    failures: int


def answer_user_calls(
    episode: Episode, reply: UserReply, info: dict[str, Any]
) -> Generator[list[GenerationRequest], list[Generation], UserCalls]:
    """Answer the user's calls of its own tools, as the agent's are answered: each checked against the user's
    tools, then routed (the real executor's user side, or the Rehearse role: under ``executor="rehearsal"`` the
    policy rehearses the user's tools too). Changes nothing of the episode: it returns what happened."""
    calls = [replace(c, id=f"user_call_{episode.transcript.steps}_{i}") for i, c in enumerate(reply.calls)]
    states = [CallState(call) for call in calls]
    registry = episode.user_registry or ToolRegistry()  # a user offered no tools has none to call
    with episode.budget:
        for state in states:
            state.error = registry.validate(state.call).error
    failures = getattr(episode.executor, "failures", 0)
    for state in states:
        if state.error is None:
            answer_without_model(episode, state, user=True)
    failures = getattr(episode.executor, "failures", 0) - failures
    rows: list[Row] = []
    pending = [s for s in states if s.route == "rehearsal"]
    if pending:
        text = "The user's own call(s) on their side: " + json.dumps([c.to_json() for c in calls])
        rows = yield from separate.rehearse(episode, pending, text, info, user=True)
    return UserCalls(states, rows, failures)


def user_row(user: UserSimulator | None, reply: UserReply) -> Row | None:
    """A trained user's generation (``user="rehearse"``) is a training row of role :attr:`~.types.Role.USER`."""
    gen = reply.generation
    if user is not None and user.trained and gen is not None and gen.completion_ids:
        return Row(Role.USER, gen.prompt_ids, gen.completion_ids, gen.logprobs, (1,) * len(gen.completion_ids))
    return None


def user_info(reply: UserReply) -> dict[str, Any]:
    """``info["user"]``: what the simulated user said, and the ids of a policy-backed user's generation."""
    gen = reply.generation
    return {
        "text": gen.text if gen is not None else reply.text,
        "stop": reply.stop,
        "error": reply.error,
        "prompt_ids": list(gen.prompt_ids) if gen is not None else [],
        "completion_ids": list(gen.completion_ids) if gen is not None else [],
    }
