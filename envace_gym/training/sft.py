"""SFT warm start on a domain's reference trajectories, for both roles: the rows, and SFT in plain torch.

A small model cannot call tools, nor simulate them, before it has seen how. Each task's reference solution is
replayed with the real executor in an :class:`~envace_gym.episode.Episode`, so the rows have exactly the token
layout the rollouts will have:

* **Act rows**: the Act prompt at that turn (the grown conversation) → the reference turn's text + end token;
* **Rehearse rows**: the ``separate``-mode simulator prompt for each reference call (with the prefill, if
  configured) → the call's real result in the ``<execution_result>`` contract.

Rows are pre-tokenized (``input_ids`` + ``completion_mask``), so a trainer trains on the completion tokens only
and never re-renders anything: :func:`sft_steps` here (plain torch, the RL trainer's loop), or TRL's
``SFTTrainer`` with the shared-prefix forward (:mod:`envace_gym.integrations.trl.packed_sft_trainer`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..domains.domain import Domain
from ..domains.registry import make_domain
from ..domains.task import Task
from ..episode.chat import ChatFormat
from ..episode.config import EpisodeConfig
from ..episode.driver import EpisodeDriver
from ..episode.episode import Episode
from ..episode.separate import rehearse_prompt
from ..episode.start import start_episodes
from ..episode.types import Role
from ..parsing.act import RESULT_CLOSE, RESULT_OPEN
from ..policy.device import default_device, place
from ..policy.precision import autocast, dtype_name, resolve_dtype
from ..rehearsal.prompt import RehearsalConfig
from .options import enable_checkpointing, train_top_layers
from .state import load_state, save_state

logger = logging.getLogger("envace_gym")

ROLES = (Role.ACT, Role.REHEARSE)
_REPLAY_GENERATES = "a reference replay asked for a generation; replays use the real executor or the recorded results"


def sft_rows(
    domain: str | Domain,
    tokenizer: Any,
    tasks: Iterable[Task | str],
    roles: Sequence[Role | str] = ROLES,
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
        raise ValueError(f"roles must be among {[r.value for r in ROLES]}, got {sorted(unknown)}")
    # The replay needs no model: real tools answer the reference calls, or (a dataset, no real tools) the
    # recorded results do, every reference call being a cache hit.
    config = EpisodeConfig.build(executor="real" if _has_executor(dom) else "cached", rehearsal=rehearsal)
    rehearsal = config.rehearsal
    chat = ChatFormat.of(tokenizer)
    playable = []
    for task in tasks:
        task = task if isinstance(task, Task) else dom.task(task)
        if config.executor == "cached" and any(r is None for turn in task.reference for r in turn.results):
            logger.warning("sft: task %s skipped: a reference call has no recorded result to replay", task.id)
            continue
        playable.append(task)
    begun = start_episodes(
        dom, playable, config, tokenizer, max_context=max_length or 8192, rng=lambda g, k: np.random.default_rng(0),
        act_reserve=0,  # text turns: nothing reserved
    )  # fmt: skip
    too_long = begun.skipped
    made: list[list[dict[str, Any]]] = [[] for _ in begun.episodes]  # each episode's rows (its key is its index)

    def reference_turns(playing: Sequence[Episode]) -> list[str]:
        """Each episode's next reference turn, its rows made from the prompt it is played on; past the reference
        solution, :data:`~envace_gym.episode.episode.NOTHING_MORE` (no rows) until the episode ends."""
        actions = []
        for episode in playing:
            if episode.turn >= len(episode.task.reference):
                actions.append(episode.reference_act())
                continue
            turn = episode.task.reference[episode.turn]
            action = episode.reference_action(turn)  # the model family's own call syntax
            rows, task_id = made[episode.key], episode.task.id  # type: ignore[index]
            if Role.ACT in roles:  # the row, as the episode tokenizes the text turn, through the turn's end token
                ids = chat.encode(action + chat.act_end(bool(turn.calls)))
                rows.append(_row(episode.prompt_ids, ids, Role.ACT, task_id))
            if Role.REHEARSE in roles:
                for call, result in zip(turn.calls, turn.results, strict=True):
                    if result is None:  # no recorded result to teach (benchmarks that only judge calls)
                        continue
                    answer = f"{json.dumps(result, ensure_ascii=False)}\n{RESULT_CLOSE}"
                    if not rehearsal.prefill:
                        answer = f"{RESULT_OPEN}\n{answer}"
                    prompt = rehearse_prompt(episode, call, action)
                    rows.append(_row(prompt, chat.encode(answer + chat.act_end(False)), Role.REHEARSE, task_id))
            actions.append(action)
        return actions

    EpisodeDriver.without_policy(_REPLAY_GENERATES).run(begun.episodes, reference_turns)
    rows = [row for rows_of_one in made for row in rows_of_one]
    if too_long:
        logger.warning("sft: %d task(s) skipped, their opening prompt too long to play: %s", len(too_long), too_long)
    if max_length is not None:
        rows = [r for r in rows if len(r["input_ids"]) <= max_length]
    return rows


def _has_executor(domain: Domain) -> bool:
    tasks = domain.tasks("train") or domain.tasks("test")
    return not tasks or domain.make_executor(tasks[0]) is not None


def _row(prompt: Sequence[int], completion: Sequence[int], role: Role, task_id: str) -> dict[str, Any]:
    return {
        "input_ids": list(prompt) + list(completion),
        "completion_mask": [0] * len(prompt) + [1] * len(completion),
        "role": role.value,  # a plain string: the row is a dataset's
        "task_id": task_id,
    }


def sft_dataset(domain: str | Domain, tokenizer: Any, split: str = "train", num_tasks: int = 200, **kwargs: Any):
    """:func:`sft_rows` of the first ``num_tasks`` tasks of ``split``, as a ``datasets.Dataset``."""
    from datasets import Dataset

    dom = make_domain(domain)
    tasks = dom.tasks(split)[: min(num_tasks, len(dom.tasks(split)))]
    return Dataset.from_list(sft_rows(dom, tokenizer, tasks, **kwargs))


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
    device: str | torch.device | None = None,
) -> list[dict[str, float]]:
    """SFT in plain torch, the loop :mod:`envace_gym.training.trainer` uses for RL: ``steps`` AdamW steps at a
    constant rate, each on ``batch_size`` rows drawn (seeded) from the :func:`sft_rows` of the first ``tasks``
    training tasks (of each domain, given several: their demonstrations pooled), loss = mean negative
    log-likelihood of the completion tokens (shared-prefix forward). The model goes to ``output_dir``. With ``checkpoint`` (a file) the state is saved every ``checkpoint_every``
    steps and a cut-off run resumes from it. ``dtype`` ``"bfloat16"`` (or ``"auto"`` where the hardware has native
    bfloat16) runs the forward and backward under autocast; ``gradient_checkpointing`` recomputes each layer in the
    backward pass (less memory, the same gradients). The model trains on ``device`` (default:
    :func:`~envace_gym.policy.device.default_device`, the GPU when there is one). Returns one ``{"step", "loss"}``
    per step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .packing import completion_logprobs

    domains = [make_domain(d) for d in ([domain] if isinstance(domain, str | Domain) else domain)]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = place(AutoModelForCausalLM.from_pretrained(model_path), device)
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
        model = tiny_model(tokenizer, seed=seed, hidden_size=128, layers=2)
        model.config.envace_built_in_process = "tiny"  # the model card says so (integrations.trl.model_card)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


