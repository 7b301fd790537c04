"""SFT warm start on a domain's reference trajectories, for both roles, with TRL's ``SFTTrainer``.

A small model cannot call tools, nor simulate them, before it has seen how. Each task's reference solution is
replayed with the real executor in an :class:`~envace_gym.episode.Episode`, so the rows have exactly the token
layout the rollouts will have:

* **Act rows**: the Act prompt at that turn (the grown conversation) → the reference turn's text + end token;
* **Rehearse rows**: the ``separate``-mode simulator prompt for each reference call (with the prefill, if
  configured) → the call's real result in the ``<execution_result>`` contract.

Rows are pre-tokenized (``input_ids`` + ``completion_mask``), so ``SFTTrainer`` trains on the completion
tokens only and never re-renders anything.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Hashable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from trl import SFTTrainer

from ..domains.domain import Domain
from ..domains.registry import make_domain
from ..domains.task import Task
from ..episode.chat import ChatFormat
from ..episode.driver import EpisodeDriver
from ..episode.episode import Episode
from ..episode.types import EpisodeConfig
from ..errors import TaskTooLongError
from ..parsing.act import RESULT_CLOSE, RESULT_OPEN
from ..policy.precision import autocast, resolve_dtype
from ..rehearsal.prompt import RehearsalConfig
from .model_card import BaseModelCardMixin
from .options import checkpointing, enable_checkpointing, lora_config, train_top_layers, use_cpu
from .packing import DEFAULT_PACK_TOKENS, completion_scores, packing_support, unwrap
from .state import load_state, save_state

logger = logging.getLogger("envace_gym")

ROLES = ("act", "rehearse")
_REPLAY_GENERATES = "a reference replay asked for a generation; replays use the real executor or the recorded results"


def sft_rows(
    domain: str | Domain,
    tokenizer: Any,
    tasks: Iterable[Task | str],
    roles: Sequence[str] = ROLES,
    rehearsal: RehearsalConfig | None = None,
    max_length: int | None = None,
) -> list[dict[str, Any]]:
    """Pre-tokenized SFT rows (``input_ids``, ``completion_mask``, ``role``, ``task_id``) from reference replays.

    Rows longer than ``max_length`` tokens are dropped (never cut: a cut row would teach a cut turn); a task whose
    opening prompt alone is longer (8,192 tokens without ``max_length``) is skipped, with a warning that counts them.
    """
    dom = make_domain(domain)
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"roles must be among {ROLES}, got {sorted(unknown)}")
    # The replay needs no model: real tools answer the reference calls, or (a dataset, no real tools) the
    # recorded results do, every reference call being a cache hit.
    config = EpisodeConfig.build(executor="real" if _has_executor(dom) else "cached", rehearsal=rehearsal)
    rehearsal = config.rehearsal
    replay = EpisodeDriver.without_policy(_REPLAY_GENERATES)
    chat = ChatFormat.of(tokenizer)
    rows: list[dict[str, Any]] = []
    too_long: list[str] = []
    for task in tasks:
        task = task if isinstance(task, Task) else dom.task(task)
        if config.executor == "cached" and any(r is None for turn in task.reference for r in turn.results):
            logger.warning("sft: task %s skipped: a reference call has no recorded result to replay", task.id)
            continue
        try:
            episode = Episode(dom, task, config, tokenizer, np.random.default_rng(0), max_context=max_length or 8192,
                              act_max_new_tokens=0)  # text turns: nothing reserved  # fmt: skip
        except TaskTooLongError as exc:
            logger.warning("sft: %s: skipped", exc)
            too_long.append(task.id)
            continue
        for turn in task.reference:
            action = episode.reference_action(turn)  # the model family's own call syntax
            if "act" in roles:  # the row, as the episode tokenizes the text turn, through the turn's end token
                rows.append(
                    _row(episode.prompt_ids, chat.encode(action + chat.act_end(bool(turn.calls))), "act", task.id)
                )
            if "rehearse" in roles:
                for call, result in zip(turn.calls, turn.results, strict=True):
                    if result is None:  # no recorded result to teach (benchmarks that only judge calls)
                        continue
                    answer = f"{json.dumps(result, ensure_ascii=False)}\n{RESULT_CLOSE}"
                    if not rehearsal.prefill:
                        answer = f"{RESULT_OPEN}\n{answer}"
                    prompt = episode.rehearse_prompt(call, action)
                    rows.append(_row(prompt, chat.encode(answer + chat.act_end(False)), "rehearse", task.id))
            (outcome,) = replay.play([episode], [action])
            if outcome.terminated or outcome.truncated:
                break
    if too_long:
        logger.warning("sft: %d task(s) skipped, their opening prompt too long to play: %s", len(too_long), too_long)
    if max_length is not None:
        rows = [r for r in rows if len(r["input_ids"]) <= max_length]
    return rows


def _has_executor(domain: Domain) -> bool:
    tasks = domain.tasks("train") or domain.tasks("test")
    return not tasks or domain.make_executor(tasks[0]) is not None


def _row(prompt: Sequence[int], completion: Sequence[int], role: str, task_id: str) -> dict[str, Any]:
    return {
        "input_ids": list(prompt) + list(completion),
        "completion_mask": [0] * len(prompt) + [1] * len(completion),
        "role": role,
        "task_id": task_id,
    }


def sft_dataset(domain: str | Domain, tokenizer: Any, split: str = "train", num_tasks: int = 200, **kwargs: Any):
    """:func:`sft_rows` of the first ``num_tasks`` tasks of ``split``, as a ``datasets.Dataset``."""
    from datasets import Dataset

    dom = make_domain(domain)
    tasks = dom.tasks(split)[: min(num_tasks, len(dom.tasks(split)))]
    return Dataset.from_list(sft_rows(dom, tokenizer, tasks, **kwargs))


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

    Args:
        row_groups: One key per dataset row (e.g. its task id); with the default random sampling, batches are
            drawn task by task (:class:`TaskGroupedSampler`) so their rows share prefixes.
        shared_prefix: Use the packed forward (default ``True``).
        pack_tokens: Positions per packed forward.
    """

    def __init__(
        self,
        *args: Any,
        row_groups: Sequence[Hashable] | None = None,
        shared_prefix: bool = True,
        pack_tokens: int = DEFAULT_PACK_TOKENS,
        **kwargs: Any,
    ) -> None:
        self.row_groups, self.shared_prefix, self.pack_tokens = row_groups, shared_prefix, pack_tokens
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
        scores = completion_scores(model, prompts, completions, budget=self.pack_tokens)
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
            self.shared_prefix
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


