"""What an episode is configured with and what it hands out: its config, generation requests, rows, outcomes."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ToolError
from ..parsing.act import DEFAULT_LIMITS, Limits
from ..parsing.formats import FORMATS
from ..policy.protocol import SamplingParams
from ..rehearsal.prompt import RehearsalConfig
from ..rehearsal.routing import EXECUTORS
from ..tools.schema import ToolCall

ON_INVALID = ("terminate", "feedback")
REWARDS = ("domain", "reference")
REHEARSAL_MODES = ("separate", "inline")
MAX_USER_TURNS = 30  # the default of every entry point that plays episodes ("envace" protocol)
TAU2_MAX_STEPS = 200  # τ²-Bench's bounds (its DEFAULT_MAX_STEPS, DEFAULT_MAX_ERRORS): the "tau2" protocol's
TAU2_MAX_ERRORS = 10
MAX_OBSERVATION_CHARS = 1_000_000  # the bound of RehearsalEnv's observation space: no conversation grows past it


@dataclass(frozen=True)
class EpisodeConfig:
    """Episode rules shared by the single env, the vector env and the collector.

    Attributes:
        executor: Who answers tool calls: ``"rehearsal"``, ``"real"``, ``"cached"`` or ``"mixed"``.
        rehearsal_mode: ``"separate"`` (fresh prompt per call, the paper's) or ``"inline"`` (the policy
            continues its own chat in the tool role).
        p_real: With ``"mixed"``, the probability that a call goes to the real executor.
        on_invalid: ``"terminate"`` (the paper: the episode ends with reward 0) or ``"feedback"`` (the
            typed error becomes the tool's response and the episode goes on). ``None``: ``"terminate"``, and
            ``"feedback"`` under a simulated user's ``"tau2"`` protocol (τ² answers an error and goes on; it
            refuses ``"terminate"``).
        max_turns: Most Act turns before truncation (``None``: the domain's own limit; none under ``"tau2"``).
        max_user_turns: Most user turns before truncation (``None``: :data:`MAX_USER_TURNS`; none under ``"tau2"``).
        max_steps: Most messages, counted as τ²-Bench's orchestrator counts them (each user message, agent
            message and batch of tool responses is one), before the episode ends with reward 0 (termination
            reason ``"max_steps"``). ``None``: no bound, and :data:`TAU2_MAX_STEPS` under ``"tau2"``.
        max_errors: Most tool errors (invalid or malformed calls, failed or rehearsed errors) before the episode
            ends with reward 0 (``"too_many_errors"``). ``None``: no bound, and :data:`TAU2_MAX_ERRORS` under
            ``"tau2"``.
        rehearsal: How the Rehearse role is prompted and sampled.
        limits: Bounds on Act turns and JSON.
        reward: ``"domain"`` (the domain's own score, e.g. ``bank``'s final ledger, which replays the calls into
            the real tools) or ``"reference"`` (:func:`~envace_gym.domains.reward.score_reference`: the task's
            reference calls and answer facts, scored without running any tool; what training without an
            executor needs).
        tool_call_format: How Act turns write tool calls: a name in :data:`envace_gym.parsing.formats.FORMATS`,
            ``"response_parser"`` (the tokenizer's ``parse_response``), or ``None``: found from the tokenizer
            (see :func:`envace_gym.parsing.formats.tool_call_format`).
    """

    executor: str = "rehearsal"
    rehearsal_mode: str = "separate"
    p_real: float = 0.5
    on_invalid: str | None = None
    max_turns: int | None = None
    max_user_turns: int | None = None
    max_steps: int | None = None
    max_errors: int | None = None
    rehearsal: RehearsalConfig = field(default_factory=RehearsalConfig)
    limits: Limits = DEFAULT_LIMITS
    tool_call_format: str | None = None
    reward: str = "domain"

    def __post_init__(self) -> None:
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")
        if self.tool_call_format is not None and self.tool_call_format not in (*FORMATS, "response_parser"):
            raise ValueError(
                f"tool_call_format must be one of {sorted(FORMATS)}, 'response_parser' or None, "
                f"got {self.tool_call_format!r}"
            )
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        if self.rehearsal_mode not in REHEARSAL_MODES:
            raise ValueError(f"rehearsal_mode must be one of {REHEARSAL_MODES}, got {self.rehearsal_mode!r}")
        if self.on_invalid is not None and self.on_invalid not in ON_INVALID:
            raise ValueError(f"on_invalid must be one of {ON_INVALID} or None, got {self.on_invalid!r}")
        for name in ("max_turns", "max_user_turns", "max_steps", "max_errors"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 or None, got {value}")
        if not 0.0 <= self.p_real <= 1.0:
            raise ValueError(f"p_real must be in [0, 1], got {self.p_real}")

    @classmethod
    def build(
        cls,
        *,
        rehearsal: RehearsalConfig | Mapping[str, Any] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        **fields_: Any,
    ) -> EpisodeConfig:
        """The config every entry point builds from its keyword arguments: ``rehearsal`` and ``limits`` may be
        ``None`` (the defaults), their config objects or dicts of their fields; the other keywords are
        :class:`EpisodeConfig` fields. Unknown names raise ``TypeError``; bad values, ``ValueError``."""
        known = {f.name for f in fields(cls)} - {"rehearsal", "limits"}
        unknown = sorted(set(fields_) - known)
        if unknown:
            raise TypeError(
                f"unknown EpisodeConfig field(s) {unknown}; known: {sorted(known | {'rehearsal', 'limits'})}"
            )
        return cls(
            rehearsal=_coerce(RehearsalConfig, rehearsal, RehearsalConfig(), "rehearsal"),
            limits=_coerce(Limits, limits, DEFAULT_LIMITS, "limits"),
            **fields_,
        )


def _coerce(kind: type, value: Any, default: Any, name: str) -> Any:
    """``value`` as a ``kind``: itself, the default for ``None``, or built from a dict of its fields."""
    if value is None:
        return default
    if isinstance(value, kind):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a {kind.__name__}, a dict of its fields or None, got {type(value).__name__}")
    unknown = sorted(set(value) - {f.name for f in fields(kind)})
    if unknown:
        raise TypeError(f"unknown {kind.__name__} field(s) {unknown}")
    return kind(**value)


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
