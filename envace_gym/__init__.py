"""envace-gym: world rehearsal (EnvACE) for tool-using LLM agents, as a Gymnasium environment.

>>> import gymnasium as gym, envace_gym
>>> env = gym.make("EnvACE-Rehearsal-v0", domain="bank", executor="rehearsal")
>>> obs, info = env.reset(seed=0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from .domains import (
    Domain,
    FolderDomain,
    GeneratedDomain,
    ReferenceRecorder,
    ReferenceTurn,
    RewardResult,
    Task,
    Trajectory,
    list_domains,
    make_domain,
    register_domain,
)
from .env.registration import REHEARSAL_ENV_ID, register_envs
from .errors import (
    DefaultModelNotInstalledError,
    DomainError,
    EnvACEError,
    ErrorCode,
    PolicyError,
    SchemaError,
    ServerError,
    TaskNotFoundError,
    TaskTooLongError,
    ToolError,
    TrainingConfigError,
    UnknownToolError,
)
from .parsing import Limits, ToolCallFormat, parse_act, parse_execution_result, tool_call_format
from .policy import Generation, Policy, SamplingParams
from .rehearsal import RehearsalConfig
from .tools import ToolCall, ToolExecutor, ToolFailure, ToolRegistry, ToolSchema, ValidationResult, tool

__version__ = "0.1.0"

# What needs torch (the env, the episode, the transformers policy) loads on first use: `import envace_gym`
# registers the ids and the domains without it, and the torch-free stages stay importable without torch.
__getattr__ = lazy_exports(
    __name__,
    {
        "RehearsalEnv": ".env.rehearsal_env",
        "Episode": ".episode.episode",
        "EpisodeConfig": ".episode.config",
        "EpisodeSettings": ".episode.config",
        "UserSimulator": ".episode.users",
        "TransformersPolicy": ".policy.transformers",
        "make_policy": ".policy.factory",
    },
)

if TYPE_CHECKING:
    from .env.rehearsal_env import RehearsalEnv
    from .episode.config import EpisodeConfig, EpisodeSettings
    from .episode.episode import Episode
    from .episode.users import UserSimulator
    from .policy.factory import make_policy
    from .policy.transformers import TransformersPolicy


register_envs()

from .envs import register_builtin_domains  # noqa: E402  (after the core: domains build on it)

register_builtin_domains()

__all__ = [
    "REHEARSAL_ENV_ID",
    "DefaultModelNotInstalledError",
    "Domain",
    "DomainError",
    "EnvACEError",
    "Episode",
    "EpisodeConfig",
    "EpisodeSettings",
    "ErrorCode",
    "FolderDomain",
    "GeneratedDomain",
    "Generation",
    "Limits",
    "Policy",
    "PolicyError",
    "ReferenceRecorder",
    "ReferenceTurn",
    "RehearsalConfig",
    "RehearsalEnv",
    "RewardResult",
    "SamplingParams",
    "SchemaError",
    "ServerError",
    "Task",
    "TaskNotFoundError",
    "TaskTooLongError",
    "ToolCall",
    "ToolCallFormat",
    "ToolError",
    "ToolExecutor",
    "ToolFailure",
    "ToolRegistry",
    "ToolSchema",
    "Trajectory",
    "TrainingConfigError",
    "TransformersPolicy",
    "UnknownToolError",
    "UserSimulator",
    "ValidationResult",
    "list_domains",
    "make_domain",
    "make_policy",
    "parse_act",
    "parse_execution_result",
    "register_domain",
    "register_envs",
    "tool",
    "tool_call_format",
]