def run_sft(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    output_dir: str,
    *,
    epochs: float = 1.0,
    learning_rate: float = 5e-5,
    batch_size: int = 4,
    lora: bool = False,
    lora_r: int = 16,
    report_to: str = "none",
    seed: int = 0,
    max_steps: int = -1,
    logging_steps: int = 5,
    save_steps: int | None = None,
    resume: bool | str = False,
    dtype: str | torch.dtype = "auto",
    gradient_checkpointing: bool = False,
    shared_prefix: bool = True,
    pack_tokens: int = DEFAULT_PACK_TOKENS,
    gradient_accumulation_steps: int = 1,
    lr_scheduler_type: str = "linear",
    warmup_steps: float = 0,
) -> Any:
    """Fine-tune ``model`` on the completions of ``dataset`` with :class:`PackedSFTTrainer`; returns the trainer
    (``trainer.model`` is the fine-tuned model; with ``lora`` the adapters are merged before saving).

    ``epochs`` rule unless ``max_steps`` is positive; ``dtype`` ``"auto"`` computes in bfloat16 where the
    hardware has native bfloat16 (float32 master weights either way, see :mod:`envace_gym.policy.precision`)."""
    from trl import SFTConfig

    cpu = use_cpu()
    bf16 = resolve_dtype(dtype, "cpu" if cpu else "cuda") == torch.bfloat16
    args = SFTConfig(
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
        bf16=bf16,
        **checkpointing(gradient_checkpointing),
        seed=seed,
        dataset_kwargs={"skip_prepare_dataset": False},
    )
    peft_config = lora_config(lora_r) if lora else None
    groups = dataset["task_id"] if "task_id" in dataset.column_names else None
    trainer = PackedSFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset.remove_columns([c for c in ("role", "task_id") if c in dataset.column_names]),
        processing_class=tokenizer,
        peft_config=peft_config,
        row_groups=groups,
        shared_prefix=shared_prefix,
        pack_tokens=pack_tokens,
    )
    print(_plan_line(len(dataset), groups, batch_size, epochs, max_steps, trainer), flush=True)
    trainer.train(resume_from_checkpoint=resume or None)
    if lora:
        trainer.model = trainer.model.merge_and_unload()
    return trainer


