"""``PackedSFTTrainer``: TRL's ``SFTTrainer`` with the shared-prefix forward and task-grouped batches, and
:func:`run_sft`, which sets it up for the SFT rows of :mod:`envace_gym.training.sft`."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from trl import SFTTrainer

from ...policy.precision import resolve_dtype
from ...training.options import checkpointing, lora_config, use_cpu
from ...training.packing import DEFAULT_PACK_TOKENS, completion_scores, packing_support, unwrap
from .model_card import BaseModelCardMixin
from .packed_sft_config import PackedSFTConfig


class TaskGroupedSampler(torch.utils.data.Sampler[int]):
    """Rows in a fresh random order each epoch, shuffled task by task: the rows of one task stay together,
    so the rows of a batch share their prompts' prefixes (which the shared-prefix forward encodes once)."""

    def __init__(self, groups: Sequence[Hashable], seed: int = 0) -> None:
        self.groups, self.seed, self.epoch = list(groups), seed, 0
        self._members: dict[Hashable, list[int]] = {}
        for i, g in enumerate(self.groups):
            self._members.setdefault(g, []).append(i)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self) -> Iterator[int]:
        keys = list(self._members)
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(keys))
        for k in order:
            yield from self._members[keys[k]]


class PackedSFTTrainer(BaseModelCardMixin, SFTTrainer):
    """TRL's ``SFTTrainer`` with the shared-prefix forward (:mod:`envace_gym.training.packing`) and task-grouped batches.

    The loss is TRL's (``loss_type`` ``"nll"`` or ``"dft"``: the token-mean over the completion tokens of the
    batch, normalized by ``num_items_in_batch``), with the same ``entropy`` and ``mean_token_accuracy``
    metrics; only the forward differs: a batch's rows are packed into prefix trees of at most ``pack_tokens``
    positions and logits are computed at completion positions only. Anything the packed path does not cover
    (label smoothing, a custom ``compute_loss_func``, MoE auxiliary losses, vision inputs, padding-free
    batches, a model whose attention cannot take the mask) goes through ``SFTTrainer.compute_loss`` as is.

    The forward's settings are :class:`PackedSFTConfig`'s ``shared_prefix`` and ``pack_tokens`` (with TRL's
    own ``SFTConfig``: on, and ``DEFAULT_PACK_TOKENS``).

    Args:
        row_groups: One key per dataset row (e.g. its task id); with the default random sampling, batches are
            drawn task by task (:class:`TaskGroupedSampler`) so their rows share prefixes.
    """

    def __init__(self, *args: Any, row_groups: Sequence[Hashable] | None = None, **kwargs: Any) -> None:
        self.row_groups = row_groups
        super().__init__(*args, **kwargs)

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        if self.row_groups is not None and self.args.train_sampling_strategy == "random":
            return TaskGroupedSampler(self.row_groups, seed=self.args.seed)
        return super()._get_train_sampler(train_dataset)

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ):
        rows = None if return_outputs or not self._packs(model, inputs) else _completion_rows(inputs)
        if not rows:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        mode = "train" if self.model.training else "eval"
        prompts, completions, weights = rows
        scores = completion_scores(
            model, prompts, completions, budget=getattr(self.args, "pack_tokens", DEFAULT_PACK_TOKENS)
        )
        logp, weight = torch.cat(scores.logprobs), torch.cat(weights).to(scores.logprobs[0].device)
        per_token = -logp
        if self.args.loss_type == "dft":  # DFT: each token's loss weighted by its (detached) probability
            per_token = per_token * logp.exp().detach()
        num_tokens = weight.sum() if num_items_in_batch is None else num_items_in_batch
        loss = (per_token * weight).sum() / torch.as_tensor(num_tokens).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())

        # TRL's metrics, over the completion tokens.
        gather = self.accelerator.gather_for_metrics
        valid = gather(weight.sum()).sum()
        entropy = gather((torch.cat(scores.entropies).detach() * weight).sum()).sum()
        correct = gather((torch.cat(scores.top1).float() * weight).sum()).sum()
        self._metrics[mode]["entropy"].append((entropy / valid).item() if valid > 0 else 0.0)
        self._metrics[mode]["mean_token_accuracy"].append((correct / valid).item() if valid > 0 else 0.0)
        if mode == "train":
            self._total_train_tokens += gather(inputs["attention_mask"].sum()).sum().item() // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        return loss

    def _packs(self, model: Any, inputs: dict[str, Any]) -> bool:
        """Whether this batch can take the packed path (else TRL's own forward runs)."""
        plain_keys = {"input_ids", "attention_mask", "labels", "use_cache"}
        return (
            getattr(self.args, "shared_prefix", True)
            and set(inputs) <= plain_keys
            and "attention_mask" in inputs
            and self.compute_loss_func is None
            and self.label_smoother is None
            and self.args.loss_type in ("nll", "dft")
            and not self.aux_loss_enabled
            and packing_support(unwrap(model)) is None
        )


