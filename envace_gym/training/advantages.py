"""Role-wise GRPO advantages (docs/method.md: "Reward and objective").

Every generation is a training row carrying its episode's reward R. Rows are grouped by task (the G
episodes sampled for one task) *and* by role (Act rows, Rehearse rows; an ``inline`` episode row is its own
role). The advantage of a row is its reward minus the mean reward of the rows of the same role in the same
group; there is no division by the standard deviation.

Rows whose reward is ``None`` (the verifier could not judge) get advantage 0 and do not enter the means.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence


def rolewise_advantages(
    groups: Sequence[Hashable], roles: Sequence[str], rewards: Sequence[float | None]
) -> list[float]:
    """``A_i = R_i - mean{R_j : group_j == group_i, role_j == role_i, R_j is not None}``.

    >>> rolewise_advantages([0, 0, 0, 0], ["act", "act", "rehearse", "rehearse"], [1.0, 0.0, 1.0, 1.0])
    [0.5, -0.5, 0.0, 0.0]
    """
    if not len(groups) == len(roles) == len(rewards):
        raise ValueError("groups, roles and rewards must have the same length")
    totals: dict[tuple[Hashable, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for group, role, reward in zip(groups, roles, rewards, strict=True):
        if reward is not None:
            cell = totals[(group, role)]
            cell[0] += reward
            cell[1] += 1
    out = []
    for group, role, reward in zip(groups, roles, rewards, strict=True):
        if reward is None:
            out.append(0.0)
        else:
            total, count = totals[(group, role)]
            out.append(reward - total / count)
    return out
