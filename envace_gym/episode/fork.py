"""An episode's private copy (the planner's imagined episodes) and a note placed before its next Act turn."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from ..errors import EnvACEError
from ..text import clean_text
from .config import EpisodeConfig

if TYPE_CHECKING:
    from .episode import Episode


def fork(episode: Episode, config: EpisodeConfig, rng: np.random.Generator, note: str | None = None) -> Episode:
    """A private copy of the conversation so far, played on under ``config`` (say, every call rehearsed):
    nothing done in it reaches ``episode`` or its executor. It knows no future user turn (a final
    answer ends it) and it is not scored: the verifier's view of the task is not the agent's. A ``note``
    (say, a planner's memory) is placed before the copy's next Act turn (:func:`prompt_with_note`)."""
    twin = copy.copy(episode)
    twin.config, twin.rng, twin.key = config, rng, None
    twin.executor = None if config.executor == "rehearsal" else episode.domain.make_executor(episode.task)
    twin.cache = None
    # the copy records only what happens in it, from its prompt on (with the note)
    twin.transcript = episode.transcript.fork(prompt_with_note(episode, note) if note is not None else None)
    twin.scripted_turns, twin.scored, twin.done, twin.reward_result = (), False, False, None
    twin.user = None
    twin.on_invalid = config.on_invalid or episode.on_invalid
    twin.max_turns = episode.turn + (config.max_turns or episode.max_turns or episode.domain.max_turns)
    return twin


def prompt_with_note(episode: Episode, note: str, role: str = "system") -> tuple[list[int], str]:
    """The next Act prompt (ids, text) with a private note inserted just before the assistant's turn;
    the episode itself is unchanged."""
    opening, tail = episode.chat.generation_prompt, episode.chat.generation_prompt_ids
    if not episode.prompt_text.endswith(opening) or episode.prompt_ids[-len(tail) :] != tail:
        raise EnvACEError("the prompt does not end with the template's generation prompt")
    insert = episode.chat.insertion([{"role": role, "content": episode.chat.neutralize(clean_text(note))}]) + opening
    return episode.prompt_ids[: -len(tail)] + episode.chat.encode(insert), episode.prompt_text[: -len(opening)] + insert
