"""What an episode hands out: generation requests, tool calls as answered, rows (with their roles), outcomes."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum
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


class Role(str, Enum):
    """Whose tokens a training row holds; advantages are computed per role within a group. A ``str``, so a role
    compares, prints and serializes as its value (``"act"``)."""

    ACT = "act"  # an Act turn (separate mode)
    REHEARSE = "rehearse"  # a rehearsed tool response, with its own prompt (separate mode)
    EPISODE = "episode"  # the whole episode, both roles' tokens marked (inline mode)
    USER = "user"  # a simulated user's turn, when the policy rehearses its users (user="rehearse")

    def __str__(self) -> str:  # (Python 3.11+ would print "Role.ACT" in f-strings)
        return self.value


@dataclass(frozen=True)
class Row:
    """One training row: a prompt and the tokens after it.

    ``mask[i]`` is 1 where the policy wrote ``completion_ids[i]`` (trained) and 0 for environment text (the
    template's scaffolding, user turns, real tool results); ``logprobs`` are 0 where the mask is 0.
    ``role`` is :attr:`Role.ACT` or :attr:`Role.REHEARSE` (``separate`` mode: one row per generation) or
    :attr:`Role.EPISODE` (``inline`` mode: the whole episode, both roles); :attr:`Role.USER` for a simulated user's
    turn when the policy rehearses its users (``user="rehearse"``), in either mode.

    An episode makes its rows unlabelled; :meth:`~envace_gym.rollout.RolloutBatch.samples` labels them with what
    training groups and weighs them by: ``group`` (the task's place in the batch: GRPO's group), ``episode`` (the
    episode's index in the batch) and ``reward`` (its episode's; ``None``: masked, the row trains nothing).
    """

    role: Role
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    mask: tuple[int, ...]
    group: int = -1  # -1: not in a batch yet
    episode: int = -1
    reward: float | None = None


@dataclass
class StepOutcome:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
