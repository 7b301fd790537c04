"""``PackedSFTConfig``: TRL's ``SFTConfig`` with the shared-prefix forward's settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import SFTConfig

from ...training.packing import DEFAULT_PACK_TOKENS


@dataclass
class PackedSFTConfig(SFTConfig):
    """``SFTConfig`` with the shared-prefix forward's two settings, read by :class:`PackedSFTTrainer` (as
    ``PackedGRPOConfig`` has them for the GRPO trainers)."""

    # Parameters that control the shared-prefix forward (as `envace train --shared_prefix --pack_tokens`)
    shared_prefix: bool = field(
        default=True,
        metadata={"help": "Encode the prefix that rows share once (exact; see envace_gym.training.packing)."},
    )
    pack_tokens: int = field(
        default=DEFAULT_PACK_TOKENS,
        metadata={"help": "Positions per packed forward; more packs than one are recomputed in the backward."},
    )
