"""What an episode hands out: generation requests, tool calls as answered, rows, outcomes."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from ..errors import ToolError
from ..policy.protocol import SamplingParams
from ..tools.schema import ToolCall


@dataclass(frozen=True)
class GenerationRequest:
    """A prompt the episode needs generated. ``params.seed`` is left unset: whoever batches the
    requests seeds each batch, from its own ``np_random``. ``key`` names the conversation the prompt
    continues (``inline`` rehearsals), so a generation session can reuse its KV cache; ``None`` for a
    fresh prompt."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    key: Hashable | None = None


@dataclass
class CallState:
    """One tool call of an Act turn as the turn answers it: where it went (``"real"``, ``"cache"``,
    ``"rehearsal"``; ``None`` while unrouted or when it failed validation) and its response or typed error."""

    call: ToolCall
    route: str | None = None
    response: Any = None
    error: ToolError | None = None


@dataclass(frozen=True)
class Row:
    """One training row: a prompt and the tokens after it.

    ``mask[i]`` is 1 where the policy wrote ``completion_ids[i]`` (trained) and 0 for environment text (the
    template's scaffolding, user turns, real tool results); ``logprobs`` are 0 where the mask is 0.
    ``role`` is ``"act"`` or ``"rehearse"`` (``separate`` mode: one row per generation) or ``"episode"``
    (``inline`` mode: the whole episode, both roles); ``"user"`` for a simulated user's turn when the policy
    rehearses its users (``user="rehearse"``), in either mode.
    """

    role: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    mask: tuple[int, ...]


@dataclass
class StepOutcome:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
