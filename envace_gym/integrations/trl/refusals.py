"""TRL settings that world-rehearsal rollouts would not apply, refused by name instead of ignored."""

from __future__ import annotations

import os
from typing import Any

from ...errors import TrainingConfigError

# GRPOConfig settings that world-rehearsal rollouts do not apply (they sample with temperature, top_p and
# max_completion_length only, render with the tokenizer's own chat template and play episodes to max_turns), with
# the values that mean "left unset".
UNUSED_BY_ROLLOUTS: dict[str, tuple[Any, ...]] = {
    "top_k": (0, None), "min_p": (None,), "repetition_penalty": (1.0, None), "generation_kwargs": (None, {}),
    "chat_template_kwargs": (None, {}), "cache_implementation": (None,), "max_tool_calling_iterations": (None,),
    "vllm_structured_outputs_regex": (None,), "use_transformers_paged": (False,),
    "use_transformers_continuous_batching": (False,), "transformers_continuous_batching_config": (None, {}),
}  # fmt: skip


# ... and those EnvACEGRPOTrainer's own generation step does not apply either: its advantages are role-wise
# (A = R - mean of the group's rows of the same role), its episode reward the weighted sum of the reward functions.
UNUSED_BY_ENVACE_TRAINER: dict[str, tuple[Any, ...]] = {
    **UNUSED_BY_ROLLOUTS, "scale_rewards": ("none",), "mask_truncated_completions": (False,),
    "pad_to_multiple_of": ("auto", None), "multi_objective_aggregation": ("sum_then_normalize",),
}  # fmt: skip


def refuse_unused(args: Any, unused: dict[str, tuple[Any, ...]], what: str) -> None:
    """Refuse, naming them, the settings a user set that ``what`` would otherwise silently ignore."""
    given = [f"{k}={getattr(args, k)!r}" for k, unset in unused.items() if getattr(args, k, unset[0]) not in unset]
    if given:
        why = (
            "its advantages are role-wise (A = R - mean, scale_rewards='none') and its reward the weighted sum of "
            "the reward functions"
            if unused is UNUSED_BY_ENVACE_TRAINER
            else "TRL's own generation settings do not reach them"
        )
        raise TrainingConfigError(
            f"{what} does not apply {', '.join(given)}: its rollouts sample with temperature, top_p and "
            f"max_completion_length only, with the tokenizer's own chat template, and {why}. Leave these settings "
            "at their defaults."
        )


def sharding(args: Any) -> str | None:
    """The parameter sharding ``args`` asks for, from the settings alone (``accelerate launch`` says FSDP in the
    environment): ``"DeepSpeed ZeRO-3"``, ``"FSDP"`` or ``None`` (whole parameters on every rank: DDP, ZeRO-1/2)."""
    plugin = getattr(args, "deepspeed_plugin", None)
    fsdp = bool(getattr(args, "fsdp", None)) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true")
    return "DeepSpeed ZeRO-3" if getattr(plugin, "zero_stage", None) == 3 else "FSDP" if fsdp else None


def refuse_sharded(args: Any, what: str) -> None:
    """Sharded parameters are fine where rollouts never run the sharded model: with vLLM (TRL gathers the shards
    once per step to load the engine, and generation then runs no collective) and under ZeRO-3 with
    ``ds3_gather_for_generation`` (TRL gathers the whole model once for the rollout batch). What is left is
    refused before any model loads: FSDP without vLLM (TRL generates from the sharded layers, one all-gather per
    layer and forward, which needs every rank to generate in lockstep; a rank whose episodes take more turns
    would wait on the others forever), and ZeRO-3 with ``ds3_gather_for_generation=False`` (the same)."""
    sharded = sharding(args)
    if sharded is None or getattr(args, "use_vllm", False):
        return
    if sharded == "DeepSpeed ZeRO-3" and getattr(args, "ds3_gather_for_generation", True):
        return
    how = "FSDP" if sharded == "FSDP" else "DeepSpeed ZeRO-3 with ds3_gather_for_generation=False"
    raise TrainingConfigError(
        f"{what} cannot generate from sharded parameters ({how}) without vLLM: each forward would gather the "
        "layers from every rank, and a rank whose episodes take more turns would wait on the others. Use "
        "use_vllm=True (vllm_mode='colocate' or 'server': TRL gathers the shards once per step to load the "
        "engine), or DeepSpeed ZeRO-3 with ds3_gather_for_generation=True (the whole model gathered once per "
        "rollout batch)."
    )
