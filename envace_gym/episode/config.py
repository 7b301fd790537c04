"""How an episode is played: every setting once, with its help, and the one way a flat config builds them.

:class:`EpisodeSettings` holds the settings a command line can carry (names, numbers), each declared once with
its ``help``. The flat configs of the entry points (``TrainerConfig``, ``TrainConfig``, ``ExperimentConfig``,
``EnvACEGRPOConfig``: TRL's users expect flat fields) inherit them, so a setting added here reaches their
flags, and they hand them on through :meth:`EpisodeSettings.episode_config`. :class:`EpisodeConfig` adds what
only code passes (the sampling and prompt objects, a user given as an object); :class:`~envace_gym.RehearsalEnv`,
its vector env and :func:`~envace_gym.rollout.collect_rollouts` take it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..domains.user_protocol import MAX_USER_TURNS
from ..parsing.act import DEFAULT_LIMITS, Limits
from ..parsing.formats import FORMATS
from ..policy.protocol import SamplingParams
from ..rehearsal.prompt import RehearsalConfig
from ..rehearsal.routing import EXECUTORS
from .users import check_user

ON_INVALID = ("terminate", "feedback")
REWARDS = ("domain", "reference")
REHEARSAL_MODES = ("separate", "inline")
MAX_OBSERVATION_CHARS = 1_000_000  # the bound of RehearsalEnv's observation space: no conversation grows past it


def _setting(default: Any, help: str, **metadata: Any) -> Any:
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class EpisodeSettings:
    """The settings of how an episode is played that a command line carries; each field's ``help`` says what it
    does. Inherit it to give a flat config these fields; :meth:`episode_config` hands them on."""

    executor: str = _setting(
        "rehearsal",
        "Who answers tool calls: rehearsal (the policy writes the response), real (the domain's tools), cached "
        "(the task's recorded results) or mixed (real with probability p_real, else rehearsal).",
        choices=EXECUTORS,
    )
    rehearsal_mode: str = _setting(
        "separate",
        "separate (a fresh prompt per call with the reference results, the paper's; rows per role) or inline (the "
        "policy writes the tool turn as a continuation of its own chat; one row per episode).",
        choices=REHEARSAL_MODES,
    )
    p_real: float = _setting(0.5, "With executor mixed: the probability that a call goes to the real tools.")
    on_invalid: str | None = _setting(
        None,
        "A malformed call or a failed rehearsal: terminate (the episode ends at reward 0, the paper's) or feedback (the "
        "typed error is the tool's response and the episode goes on). Default: the simulated user's protocol's "
        "(terminate for the envace protocol; a benchmark's may answer errors and refuse terminate).",
        choices=ON_INVALID,
    )
    max_turns: int | None = _setting(
        None, "Most Act turns before truncation (default: the domain's; a user protocol may set none)."
    )
    max_user_turns: int | None = _setting(
        None, f"Most user turns before truncation (default: {MAX_USER_TURNS}; a user protocol may set none)."
    )
    max_messages: int | None = _setting(
        None,
        "Most messages (each user message, agent message and batch of tool responses is one), before the episode "
        "ends at reward 0 (termination reason max_steps). Default: none, or the simulated user's protocol's.",
    )
    max_errors: int | None = _setting(
        None,
        "Most tool errors (invalid or malformed calls, failed or rehearsed errors) before the episode ends at reward "
        "0 (too_many_errors). Default: none, or the simulated user's protocol's.",
    )
    tool_call_format: str | None = _setting(
        None,
        "How Act turns write tool calls: a format name (hermes, qwen3, llama3_json, mistral, ...) or response_parser "
        "(the tokenizer's parse_response). Default: found from the tokenizer.",
    )
    reward: str = _setting(
        "domain",
        "What episodes are scored with: domain (the domain's own score; bank's replays the calls into the real tools) "
        "or reference (the task's reference calls and answer facts, no tool run: training with no executor at all).",
        choices=REWARDS,
    )
    user: str = _setting(
        "scripted",
        "Who answers the agent's final answers: scripted (the task's later user turns), llm (the policy plays the "
        "user, untrained), rehearse (the policy plays the user and learns to: a third role, rows 'user'), or an "
        "OpenAI-compatible endpoint URL (with user_model).",
    )
    user_model: str | None = _setting(None, "The model name of an endpoint user (user is a URL).")
    user_temperature: float | None = _setting(
        None, "The simulated user's temperature (default: its protocol's; 0.7 for the envace protocol)."
    )
    user_max_tokens: int | None = _setting(
        None,
        "The simulated user's reply budget, 0 for none but its context (default: its protocol's; 128 for the "
        "envace protocol).",
    )

    def __post_init__(self) -> None:
        self.check_episode_settings()

    def check_episode_settings(self) -> None:
        """Refuse a setting no episode can be played with (``ValueError``): called when the object is built."""
        for name in ("executor", "rehearsal_mode", "on_invalid", "reward"):
            value, allowed = getattr(self, name), _field(name).metadata["choices"]
            if value not in allowed and not (value is None and name == "on_invalid"):
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.tool_call_format is not None and self.tool_call_format not in (*FORMATS, "response_parser"):
            raise ValueError(
                f"tool_call_format must be one of {sorted(FORMATS)}, 'response_parser' or None, "
                f"got {self.tool_call_format!r}"
            )
        for name in ("max_turns", "max_user_turns", "max_messages", "max_errors"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 or None, got {value}")
        if not 0.0 <= self.p_real <= 1.0:
            raise ValueError(f"p_real must be in [0, 1], got {self.p_real}")
        check_user(self.user, self.user_model, self.user_temperature, self.user_max_tokens)

    def changed_episode_settings(self) -> list[str]:
        """The names of the episode settings that differ from their defaults (for entry points that refuse some)."""
        declared = self.__dataclass_fields__  # a flat config's own defaults (see setting)
        return [f.name for f in fields(EpisodeSettings) if getattr(self, f.name) != declared[f.name].default]

    def episode_settings(self) -> dict[str, Any]:
        """These settings by name (to hand them to another flat config)."""
        return {f.name: getattr(self, f.name) for f in fields(EpisodeSettings)}

    def episode_config(self, **objects: Any) -> EpisodeConfig:
        """The :class:`EpisodeConfig` of these settings; ``objects`` sets its other fields (``act_sampling``,
        ``rehearsal``, ``limits``) and may override a setting."""
        return EpisodeConfig.build(**{**self.episode_settings(), **objects})


def settings_table() -> str:
    """The Markdown table of the episode settings (docs/environment.md holds it; a test keeps the two the same)."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for f in fields(EpisodeSettings):
        choices = f" One of: {', '.join(f'`{c}`' for c in f.metadata['choices'])}." if "choices" in f.metadata else ""
        rows.append(f"| `{f.name}` | `{f.default!r}` | {f.metadata['help']}{choices} |")
    return "\n".join(rows)


