"""Training on rollouts in plain torch: role-wise GRPO advantages, the shared-prefix forward, the pure-torch
trainer and the SFT warm start's rows (and its plain-torch loop). TRL's trainers (GRPO, and SFT with this forward)
live in :mod:`envace_gym.integrations.trl`; ``envace train`` in :mod:`envace_gym.recipes.train`. Nothing here
imports trl.
"""

from __future__ import annotations

from .advantages import rolewise_advantages
from .packing import DEFAULT_PACK_TOKENS, completion_logprobs, completion_scores, packing_support, plan_packs
from .diagnosis import NoLearningMonitor, NoLearningWarning
from .sft import sft_dataset, sft_rows, sft_steps, warm_start
from .trainer import TrainerConfig, grpo_loss

__all__ = [
    "DEFAULT_PACK_TOKENS",
    "NoLearningMonitor",
    "NoLearningWarning",
    "TrainerConfig",
    "completion_logprobs",
    "completion_scores",
    "grpo_loss",
    "packing_support",
    "plan_packs",
    "rolewise_advantages",
    "sft_dataset",
    "sft_rows",
    "sft_steps",
    "warm_start",
]
