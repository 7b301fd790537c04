"""The rollout collector: many world-rehearsal episodes to the end, batched, ready for training.

``collect_rollouts(policy, domain, tasks, group_size=G)`` plays ``len(tasks) * G`` episodes. At each
micro-step the Act turns of every live episode are generated in **one** call, then the episodes step
together and their rehearsals are generated in one call per round (:class:`~envace_gym.episode.driver.EpisodeDriver`).
Finished episodes leave the batch. Act prompts grow by appending ids (nothing is re-tokenized).

The result holds, per episode, the reward and the messages, and the training rows: in ``separate`` mode one
row per generation (:class:`~envace_gym.episode.Role` ``ACT`` or ``REHEARSE``, each with its own prompt), in
``inline`` mode one row per episode (``EPISODE``) whose mask marks both roles' tokens; with ``user="rehearse"``, also
one row per simulated user turn (``USER``), in either mode. Each episode's calls are typed records
(:class:`~envace_gym.domains.CallRecord`), as the reward saw them.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..domains.domain import Domain
from ..domains.registry import make_domain
from ..domains.task import Task
from ..domains.trajectory import CallRecord
from ..episode.config import EpisodeConfig
from ..episode.driver import Actor, EpisodeDriver, open_session
from ..episode.episode import Episode
from ..episode.start import simulated_user, start_episodes
from ..episode.types import Role, Row, StepOutcome
from ..policy.protocol import Policy
from ..progress import Progress, ProgressReporter

ACT_SOURCES = ("policy", "reference")


@dataclass
class EpisodeResult:
    """One finished episode."""

    index: int
    group: int
    task_id: str
    reward: float | None  # None: the verifier could not judge (mask this episode)
    success: bool
    terminated: bool
    truncated: bool
    turns: int
    checks: dict[str, bool]
    messages: list[dict[str, Any]]
    calls: list[CallRecord]  # every call, in order (the agent's, and a user's with tools of its own)
    rows: list[Row]
    episode_row: Row  # the whole episode as one row (what `inline` trains; in `separate` mode, Act tokens marked)
    user_error: str | None = None  # a simulated user's reply that could not be used (the episode is masked)
    termination_reason: str | None = None  # why it ended ("user_stop", "max_steps", "context", ...)

    @property
    def real_calls(self) -> int:
        """Calls the real executor answered (0 when every call is rehearsed)."""
        return sum(c.route == "real" for c in self.calls)


@dataclass(frozen=True)
class RolloutStats:
    """What a :func:`collect_rollouts` call played and what it cost."""

    seconds: float = 0.0
    episodes: int = 0
    rounds: int = 0  # generation rounds (one batched Act call each, with ``act="policy"``)
    act_generate_calls: int = 0
    act_tokens: int = 0
    rehearse_tokens: int = 0
    mean_reward: float = 0.0  # of the scored episodes
    success_rate: float = 0.0
    masked_episodes: int = 0  # the verifier (or a simulated user) failed them
    user_opening_fallbacks: int = 0  # the simulated user's opening could not be used: the task's prompt opened
    skipped_tasks: int = 0  # too long to play (TaskTooLongError)
    kv_reused_tokens: int = 0
    kv_computed_tokens: int = 0


@dataclass
class RolloutBatch:
    """What :func:`collect_rollouts` returns."""

    episodes: list[EpisodeResult]
    stats: RolloutStats = field(default_factory=RolloutStats)

    def samples(self, roles: Iterable[Role] | None = None) -> list[Row]:
        """Every training row (of ``roles``: all by default), labelled with its group, its episode and the episode's
        reward."""
        wanted = set(roles) if roles is not None else None
        return [
            replace(r, group=e.group, episode=e.index, reward=e.reward)
            for e in self.episodes
            for r in e.rows
            if wanted is None or r.role in wanted
        ]

    @property
    def rewards(self) -> list[float | None]:
        return [e.reward for e in self.episodes]

    def reward_spread(self) -> dict[Hashable, bool]:
        """Per group: do its scored episodes earn different rewards? (:func:`reward_spread`)"""
        return reward_spread([e.group for e in self.episodes], self.rewards)


def reward_spread(groups: Sequence[Hashable], rewards: Sequence[float | None]) -> dict[Hashable, bool]:
    """Per group with a scored episode (reward not ``None``): do its scored episodes earn different rewards? A group
    without a spread gives GRPO no gradient."""
    by_group: dict[Hashable, set[float]] = {}
    for group, reward in zip(groups, rewards, strict=True):
        if reward is not None:
            by_group.setdefault(group, set()).add(round(reward, 9))
    return {g: len(r) > 1 for g, r in by_group.items()}


def collect_rollouts(
    policy: Policy,
    domain: str | Domain,
    tasks: Sequence[Task | str],
    group_size: int = 1,
    config: EpisodeConfig | None = None,
    *,
    act: str = "policy",
    seed: int = 0,
    reuse_kv: bool = True,
    actor: Actor | None = None,
    simulator: Policy | None = None,
    progress: Progress = False,
    unfit: str = "skip",
    **settings: Any,
) -> RolloutBatch:
    """Play ``group_size`` episodes of each task to the end, batching every generation.

    Args:
        policy: Writes the Act turns and the rehearsals (the same weights).
        domain: A domain name, folder or object.
        tasks: Tasks or task ids; each gives one group of ``group_size`` episodes.
        group_size: Episodes per task (the G of GRPO).
        config: How the episodes are played (:class:`~envace_gym.episode.EpisodeConfig`: executor, rehearsal mode,
            reward, limits, the simulated user, the Act turns' sampling, ...); ``settings`` (its field names) set
            fields on top of it, or of the defaults. A simulated user's turns of a round are generated in one batch.
        act: ``"policy"`` (the policy writes the Act turns) or ``"reference"`` (each task's reference
            solution does, so only the Rehearse role is exercised: fidelity checks, demos, SFT data).
        seed: Seeds the generation batches and each episode's own ``np_random``.
        reuse_kv: Keep each conversation's KV cache between turns (:mod:`envace_gym.policy.sessions`).
        actor: Writes the Act turns instead of one batched policy call: ``actor(episodes, rng, session, keys)``
            returns one generation per live episode (e.g. :class:`~envace_gym.rollout.planner.RehearsalPlanner`).
        simulator: Writes the rehearsals instead of ``policy`` (``separate`` mode): a frozen simulator, the
            paper's ablation in which only the Act role learns.
        progress: ``True`` (or a label) shows a bar of finished episodes with the generation round; a callable
            is called as ``progress(done, total)`` each time an episode finishes (:mod:`envace_gym.progress`).
        unfit: A task whose opening prompt does not fit the policy's context (with the Act turn's budget) or
            the observation space: ``"skip"`` it with a warning, counted in ``stats.skipped_tasks`` (its
            group is absent from the batch), or ``"raise"`` its :class:`~envace_gym.errors.TaskTooLongError`.
    """
    if act not in ACT_SOURCES:
        raise ValueError(f"act must be one of {ACT_SOURCES}, got {act!r}")
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    config = EpisodeConfig.build(config, **settings)
    if simulator is not None and config.rehearsal_mode != "separate":
        raise ValueError(
            "a separate simulator rehearses in rehearsal_mode='separate' only (inline: the policy's own chat)"
        )
    domain = make_domain(domain)
    user = simulated_user(config, lambda: policy, domain)
    rng = np.random.default_rng(seed)
    resolved = [t if isinstance(t, Task) else domain.task(t) for t in tasks]
    session = open_session(policy) if reuse_kv else None
    driver = EpisodeDriver(policy, rng, session, simulator)
    started = time.perf_counter()
    begun = start_episodes(
        domain, resolved, config, policy.tokenizer, max_context=policy.max_context,
        rng=lambda g, k: np.random.default_rng([seed, g, k]), group_size=group_size,
        act_reserve=None if act == "policy" else 0,  # text turns: no reserve
        user=user, user_rng=rng, unfit=unfit,
    )  # fmt: skip
    episodes, groups, skipped = begun.episodes, begun.groups, begun.skipped  # an episode's key is its index
    results: list[EpisodeResult | None] = [None] * len(episodes)
    counts = {"act_calls": 0, "act_tokens": 0, "rounds": 0}
    bar = ProgressReporter(progress, len(episodes), "episodes", "ep")

    def on_round(live: Sequence[int], moves: Sequence[Any]) -> None:
        counts["rounds"] += 1
        bar.note(round=counts["rounds"], live=len(live))
        if act == "policy":
            counts["act_calls"] += 1
            counts["act_tokens"] += sum(len(m.completion_ids) for m in moves)

    def on_end(i: int, outcome: StepOutcome) -> None:
        results[i] = _result(i, groups[i], episodes[i], outcome)
        bar.update(1)
        if session is not None:
            session.forget([i])  # an episode's key is its index

    moves = config.act_sampling if act == "policy" else (lambda playing: [e.reference_act() for e in playing])
    driver.run(episodes, moves, actor=actor, on_round=on_round, on_end=on_end)
    bar.close()
    done = [r for r in results if r is not None]
    rehearse_tokens = sum(len(r.completion_ids) for e in done for r in e.rows if r.role == Role.REHEARSE)
    stats = RolloutStats(
        seconds=time.perf_counter() - started,
        episodes=len(done),
        rounds=counts["rounds"],
        act_generate_calls=counts["act_calls"],
        act_tokens=counts["act_tokens"],
        rehearse_tokens=rehearse_tokens,
        mean_reward=float(np.mean([e.reward for e in done if e.reward is not None] or [0.0])),
        success_rate=float(np.mean([e.success for e in done] or [0.0])),
        masked_episodes=sum(e.reward is None for e in done),
        user_opening_fallbacks=sum(e.opening_error is not None for e in episodes),
        skipped_tasks=len(skipped),
        kv_reused_tokens=getattr(session, "reused_tokens", 0),
        kv_computed_tokens=getattr(session, "computed_tokens", 0),
    )
    return RolloutBatch(done, stats)


def _result(index: int, group: int, episode: Episode, outcome: StepOutcome) -> EpisodeResult:
    """The finished episode as a typed record, read from the episode itself (its ``info`` is for Gymnasium's API)."""
    ended = episode.reward_result  # set by every ending
    whole = episode.episode_row()
    # inline: the episode is one row, plus a trained user's own rows (its turns are context in the episode row)
    rows = (
        [whole, *(r for r in episode.rows if r.role == Role.USER)]
        if episode.config.rehearsal_mode == "inline"
        else list(episode.rows)
    )
    return EpisodeResult(
        index=index,
        group=group,
        task_id=episode.task.id,
        reward=None if ended is not None and ended.score is None else float(outcome.reward),
        success=ended is not None and ended.success,
        terminated=outcome.terminated,
        truncated=outcome.truncated,
        turns=episode.turn,
        checks=dict(ended.checks) if ended is not None else {},
        messages=copy.deepcopy(episode.messages),
        calls=list(episode.records),
        rows=rows,
        episode_row=whole,
        user_error=episode.user_error,
        termination_reason=episode.termination_reason,
    )
