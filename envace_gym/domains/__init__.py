"""Domains: tools + tasks + reward + (optionally) a real executor.

A :class:`Domain` is mostly data. Its :class:`Task` objects carry the user turn(s), the tool whitelist,
the reference trajectory (calls *and* the real results they produced; the rehearse role's privileged
few-shot), and what the reward checks. The built-in domains live in ``envs/`` (installed as
``envace_gym.envs``); users register their own with :func:`register_domain`, pass a Domain object to
the environment, point :func:`make_domain` at a folder (:class:`FolderDomain`) or at a dataset of
conversations (:class:`DatasetDomain`). No torch here: a judge backend loads its model when it is built.
"""

from __future__ import annotations

from .dataset import DatasetDomain, is_dataset_source, reference_call_reward
from .domain import Domain, GeneratedDomain
from .folder import FolderDomain
from .registry import ENTRY_POINT_GROUP, list_domains, make_domain, register_domain
from .reward import RewardResult, numbers_in, score_expected
from .spec import DomainSpec
from .task import SPLITS, LazyTasks, ReferenceRecorder, ReferenceTurn, Task, check_split, stable_hash
from .trajectory import CallRecord, Trajectory
from .user_protocol import ENVACE_PROTOCOL, EpisodeRules, UserProtocol

__all__ = [
    "CallRecord",
    "DatasetDomain",
    "Domain",
    "DomainSpec",
    "ENVACE_PROTOCOL",
    "ENTRY_POINT_GROUP",
    "FolderDomain",
    "EpisodeRules",
    "GeneratedDomain",
    "LazyTasks",
    "ReferenceRecorder",
    "ReferenceTurn",
    "RewardResult",
    "SPLITS",
    "Task",
    "Trajectory",
    "UserProtocol",
    "check_split",
    "is_dataset_source",
    "list_domains",
    "make_domain",
    "numbers_in",
    "reference_call_reward",
    "register_domain",
    "score_expected",
    "stable_hash",
]
