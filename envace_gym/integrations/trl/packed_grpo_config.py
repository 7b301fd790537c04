"""``PackedGRPOConfig``: TRL's ``GRPOConfig`` with the shared-prefix forward's settings and CPU-aware defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from ...policy.precision import resolve_dtype
from ...training.packing import PackingSettings


@dataclass
class PackedGRPOConfig(GRPOConfig, PackingSettings):
    """``GRPOConfig`` with the shared-prefix forward's two settings (read by :class:`SharedPrefixMixin`), and two
    defaults of its own: ``bf16`` unset means bfloat16 only where the hardware has it natively
    (:func:`envace_gym.policy.precision.resolve_dtype`; TRL's default is ``True``, which on a CPU without native
    bfloat16 runs ~14x slower: docs/performance.md), and gradient checkpointing is off (TRL's default is on; the
    packs bound memory, ``activation_checkpointing=True`` lowers it further at some cost in time)."""

    # Parameters whose default values are overridden from GRPOConfig
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing (default: off)."}
    )

    def __post_init__(self) -> None:
        if self.bf16 is None and not self.fp16:
            on_gpu = torch.cuda.is_available() and not self.use_cpu
            self.bf16 = resolve_dtype("auto", "cuda" if on_gpu else "cpu") == torch.bfloat16
        super().__post_init__()

