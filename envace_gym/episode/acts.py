"""The Act turn as ids: the generation's own, or its text tokenized as the template writes such a turn; and what the
turn records (an ``act`` row, ``info["act"]``), for the episode to apply."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..policy.protocol import Generation
from .types import Role, Row

if TYPE_CHECKING:
    from .episode import Episode


def act_ids(episode: Episode, action: str, act: Generation | None, calls: bool) -> tuple[list[int], list[float]]:
    """The Act turn's ids and log-probs: the generation's own, or the text tokenized (log-probs 0) with the
    end token the template closes such a turn with (the text may already end with it). Special-token strings
    in the text stay plain text, except the ones the tool-call format writes calls with."""
    if act is not None:
        return list(act.completion_ids), list(act.logprobs)
    text = action if isinstance(action, str) else ""
    # An over-long action is rejected by the parser; only its head is kept in the chat, so the cost of
    # recording it stays bounded whatever its length.
    text = text[: episode.config.limits.max_action_chars]
    ids = episode.chat.encode(episode.chat.neutralize(text, keep=episode.tool_format.act_tokens))
    ids += episode.chat.encode(episode.chat.act_end(calls))
    return ids, [0.0] * len(ids)


def act_record(
    prompt: tuple[int, ...], ids: list[int], logprobs: list[float], act: Generation | None
) -> tuple[Row | None, dict[str, Any]]:
    """The Act turn written after ``prompt``: its training row (an ``act`` row, where it was generated) and
    ``info["act"]``. The episode applies them."""
    row = Row(Role.ACT, prompt, act.completion_ids, act.logprobs, (1,) * len(ids)) if act is not None else None
    return row, {
        "prompt_ids": list(prompt),
        "completion_ids": list(ids),
        "logprobs": logprobs if act is not None else None,
        "generated": act is not None,
    }
