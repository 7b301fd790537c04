"""A compact, pure-torch EnvACE trainer: role-wise GRPO on world-rehearsal rollouts.

Read it top to bottom against docs/method.md ("Reward and objective"):

1. **Roll out** G episodes per task with the collector. The policy acts, and the *same weights* rehearse
   every tool call (``executor="rehearsal"``); each generation becomes a training row carrying its episode's
   task-success reward R (``separate`` mode: Act rows and Rehearse rows; ``inline`` mode: one row per episode
   with both roles' tokens marked). With ``user="rehearse"`` the policy also plays each task's simulated user,
   and every user turn is a row of a third role, ``"user"``.
2. **Advantages, role-wise**: A = R - mean(R over the rows of that role in the same group), no std division.
3. **One on-policy gradient step**: the PPO clipped objective (``epsilon`` 0.2) with dual-clip (``delta``,
   c = 3) for negative advantages, averaged over every trained token of the batch (token-mean), plus an
   optional low-variance KL penalty (k3, weight ``beta``) against a frozen reference copy. The log-probabilities
   come from the shared-prefix forward (:mod:`envace_gym.training.packing`): the rows' common prefixes are encoded
   once, with the same values as a per-row forward.

It needs nothing but torch and the collector, which is the point: any RL loop can drive the environment.
Launched with ``torchrun`` it trains past one device on torch's FSDP2 (:mod:`envace_gym.training.sharding`):
each rank plays its share of the tasks, the advantages and the token-mean are the global batch's.
For TRL's trainers see :mod:`envace_gym.integrations.trl`.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..domains.domain import Domain
from ..domains.registry import make_domain
from ..episode.config import EpisodeSettings
from ..episode.types import Role, Row
from ..policy.precision import autocast, resolve_dtype
from ..policy.protocol import Policy
from ..policy.transformers import TransformersPolicy
from ..rehearsal.prompt import rollout_sampling
from ..rollout.collector import RolloutBatch, collect_rollouts
from . import metrics, sharding
from .advantages import rolewise_advantages
from .diagnosis import NoLearningMonitor, episode_facts, step_evidence
from .packing import DEFAULT_PACK_TOKENS, completion_logprobs, packing_support, plan_packs
from .state import load_state, save_state

if TYPE_CHECKING:
    from ..policy.vllm import VLLMPolicy


@dataclass
class TrainerConfig(EpisodeSettings):
    """Settings of :func:`train`, grouped as in TRL's configs; every field has a ``help``. How the rollouts' episodes
    are played (executor, rehearsal mode, reward, user, limits, ...) are the :class:`EpisodeSettings` it inherits.

    The objective's knobs have TRL's names (``epsilon``, ``delta``, ``beta``, as in ``GRPOConfig``); G is
    ``group_size`` (TRL's ``num_generations``).
    """

    # Parameters that control the rollouts
    domain: str | Domain = field(
        default="bank", metadata={"help": "Domain to train on (name, folder, dataset file or Domain object)."}
    )
    frozen_simulator: bool = field(
        default=False,
        metadata={
            "help": "The paper's ablation: rehearsals by a frozen copy of the starting model, only Act rows trained "
            "(separate mode); False: the policy rehearses and both roles train (EnvACE)."
        },
    )
    tasks_per_step: int = field(default=2, metadata={"help": "Tasks per batch (each gives one group)."})
    group_size: int = field(default=4, metadata={"help": "Episodes per task: the G of GRPO (TRL's num_generations)."})
    max_new_tokens: int = field(
        default=128,
        metadata={"help": "Token budget of each Act turn and rehearsal (per generation; TRL's max_completion_length)."},
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of training rollouts."})

    # Parameters that control the training
    steps: int = field(default=10, metadata={"help": "Gradient steps (one per batch of rollouts; TRL's max_steps)."})
    learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate (the paper: 1e-6 for 8B)."})
    epsilon: float = field(default=0.2, metadata={"help": "PPO clip range epsilon (as TRL's GRPOConfig.epsilon)."})
    delta: float | None = field(
        default=3.0,
        metadata={
            "help": "Dual-clip bound c for negative advantages (as TRL's GRPOConfig.delta, which caps their ratio at "
            "delta: the same loss); None: no dual clip."
        },
    )
    beta: float = field(
        default=0.0, metadata={"help": "Coefficient of the low-variance KL (k3) penalty (the paper: 1e-4 or 0)."}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    refill_zero_std: int = field(
        default=0,
        metadata={
            "help": "DAPO-style dynamic sampling: up to this many extra rollout rounds per step replace the groups "
            "whose episodes all earned the same reward (they carry no gradient), and such groups leave the "
            "token-mean; 0: keep every group (the paper's). Either way frac_reward_zero_std is logged."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seeds task draws and sampling."})
    train_tasks: int | None = field(
        default=None,
        metadata={"help": "Draw tasks from the first N training tasks only (the rest can be validation); None: all."},
    )

    # Parameters that control speed and memory
    shared_prefix: bool = field(
        default=True, metadata={"help": "Shared-prefix forward: encode each prefix rows share once (exact)."}
    )
    pack_tokens: int = field(
        default=DEFAULT_PACK_TOKENS,
        metadata={
            "help": "Tokens per forward/backward micro-batch: the positions of one pack (shared_prefix), or rows x "
            "longest row (plain)."
        },
    )
    dtype: str = field(
        default="auto",
        metadata={"help": "Compute dtype: auto (bfloat16 where the hardware has it natively), float32 or bfloat16."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # the episode settings
        if self.frozen_simulator and (self.rehearsal_mode != "separate" or self.executor != "rehearsal"):
            raise ValueError("frozen_simulator rehearses with executor='rehearsal' in rehearsal_mode='separate'")
        if not isinstance(self.user, str):
            raise ValueError("user is a name or an endpoint URL here; pass a UserSimulator to collect_rollouts instead")
        if self.train_tasks is not None and self.train_tasks < self.tasks_per_step:
            raise ValueError(f"train_tasks ({self.train_tasks}) must be at least tasks_per_step ({self.tasks_per_step})")
        if self.refill_zero_std < 0:
            raise ValueError(f"refill_zero_std must be at least 0, got {self.refill_zero_std}")
        if self.epsilon <= 0:
            raise ValueError(f"epsilon (the clip range) must be positive, got {self.epsilon}")
        if self.delta is not None and self.delta <= 1 + self.epsilon:  # below, it stops gradients PPO's clip keeps
            raise ValueError(f"delta (the dual-clip bound) must exceed 1 + epsilon = {1 + self.epsilon}, got {self.delta}")


def token_logprobs(
    model: Any,
    rows: Sequence[Row],
    temperature: float,
    *,
    packing: bool = True,
    budget: int = DEFAULT_PACK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(completion token | everything before it) at ``temperature``, for a batch of rows.

    Returns ``(logprobs, mask)`` of shape (rows, longest completion), completions left-aligned. With ``packing``
    the rows go through the shared-prefix forward (:mod:`envace_gym.training.packing`; the same values, fewer tokens
    encoded), else through one padded batch.
    """
    per_row = completion_logprobs(
        model, [r.prompt_ids for r in rows], [r.completion_ids for r in rows], temperature, packing=packing,
        budget=budget,
    )  # fmt: skip
    width = max(len(r.completion_ids) for r in rows)
    device = per_row[0].device
    logp = torch.zeros((len(rows), width), device=device)
    mask = torch.zeros((len(rows), width), device=device)
    for i, (r, lp) in enumerate(zip(rows, per_row, strict=True)):
        logp[i, : len(lp)] = lp
        mask[i, : len(r.mask)] = torch.tensor(r.mask, dtype=torch.float, device=device)
    return logp, mask


def micro_batches(items: list[Any], budget: int, size: Callable[[Any], int]) -> list[list[Any]]:
    """Consecutive groups of items whose padded size (rows x longest) stays within ``budget`` tokens."""
    out: list[list[Any]] = []
    for item in sorted(items, key=size):
        if out and (len(out[-1]) + 1) * max(size(item), *(size(x) for x in out[-1])) <= budget:
            out[-1].append(item)
        else:
            out.append([item])
    return out


def _micro_batches(model: Any, pairs: list[tuple[Row, float]], config: TrainerConfig) -> list[list[Any]]:
    """(row, advantage) pairs in groups of one forward and backward each, within ``pack_tokens``:
    packed, the positions of a group's prefix tree (rows that share prefixes land together); plain, the
    padded size."""
    if config.shared_prefix and packing_support(model) is None:
        packs = plan_packs([s.prompt_ids + s.completion_ids for s, _ in pairs], config.pack_tokens)
        return [[pairs[i] for i in pack] for pack in packs]
    return micro_batches(pairs, config.pack_tokens, lambda p: len(p[0].prompt_ids) + len(p[0].completion_ids))


def grpo_loss(
    model: Any,
    rows: Sequence[Row],
    advantages: Sequence[float],
    config: TrainerConfig,
    total_tokens: int,
    reference: Any = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy-gradient loss of ``rows``, divided by ``total_tokens`` (the batch's trained tokens,
    so micro-batches add up to a token-mean). The "old" log-probs are those recorded while sampling."""
    device = next(model.parameters()).device
    with autocast(resolve_dtype(config.dtype, device), device):
        logp, mask = token_logprobs(
            model, rows, config.temperature, packing=config.shared_prefix, budget=config.pack_tokens
        )
    old = torch.zeros_like(logp)
    for i, s in enumerate(rows):
        old[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
    adv = torch.tensor(list(advantages), dtype=logp.dtype, device=logp.device)[:, None]
    ratio = torch.exp(logp - old)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - config.epsilon, 1 + config.epsilon) * adv)
    if config.delta is not None:  # dual-clip: bound how far a negative advantage can push
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, config.delta * adv), surrogate)
    per_token = -surrogate
    kl_sum = 0.0
    if reference is not None:
        with torch.no_grad(), autocast(resolve_dtype(config.dtype, device), device):
            ref_logp, _ = token_logprobs(
                reference, rows, config.temperature, packing=config.shared_prefix, budget=config.pack_tokens
            )
        kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1  # k3: the low-variance KL estimate
        per_token = per_token + config.beta * kl
        kl_sum = float((kl * mask).sum().detach())
    loss = (per_token * mask).sum() / max(total_tokens, 1)
    clipped = float((((ratio - 1).abs() > config.epsilon).float() * mask).sum().detach())
    return loss, {"loss": float(loss.detach()), "clipped": clipped, "kl": kl_sum}


def train(
    policy: TransformersPolicy,
    config: TrainerConfig,
    log: Callable[[dict[str, Any]], None] | None = None,
    *,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 0,
    on_checkpoint: Callable[[int], None] | None = None,
    simulator: Policy | None = None,
    engine: VLLMPolicy | None = None,
) -> list[dict[str, Any]]:
    """Train ``policy.model`` in place; returns one metrics dict per step (also passed to ``log``).

    Under ``torchrun`` (several processes) the trained copy is sharded by FSDP2 and ``policy.model``, whole on
    every rank, is loaded from its shards after every step (see :mod:`~envace_gym.training.sharding`); every rank
    calls ``train`` with the same config, the metrics are the global batch's, and rank 0 writes the checkpoint.

    ``checkpoint``: a file that holds the training state (weights, optimizer, random state, history) every
    ``checkpoint_every`` steps and at the end; when it exists, training resumes from it. ``on_checkpoint(step)``
    runs just before each save (an evaluation for a learning curve, say). ``simulator``: the frozen simulator of
    ``config.frozen_simulator`` (default: a copy of the weights ``policy`` holds when called, before a checkpoint
    is loaded, as the KL reference is: the starting weights, when a resumed run is given its starting model).
    ``engine``: a faster generator of the same model (a :class:`~envace_gym.policy.vllm.VLLMPolicy` in
    ``config.dtype``) that plays the rollouts instead of ``policy``; it is given ``policy.model``'s weights
    (``engine.load_weights``) before the first rollout and after every optimizer step, so each step's rollouts
    come from the weights being trained, and ``on_checkpoint`` evaluates what it holds.
    """
    model, domain = policy.model, make_domain(config.domain)
    tasks = domain.tasks("train")
    tasks = tasks if config.train_tasks is None else tasks[: config.train_tasks]  # (a slice builds every task)
    rng = np.random.default_rng(config.seed)  # the same draws on every rank: the tasks of a step, their seeds
    rank, world = sharding.join_process_group(_device(model)) if sharding.launched_distributed() else (0, 1)
    if world > 1 and config.refill_zero_std:
        raise ValueError("refill_zero_std is not implemented under torchrun (each rank would refill its own groups); "
                         "set it to 0 there")  # fmt: skip
    # Past one device the trained copy is sharded (FSDP2); `model` stays whole, for the rollouts.
    trained = sharding.shard(model) if world > 1 else model
    optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=config.learning_rate)
    reference = copy.deepcopy(model).eval().requires_grad_(False) if config.beta > 0 else None
    if reference is not None and world > 1:
        reference = sharding.shard(reference)  # its forwards gather layers like the trained copy's
    if simulator is not None and not config.frozen_simulator:
        raise ValueError("a simulator is given but config.frozen_simulator is False: the policy would rehearse")
    if config.frozen_simulator and simulator is None:  # rehearsals by the starting weights, never updated
        simulator = TransformersPolicy(copy.deepcopy(model).eval().requires_grad_(False), policy.tokenizer)
    if world > 1:
        history: list[dict[str, Any]] = sharding.load_sharded_state(checkpoint, trained, optimizer, rng)
        sharding.load_whole(model, trained)
    else:
        history = load_state(checkpoint, model, optimizer, rng)
    sampling, rehearsal = rollout_sampling(config.max_new_tokens, config.temperature)
    episodes = config.episode_config(act_sampling=sampling, rehearsal=rehearsal)
    # Rollouts sample in the dtype the loss recomputes in, so the recorded log-probs are the "old" ones.
    dtype = resolve_dtype(config.dtype, next(model.parameters()).device)
    actor = policy.with_compute_dtype(None if dtype == torch.float32 else dtype) if engine is None else engine
    if engine is not None:
        engine.load_weights(model.named_parameters())  # the starting (or resumed) weights
    no_learning = NoLearningMonitor("envace_gym.training.train")  # one warning per run (training.diagnosis)
    # the Rehearse role trains only where the policy rehearses each call in a row of its own
    rehearses = simulator is None and config.executor != "real" and config.rehearsal_mode == "separate"
    for step in range(len(history), config.steps):
        started = time.perf_counter()

        # 1. Roll out: G episodes per task; the policy acts and rehearses with the same weights.
        model.eval()

        def roll_out(count: int) -> RolloutBatch:  # this rank's share of the step's tasks
            chosen = [tasks[int(i)] for i in rng.choice(len(tasks), size=count, replace=False)]
            seed = int(rng.integers(2**31)) + rank
            return collect_rollouts(
                actor, domain, chosen[rank::world], config.group_size, episodes, seed=seed, simulator=simulator
            )

        batch = roll_out(config.tasks_per_step)
        # what the step's groups, as played (before a refill keeps the informative ones), give GRPO to learn from
        played_facts = [((rank, e.group), e.reward, episode_facts(e.calls)) for e in batch.episodes]
        played, zero_std = _group_counts(batch)
        skipped = batch.stats.skipped_tasks
        if config.refill_zero_std:  # DAPO: keep only groups with a reward spread, refill the rest
            batch, rounds = _informative(batch), 0
            while _groups(batch) < config.tasks_per_step and rounds < config.refill_zero_std:
                rounds += 1
                extra = roll_out(config.tasks_per_step - _groups(batch))
                more_played, more_zero_std = _group_counts(extra)
                played, zero_std = played + more_played, zero_std + more_zero_std
                skipped += extra.stats.skipped_tasks
                batch = _merge(batch, _informative(extra))
        # (with a refill, the batch and the metrics below hold the kept groups only)
        # a frozen simulator's rehearsals are not trained; a rehearsed user's turns are (user="rehearse")
        trained_roles = [r for r in Role if r is not Role.REHEARSE or simulator is None]
        samples = [s for s in batch.samples(trained_roles) if any(s.mask)]

        # 2. Role-wise advantages: A = R - mean(R of the same role in the same group), no std division, over the
        #    global batch (a group is a rank's: (rank, group)).
        ranks = _everyone(world, [(s.group, s.role, s.reward) for s in samples])
        every = [((r, group), role, reward) for r, part in enumerate(ranks) for group, role, reward in part]
        columns = [list(column) for column in zip(*every, strict=True)] if every else [[], [], []]
        advantages = rolewise_advantages(*columns)
        mine = sum(len(part) for part in ranks[:rank])
        advantages = advantages[mine : mine + len(samples)]
        trained_tokens = sum(_everyone(world, sum(sum(s.mask) for s in samples if s.reward is not None)))

        # 3. One gradient step on the clipped objective, token-mean over the batch (masked episodes skipped).
        #    Micro-batches share their rows' common prefixes (packing); their losses add up to the token-mean.
        #    Every rank runs as many passes as the busiest (FSDP's collectives match); an idle pass trains nothing.
        trained.train()
        optimizer.zero_grad(set_to_none=True)
        totals = {"loss": 0.0, "clipped": 0.0, "kl": 0.0}
        pairs = [(s, a) for s, a in zip(samples, advantages, strict=True) if s.reward is not None]
        micros = _micro_batches(trained, pairs, config)
        for k in range(sharding.global_max(len(micros)) if world > 1 else len(micros)):
            micro = micros[k] if k < len(micros) else [(_IDLE_ROW, 0.0)]
            loss, stats = grpo_loss(
                trained, [s for s, _ in micro], [a for _, a in micro], config, trained_tokens, reference
            )
            (loss * world).backward()  # FSDP2 averages gradients over the ranks: their sum is the token-mean's
            totals = {k: totals[k] + stats[k] for k in totals}
        grad_norm = _as_float(torch.nn.utils.clip_grad_norm_(trained.parameters(), config.max_grad_norm))
        optimizer.step()
        trained.eval()
        if world > 1:
            sharding.load_whole(model, trained)  # the next rollouts' weights, gathered once
        if engine is not None:  # the next rollouts (and an evaluation at this checkpoint) use the new weights
            engine.load_weights(model.named_parameters())

        # The global batch's figures: every rank's episodes, and its counts summed.
        this_rank = ([metrics.EpisodeTally.of(e, e.reward) for e in batch.episodes], played_facts)
        everyone = _everyone(world, this_rank)  # one collective for both
        tallies = [t for part, _ in everyone for t in part]
        facts = [f for _, part in everyone for f in part]
        roles = metrics.role_counts(samples)
        summed = _everyone(world, (zero_std, played, skipped, *totals.values(), *roles.values()))
        counts = [sum(c) for c in zip(*summed, strict=True)]
        zero_std, played, skipped, loss_sum, clipped, kl = counts[:6]
        logged = {  # the names every trainer logs (envace_gym.training.metrics)
            metrics.STEP: step + 1,
            **metrics.step_metrics(
                tallies, dict(zip(roles, counts[6:], strict=True)), trained_tokens=trained_tokens, groups=played,
                zero_std_groups=zero_std, skipped_tasks=skipped,
            ),
            metrics.LOSS: loss_sum,
            metrics.GRAD_NORM: grad_norm,
            metrics.KL: kl / max(trained_tokens, 1),
            metrics.CLIP_RATIO: clipped / max(trained_tokens, 1),
            metrics.STEP_TIME: time.perf_counter() - started,
        }
        no_learning.observe(
            step_evidence([g for g, _, _ in facts], [r for _, r, _ in facts], [f for _, _, f in facts]),
            int(logged[metrics.rows(Role.REHEARSE)]) if rehearses else None,
            emit=rank == 0,
        )
        history.append(logged)
        if log is not None:
            log(logged)
        last = step + 1 == config.steps
        if checkpoint is not None and (last or (checkpoint_every and (step + 1) % checkpoint_every == 0)):
            if on_checkpoint is not None:
                on_checkpoint(step + 1)
            if world > 1:
                sharding.save_sharded_state(checkpoint, trained, optimizer, rng, history)
            else:
                save_state(checkpoint, model, optimizer, rng, history)
    return history


# A pass that trains nothing (mask 0): a rank with fewer micro-batches than the busiest runs it, so that every
# rank gathers and reduces FSDP's shards the same number of times.
_IDLE_ROW = Row(Role.ACT, prompt_ids=(0,), completion_ids=(0,), logprobs=(0.0,), mask=(0,), reward=0.0)


def _everyone(world: int, value: Any) -> list[Any]:
    """``value`` from every rank, in rank order (this rank's alone in a single process)."""
    return sharding.gathered(value) if world > 1 else [value]


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _as_float(norm: torch.Tensor) -> float:
    """A norm that may be a DTensor (FSDP2's gradients): its whole value."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _group_counts(batch: RolloutBatch) -> tuple[int, int]:
    """The batch's groups, and those without a reward spread (:func:`~envace_gym.training.metrics.group_counts`)."""
    return metrics.group_counts([e.group for e in batch.episodes], batch.rewards)


def _groups(batch: RolloutBatch) -> int:
    return len({e.group for e in batch.episodes})


def _informative(batch: RolloutBatch) -> RolloutBatch:
    """The episodes of the groups with a reward spread."""
    spread = batch.reward_spread()
    return RolloutBatch([e for e in batch.episodes if spread.get(e.group, False)], batch.stats)


def _merge(a: RolloutBatch, b: RolloutBatch) -> RolloutBatch:
    """``b``'s episodes after ``a``'s, renumbered so that groups and episode indices stay distinct."""
    groups = {g: i for i, g in enumerate(sorted({e.group for e in a.episodes}))}
    episodes = [dataclasses.replace(e, group=groups[e.group]) for e in a.episodes]
    offset, index = len(groups), len(episodes)
    for k, g in enumerate(sorted({e.group for e in b.episodes})):
        groups_b = [e for e in b.episodes if e.group == g]
        for e in groups_b:
            episodes.append(dataclasses.replace(e, group=offset + k, index=index))
            index += 1
    return RolloutBatch(episodes, a.stats)


__all__ = ["TrainerConfig", "grpo_loss", "token_logprobs", "train"]
