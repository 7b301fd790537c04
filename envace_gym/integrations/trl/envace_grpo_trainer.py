"""``EnvACEGRPOTrainer``: the paper's role-wise GRPO in TRL. Every Act turn and every rehearsal is its own row
with its own prompt, and A = R - mean(R of that role in the group). It replaces one hook,
``_generate_and_score_completions``; TRL's loss (clip ``epsilon``, dual-clip ``delta``, token-mean
``loss_type="dapo"``, KL ``beta``), optimizer, logging and checkpoints are used as they are."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from accelerate.utils import gather, gather_object
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.trainer.utils import pad, use_adapter

from ...domains.registry import make_domain
from ...episode.types import Role, Row
from ...errors import TrainingConfigError
from ...rollout.collector import RolloutBatch, collect_rollouts
from ...training import metrics as names
from ...training.advantages import rolewise_advantages
from ...training.diagnosis import NoLearningMonitor, episode_facts, step_evidence
from .colocated_vllm import ColocatedVLLMMixin, importance_sampling_ratio
from .dataset import task_dataset, task_ids
from .envace_grpo_config import EnvACEGRPOConfig
from .model_card import BaseModelCardMixin
from .rollout_func import envace_reward
from .shared_prefix import SharedPrefixMixin
from .trainer_policy import rollout_weights, trl_sampling


class EnvACEGRPOTrainer(BaseModelCardMixin, ColocatedVLLMMixin, SharedPrefixMixin, GRPOTrainer):
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
        if not isinstance(args, EnvACEGRPOConfig):  # its settings are checked when it is built
            raise TrainingConfigError(
                "EnvACEGRPOTrainer needs an EnvACEGRPOConfig (domain, rehearsal and reward settings), got "
                + type(args).__name__
            )
        self.domain = make_domain(args.domain)
        self.no_learning = NoLearningMonitor("EnvACEGRPOTrainer")  # one warning per run (training.diagnosis)
        kwargs["reward_funcs"] = _with_domain_reward(kwargs.get("reward_funcs"), args.reward_weights)
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset if train_dataset is not None else task_dataset(self.domain),
            processing_class=processing_class,
            **kwargs,
        )

    def _plays_episodes(self, arguments: dict[str, Any]) -> bool:
        return True  # every rollout is an episode: in vllm_mode="server" the servers serve its policy

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
        act, rehearsal = trl_sampling(self.args)
        if self.use_vllm and self.state.global_step != self._last_loaded_step:  # new weights: once per step
            with profiling_context(self, "sync_weights"):
                self.vllm_generation.sync_weights()
            self._last_loaded_step = self.state.global_step
        tasks = task_ids([x["prompt"] for x in inputs])
        with rollout_weights(self) as policy:  # gathered once (ZeRO-3), or the engine awake (sleep mode)
            batch: RolloutBatch = collect_rollouts(
                policy, self.domain, tasks, 1, self.args.episode_config(act_sampling=act, rehearsal=rehearsal),
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

        if sum(gather_object([len(samples)])) == 0:  # decided together: a process alone raising leaves the rest waiting
            skipped = batch.stats.skipped_tasks
            why = f"{skipped} of its {len(tasks)} task(s) too long to play (see the warnings)" if skipped else "none"
            raise RuntimeError(f"the rollouts produced no training rows; skipped here: {why}")
        # Keep the generation batch divisible by steps_per_generation: pad with rows that train nothing (a process
        # whose episodes gave no row trains padding only, and still takes part in every collective step).
        steps = self.args.steps_per_generation if mode == "train" else 1
        pad_rows = (-len(samples)) % steps if samples else steps
        pad_id = self.processing_class.pad_token_id or 0
        prompts = [list(s.prompt_ids) for s in samples] + [[pad_id]] * pad_rows
        completions = [list(s.completion_ids) for s in samples] + [[pad_id]] * pad_rows
        # A masked episode (its verifier could not judge: reward None) trains nothing: its tokens leave the loss,
        # its denominator and the KL term, as in envace_gym.training.trainer.
        trained = [list(s.mask) if s.reward is not None else [0] * len(s.mask) for s in samples] + [[0]] * pad_rows
        advantages = advantages + [0.0] * pad_rows

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
        correct_sampling = self.use_vllm and self.vllm_importance_sampling_correction
        with torch.no_grad():
            # vLLM samples with other kernels than the trainer's forward: its log-probs are corrected for, as TRL does.
            if self.args.gradient_accumulation_steps % (steps * self.num_iterations) != 0 or correct_sampling:
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
        if self.use_vllm:  # the engine's own log-probs: TRL's off-policy mask reads them, as its sampling correction
            sampled = pad(
                [torch.tensor(s.logprobs, dtype=torch.float32) for s in samples] + [torch.zeros(1)] * pad_rows,
                padding_value=0.0, padding_side="right",
            ).to(device)  # fmt: skip
            output["sampling_per_token_logps"] = sampled
        if correct_sampling:
            scored = completion_mask * tool_mask
            ratio = importance_sampling_ratio(output["old_per_token_logps"], sampled, scored, self.args)
            output["importance_sampling_ratio"] = ratio
            kept = scored.bool()
            gap = (output["old_per_token_logps"] - sampled).abs()[kept]
            per_row = self.args.vllm_importance_sampling_mode.startswith("sequence")
            flat = ratio.flatten() if per_row else ratio[kept]
            for name, values in (("sampling/sampling_logp_difference", gap), ("sampling/importance_sampling_ratio", flat)):
                every = [v for part in gather_object([values.tolist()]) for v in part]
                if every:  # TRL's metrics of the correction, under TRL's names
                    metrics[f"{name}/mean"].append(_mean(every))
                    metrics[f"{name}/max"].append(max(every))
                    if name.endswith("ratio"):
                        metrics[f"{name}/min"].append(min(every))
        self._log_completions(batch, samples, rewards, groups, mode)
        tokens = sum(gather_object([sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)]))
        if mode == "train":  # TRL's count: every row's prompt and completion tokens
            self.state.num_input_tokens_seen += tokens
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        # envace_gym.training.metrics: what the pure-torch trainer logs too, computed by the same function
        scored = gather_object(list(zip(groups, rewards, strict=True)))  # every process's (group, reward) pairs
        played, zero_std = names.group_counts([g for g, _ in scored], [r for _, r in scored])
        # separate mode: act + rehearse rows; inline: one episode row each; user="rehearse": user rows too
        per_role = gather_object([names.role_counts(samples)])
        logged = names.step_metrics(
            gather_object([names.EpisodeTally.of(e, r) for e, r in zip(batch.episodes, rewards, strict=True)]),
            {role: sum(part[role] for part in per_role) for role in names.ROLES},
            trained_tokens=sum(gather_object([sum(sum(s.mask) for s in samples if s.reward is not None)])),
            groups=played,
            zero_std_groups=zero_std,
            skipped_tasks=sum(gather_object([batch.stats.skipped_tasks])),
        )
        for name, value in logged.items():
            metrics[name].append(float(value))
        self.masked_episodes = getattr(self, "masked_episodes", 0) + logged[names.MASKED]  # over all processes
        if mode == "train":  # why a step learns nothing, said once per run with the remedy
            mine = zip(groups, rewards, (episode_facts(e.calls) for e in batch.episodes), strict=True)
            facts = gather_object(list(mine))
            rehearses = self.args.executor != "real" and self.args.rehearsal_mode == "separate"
            self.no_learning.observe(
                step_evidence([g for g, _, _ in facts], [r for _, r, _ in facts], [f for _, _, f in facts]),
                int(logged[names.rows(Role.REHEARSE)]) if rehearses else None,
                emit=self.accelerator.is_main_process,
            )
        self._envace_batches = getattr(self, "_envace_batches", 0) + 1
        metrics["rollouts/batches_this_run"].append(float(self._envace_batches))  # restarts at 1 on --resume
        return output

    def _log_completions(
        self, batch: RolloutBatch, samples: list[Row], rewards: list[float | None], groups: list[Any], mode: str
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

