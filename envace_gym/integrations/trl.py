"""World rehearsal in TRL's ``GRPOTrainer`` (trl >= 1.16).

Three ways in, from least to most EnvACE:

* :func:`real_tools_environment` — an ``environment_factory`` that exposes a domain's **real** tools to TRL's
  own tool-calling loop: standard GRPO with real tools, the baseline. Use :func:`real_tools_reward` as reward.
* :func:`make_rollout_func` — a ``rollout_func`` that plays each prompt (a task id, already repeated G times
  by TRL) as a world-rehearsal episode and returns one row per episode: ``inline`` mode trains Act and
  Rehearse tokens in that row; ``separate`` mode trains the Act tokens there (the rehearsals stay context).
  Rewards reach TRL through :func:`envace_reward` (``None`` for a verifier that could not judge: TRL masks it).
* :class:`EnvACEGRPOTrainer` — the paper's **role-wise GRPO** in ``separate`` mode: every Act turn and every
  rehearsal is its own row with its own prompt, and A = R - mean(R of that role in the group). It replaces
  one hook, ``_generate_and_score_completions``; TRL's loss (clip ``epsilon``, dual-clip ``delta``, token-mean
  ``loss_type="dapo"``, KL ``beta``), optimizer, logging and checkpoints are used as they are.

Both trainers here (:class:`EnvACEGRPOTrainer` and :class:`RealToolsGRPOTrainer`, ``GRPOTrainer`` for the
baseline) compute their log-probabilities with the shared-prefix forward (:class:`SharedPrefixMixin`): rows
that share a prompt prefix encode it once, with the same values and gradients as TRL's per-row forward.

The dataset of all three is built by :func:`task_dataset`: one row per task, with ``prompt`` holding the
task id (and, for the real-tools baseline, the task's opening messages).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from accelerate.utils import gather, gather_object
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import pad, use_adapter

from ..domains.domain import Domain
from ..domains.registry import make_domain
from ..domains.reward import score_reference
from ..domains.task import Task
from ..domains.trajectory import CallRecord, Trajectory
from ..episode.types import REWARDS
from ..errors import TrainingConfigError
from ..policy.precision import resolve_dtype
from ..policy.protocol import SamplingParams
from ..policy.transformers import TransformersPolicy
from ..rehearsal.prompt import RehearsalConfig, rollout_sampling
from ..rollout.collector import RolloutBatch, collect_rollouts
from ..tools.schema import ToolCall
from ..training.advantages import rolewise_advantages
from ..training.model_card import BaseModelCardMixin
from ..training.packing import DEFAULT_PACK_TOKENS, completion_scores, packing_support, unwrap


# ----------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------
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


def _task_ids(prompts: Sequence[Any]) -> list[str]:
    ids = []
    for p in prompts:
        if not isinstance(p, str):
            raise ValueError("world-rehearsal rollouts need task ids as prompts: build the dataset with task_dataset()")
        ids.append(p)
    return ids


def _policy_of(trainer: Any) -> TransformersPolicy:
    """The trainer's model (the weights being trained) as a Policy; cached per trainer. With ``bf16`` it
    samples under the same autocast as the loss, so the recorded log-probs are the ones the loss recomputes."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    policy = getattr(trainer, "_envace_policy", None)
    if policy is None or policy.model is not model:
        policy = TransformersPolicy(
            model, trainer.processing_class, max_context=getattr(model.config, "max_position_embeddings", None),
            compute_dtype=torch.bfloat16 if getattr(trainer.args, "bf16", False) else None,
        )  # fmt: skip
        trainer._envace_policy = policy
    return policy


def _sampling(args: Any) -> tuple[SamplingParams, RehearsalConfig]:
    """Both roles' sampling from TRL's settings: ``max_completion_length`` is each generation's budget."""
    tokens = getattr(args, "max_completion_length", 256) or 256
    return rollout_sampling(tokens, getattr(args, "temperature", 1.0), getattr(args, "top_p", 1.0) or 1.0)


