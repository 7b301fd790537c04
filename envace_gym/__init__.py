"""envace-gym: world rehearsal (EnvACE) for tool-using LLM agents, as a Gymnasium environment.

>>> import gymnasium as gym, envace_gym
>>> env = gym.make("EnvACE-Rehearsal-v0", domain="bank", executor="rehearsal")
>>> obs, info = env.reset(seed=0)
"""

from __future__ import annotations

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
from .env import RehearsalEnv
from .episode import Episode, EpisodeConfig
from .errors import (
    DefaultModelNotInstalledError,
    DomainError,
    EnvACEError,
    ErrorCode,
    PolicyError,
    SchemaError,
    TaskNotFoundError,
    ToolError,
    TrainingConfigError,
    UnknownToolError,
)
from .executors import ToolExecutor, ToolFailure, tool
from .formats import ToolCallFormat, tool_call_format
from .parsing import Limits, parse_act, parse_execution_result
from .policy import Generation, Policy, SamplingParams, TransformersPolicy, make_policy
from .registration import REHEARSAL_ENV_ID, register_envs
from .simulator import RehearsalConfig
from .tools import ToolCall, ToolRegistry, ToolSchema, ValidationResult

__version__ = "0.1.0"

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
    "Task",
    "TaskNotFoundError",
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
