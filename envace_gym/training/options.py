"""Settings every training entry point (``run_sft``, ``sft_steps``, ``envace train``, ``envace experiment``)
resolves the same way: where training runs, the LoRA adapters ``--lora`` trains, and which layers
``--train_layers`` leaves trainable."""

from __future__ import annotations

from typing import Any

import torch


def use_cpu() -> bool:
    """Train on the CPU when no CUDA device is visible (TRL's ``use_cpu``)."""
    return not torch.cuda.is_available()


def checkpointing(on: bool) -> dict[str, bool]:
    """transformers' setting for recomputing layers in the backward pass, under its name in the installed
    version: ``activation_checkpointing`` (5.20 and later) or ``gradient_checkpointing`` (before: vLLM pins
    an older transformers)."""
    from transformers import TrainingArguments

    named = "activation_checkpointing" in TrainingArguments.__dataclass_fields__
    return {"activation_checkpointing" if named else "gradient_checkpointing": on}


def enable_checkpointing(model: Any) -> Any:
    """Make ``model`` recompute its layers in the backward pass (the memory of one layer's activations instead
    of all of them; the same gradients), under the method's name in the installed transformers. Returns it."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.20 and later
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def lora_config(r: int) -> Any:
    """peft's ``LoraConfig`` of rank ``r`` on every linear layer of a causal LM, with ``lora_alpha = 2r``."""
    if r < 1:
        raise ValueError(f"the LoRA rank must be at least 1, got {r}")
    from peft import LoraConfig  # peft is optional: loaded only when LoRA is asked for

    return LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM")


def train_top_layers(model: Any, layers: int | None) -> Any:
    """Freeze all of ``model`` but its top ``layers`` decoder layers and the final norm (a CPU budget option);
    ``None`` leaves everything trainable. Returns the model."""
    if layers is None:
        return model
    decoder = model.get_decoder()
    model.requires_grad_(False)
    for layer in decoder.layers[len(decoder.layers) - layers :]:
        layer.requires_grad_(True)
    decoder.norm.requires_grad_(True)
    return model


__all__ = ["enable_checkpointing", "lora_config", "train_top_layers", "use_cpu"]
