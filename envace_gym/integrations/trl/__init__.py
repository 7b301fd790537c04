"""World rehearsal in TRL's trainers (trl >= 1.16), laid out as TRL lays out its trainers: a config module
beside each trainer module.

Three ways in, from least to most EnvACE:

* :class:`RealToolsBaseline` — standard GRPO with a domain's **real** tools in TRL's own tool loop: its
  dataset, ``environment_factory`` and reward, built together (``real_tools.py``); train it with
  :class:`PackedGRPOTrainer`.
* :func:`make_rollout_func` — a ``rollout_func`` that plays each prompt (a task id, already repeated G times
  by TRL) as a world-rehearsal episode and returns one row per episode (``rollout_func.py``); rewards reach
  TRL through :func:`envace_reward` (``None`` for a verifier that could not judge: TRL masks it).
* :class:`EnvACEGRPOTrainer` + :class:`EnvACEGRPOConfig` — the paper's **role-wise GRPO** in ``separate``
  mode: every Act turn and every rehearsal is its own row, A = R - mean(R of that role in the group)
  (``envace_grpo_trainer.py``, ``envace_grpo_config.py``).

The SFT warm start: :class:`PackedSFTTrainer` + :class:`PackedSFTConfig`, TRL's ``SFTTrainer`` with the same
forward on the rows of :mod:`envace_gym.training.sft`, set up by :func:`run_sft` (``packed_sft_trainer.py``,
``packed_sft_config.py``); :func:`warm_start` is the quick run's short SFT before either GRPO path. The
trainers name the model a run started from in their model cards
(``model_card.py``).

Both GRPO trainers here compute their log-probabilities with the shared-prefix forward (``shared_prefix.py``),
and with ``use_vllm=True`` generate with TRL's colocated engine, on vLLM's CPU backend too
(``colocated_vllm.py``). The dataset of task ids is :func:`task_dataset` (``dataset.py``); the trainer's
weights and sampling reach the collector through ``trainer_policy.py``; the TRL settings rollouts would not
apply are refused by name (``refusals.py``).
"""

from .colocated_vllm import ColocatedVLLMMixin
from .dataset import task_dataset
from .envace_grpo_config import EnvACEGRPOConfig, paper_objective
from .envace_grpo_trainer import EnvACEGRPOTrainer
from .packed_grpo_config import PackedGRPOConfig
from .packed_grpo_trainer import PackedGRPOTrainer
from .packed_sft_config import PackedSFTConfig
from .packed_sft_trainer import PackedSFTTrainer, TaskGroupedSampler, run_sft, sft_config
from .real_tools import RealToolsBaseline, real_tools_environment, real_tools_reward
from .rollout_func import envace_reward, make_rollout_func
from .shared_prefix import SharedPrefixMixin
# the quick run's short SFT, for either GRPO path here, and the from-scratch model it can start from (docs/training.md)
from ...training.sft import FROM_SCRATCH_WARM_START, WarmStartSettings, tiny_start_model, warm_start

__all__ = [
    "FROM_SCRATCH_WARM_START",
    "ColocatedVLLMMixin",
    "EnvACEGRPOConfig",
    "EnvACEGRPOTrainer",
    "PackedGRPOConfig",
    "PackedGRPOTrainer",
    "PackedSFTConfig",
    "PackedSFTTrainer",
    "RealToolsBaseline",
    "SharedPrefixMixin",
    "TaskGroupedSampler",
    "WarmStartSettings",
    "envace_reward",
    "make_rollout_func",
    "paper_objective",
    "real_tools_environment",
    "real_tools_reward",
    "run_sft",
    "sft_config",
    "task_dataset",
    "tiny_start_model",
    "warm_start",
]
