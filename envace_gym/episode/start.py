"""Starting episodes: the one place that builds :class:`~.episode.Episode` objects for the env, the collector, SFT
and the benchmarks, with a simulated user's openings and the tasks too long to play."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..domains.domain import Domain
from ..domains.task import Task
from ..errors import TaskTooLongError
from ..policy.protocol import Policy
from .config import MAX_OBSERVATION_CHARS, EpisodeConfig
from .episode import Episode
from .users import UserSimulator, make_user

logger = logging.getLogger("envace_gym")


@dataclass
class Started:
    """What :func:`start_episodes` started: the episodes (group by group), each one's group (its task's index in
    the tasks given) and the ids of the tasks skipped as too long to play."""

    episodes: list[Episode] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def simulated_user(config: EpisodeConfig, own: Callable[[], Policy], domain: Domain) -> UserSimulator | None:
    """The simulated user ``config.user`` asks for, under the domain's protocol (``None``: the scripted one);
    ``own()`` gives the policy, for a user the policy plays."""
    return make_user(
        config.user, own, config.user_model, config.act_sampling, protocol=domain.user_protocol,
        temperature=config.user_temperature, max_tokens=config.user_max_tokens,
    )  # fmt: skip


def start_episodes(
    domain: Domain,
    tasks: Sequence[Task],
    config: EpisodeConfig,
    tokenizer: Any,
    *,
    max_context: int,
    rng: Callable[[int, int], np.random.Generator],
    group_size: int = 1,
    key: Callable[[int], Hashable] = lambda i: i,
    act_reserve: int | None = None,
    user: UserSimulator | None = None,
    user_rng: np.random.Generator | None = None,
    max_observation_chars: int = MAX_OBSERVATION_CHARS,
    unfit: str = "skip",
) -> Started:
    """``group_size`` episodes of each task, ready to play.

    Args:
        rng: The generator of episode ``k`` of group ``g``: ``rng(g, k)``.
        key: The key of the ``i``-th episode started (its conversation's name in a KV session).
        act_reserve: Tokens kept free in ``max_context`` for the Act turn (default: ``config.act_sampling``'s
            budget; 0 for text turns).
        user, user_rng: A simulated user that writes the first message (of tasks that carry a scenario) writes
            every episode's opening, in one batch, sampled from ``user_rng``.
        unfit: A task whose opening prompt does not fit ``max_context`` (with the reserve) or
            ``max_observation_chars``: ``"skip"`` it with a warning (its id in ``skipped``) or ``"raise"`` its
            :class:`~envace_gym.errors.TaskTooLongError`.
    """
    if unfit not in ("skip", "raise"):
        raise ValueError(f"unfit must be 'skip' or 'raise', got {unfit!r}")
    reserve = config.act_sampling.max_new_tokens if act_reserve is None else act_reserve
    openings: list[Any] = [None] * (len(tasks) * group_size)
    if user is not None:
        if user_rng is None:
            raise ValueError("a simulated user samples its openings from user_rng: pass one")
        openings = user.openings([t for t in tasks for _ in range(group_size)], user_rng)
    started = Started()
    for g, task in enumerate(tasks):
        try:
            group = [
                Episode(
                    domain, task, config, tokenizer, rng(g, k), max_context=max_context, act_max_new_tokens=reserve,
                    key=key(len(started.episodes) + k), max_observation_chars=max_observation_chars, user=user,
                    opening=openings[g * group_size + k],
                )  # fmt: skip
                for k in range(group_size)
            ]
        except TaskTooLongError as exc:
            if unfit == "raise":
                raise
            logger.warning("%s: skipped", exc)
            started.skipped.append(task.id)
            continue
        started.episodes += group
        started.groups += [g] * group_size
    return started