def _completion_rows(inputs: dict[str, Any]) -> tuple[list[list[int]], list[list[int]], list[torch.Tensor]] | None:
    """Per row of a right-padded SFT batch: the tokens before its first labelled one, the tokens from there
    to its end, and which of those carry a label (1.0) or not (0.0). ``None`` if no row has a label."""
    prompts, completions, weights = [], [], []
    for ids, mask, labels in zip(inputs["input_ids"], inputs["attention_mask"], inputs["labels"], strict=True):
        n = int(mask.sum())
        labelled = torch.nonzero(labels[:n] != -100).flatten()
        if len(labelled) == 0 or int(labelled[0]) == 0:  # nothing to learn, or no context before it
            start = n if len(labelled) == 0 else 1
        else:
            start = int(labelled[0])
        prompts.append(ids[:start].tolist())
        completions.append(ids[start:n].tolist())
        weights.append((labels[start:n] != -100).float())
    return (prompts, completions, weights) if any(len(c) for c in completions) else None


def sft_config(
    output_dir: str,
    *,
    epochs: float = 1.0,
    learning_rate: float = 5e-5,
    batch_size: int = 4,
    report_to: str = "none",
    seed: int = 0,
    max_steps: int = -1,
    logging_steps: int = 5,
    save_steps: int | None = None,
    dtype: str | torch.dtype = "auto",
    gradient_checkpointing: bool = False,
    shared_prefix: bool = True,
    pack_tokens: int = DEFAULT_PACK_TOKENS,
    gradient_accumulation_steps: int = 1,
    lr_scheduler_type: str = "linear",
    warmup_steps: float = 0,
) -> PackedSFTConfig:
    """The :class:`PackedSFTConfig` of an SFT run on the rows of :mod:`envace_gym.training.sft` (completion-only loss,
    rows pre-tokenized, the last checkpoint kept). ``epochs`` rule unless ``max_steps`` is positive; ``dtype``
    ``"auto"`` computes in bfloat16 where the hardware has native bfloat16 (float32 master weights either way, see
    :mod:`envace_gym.policy.precision`)."""
    cpu = use_cpu()
    return PackedSFTConfig(
        output_dir=output_dir,
        num_train_epochs=epochs,
        max_steps=max_steps,
        learning_rate=learning_rate,
        lr_scheduler_type=lr_scheduler_type,
        warmup_steps=warmup_steps,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        completion_only_loss=True,
        max_length=None,
        logging_steps=logging_steps,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        save_total_limit=1,  # resuming needs the last checkpoint only; every one of them fills the disk
        report_to=report_to,
        use_cpu=cpu,
        bf16=resolve_dtype(dtype, "cpu" if cpu else "cuda") == torch.bfloat16,
        **checkpointing(gradient_checkpointing),
        seed=seed,
        dataset_kwargs={"skip_prepare_dataset": False},
        shared_prefix=shared_prefix,
        pack_tokens=pack_tokens,
    )


def run_sft(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    output_dir: str | None = None,
    *,
    args: PackedSFTConfig | None = None,
    lora: bool = False,
    lora_r: int = 16,
    resume: bool | str = False,
    **settings: Any,
) -> Any:
    """Fine-tune ``model`` on the completions of ``dataset`` with :class:`PackedSFTTrainer`; returns the trainer
    (``trainer.model`` is the fine-tuned model; with ``lora`` the adapters are merged before saving).

    ``args``: the trainer's config; without it, :func:`sft_config` of ``output_dir`` and ``settings`` (its
    keywords: ``epochs``, ``learning_rate``, ``batch_size``, ``max_steps``, ``dtype``, ...)."""
    if args is None:
        if output_dir is None:
            raise TypeError("run_sft needs output_dir, or args")
        args = sft_config(output_dir, **settings)
    elif settings or output_dir is not None:
        raise TypeError(f"run_sft takes args or its settings, not both: {sorted(settings) or ['output_dir']}")
    peft_config = lora_config(lora_r) if lora else None
    groups = dataset["task_id"] if "task_id" in dataset.column_names else None
    trainer = PackedSFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset.remove_columns([c for c in ("role", "task_id") if c in dataset.column_names]),
        processing_class=tokenizer,
        peft_config=peft_config,
        row_groups=groups,
    )
    print(_plan_line(len(dataset), groups, trainer), flush=True)
    trainer.train(resume_from_checkpoint=resume or None)
    if lora:
        trainer.model = trainer.model.merge_and_unload()
    return trainer


def _plan_line(rows: int, groups: Any, trainer: Any) -> str:
    """What the run will do, said before it starts: rows, batches, epochs, optimizer steps."""
    epochs, max_steps = trainer.args.num_train_epochs, trainer.args.max_steps
    per_step = (
        trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps
        * trainer.accelerator.num_processes
    )  # fmt: skip
    per_epoch = max(1, math.ceil(rows / per_step))
    tasks = f" of {len(set(groups))} tasks" if groups is not None else ""
    if max_steps > 0:
        plan = f"{max_steps} optimizer steps (--steps; {max_steps / per_epoch:.2f} epochs)"
    else:
        plan = f"{epochs:g} epochs = {math.ceil(per_epoch * epochs)} optimizer steps"
    return f"envace sft: {rows} rows{tasks}, batches of {per_step} rows, {plan}"