def _field(name: str) -> dataclasses.Field[Any]:
    return EpisodeSettings.__dataclass_fields__[name]


def setting(name: str, default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """An :class:`EpisodeSettings` field for a flat config that wants another default: its help stays the one
    declared here (``metadata`` adds to it, e.g. ``choices``)."""
    declared = _field(name)
    return field(
        default=declared.default if default is dataclasses.MISSING else default,
        metadata={**declared.metadata, **metadata},
    )


@dataclass
class EpisodeConfig(EpisodeSettings):
    """Everything an episode is played with: the :class:`EpisodeSettings` and the objects below. Build it with
    :meth:`build` (which takes dicts for the objects) or :meth:`EpisodeSettings.episode_config`.

    Attributes:
        user: As :attr:`EpisodeSettings.user`, or a :class:`~envace_gym.policy.Policy` or ``UserSimulator``.
        act_sampling: Sampling of the Act turns (its ``max_new_tokens`` is also reserved in the context guard).
        rehearsal: How the Rehearse role is prompted and sampled.
        limits: Bounds on Act turns and JSON.
    """

    user: Any = setting("user")  # here also a Policy or a UserSimulator (a command line names one)
    act_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=512))
    rehearsal: RehearsalConfig = field(default_factory=RehearsalConfig)
    limits: Limits = DEFAULT_LIMITS

    @classmethod
    def build(cls, base: EpisodeConfig | None = None, /, **fields_: Any) -> EpisodeConfig:
        """``base`` (default: the defaults) with ``fields_`` set. ``act_sampling``, ``rehearsal`` and ``limits`` may
        be ``None`` (their defaults), their objects or dicts of their fields. Unknown names raise ``TypeError``;
        bad values, ``ValueError``."""
        if base is not None and not isinstance(base, EpisodeConfig):
            raise TypeError(f"config must be an EpisodeConfig (settings go by keyword), got {type(base).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(fields_) - known)
        if unknown:
            raise TypeError(f"unknown episode setting(s) {unknown}; known: {sorted(known)}")
        fresh = cls()
        for name, kind in (("act_sampling", SamplingParams), ("rehearsal", RehearsalConfig), ("limits", Limits)):
            if name in fields_:
                fields_[name] = _coerce(kind, fields_[name], getattr(fresh, name), name)
        return dataclasses.replace(fresh if base is None else base, **fields_)


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
