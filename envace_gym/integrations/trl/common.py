"""What the ``rollout_func`` path and :class:`EnvACEGRPOTrainer` share: the dataset of task ids, the trainer's
weights as a policy, TRL's sampling settings as the collector's, and the settings neither applies."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from ...domains.domain import Domain
from ...domains.registry import make_domain
from ...errors import TrainingConfigError
from ...policy.protocol import Policy, SamplingParams
from ...policy.transformers import TransformersPolicy
from ...rehearsal.prompt import RehearsalConfig, rollout_sampling


def task_dataset(domain: str | Domain, split: str = "train", size: int | None = None, conversational: bool = False):
    """A ``datasets.Dataset`` with one row per task: ``prompt`` (the task id, or with ``conversational`` the
    task's system and first user message, as TRL's tool loop needs) and ``task_id``."""
    from datasets import Dataset

    dom = make_domain(domain)
    tasks = dom.tasks(split)
    tasks = tasks[: size if size is not None else len(tasks)]
    rows = []
    for task in tasks:
        prompt: Any = task.id
        if conversational:
            prompt = [
                {"role": "system", "content": task.system_prompt or dom.system_prompt},
                {"role": "user", "content": task.prompt},
            ]
        rows.append({"prompt": prompt, "task_id": task.id})
    return Dataset.from_list(rows)


def task_ids(prompts: Sequence[Any]) -> list[str]:
    ids = []
    for p in prompts:
        if not isinstance(p, str):
            raise ValueError("world-rehearsal rollouts need task ids as prompts: build the dataset with task_dataset()")
        ids.append(p)
    return ids


def trainer_policy(trainer: Any) -> Policy:
    """The trainer's model (the weights being trained) as a Policy; cached per trainer. With ``use_vllm`` it is
    TRL's colocated engine (which the trainer loads its weights into once per optimizer step). Otherwise the
    model itself: with ``bf16`` it samples under the same autocast as the loss, so the recorded log-probs are the
    ones the loss recomputes."""
    if getattr(trainer.args, "use_vllm", False):
        policy = getattr(trainer, "_envace_policy", None)
        if policy is None:
            from ...policy.vllm import VLLMPolicy

            policy = VLLMPolicy.from_engine(trainer.vllm_generation.llm, trainer.processing_class)
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


def trl_sampling(args: Any) -> tuple[SamplingParams, RehearsalConfig]:
    """Both roles' sampling from TRL's settings: ``max_completion_length`` is each generation's budget."""
    tokens = getattr(args, "max_completion_length", 256) or 256
    return rollout_sampling(tokens, getattr(args, "temperature", 1.0), getattr(args, "top_p", 1.0) or 1.0)


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


def refuse_sharded(args: Any, what: str) -> None:
    """Rollouts generate with the trained model's own parameters, many calls per step, one episode driver per
    process: parameters sharded across processes (DeepSpeed ZeRO-3, FSDP) are not gathered for them, and
    processes whose episodes take different numbers of turns would wait on each other forever. Refused, from
    the settings alone (``accelerate launch`` says FSDP in the environment), before any model is loaded."""
    plugin = getattr(args, "deepspeed_plugin", None)
    fsdp = bool(getattr(args, "fsdp", None)) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true")
    sharding = "DeepSpeed ZeRO-3" if getattr(plugin, "zero_stage", None) == 3 else "FSDP" if fsdp else None
    if sharding is not None:
        raise TrainingConfigError(
            f"{what} cannot generate from sharded parameters ({sharding}): its rollouts call the trained model's "
            "generate many times per step, and a rank whose episodes take more turns would wait on the others. "
            "Use data parallelism (accelerate launch --multi_gpu), DeepSpeed ZeRO-1/2, LoRA (peft_config) or "
            "--train_layers to fit the model."
        )

