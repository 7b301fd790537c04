"""``PackedGRPOTrainer``: TRL's ``GRPOTrainer`` with the shared-prefix forward and a colocated vLLM engine that
also trains on a CPU; the trainer of the real-tools baseline and of any ``make_rollout_func`` run."""

from __future__ import annotations

from trl import GRPOTrainer

from .model_card import BaseModelCardMixin
from .colocated_vllm import ColocatedVLLMMixin
from .shared_prefix import SharedPrefixMixin


class PackedGRPOTrainer(BaseModelCardMixin, ColocatedVLLMMixin, SharedPrefixMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` (the real-tools baseline, or any GRPO run: a :func:`make_rollout_func` one too) with
    the shared-prefix forward and, with ``use_vllm``, a colocated engine that also trains on a CPU; give it a
    :class:`PackedGRPOConfig` to set the packing, or a plain ``GRPOConfig`` for the defaults."""