# ----------------------------------------------------------------------------------------------------
# rollout_func: one row per episode
# ----------------------------------------------------------------------------------------------------
def envace_reward(
    prompts: Any = None, completions: Any = None, episode_reward: Sequence[float | None] | None = None, **kwargs: Any
) -> list[float | None]:
    """Reward function for the ``rollout_func`` path: each episode's task-success reward, computed by the
    domain at the end of the episode (``None``, masked by TRL, when the verifier could not judge)."""
    if episode_reward is None:
        raise ValueError("envace_reward needs the 'episode_reward' field that make_rollout_func returns")
    return [None if r is None else float(r) for r in episode_reward]


# GRPOConfig settings that world-rehearsal rollouts do not apply, with the values that mean "left unset".
_UNUSED_BY_ROLLOUTS: dict[str, tuple[Any, ...]] = {
    "top_k": (0, None), "min_p": (None,), "repetition_penalty": (1.0, None), "generation_kwargs": (None, {}),
}  # fmt: skip
# ... and those EnvACEGRPOTrainer's own generation step does not apply either.
_UNUSED_BY_ENVACE_TRAINER: dict[str, tuple[Any, ...]] = {
    **_UNUSED_BY_ROLLOUTS, "scale_rewards": ("none",), "mask_truncated_completions": (False,),
    "pad_to_multiple_of": ("auto", None),
}  # fmt: skip


def _refuse_unused(args: Any, unused: dict[str, tuple[Any, ...]], what: str) -> None:
    """Refuse, naming them, the settings a user set that ``what`` would otherwise silently ignore."""
    given = [f"{k}={getattr(args, k)!r}" for k, unset in unused.items() if getattr(args, k, unset[0]) not in unset]
    if given:
        raise TrainingConfigError(
            f"{what} does not apply {', '.join(given)}: its rollouts sample with temperature, top_p and "
            "max_completion_length only, and its advantages are role-wise (A = R - mean, scale_rewards='none'). "
            "Leave these settings at their defaults."
        )


def _refuse_vllm(args: Any, what: str) -> None:
    """World-rehearsal rollouts generate with the model being trained, through transformers: a vLLM engine
    would be started and synced every step without generating anything, so ``use_vllm`` is refused."""
    if getattr(args, "use_vllm", False):
        raise TrainingConfigError(
            f"{what} cannot generate with vLLM: every Act turn and rehearsal is generated by the model being "
            "trained, through transformers' generate (with KV reuse across turns). Set use_vllm=False; for "
            "faster rollouts use a GPU, rehearsal_mode='inline', or smaller max_completion_length."
        )


def _refuse_sharded(args: Any, what: str) -> None:
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


def make_rollout_func(
    domain: str | Domain,
    *,
    rehearsal_mode: str = "inline",
    executor: str = "rehearsal",
    on_invalid: str = "terminate",
    max_turns: int | None = None,
):
    """A ``rollout_func`` for ``GRPOTrainer``: each prompt (a task id) is played to the end as an EnvACE episode
    with the model being trained; returns ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask`` and,
    for the reward functions, ``episode_reward``, ``success`` and ``task_id``."""
    dom = make_domain(domain)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        _refuse_vllm(trainer.args, "make_rollout_func's rollouts")
        _refuse_sharded(trainer.args, "make_rollout_func's rollouts")
        _refuse_unused(trainer.args, _UNUSED_BY_ROLLOUTS, "make_rollout_func's rollouts")
        act, rehearsal = _sampling(trainer.args)
        policy = _policy_of(trainer)
        batch = collect_rollouts(
            policy, dom, _task_ids(prompts), 1, executor=executor, rehearsal_mode=rehearsal_mode,
            act_sampling=act, rehearsal=rehearsal, on_invalid=on_invalid, max_turns=max_turns,
            seed=int(torch.randint(2**31, (1,)).item()),
        )  # fmt: skip
        rows = [_ended_row(e, policy.stop_ids) for e in batch.episodes]
        return {
            "prompt_ids": [list(r.prompt_ids) for r in rows],
            "completion_ids": [list(r.completion_ids) for r in rows],
            "logprobs": [list(r.logprobs) for r in rows],
            # a masked episode (reward None) trains nothing: TRL multiplies its loss by env_mask
            "env_mask": [
                list(r.mask) if e.reward is not None else [0] * len(r.mask)
                for r, e in zip(rows, batch.episodes, strict=True)
            ],
            "episode_reward": [e.reward for e in batch.episodes],
            "success": [e.success for e in batch.episodes],
            "task_id": [e.task_id for e in batch.episodes],
        }

    return rollout_func


