"""Why a step learns nothing: one warning per run that names the cause, read from the step's episodes, and the
remedy.

GRPO learns from a group only when its episodes earn different rewards. A model that has never seen the domain
writes no tool call, so every episode of every group scores alike (``frac_reward_zero_std`` 1, ``loss`` 0,
``grad_norm`` 0) and, with no valid call, nothing is rehearsed (``rows/rehearse`` 0). The metrics say *that*;
:class:`NoLearningMonitor` says *why* and what to do, once per run, from every trainer: ``envace train``
(through :class:`~envace_gym.integrations.trl.EnvACEGRPOTrainer`), ``EnvACEGRPOTrainer`` itself, a
:func:`~envace_gym.integrations.trl.make_rollout_func` run and the pure-torch trainer
(:func:`envace_gym.training.train`, which ``envace experiment`` runs).
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from ..domains.trajectory import CallRecord
from ..errors import ErrorCode

WARM_START = (
    "warm-start on the domain's reference rows first: `envace train --warm_start sft ...`, or in Python "
    "`envace_gym.integrations.trl.warm_start(model, domain, output_dir)` and train the model it returns "
    "(docs/training.md, \"The quick run\")"
)


class NoLearningWarning(UserWarning):
    """A training step gave GRPO nothing to learn from; the message names the cause and the remedy."""


@dataclass(frozen=True)
class StepEvidence:
    """What one step's episodes (over all processes) say about whether it can learn."""

    groups: int  # scored groups
    spread_groups: int  # groups whose scored episodes earned different rewards
    rewards: tuple[float, ...]  # the distinct rewards of the step's scored episodes
    calls_written: int  # tool calls the agent wrote, malformed ones included
    valid_calls: int  # of those, the ones that passed format, whitelist and schema checks
    rehearsals: int  # calls the policy rehearsed
    invalid_rehearsals: int  # of those, the ones whose rehearsal was invalid


def episode_facts(calls: Iterable[CallRecord]) -> tuple[int, int, int, int]:
    """One episode's (calls written, valid calls, rehearsals, invalid rehearsals), from its call records
    (``EpisodeResult.calls``); calls a simulated user made with tools of its own are not the agent's."""
    written = valid = rehearsed = invalid = 0
    for call in calls:
        if call.requestor != "assistant":
            continue
        written += 1
        valid += call.validated
        if call.route == "rehearsal":
            rehearsed += 1
            invalid += call.error is not None and call.error.code is ErrorCode.INVALID_REHEARSAL
    return written, valid, rehearsed, invalid


def step_evidence(
    groups: Sequence[Hashable], rewards: Sequence[float | None], facts: Sequence[tuple[int, int, int, int]]
) -> StepEvidence:
    """The :class:`StepEvidence` of a step: each episode's group, reward (``None``: masked) and
    :func:`episode_facts`."""
    by_group: dict[Hashable, set[float]] = {}
    for group, reward in zip(groups, rewards, strict=True):
        if reward is not None:
            by_group.setdefault(group, set()).add(round(float(reward), 9))
    totals = [sum(f[i] for f in facts) for i in range(4)]
    return StepEvidence(
        groups=len(by_group),
        spread_groups=sum(len(r) > 1 for r in by_group.values()),
        rewards=tuple(sorted(set().union(*by_group.values()))) if by_group else (),
        calls_written=totals[0],
        valid_calls=totals[1],
        rehearsals=totals[2],
        invalid_rehearsals=totals[3],
    )


def diagnose(evidence: StepEvidence, rehearse_rows: int | None = None) -> str | None:
    """Why the step of ``evidence`` learns nothing (or its Rehearse role nothing), with the remedy; ``None`` when
    some group has a reward spread and, where the run trains rehearse rows (``rehearse_rows`` given), it has some.
    """
    if evidence.groups == 0:
        return None  # every episode masked: the trainers count and report that already
    if evidence.spread_groups == 0:
        same = ", ".join(f"{r:g}" for r in evidence.rewards)
        head = f"no group of this step has a reward spread (every episode of each group earned the same: {same}), "
        if evidence.valid_calls == 0:
            written = (
                "none wrote any tool call"
                if evidence.calls_written == 0
                else f"its {evidence.calls_written} call(s) were all malformed or invalid"
            )
            return (
                f"{head}because no episode wrote a valid tool call ({written}): the model does not yet know this "
                f"domain's call format, so GRPO has nothing to compare. Remedy: {WARM_START}."
            )
        if evidence.rehearsals and evidence.invalid_rehearsals == evidence.rehearsals:
            return (
                f"{head}and every one of the {evidence.rehearsals} rehearsal(s) was invalid: the model does not yet "
                f"write this domain's tool results. Remedy: {WARM_START}."
            )
        if max(evidence.rewards) >= 1.0 and len(evidence.rewards) == 1:
            return (
                f"{head}because every episode earned full marks: these tasks are solved. Remedy: harder tasks, or "
                "stop training here."
            )
        return (
            f"{head}although {evidence.valid_calls} valid call(s) were made: all episodes of every group failed (or "
            "passed) alike. Remedy: a reward with partial credit (`expected['weights']` over several checks, or "
            f"your own `score`), a larger group_size or a higher temperature; or {WARM_START}."
        )
    if rehearse_rows == 0:
        why = (
            "every rehearsal was invalid"
            if evidence.rehearsals and evidence.invalid_rehearsals == evidence.rehearsals
            else "no valid call was rehearsed"
        )
        return (
            f"no rehearse rows in this step ({why}): only the Act role trains, the Rehearse role learns nothing. "
            f"Remedy: {WARM_START}."
        )
    return None


class NoLearningMonitor:
    """Warns (:class:`NoLearningWarning`) at the first step :func:`diagnose` finds nothing to learn from, and
    never again in the run: a trainer holds one."""

    def __init__(self, who: str = "envace") -> None:
        self.who = who
        self.warned: str | None = None  # the message, once given

    def observe(self, evidence: StepEvidence, rehearse_rows: int | None = None, *, emit: bool = True) -> str | None:
        """Diagnose one step; warn if it is the run's first diagnosis (and ``emit``: the main process only)."""
        if self.warned is not None:
            return None
        found = diagnose(evidence, rehearse_rows)
        if found is not None:
            self.warned = found
            if emit:
                warnings.warn(f"{self.who}: {found}", NoLearningWarning, stacklevel=2)
        return found


__all__ = ["NoLearningMonitor", "NoLearningWarning", "StepEvidence", "diagnose", "episode_facts", "step_evidence"]
