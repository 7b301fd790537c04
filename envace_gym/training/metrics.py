"""What the trainers log each step, named once, in TRL's slash style.

Both trainers (the pure-torch :func:`~envace_gym.training.trainer.train` and TRL's
:class:`~envace_gym.integrations.trl.EnvACEGRPOTrainer`) log these names with these meanings, so a curve from
one plots beside the other; where TRL already has a name for a quantity (``reward``, ``kl``,
``clip_ratio/region_mean``, ``frac_reward_zero_std``, ``step_time``) it is TRL's. :data:`STEP_METRICS` says
what each means and who logs it; docs/training.md's metric table is :func:`metrics_table` (a test compares them).
What the rollouts say of a step (rewards, groups, rows, ...) both compute with :func:`step_metrics`, from every
process's episodes (:class:`EpisodeTally`); the loss's own figures are each trainer's.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..episode.types import Role, Row
from ..rollout.collector import EpisodeResult, reward_spread

STEP = "step"
REWARD = "reward"
SUCCESS = "success"
LOSS = "loss"
GRAD_NORM = "grad_norm"
KL = "kl"
CLIP_RATIO = "clip_ratio/region_mean"
ZERO_STD = "frac_reward_zero_std"
GROUPS = "rollouts/groups"
SKIPPED_TASKS = "rollouts/skipped_tasks"
REAL_TOOL_CALLS = "rollouts/real_tool_calls"
EPISODES = "episodes"
TURNS = "episode/turns"
MASKED = "episode/masked"
TRAINED_TOKENS = "tokens/trained"
STEP_TIME = "step_time"
ROLES = tuple(Role)


def rows(role: Role | str) -> str:
    """The metric of the rows of ``role`` trained in a step (``rows/act``, ``rows/rehearse``, ...)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {[r.value for r in ROLES]}, got {role!r}")
    return f"rows/{Role(role).value}"


BOTH = "both"
TORCH = "pure-torch trainer"

# name -> (who logs it, what it means): the one definition the trainers' names and the docs' table come from.
STEP_METRICS: dict[str, tuple[str, str]] = {
    STEP: (TORCH, "the optimizer step, from 1 (TRL's log history carries its own `step`)"),
    REWARD: (BOTH, "mean reward of the step's scored episodes"),
    SUCCESS: (BOTH, "share of the step's episodes that succeeded"),
    LOSS: (BOTH, "the clipped GRPO objective, token-mean over the trained tokens"),
    GRAD_NORM: (BOTH, "gradient norm before clipping"),
    KL: (BOTH, "mean per-token KL to the reference model (TRL logs it with beta > 0 only)"),
    CLIP_RATIO: (BOTH, "share of trained tokens whose probability ratio was clipped"),
    ZERO_STD: (BOTH, "share of the step's groups whose episodes all earned the same reward: no gradient from them"),
    GROUPS: (BOTH, "groups played in the step (refills included)"),
    SKIPPED_TASKS: (BOTH, "tasks drawn but too long to play (no episode)"),
    REAL_TOOL_CALLS: (BOTH, "calls the real executor answered (0 when every call is rehearsed)"),
    EPISODES: (BOTH, "episodes played in the step"),
    TURNS: (BOTH, "mean turns per episode"),
    MASKED: (BOTH, "episodes whose verifier could not score them: they train nothing"),
    TRAINED_TOKENS: (BOTH, "completion tokens that carry a gradient"),
    **{rows(role): (BOTH, f"rows of the {role} role trained in the step") for role in ROLES},
    STEP_TIME: (BOTH, "seconds of the step: rollouts, their scoring and the update"),
}


@dataclass(frozen=True)
class EpisodeTally:
    """What a step's metrics read of one episode: small, so that every process's can be gathered."""

    reward: float | None  # the reward the step trains on (None: masked)
    success: bool
    turns: int
    real_calls: int

    @classmethod
    def of(cls, episode: EpisodeResult, reward: float | None) -> EpisodeTally:
        """``episode`` as trained with ``reward`` (a trainer's reward functions may replace the domain's)."""
        return cls(reward, episode.success, episode.turns, episode.real_calls)


def group_counts(groups: Sequence[Hashable], rewards: Sequence[float | None]) -> tuple[int, int]:
    """The groups played (every episode's, over all processes) and of those, the ones whose scored episodes all
    earned the same reward (no gradient). A group with no scored episode is played, but counts as neither."""
    spread = reward_spread(groups, rewards)
    return len(set(groups)), sum(not s for s in spread.values())


def role_counts(trained: Iterable[Row]) -> dict[Role, int]:
    """How many of the ``trained`` rows each role has (every role, 0 included)."""
    counts = dict.fromkeys(ROLES, 0)
    for row in trained:
        counts[Role(row.role)] += 1
    return counts


def step_metrics(
    episodes: Sequence[EpisodeTally],
    roles: Mapping[Role, int],
    *,
    trained_tokens: int,
    groups: int,
    zero_std_groups: int,
    skipped_tasks: int,
) -> dict[str, float]:
    """The metrics of a step that come from its rollouts, as both trainers log them: from every process's
    ``episodes``, the trained rows per role (:func:`role_counts`, summed over processes), the trained tokens,
    :func:`group_counts` (refills included) and the tasks too long to play."""
    rewards = [e.reward for e in episodes if e.reward is not None]
    return {
        REWARD: _mean(rewards),
        SUCCESS: _mean([float(e.success) for e in episodes]),
        ZERO_STD: zero_std_groups / groups if groups else float("nan"),  # no reward spread: no gradient
        GROUPS: groups,
        SKIPPED_TASKS: skipped_tasks,  # drawn but too long to play (TaskTooLongError): no episode
        REAL_TOOL_CALLS: sum(e.real_calls for e in episodes),  # 0 with executor="rehearsal"
        EPISODES: len(episodes),
        TURNS: _mean([float(e.turns) for e in episodes]),
        MASKED: sum(e.reward is None for e in episodes),  # their verifier could not score them
        TRAINED_TOKENS: trained_tokens,
        **{rows(role): roles.get(role, 0) for role in ROLES},
    }


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def metrics_table() -> str:
    """The Markdown table of :data:`STEP_METRICS`, as docs/training.md holds it."""
    lines = ["| metric | logged by | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {who} | {meaning} |" for name, (who, meaning) in STEP_METRICS.items()]
    return "\n".join(lines)


__all__ = [
    "CLIP_RATIO", "EPISODES", "GRAD_NORM", "GROUPS", "KL", "LOSS", "MASKED", "REAL_TOOL_CALLS", "REWARD", "ROLES",
    "SKIPPED_TASKS", "STEP", "STEP_METRICS", "STEP_TIME", "SUCCESS", "TRAINED_TOKENS", "TURNS", "ZERO_STD",
    "EpisodeTally", "group_counts", "metrics_table", "role_counts", "rows", "step_metrics",
]  # fmt: skip