def sft_steps(
    model_path: str | Path,
    domain: str | Domain | Sequence[str | Domain],
    output_dir: str | Path,
    *,
    tasks: int = 200,
    steps: int = 200,
    batch_size: int = 8,
    learning_rate: float = 1e-3,
    seed: int = 0,
    train_layers: int | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 50,
    log: Any = None,
    dtype: str | torch.dtype = "float32",
    gradient_checkpointing: bool = False,
) -> list[dict[str, float]]:
    """SFT in plain torch, the loop :mod:`envace_gym.training.trainer` uses for RL: ``steps`` AdamW steps at a
    constant rate, each on ``batch_size`` rows drawn (seeded) from the :func:`sft_rows` of the first ``tasks``
    training tasks (of each domain, given several: their demonstrations pooled), loss = mean negative
    log-likelihood of the completion tokens (shared-prefix forward). The model goes to ``output_dir``. With ``checkpoint`` (a file) the state is saved every ``checkpoint_every``
    steps and a cut-off run resumes from it. ``dtype`` ``"bfloat16"`` (or ``"auto"`` where the hardware has native
    bfloat16) runs the forward and backward under autocast; ``gradient_checkpointing`` recomputes each layer in the
    backward pass (less memory, the same gradients). Returns one ``{"step", "loss"}`` per step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .packing import completion_logprobs

    domains = [make_domain(d) for d in ([domain] if isinstance(domain, str | Domain) else domain)]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    train_top_layers(model, train_layers)
    if gradient_checkpointing:
        enable_checkpointing(model)
    rows = [row for dom in domains for row in sft_rows(dom, tokenizer, dom.tasks("train")[:tasks])]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
    rng = np.random.default_rng(seed)
    history: list[dict[str, float]] = load_state(checkpoint, model, optimizer, rng)
    device = next(model.parameters()).device
    compute = resolve_dtype(dtype, device)
    model.train()
    for step in range(len(history), steps):
        batch = [rows[int(i)] for i in rng.choice(len(rows), size=min(batch_size, len(rows)), replace=False)]
        split = [r["completion_mask"].index(1) for r in batch]
        with autocast(compute, device):
            logprobs = completion_logprobs(
                model, [r["input_ids"][:k] for r, k in zip(batch, split, strict=True)],
                [r["input_ids"][k:] for r, k in zip(batch, split, strict=True)],
            )  # fmt: skip
            loss = -torch.cat(logprobs).float().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history.append({"step": step + 1, "loss": float(loss.detach())})
        if log is not None:
            log(history[-1])
        if checkpoint is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == steps):
            save_state(checkpoint, model, optimizer, rng, history)
    model.eval()
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return history


def tiny_start_model(domain: str | Domain, path: str | Path, *, seed: int = 0, vocab_size: int = 1000) -> Path:
    """A from-scratch starting model for ``domain`` at ``path`` (made once): a 2-layer Llama (~0.4M parameters)
    over a tiny tokenizer learnt from the domain's own prompts and references, words as whole tokens, so the
    model can copy a room or a value by copying one token. What the package's learning test and the small
    scale of ``envace experiment`` train."""
    from ..policy.tiny import tiny_model, tiny_tokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        dom = make_domain(domain)
        boot = tiny_tokenizer()
        corpus = [boot.decode(r["input_ids"]) for r in sft_rows(dom, boot, dom.tasks("train")[:20])]
        tokenizer = tiny_tokenizer(vocab_size, corpus=corpus, whole_words=True)
        tiny_model(tokenizer, seed=seed, hidden_size=128, layers=2).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def _plan_line(rows: int, groups: Any, batch_size: int, epochs: float, max_steps: int, trainer: Any) -> str:
    """What the run will do, said before it starts: rows, batches, epochs, optimizer steps."""
    per_step = batch_size * trainer.args.gradient_accumulation_steps * trainer.accelerator.num_processes
    per_epoch = max(1, math.ceil(rows / per_step))
    tasks = f" of {len(set(groups))} tasks" if groups is not None else ""
    if max_steps > 0:
        plan = f"{max_steps} optimizer steps (--steps; {max_steps / per_epoch:.2f} epochs)"
    else:
        plan = f"{epochs:g} epochs = {math.ceil(per_epoch * epochs)} optimizer steps"
    return f"envace sft: {rows} rows{tasks}, batches of {per_step} rows, {plan}"