def _ended_row(episode: Any, stop_ids: Sequence[int]) -> Any:
    """The episode's row as TRL should read it. TRL calls a completion truncated (``completions/clipped_ratio``;
    dropped by ``mask_truncated_completions``) when its last token is not an end token; an episode that ended on
    its own but whose last tokens are not one (an invalid rehearsal cut at its budget, in inline mode) gets an
    end token appended, untrained (mask 0), so only episodes stopped by a limit look truncated."""
    row = episode.episode_row
    if episode.truncated or not stop_ids or not row.completion_ids or row.completion_ids[-1] in stop_ids:
        return row
    return replace(
        row,
        completion_ids=(*row.completion_ids, stop_ids[0]),
        logprobs=(*row.logprobs, 0.0),
        mask=(*row.mask, 0),
    )


# ----------------------------------------------------------------------------------------------------
# The shared-prefix forward inside TRL's loss
# ----------------------------------------------------------------------------------------------------
class SharedPrefixMixin:
    """For a ``GRPOTrainer`` subclass: per-token log-probabilities (current policy, "old" and reference
    passes alike) from the shared-prefix forward of :mod:`envace_gym.training.packing` instead of one padded batch.

    The rows of each call are packed into prefix trees of at most ``args.pack_tokens`` positions (default
    4096); a call with several packs recomputes each in the backward pass, so memory holds one pack's
    activations. Vision inputs, MoE auxiliary losses, ``args.shared_prefix=False`` and models whose attention
    cannot take the mask (logged once) go through TRL's own forward.
    """

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **extra: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        rows = _unpadded(input_ids, attention_mask, logits_to_keep)
        plain = (
            not getattr(self.args, "shared_prefix", True)
            or compute_aux_loss
            or any(v is not None for v in extra.values())
            or rows is None
            or packing_support(unwrap(model)) is not None
        )
        if plain:
            return super()._get_per_token_logps_and_entropies(  # type: ignore[misc]
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **extra,
            )  # fmt: skip
        prompts, completions = rows
        with self.accelerator.autocast():  # type: ignore[attr-defined]
            scores = completion_scores(
                model, prompts, completions, self.temperature,  # type: ignore[attr-defined]
                budget=getattr(self.args, "pack_tokens", DEFAULT_PACK_TOKENS),
            )  # fmt: skip
        logps = _grid(scores.logprobs, logits_to_keep, input_ids.device)
        entropies = _grid(scores.entropies, logits_to_keep, input_ids.device) if compute_entropy else None
        return logps, entropies, None


def _unpadded(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int
) -> tuple[list[list[int]], list[list[int]]] | None:
    """Each row's (prompt, completion) ids from TRL's layout (left-padded prompts, right-padded completions);
    ``None`` when a completion's mask is not one run from its start (TRL's forward then handles it)."""
    prompts, completions = [], []
    width = input_ids.shape[1] - logits_to_keep
    for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
        n = sum(mask[width:])
        if any(mask[width + n :]) or (n and not all(mask[width : width + n])):
            return None
        prompts.append([t for t, m in zip(ids[:width], mask[:width], strict=True) if m])
        completions.append(ids[width : width + n])
    return prompts, completions


