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
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .chat import ChatFormat
from .domains import Domain, Task, make_domain
from .episode import Episode, EpisodeConfig
from .errors import DomainError
from .parsing import RESULT_CLOSE, RESULT_OPEN
from .simulator import RehearsalConfig

ROLES = ("act", "rehearse")


def sft_rows(
    domain: str | Domain,
    tokenizer: Any,
    tasks: Iterable[Task | str],
    roles: Sequence[str] = ROLES,
    rehearsal: RehearsalConfig | None = None,
    max_length: int | None = None,
) -> list[dict[str, Any]]:
    """Pre-tokenized SFT rows (``input_ids``, ``completion_mask``, ``role``, ``task_id``) from reference replays.

    Rows longer than ``max_length`` tokens are dropped (never cut: a cut row would teach a cut turn).
    """
    dom = make_domain(domain)
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"roles must be among {ROLES}, got {sorted(unknown)}")
    rehearsal = rehearsal or RehearsalConfig()
    config = EpisodeConfig(executor="real", rehearsal=rehearsal)
    chat = ChatFormat.of(tokenizer)
    rows: list[dict[str, Any]] = []
    for task in tasks:
        task = task if isinstance(task, Task) else dom.task(task)
        episode = Episode(dom, task, config, tokenizer, np.random.default_rng(0))
        for turn in task.reference:
            if "act" in roles:
                rows.append(_row(episode.prompt_ids, chat.encode(turn.text) + [chat.eos_id], "act", task.id))
            if "rehearse" in roles:
                for call, result in zip(turn.calls, turn.results, strict=True):
                    if result is None:  # no recorded result to teach (benchmarks that only judge calls)
                        continue
                    answer = f"{json.dumps(result, ensure_ascii=False)}\n{RESULT_CLOSE}"
                    if not rehearsal.prefill:
                        answer = f"{RESULT_OPEN}\n{answer}"
                    prompt = episode.rehearse_prompt(call, turn.text)
                    rows.append(_row(prompt, chat.encode(answer) + [chat.eos_id], "rehearse", task.id))
            outcome = _play(episode.step(turn.text))
            if outcome.terminated or outcome.truncated:
                break
    if max_length is not None:
        rows = [r for r in rows if len(r["input_ids"]) <= max_length]
    return rows


def _row(prompt: Sequence[int], completion: Sequence[int], role: str, task_id: str) -> dict[str, Any]:
    return {
        "input_ids": list(prompt) + list(completion),
        "completion_mask": [0] * len(prompt) + [1] * len(completion),
        "role": role,
        "task_id": task_id,
    }


def _play(step: Any) -> Any:
    """Run one real-executor step (it needs no generation)."""
    try:
        next(step)
    except StopIteration as stop:
        return stop.value
    raise DomainError("a reference replay asked for a generation; replays use the real executor")


def sft_dataset(domain: str | Domain, tokenizer: Any, split: str = "train", num_tasks: int = 200, **kwargs: Any):
    """:func:`sft_rows` of the first ``num_tasks`` tasks of ``split``, as a ``datasets.Dataset``."""
    from datasets import Dataset

    dom = make_domain(domain)
    tasks = dom.tasks(split)[: min(num_tasks, len(dom.tasks(split)))]
    return Dataset.from_list(sft_rows(dom, tokenizer, tasks, **kwargs))


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
) -> Any:
    """Fine-tune ``model`` on the completions of ``dataset`` with TRL's ``SFTTrainer``; returns the trainer
    (``trainer.model`` is the fine-tuned model; with ``lora`` the adapters are merged before saving)."""
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=output_dir,
        num_train_epochs=epochs,
        max_steps=max_steps,
        learning_rate=learning_rate,
        per_device_train_batch_size=batch_size,
        completion_only_loss=True,
        max_length=None,
        logging_steps=logging_steps,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        report_to=report_to,
        use_cpu=not _has_accelerator(),
        bf16=False,
        gradient_checkpointing=False,
        seed=seed,
        dataset_kwargs={"skip_prepare_dataset": False},
    )
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset.remove_columns([c for c in ("role", "task_id") if c in dataset.column_names]),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train(resume_from_checkpoint=resume or None)
    if lora:
        trainer.model = trainer.model.merge_and_unload()
    return trainer


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available()
