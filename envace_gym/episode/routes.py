"""Routing a valid call and answering it without the model: the reference cache, the real executor (whose own
bug becomes the call's typed error, reported once per place), or left for the Rehearse role."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import ErrorCode, ToolError, raised_at
from ..rehearsal.routing import choose_route
from .types import CallState

if TYPE_CHECKING:
    from .episode import Episode

logger = logging.getLogger("envace_gym")


def answer_without_model(episode: Episode, state: CallState, user: bool = False) -> None:
    """Route one valid call (``user``: a call of the user's own tools, which the reference cache does not
    hold); answer it now unless it goes to the Rehearse role."""
    call = state.call
    with episode.budget:
        hit, cached = episode.cache.lookup(call) if episode.cache is not None and not user else (False, None)
    state.route = choose_route(episode.config.executor, episode.rng, episode.config.p_real, hit)
    if state.route == "cache":
        state.response = cached
    elif state.route == "real":
        run = episode.executor.execute_user if user else episode.executor.execute  # type: ignore[union-attr]
        try:
            state.response = run(call)
        except Exception as exc:  # the executor's bug, reported as data; the episode survives it
            state.error = ToolError(
                ErrorCode.EXECUTION_ERROR,
                f"{call.name} failed: {type(exc).__name__}: {exc}"[:300],
                {"tool": call.name},
                source="executor",
                origin=raised_at(exc),
            )
            _report_tool_bug(state.error)


_REPORTED: set[tuple[str, str | None]] = set()


def _report_tool_bug(error: ToolError) -> None:
    """A tool that raised is a bug in the domain's code: say where, once per place (the agent sees only the error)."""
    key = (error.details.get("tool", ""), error.origin)
    if key not in _REPORTED:
        _REPORTED.add(key)
        logger.warning("%s, raised at %s (reported once per place)", error.message, error.origin)
