"""What the trainers log each step, named once, in TRL's slash style.

Both trainers (the pure-torch :func:`~envace_gym.training.trainer.train` and TRL's
:class:`~envace_gym.integrations.trl.EnvACEGRPOTrainer`) log these names with these meanings, so a curve from
one plots beside the other; where TRL already has a name for a quantity (``reward``, ``kl``,
``clip_ratio/region_mean``, ``frac_reward_zero_std``, ``step_time``) it is TRL's. :data:`STEP_METRICS` says
what each means and who logs it; docs/training.md's metric table is :func:`metrics_table` (a test compares them).
"""

from __future__ import annotations

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
ROLES = ("act", "rehearse", "episode", "user")


def rows(role: str) -> str:
    """The metric of the rows of ``role`` trained in a step (``rows/act``, ``rows/rehearse``, ...)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return f"rows/{role}"


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


def metrics_table() -> str:
    """The Markdown table of :data:`STEP_METRICS`, as docs/training.md holds it."""
    lines = ["| metric | logged by | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {who} | {meaning} |" for name, (who, meaning) in STEP_METRICS.items()]
    return "\n".join(lines)


__all__ = [
    "CLIP_RATIO", "EPISODES", "GRAD_NORM", "GROUPS", "KL", "LOSS", "MASKED", "REAL_TOOL_CALLS", "REWARD", "ROLES",
    "SKIPPED_TASKS", "STEP", "STEP_METRICS", "STEP_TIME", "SUCCESS", "TRAINED_TOKENS", "TURNS", "ZERO_STD",
    "metrics_table", "rows",
]  # fmt: skip
