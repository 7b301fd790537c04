"""A ``rollout_func`` for TRL's ``GRPOTrainer``: each prompt (a task id) played to the end as one world-rehearsal
episode, returned as one row (``inline`` mode trains Act and Rehearse tokens in it; ``separate`` mode the Act
tokens, the rehearsals staying context), with :func:`envace_reward` as the reward function."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from ...domains.domain import Domain
from ...domains.registry import make_domain
from ...episode.config import EpisodeConfig
from ...episode.types import Row
from ...rollout.collector import EpisodeResult, collect_rollouts
from ...training.diagnosis import NoLearningMonitor, episode_facts, step_evidence
from .colocated_vllm import refuse_vllm_settings
from .dataset import task_ids
from .refusals import UNUSED_BY_ROLLOUTS, refuse_sharded, refuse_unused
from .trainer_policy import rollout_weights, trl_sampling


def envace_reward(
    prompts: Any = None, completions: Any = None, episode_reward: Sequence[float | None] | None = None, **kwargs: Any
) -> list[float | None]:
    """Reward function for the ``rollout_func`` path: each episode's task-success reward, computed by the
    domain at the end of the episode (``None``, masked by TRL, when the verifier could not judge)."""
    if episode_reward is None:
        raise ValueError("envace_reward needs the 'episode_reward' field that make_rollout_func returns")
    return [None if r is None else float(r) for r in episode_reward]


def make_rollout_func(domain: str | Domain, config: EpisodeConfig | None = None, **settings: Any):
    """A ``rollout_func`` for ``GRPOTrainer``: each prompt (a task id) is played to the end as an EnvACE episode
    with the model being trained; returns ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask`` and,
    for the reward functions, ``episode_reward``, ``success`` and ``task_id``.

    ``config`` and ``settings`` say how episodes are played, as for :func:`~envace_gym.rollout.collect_rollouts`
    (default ``rehearsal_mode="inline"``: the row trains both roles); the sampling is the trainer's. A simulated
    user is refused: its turns would have no row here (``EnvACEGRPOTrainer`` trains with one)."""
    dom = make_domain(domain)
    config = EpisodeConfig.build(config or EpisodeConfig(rehearsal_mode="inline"), **settings)
    if config.user not in (None, "scripted"):
        raise ValueError("make_rollout_func plays scripted users only (one row per prompt); use EnvACEGRPOTrainer")
    no_learning = NoLearningMonitor("make_rollout_func")  # one warning per run (training.diagnosis)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        refuse_vllm_settings(trainer.args, "make_rollout_func's rollouts")
        refuse_sharded(trainer.args, "make_rollout_func's rollouts")
        refuse_unused(trainer.args, UNUSED_BY_ROLLOUTS, "make_rollout_func's rollouts")
        act, rehearsal = trl_sampling(trainer.args)
        with rollout_weights(trainer) as policy:  # gathered once (ZeRO-3), or the engine awake (sleep mode)
            batch = collect_rollouts(
                policy, dom, task_ids(prompts), 1, config, act_sampling=act, rehearsal=rehearsal,
                seed=int(torch.randint(2**31, (1,)).item()), unfit="raise",  # TRL needs one row per prompt
            )  # fmt: skip
        rows = [_ended_row(e, policy.stop_ids) for e in batch.episodes]
        model = getattr(trainer, "model", None)
        if model is None or model.training:  # TRL repeats each prompt num_generations times: its runs of G are groups
            size = getattr(trainer, "num_generations", None) or trainer.args.num_generations
            groups, seen = [], {}
            for e in batch.episodes:
                groups.append((e.task_id, seen.get(e.task_id, 0) // size))
                seen[e.task_id] = seen.get(e.task_id, 0) + 1
            facts = [episode_facts(e.calls) for e in batch.episodes]
            # this process's episodes; inline mode has no rehearse rows (rehearsals train inside the episode's row)
            no_learning.observe(
                step_evidence(groups, [e.reward for e in batch.episodes], facts),
                emit=getattr(getattr(trainer, "accelerator", None), "is_main_process", True),
            )
        return {
            "prompt_ids": [list(r.prompt_ids) for r in rows],
            "completion_ids": [list(r.completion_ids) for r in rows],
            "logprobs": [list(r.logprobs) for r in rows],
            # a masked episode (reward None) trains nothing: TRL multiplies its loss by env_mask
            "env_mask": [
                list(r.mask) if e.reward is not None else [0] * len(r.mask)
                for r, e in zip(rows, batch.episodes, strict=True)
            ],
            "episode_reward": [e.reward for e in batch.episodes],
            "success": [e.success for e in batch.episodes],
            "task_id": [e.task_id for e in batch.episodes],
        }

    return rollout_func


def _ended_row(episode: EpisodeResult, stop_ids: Sequence[int]) -> Row:
    """The episode's row as TRL should read it. TRL calls a completion truncated (``completions/clipped_ratio``;
    dropped by ``mask_truncated_completions``) when its last token is not an end token; an episode that ended on
    its own but whose last tokens are not one (an invalid rehearsal cut at its budget, in inline mode) gets an
    end token appended, untrained (mask 0), so only episodes stopped by a limit look truncated."""
    row = episode.episode_row
    if episode.truncated or not stop_ids or not row.completion_ids or row.completion_ids[-1] in stop_ids:
        return row
    return replace(
        row,
        completion_ids=(*row.completion_ids, stop_ids[0]),
        logprobs=(*row.logprobs, 0.0),
        mask=(*row.mask, 0),
    )