@dataclass(frozen=True)
class WarmStartSettings:
    """How long and how fast the quick run's warm start trains (:func:`warm_start`)."""

    steps: int
    learning_rate: float  # constant
    batch_size: int  # rows per step
    tasks: int = 200  # the reference rows of the first this many training tasks


# The quick run's warm starts (docs/training.md, "The quick run"): enough SFT steps on the domain's reference rows
# that the first GRPO steps write valid calls and rehearsals, so groups get a reward spread. Measured there.
PRETRAINED_WARM_START = WarmStartSettings(steps=20, learning_rate=2e-4, batch_size=4)
# A from-scratch model (``tiny_start_model``) has everything to learn: the learning check's SFT (recipes/learning)
FROM_SCRATCH_WARM_START = WarmStartSettings(steps=500, learning_rate=1e-3, batch_size=8)


def warm_start(
    model: str | Path,
    domain: str | Domain,
    output_dir: str | Path,
    settings: WarmStartSettings = PRETRAINED_WARM_START,
    *,
    seed: int = 0,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    log: Any = None,
) -> Path:
    """A short SFT of ``model`` (a path or hub id) on ``domain``'s reference rows, both roles (:func:`sft_steps`),
    saved to ``output_dir``, whose path it returns: give that path to the GRPO trainer. The default settings are
    the ones measured to give a pretrained model's first GRPO steps a reward spread; for a model made by
    :func:`tiny_start_model` pass :data:`FROM_SCRATCH_WARM_START` (docs/training.md, "The quick run"). A folder
    that holds a model warm-started with the same settings (its ``warm_start.json``) is reused, so a resumed
    run does not redo it."""
    output_dir = Path(output_dir)
    if settings.steps < 1:
        raise ValueError(f"warm start steps must be at least 1, got {settings.steps}")
    dom = make_domain(domain)
    # the dtype as resolved here ("auto" and what it chose are one setting): what the record names is what ran
    ran_in = dtype_name(resolve_dtype(dtype, default_device() if device is None else device))
    record = {"model": str(model), "domain": dom.id or dom.name, **asdict(settings), "seed": seed, "dtype": ran_in}
    marker = output_dir / "warm_start.json"
    if marker.is_file() and json.loads(marker.read_text()) == record and (output_dir / "config.json").is_file():
        return output_dir
    sft_steps(
        model, dom, output_dir, tasks=settings.tasks, steps=settings.steps, batch_size=settings.batch_size,
        learning_rate=settings.learning_rate, seed=seed, log=log, dtype=ran_in, device=device,
    )  # fmt: skip
    marker.write_text(json.dumps(record, indent=2))
    return output_dir
