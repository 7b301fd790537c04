"""``PackedSFTConfig``: TRL's ``SFTConfig`` with the shared-prefix forward's settings."""

from __future__ import annotations

from dataclasses import dataclass

from trl import SFTConfig

from ...training.packing import PackingSettings


@dataclass
class PackedSFTConfig(SFTConfig, PackingSettings):
    """``SFTConfig`` with the shared-prefix forward's two settings, read by :class:`PackedSFTTrainer` (as
    ``PackedGRPOConfig`` has them for the GRPO trainers)."""