def _grid(values: Sequence[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    """Per-row tensors, left-aligned into one ``(rows, width)`` tensor (zeros after each row's end)."""
    rows = [v if len(v) == width else torch.cat([v, v.new_zeros(width - len(v))]) for v in values]
    return torch.stack(rows).to(device) if rows else torch.zeros((0, width), device=device)


@dataclass
class PackedGRPOConfig(GRPOConfig):
    """``GRPOConfig`` with the shared-prefix forward's two settings (read by :class:`SharedPrefixMixin`), and two
    defaults of its own: ``bf16`` unset means bfloat16 only where the hardware runs it faster
    (:func:`envace_gym.policy.precision.resolve_dtype`; TRL's default is ``True``, which on a CPU without native
    bfloat16 runs ~80x slower), and gradient checkpointing is off (TRL's default is on; the packs bound memory,
    ``activation_checkpointing=True`` lowers it further at some cost in time)."""

    # Parameters whose default values are overridden from GRPOConfig
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing (default: off)."}
    )

    # Parameters that control the shared-prefix forward (as `envace train --shared_prefix --pack_tokens`)
    shared_prefix: bool = field(
        default=True,
        metadata={"help": "Encode the prefix that rows share once (exact; see envace_gym.training.packing)."},
    )
    pack_tokens: int = field(
        default=DEFAULT_PACK_TOKENS,
        metadata={"help": "Positions per packed forward; more packs than one are recomputed in the backward."},
    )

    def __post_init__(self) -> None:
        if self.bf16 is None and not self.fp16:
            on_gpu = torch.cuda.is_available() and not self.use_cpu
            self.bf16 = resolve_dtype("auto", "cuda" if on_gpu else "cpu") == torch.bfloat16
        super().__post_init__()


class RealToolsGRPOTrainer(BaseModelCardMixin, SharedPrefixMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` (the real-tools baseline, or any GRPO run) with the shared-prefix forward; give it
    a :class:`PackedGRPOConfig` to set the packing, or a plain ``GRPOConfig`` for the defaults."""


# ----------------------------------------------------------------------------------------------------
# Role-wise GRPO: every generation its own row
# ----------------------------------------------------------------------------------------------------
@dataclass
class EnvACEGRPOConfig(PackedGRPOConfig):
    """``GRPOConfig`` with the EnvACE settings; defaults follow the paper (docs/method.md).

    ``scale_rewards="none"`` (A = R - mean, no std), ``delta=3.0`` (TRL's two-sided clipping caps the ratio of
    negative-advantage tokens: the paper's dual-clip c = 3), ``loss_type="dapo"`` (token-mean over the batch),
    ``use_bias_correction_kl=False`` (the paper's low-variance KL estimate, k3, when ``beta > 0``).
    TRL's names stay TRL's: ``num_generations`` is G (``group_size`` in the package's own settings) and
    ``max_completion_length`` the budget of each generation (``max_new_tokens``).
    ``per_device_train_batch_size`` counts episodes (tasks x ``num_generations``); the number of training rows
    each batch yields varies with the episodes.
    """

    # Parameters that control the rollouts
    domain: str = field(default="bank", metadata={"help": "Domain to train on (name or folder)."})
    rehearsal_mode: str = field(default="separate", metadata={"help": "'separate' (role-wise rows) or 'inline'."})
    executor: str = field(default="rehearsal", metadata={"help": "Who answers tool calls in rollouts."})
    on_invalid: str = field(default="terminate", metadata={"help": "'terminate' (reward 0) or 'feedback'."})
    reward: str = field(
        default="domain",
        metadata={"help": "'domain' (the domain's score) or 'reference' (reference calls and answer facts, no tool run)."},
    )
    max_turns: int | None = field(default=None, metadata={"help": "Act turns per episode (default: the domain's)."})

    # Parameters whose default values are overridden from GRPOConfig (the paper's objective)
    scale_rewards: str = field(default="none", metadata={"help": "No std normalization, as in the paper."})
    delta: float | None = field(default=3.0, metadata={"help": "Dual-clip bound for negative advantages."})
    loss_type: str = field(default="dapo", metadata={"help": "Token-mean over the batch."})
    use_bias_correction_kl: bool = field(
        default=False,
        metadata={
            "help": "The paper's low-variance KL (k3), as envace_gym.training.trainer has it; TRL's default (True) multiplies "
            "it by the importance ratio, which changes the KL gradient even on-policy."
        },
    )


class EnvACEGRPOTrainer(BaseModelCardMixin, SharedPrefixMixin, GRPOTrainer):
    """``GRPOTrainer`` whose generation step plays world-rehearsal episodes and trains both roles.

    Args:
        model, args, train_dataset, processing_class, **kwargs: as for ``GRPOTrainer``; ``train_dataset``
            defaults to :func:`task_dataset` of ``args.domain``.
        reward_funcs: Optional, functions added to the domain's reward (``Domain.score``, always the first).
            Each is called once per batch as ``f(prompts=..., completions=..., **fields)`` with one entry per
            episode: ``prompts`` (task ids), ``completions`` (the messages after the opening), ``messages``,
            ``task_id``, ``episode_reward`` (the domain's), ``success``, ``reward_checks``, plus
            ``trainer_state``, ``log_metric(name, value)`` and ``log_extra(column, values)``; it returns a float
            or ``None`` per episode. An episode's reward is ``Σ w·r`` with ``args.reward_weights`` (one per
            function in order: the domain's first, unless the list places :func:`envace_reward` itself; default
            all 1, as in TRL), and ``None`` from any function masks the episode. Each function's mean is logged
            as ``rewards/<name>/mean``.
    """

    def __init__(
        self, model: Any, args: EnvACEGRPOConfig, train_dataset: Any = None, processing_class: Any = None, **kwargs: Any
    ) -> None:
        _refuse_vllm(args, "EnvACEGRPOTrainer")
        _refuse_unused(args, _UNUSED_BY_ENVACE_TRAINER, "EnvACEGRPOTrainer")
        _refuse_sharded(args, "EnvACEGRPOTrainer")
        self.domain = make_domain(args.domain)
        kwargs["reward_funcs"] = _with_domain_reward(kwargs.get("reward_funcs"), args.reward_weights)
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset if train_dataset is not None else task_dataset(self.domain),
            processing_class=processing_class,
            **kwargs,
        )

    def _group_keys(self, batch: RolloutBatch) -> list[tuple[str, int]]:
        """Each episode's GRPO group: its task and which run of ``num_generations`` episodes of that task it is
        in, over the whole generation batch, so a task that appears twice in a batch makes two groups of G,
        not one of 2G."""
        everyone = gather_object([[e.task_id for e in batch.episodes]])
        size = self.num_generations if self.model.training else self.num_generations_eval
        seen: dict[str, int] = {}
        keys = []
        for task_id in (t for part in everyone for t in part):
            keys.append((task_id, seen.get(task_id, 0) // size))
            seen[task_id] = seen.get(task_id, 0) + 1
        start = sum(len(part) for part in everyone[: self.accelerator.process_index])
        return keys[start : start + len(batch.episodes)]

    def _episode_rewards(self, batch: RolloutBatch, mode: str) -> list[float | None]:
        """Each episode's reward: ``Σ w·r`` over the reward functions, the domain's first (TRL's
        ``reward_weights``); ``None`` (or NaN) from any function masks the episode."""
        episodes = batch.episodes
        pending: dict[str, list[float]] = {}
        extra: dict[str, list[Any]] = {}
        fields = {
            "prompts": [e.task_id for e in episodes],
            "completions": [_after_opening(e.messages) for e in episodes],
            "messages": [e.messages for e in episodes],
            "task_id": [e.task_id for e in episodes],
            "episode_reward": [e.reward for e in episodes],
            "success": [e.success for e in episodes],
            "reward_checks": [e.checks for e in episodes],
            "trainer_state": self.state,
            "log_metric": lambda name, value: pending.setdefault(name, []).append(float(value)),
            "log_extra": lambda column, values: extra.setdefault(column, []).extend(values),
        }
        per_func: list[list[float | None]] = []
        for func, name in zip(self.reward_funcs, self.reward_func_names, strict=True):
            values = list(func(**fields))
            if len(values) != len(episodes):
                raise ValueError(f"reward function {name} returned {len(values)} rewards for {len(episodes)} episodes")
            per_func.append([None if v is None or v != v else float(v) for v in values])  # v != v: NaN
            given = [v for v in per_func[-1] if v is not None]
            self._metrics[mode][f"rewards/{name}/mean"].append(_mean(gather_object(given)))
        for name in sorted(set(gather_object(list(pending)))):  # what reward functions logged, over processes
            self._metrics[mode][name].append(_mean(gather_object(pending.get(name, []))))
        for column in sorted(set(gather_object(list(extra)))):  # columns for TRL's completions table
            self._logs["extra"][column].extend(gather_object(extra.get(column, [None] * len(episodes))))
        weights = self.reward_weights.tolist()
        return [
            None if any(v is None for v in values) else sum(w * v for w, v in zip(weights, values, strict=True))
            for values in zip(*per_func, strict=True)
        ]

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        act, rehearsal = _sampling(self.args)
        task_ids = _task_ids([x["prompt"] for x in inputs])
        batch: RolloutBatch = collect_rollouts(
            _policy_of(self), self.domain, task_ids, 1, executor=self.args.executor,
            rehearsal_mode=self.args.rehearsal_mode, act_sampling=act, rehearsal=rehearsal,
            on_invalid=self.args.on_invalid, max_turns=self.args.max_turns, reward=self.args.reward,
            seed=int(torch.randint(2**31, (1,)).item()),
        )  # fmt: skip
        rewards = self._episode_rewards(batch, mode)
        samples = [replace(s, reward=rewards[s.episode]) for s in batch.samples() if s.completion_ids and any(s.mask)]

        # Role-wise advantages over the whole generation batch (groups may straddle processes).
        groups = self._group_keys(batch)
        mine = [(groups[s.episode], s.role, s.reward) for s in samples]
        everyone = gather_object(mine)
        all_adv = rolewise_advantages(
            [g for g, _, _ in everyone], [r for _, r, _ in everyone], [x for _, _, x in everyone]
        )
        offset = sum(len(x) for x in gather_object([mine])[: self.accelerator.process_index])
        advantages = all_adv[offset : offset + len(mine)]

        # Keep the generation batch divisible by steps_per_generation: pad with rows that train nothing.
        steps = self.args.steps_per_generation if mode == "train" else 1
        pad_rows = (-len(samples)) % steps
        pad_id = self.processing_class.pad_token_id or 0
        prompts = [list(s.prompt_ids) for s in samples] + [[pad_id]] * pad_rows
        completions = [list(s.completion_ids) for s in samples] + [[pad_id]] * pad_rows
        # A masked episode (its verifier could not judge: reward None) trains nothing: its tokens leave the loss,
        # its denominator and the KL term, as in envace_gym.training.trainer.
        trained = [list(s.mask) if s.reward is not None else [0] * len(s.mask) for s in samples] + [[0]] * pad_rows
        advantages = advantages + [0.0] * pad_rows
        if not samples:  # nothing was generated (cannot happen with a non-empty batch; keep TRL's contract)
            raise RuntimeError("the rollouts produced no training rows")

        prompt_ids = pad([torch.tensor(p) for p in prompts], padding_value=pad_id, padding_side="left").to(device)
        prompt_mask = pad(
            [torch.ones(len(p), dtype=torch.long) for p in prompts], padding_value=0, padding_side="left"
        ).to(device)
        prompt_mask[len(samples) :] = 0
        completion_ids = pad([torch.tensor(c) for c in completions], padding_value=pad_id, padding_side="right").to(
            device
        )
        completion_mask = pad(
            [torch.ones(len(c), dtype=torch.long) for c in completions], padding_value=0, padding_side="right"
        ).to(device)
        tool_mask = pad([torch.tensor(m, dtype=torch.long) for m in trained], padding_value=0, padding_side="right").to(
            device
        )
        num_items_in_batch = gather((completion_mask * tool_mask).sum()).sum()

        output: dict[str, Any] = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "tool_mask": tool_mask,
            "advantages": torch.tensor(advantages, dtype=torch.float32, device=device),
            "num_items_in_batch": num_items_in_batch,
        }
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention = torch.cat([prompt_mask, completion_mask], dim=1)
        keep = completion_ids.size(1)
        # The extra forward passes run in chunks of a micro-batch of rows, as TRL's do (the plain forward's memory).
        chunk = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        with torch.no_grad():
            if self.args.gradient_accumulation_steps % (steps * self.num_iterations) != 0:
                output["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    self.model, ids, attention, keep, chunk
                )
            if self.beta != 0.0:
                if self.ref_model is not None:
                    ref, _, _ = self._get_per_token_logps_and_entropies(self.ref_model, ids, attention, keep, chunk)
                else:
                    unwrapped = self.accelerator.unwrap_model(self.model)
                    with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                        ref, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attention, keep, chunk)
                output["ref_per_token_logps"] = ref

        metrics = self._metrics[mode]
        metrics["reward"].append(_mean(gather_object([r for r in rewards if r is not None])))
        metrics["success"].append(_mean(gather_object([float(e.success) for e in batch.episodes])))
        for role in ("act", "rehearse", "episode"):  # separate mode: act + rehearse rows; inline: one episode row each
            metrics[f"rows/{role}"].append(float(sum(gather_object([sum(s.role == role for s in samples)]))))
        self._log_completions(batch, samples, rewards, groups, mode)
        metrics["episodes"].append(float(sum(gather_object([len(batch.episodes)]))))
        metrics["episode/turns"].append(_mean(gather_object([float(e.turns) for e in batch.episodes])))
        metrics["episode/masked"].append(float(sum(gather_object([int(r is None) for r in rewards]))))
        self._envace_batches = getattr(self, "_envace_batches", 0) + 1
        metrics["rollouts/batches_this_run"].append(float(self._envace_batches))  # restarts at 1 on --resume
        return output

    def _log_completions(
        self, batch: RolloutBatch, samples: list[Any], rewards: list[float | None], groups: list[Any], mode: str
    ) -> None:
        """TRL's ``completions/*`` metrics and its prompt/completion table (``log_completions``), one entry per
        episode: its trained tokens, whether it was truncated (it stopped at a limit, not on its own), and its
        episode-level advantage (reward minus its group's mean)."""
        lengths = [0] * len(batch.episodes)
        for s in samples:
            lengths[s.episode] += sum(s.mask)
        every = gather_object([(n, e.truncated) for n, e in zip(lengths, batch.episodes, strict=True)])
        metrics = self._metrics[mode]
        metrics["completions/mean_length"].append(_mean([float(n) for n, _ in every]))
        metrics["completions/min_length"].append(float(min((n for n, _ in every), default=0)))
        metrics["completions/max_length"].append(float(max((n for n, _ in every), default=0)))
        metrics["completions/clipped_ratio"].append(_mean([float(t) for _, t in every]))
        ended = [float(n) for n, t in every if not t]
        metrics["completions/mean_terminated_length"].append(_mean(ended))
        metrics["completions/min_terminated_length"].append(min(ended, default=0.0))
        metrics["completions/max_terminated_length"].append(max(ended, default=0.0))
        everyone = gather_object([(g, r) for g, r in zip(groups, rewards, strict=True) if r is not None])
        by_group: dict[Any, list[float]] = {}
        for g, r in everyone:
            by_group.setdefault(g, []).append(r)
        self._logs["prompt"].extend(gather_object([e.task_id for e in batch.episodes]))
        self._logs["completion"].extend(gather_object([_after_opening(e.messages) for e in batch.episodes]))
        self._logs["rewards"]["reward"].extend(gather_object([float("nan") if r is None else r for r in rewards]))
        advantages = [
            float("nan") if r is None else r - _mean(by_group[g]) for g, r in zip(groups, rewards, strict=True)
        ]
        self._logs["advantages"].extend(gather_object(advantages))


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _with_domain_reward(given: Any, weights: Sequence[float] | None) -> list[Any]:
    """The reward functions of an :class:`EnvACEGRPOTrainer`: the domain's (:func:`envace_reward`) first, then
    the user's, which must be callables (a reward model has no episode to score). A list that holds
    ``envace_reward`` itself keeps its order, so its ``reward_weights`` stay with their functions."""
    user = [] if given is None else list(given if isinstance(given, (list, tuple)) else [given])
    for f in user:
        if f is envace_reward:
            continue
        if isinstance(f, (str, torch.nn.Module)) or not callable(f) or inspect.iscoroutinefunction(f):
            raise TrainingConfigError(
                "EnvACEGRPOTrainer's reward_funcs must be plain functions f(prompts, completions, **fields) -> "
                f"list[float | None], called once per batch of episodes; got {f!r} (reward models and async "
                "functions are not supported here)"
            )
    funcs = user if envace_reward in user else [envace_reward, *user]
    if weights is not None and len(weights) != len(funcs):
        raise TrainingConfigError(
            f"reward_weights needs {len(funcs)} weights, one per reward function in order, the domain's reward "
            f"(envace_reward) first unless you placed it; got {len(weights)}"
        )
    return funcs


def _after_opening(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """An episode's messages after its opening (system prompt and first user message): its "completion"."""
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), len(messages) - 1)
    return list(messages[first_user + 1 :])


# ----------------------------------------------------------------------------------------------------
# The baseline: standard GRPO with the domain's real tools, in TRL's own tool loop
# ----------------------------------------------------------------------------------------------------
def real_tools_environment(domain: str | Domain) -> type:
    """An ``environment_factory`` class for ``GRPOTrainer``: its public methods are the domain's real tools
    (validated against the domain's schemas first, like in the env), run on a fresh executor per episode.

    TRL's loop has no scripted users, so this fits domains whose tasks have a single user turn (``units``,
    ``bank``). The dataset needs ``task_id`` and the conversational ``prompt`` (``task_dataset(...,
    conversational=True)``); pair it with :func:`real_tools_reward`.
    """
    dom = make_domain(domain)
    executor_class = type(dom.make_executor(dom.tasks("train")[0]))
    offered = sorted({name for task in dom.tasks("train")[:200] for name in dom.whitelist(task)})

    class RealToolsEnvironment:
        def reset(self, task_id: str | None = None, **kwargs: Any) -> None:
            self.task: Task = dom.task(task_id)
            self.executor = dom.make_executor(self.task)
            self.records: list[CallRecord] = []
            return None

        def _call(self, name: str, arguments: dict[str, Any]) -> str:
            call = ToolCall(name, arguments, id=f"call_{len(self.records)}")
            check = dom.tools.validate(call, dom.whitelist(self.task))
            if not check.ok:
                self.records.append(CallRecord(len(self.records), call, None, error=check.error))
                return json.dumps(check.error.to_payload())
            result = self.executor.execute(call)
            self.records.append(CallRecord(len(self.records), call, "real", result))
            return json.dumps(result)

    for name in offered:
        setattr(RealToolsEnvironment, name, _tool_method(name, executor_class.tool_functions[name]))
    RealToolsEnvironment.__name__ = f"{dom.name.capitalize()}RealTools"
    return RealToolsEnvironment


def _tool_method(name: str, fn: Any) -> Any:
    def method(self: Any, **arguments: Any) -> str:
        return self._call(name, arguments)

    return functools.update_wrapper(method, fn)  # the real tool's name, docstring and signature (via __wrapped__)


def real_tools_reward(domain: str | Domain, reward: str = "domain"):
    """The domain's reward for the real-tools baseline: the calls the episode's environment saw, plus the
    final answer (the completion's last assistant message). ``reward="reference"`` scores the task's reference
    calls and answer facts instead (:func:`~envace_gym.domains.reward.score_reference`), as an executor-free
    EnvACE run does, so the two differ only in who answers the calls."""
    dom = make_domain(domain)
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")

    def reward(completions: list[Any], environments: list[Any], **kwargs: Any) -> list[float | None]:
        out: list[float | None] = []
        successes: list[float] = []
        for completion, env in zip(completions, environments, strict=True):
            answer = _final_text(completion)
            trajectory = Trajectory(env.task, (), tuple(env.records), (answer,) if answer else ())
            try:
                result = score_reference(env.task, trajectory) if reward == "reference" else dom.score(env.task, trajectory)
            except Exception:
                out.append(None)
                continue
            out.append(result.score)
            successes.append(float(result.success))
        if successes and kwargs.get("log_metric") is not None:  # TRL logs it as "success", as the EnvACE path does
            kwargs["log_metric"]("success", sum(successes) / len(successes))
        return out

    reward.__name__ = f"{dom.name}_reward"
    return reward


def _final_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion)):
        if message.get("role") == "assistant" and not message.get("tool_calls") and message.get("content"):
            return str(message["content"])
    return ""
