"""An episode's transcript: everything it accumulates, in one object, so a turn can be undone and an episode forked.

The conversation is kept twice, as messages (what the reward and ``info["messages"]`` see) and as token ids that
only grow (the next Act prompt): ``prompt_ids`` is the opening prompt, then ``ids``, everything after it, with the
log-probability and the training mask of each (1 where the policy wrote the token). ``rows`` are the training rows of
``separate`` mode (and a rehearsed user's), ``records`` one per tool call, ``answers`` the agent's final answers, ``said``
everything it wrote outside its calls (its answers and the prose of its call turns).

Everything here only grows during a turn, so :meth:`Transcript.mark` is a handful of lengths and
:meth:`Transcript.rollback` cuts back to them: an episode whose turn fails undoes the whole turn.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ..domains.trajectory import CallRecord
from .types import Row


@dataclass(frozen=True)
class Mark:
    """Where a transcript stood (see :meth:`Transcript.mark`)."""

    messages: int
    prompt_ids: int
    ids: int
    rows: int
    records: int
    answers: int
    said: int
    prompt_text: str
    turn_open: bool


@dataclass
class Transcript:
    """The conversation as messages and as ids, with what the policy wrote of it and what it made."""

    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    prompt_text: str
    ids: list[int] = field(default_factory=list)  # everything after the opening prompt ...
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # ... and which of it the policy wrote (trained)
    rows: list[Row] = field(default_factory=list)
    records: list[CallRecord] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    turn_open: bool = False  # the last Act turn was cut before its end token

    def __post_init__(self) -> None:
        self.initial_prompt_ids = tuple(self.prompt_ids)
        self.initial_messages = len(self.messages)  # a fork's own messages start here

    def append(self, ids: list[int], text: str, logprobs: list[float] | None, trained: bool) -> None:
        """Tokens that join the conversation, with the text they show; ``logprobs`` ``None``: zeros."""
        self.prompt_ids += ids
        self.prompt_text += text
        self.ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [int(trained)] * len(ids)

    def episode_row(self) -> Row:
        """Everything after the opening prompt as one row."""
        return Row("episode", self.initial_prompt_ids, tuple(self.ids), tuple(self.logprobs), tuple(self.mask))

    def mark(self) -> Mark:
        return Mark(
            len(self.messages), len(self.prompt_ids), len(self.ids), len(self.rows), len(self.records),
            len(self.answers), len(self.said), self.prompt_text, self.turn_open,
        )  # fmt: skip

    def rollback(self, mark: Mark) -> None:
        """Back to where :meth:`mark` stood: what was added since is dropped."""
        del self.messages[mark.messages :], self.prompt_ids[mark.prompt_ids :], self.rows[mark.rows :]
        del self.ids[mark.ids :], self.logprobs[mark.ids :], self.mask[mark.ids :]
        del self.records[mark.records :], self.answers[mark.answers :], self.said[mark.said :]
        self.prompt_text, self.turn_open = mark.prompt_text, mark.turn_open

    def fork(self) -> Transcript:
        """A copy of the conversation so far that records only what happens after it: its own rows, records,
        answers and ids start empty."""
        twin = Transcript(
            copy.deepcopy(self.messages), list(self.prompt_ids), self.prompt_text, turn_open=self.turn_open
        )
        twin.initial_prompt_ids = tuple(self.prompt_ids)
        return twin


__all__ = ["Mark", "Transcript"]
