"""The trainer as the collector's source: its weights as a :class:`~envace_gym.policy.Policy`, TRL's sampling
settings as both roles' sampling."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ...policy.protocol import Policy, SamplingParams
from ...policy.transformers import TransformersPolicy
from ...rehearsal.prompt import RehearsalConfig, rollout_sampling


def trainer_policy(trainer: Any) -> Policy:
    """The trainer's model (the weights being trained) as a Policy; cached per trainer. With ``use_vllm`` it is
    TRL's colocated engine, or in ``vllm_mode="server"`` the servers (which the trainer loads its weights into
    once per optimizer step). Otherwise the model itself: with ``bf16`` it samples under the same autocast as the
    loss, so the recorded log-probs are the ones the loss recomputes."""
    if getattr(trainer.args, "use_vllm", False):
        policy = getattr(trainer, "_envace_policy", None)
        if policy is None:
            policy = _vllm_policy(trainer)
            trainer._envace_policy = policy
        return policy
    model = trainer.accelerator.unwrap_model(trainer.model)
    policy = getattr(trainer, "_envace_policy", None)
    if policy is None or policy.model is not model:
        policy = TransformersPolicy(
            model, trainer.processing_class, max_context=getattr(model.config, "max_position_embeddings", None),
            compute_dtype=torch.bfloat16 if getattr(trainer.args, "bf16", False) else None,
        )  # fmt: skip
        trainer._envace_policy = policy
    return policy


@contextlib.contextmanager
def rollout_weights(trainer: Any) -> Iterator[Policy]:
    """The trainer's current weights as a Policy, ready for one batch of rollouts (every generation of a step).

    With vLLM the engine already holds them (TRL loads it once per step, gathering ZeRO-3 or FSDP shards as it
    goes); in sleep mode its KV cache is woken for the batch and the engine put back to sleep after it (level 2,
    as TRL does: its weights are loaded again at the next wake). Without vLLM, TRL's
    ``unwrap_model_for_generation`` gathers ZeRO-3 shards once for the whole batch (``ds3_gather_for_generation``;
    ``refusals.refuse_sharded`` refuses what would gather per forward), so generation runs no collective and
    ranks whose episodes take different numbers of turns never wait on each other."""
    args = trainer.args
    if getattr(args, "use_vllm", False):
        generation = trainer.vllm_generation
        sleeps = getattr(args, "vllm_mode", "colocate") == "colocate" and getattr(args, "vllm_enable_sleep_mode", False)
        if sleeps:
            if getattr(generation, "_llm_weights_sleeping", False):
                generation.sync_weights()  # wakes the weights and loads the current ones
            generation.llm.wake_up(tags=["kv_cache"])
        try:
            yield trainer_policy(trainer)
        finally:
            if sleeps:
                generation.llm.sleep(level=2)
                generation._llm_weights_sleeping = True
        return
    from trl.models import unwrap_model_for_generation

    gather = getattr(args, "ds3_gather_for_generation", True)
    with unwrap_model_for_generation(
        trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=gather,
        gradient_checkpointing_kwargs=getattr(args, "gradient_checkpointing_kwargs", None),
    ):  # fmt: skip
        yield trainer_policy(trainer)


def _vllm_policy(trainer: Any) -> Policy:
    if getattr(trainer.args, "vllm_mode", "colocate") == "server":
        policy = getattr(trainer.vllm_generation, "policy", None)  # the package's trainers: ServerVLLMGeneration's
        if policy is None:  # TRL's own GRPOTrainer: its client syncs the weights (NCCL), the policy generates
            from ...policy.vllm_server import VLLMServerPolicy
            from .server_vllm import server_urls

            policy = VLLMServerPolicy(
                server_urls(trainer.args), trainer.processing_class, connect_timeout=trainer.args.vllm_server_timeout
            )
        return policy
    from ...policy.vllm import VLLMPolicy

    return VLLMPolicy.from_engine(trainer.vllm_generation.llm, trainer.processing_class)


def trl_sampling(args: Any) -> tuple[SamplingParams, RehearsalConfig]:
    """Both roles' sampling from TRL's settings: ``max_completion_length`` is each generation's budget."""
    tokens = getattr(args, "max_completion_length", 256) or 256
    return rollout_sampling(tokens, getattr(args, "temperature", 1.0), getattr(args, "top_p", 1.0) or 1.0)
