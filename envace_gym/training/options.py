"""Two settings every training entry point (``run_sft``, ``envace train``) resolves the same way: where training
runs, and the LoRA adapters ``--lora`` trains."""

from __future__ import annotations

from typing import Any

import torch


def use_cpu() -> bool:
    """Train on the CPU when no CUDA device is visible (TRL's ``use_cpu``)."""
    return not torch.cuda.is_available()


def lora_config(r: int) -> Any:
    """peft's ``LoraConfig`` of rank ``r`` on every linear layer of a causal LM, with ``lora_alpha = 2r``."""
    if r < 1:
        raise ValueError(f"the LoRA rank must be at least 1, got {r}")
    from peft import LoraConfig  # peft is optional: loaded only when LoRA is asked for

    return LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM")


__all__ = ["lora_config", "use_cpu"]
