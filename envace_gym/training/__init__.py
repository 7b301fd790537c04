"""Training on rollouts: role-wise GRPO advantages, the shared-prefix forward, the pure-torch trainer and the
SFT warm start. TRL's GRPO lives in :mod:`envace_gym.integrations.trl`; ``envace train`` in :mod:`envace_gym.recipes.train`.
"""

from __future__ import annotations

from .advantages import rolewise_advantages
from .packing import DEFAULT_PACK_TOKENS, completion_logprobs, completion_scores, packing_support, plan_packs
from .sft import PackedSFTTrainer, TaskGroupedSampler, run_sft, sft_dataset, sft_rows
from .trainer import TrainerConfig, grpo_loss

__all__ = [
    "DEFAULT_PACK_TOKENS",
    "PackedSFTTrainer",
    "TaskGroupedSampler",
    "TrainerConfig",
    "completion_logprobs",
    "completion_scores",
    "grpo_loss",
    "packing_support",
    "plan_packs",
    "rolewise_advantages",
    "run_sft",
    "sft_dataset",
    "sft_rows",
]
