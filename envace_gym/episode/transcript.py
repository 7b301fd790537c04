"""An episode's transcript: everything a turn changes, in one object, so a turn can be undone and an episode forked.

The conversation is kept twice, as messages (what the reward and ``info["messages"]`` see) and as token ids that
only grow (the next Act prompt): ``prompt_ids`` is the opening prompt, then ``ids``, everything after it, with the
log-probability and the training mask of each (1 where the policy wrote the token). ``rows`` are the training rows of
``separate`` mode (and a rehearsed user's), ``records`` one per tool call, ``answers`` the agent's final answers, ``said``
everything it wrote outside its calls (its answers and the prose of its call turns). The counters say where the
episode is: Act turns, user turns, messages (each user message, agent message and batch of tool responses is one),
tool errors.

During a turn every list only grows and every other field is replaced, never changed in place, so
:meth:`Transcript.mark` (each list's length, each other field's value) and :meth:`Transcript.rollback` follow from
the fields themselves: an episode whose turn fails undoes the whole turn. :meth:`Transcript.fork` copies the
conversation and starts the fields marked ``own`` (what the copy itself makes) empty.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

from ..domains.trajectory import CallRecord
from .types import Role, Row

Mark = dict[str, Any]  # a field's length (a list) or value (anything else): see Transcript.mark


def _own() -> Any:
    """A list a fork starts empty: what the copy itself makes."""
    return field(default_factory=list, metadata={"own": True})


@dataclass
class Transcript:
    """The conversation as messages and as ids, with what the policy wrote of it, what it made, and the counters."""

    messages: list[dict[str, Any]] = field(metadata={"deep": True})  # dicts: a fork copies them whole
    prompt_ids: list[int]
    prompt_text: str
    ids: list[int] = _own()  # everything after the opening prompt ...
    logprobs: list[float] = _own()
    mask: list[int] = _own()  # ... and which of it the policy wrote (trained)
    rows: list[Row] = _own()
    records: list[CallRecord] = _own()
    answers: list[str] = _own()
    said: list[str] = _own()
    turn_open: bool = False  # the last Act turn was cut before its end token
    turn: int = 0  # Act turns so far
    user_turns: int = 1  # user turns so far: the opening one
    steps: int = 1  # messages so far (max_messages bounds them): the user's first one
    errors: int = 0  # tool errors so far (max_errors)

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
        return Row(Role.EPISODE, self.initial_prompt_ids, tuple(self.ids), tuple(self.logprobs), tuple(self.mask))

    def mark(self) -> Mark:
        """Where the transcript stands: each list's length, each other field's value."""
        return {f.name: _where(getattr(self, f.name)) for f in fields(self)}

    def rollback(self, mark: Mark) -> None:
        """Back to where :meth:`mark` stood: what was added since is dropped, every other field restored."""
        for name, at in mark.items():
            value = getattr(self, name)
            if isinstance(value, list):
                del value[at:]
            else:
                setattr(self, name, at)

    def fork(self, prompt: tuple[list[int], str] | None = None) -> Transcript:
        """A copy of the conversation so far that records only what happens after it: the ``own`` fields start
        empty, its row starts at the prompt so far, or at ``prompt`` (ids, text) when given."""
        copied = {True: copy.deepcopy, False: copy.copy}  # ids and the rest: a shallow copy is a copy
        kept = {f.name: copied[bool(f.metadata.get("deep"))](getattr(self, f.name)) for f in fields(self)
                if not f.metadata.get("own")}  # fmt: skip
        if prompt is not None:
            kept["prompt_ids"], kept["prompt_text"] = list(prompt[0]), prompt[1]
        return Transcript(**kept)


def _where(value: Any) -> Any:
    return len(value) if isinstance(value, list) else value


__all__ = ["Mark", "Transcript"]
