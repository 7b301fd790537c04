"""One seeded step of the pure-torch trainer, for tests/test_sharding.py: ``sharded`` under ``torchrun`` (FSDP2
over gloo), ``single`` in one process on the global batch the sharded ranks played (recorded by them).

    python -m torch.distributed.run --nproc_per_node 2 tests/sharded_step.py OUT sharded
    python tests/sharded_step.py OUT single
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import torch

from envace_gym.domains.registry import make_domain, register_domain
from envace_gym.policy.tiny import tiny_policy
from envace_gym.training import sharding
from envace_gym.training import trainer as trainer_module
from envace_gym.training.trainer import TrainerConfig, token_logprobs, train


class SpreadUnits(type(make_domain("units"))):
    """units-v0 with a reward that varies from episode to episode (the tiny model never solves a task), so the
    step has advantages, a loss and gradients to compare."""

    name = "units-spread"

    def score(self, task, trajectory):
        return (len(repr(trajectory)) % 5) / 4


CONFIG = TrainerConfig(
    domain="units-spread", steps=1, tasks_per_step=3, group_size=4, max_new_tokens=12, learning_rate=1e-3,
    dtype="float32", seed=3, pack_tokens=1024,
)  # fmt: skip


def main(out: Path, mode: str) -> None:
    register_domain("units-spread", SpreadUnits, overwrite=True)
    rank = int(os.environ.get("RANK", "0"))
    played, passes = [], {"all": 0, "idle": 0}
    collect, loss = trainer_module.collect_rollouts, trainer_module.grpo_loss

    def counting_loss(model, rows, *args, **kwargs):
        passes["all"] += 1
        passes["idle"] += rows[0] is trainer_module._IDLE_ROW
        return loss(model, rows, *args, **kwargs)

    trainer_module.grpo_loss = counting_loss
    if mode == "sharded":
        trainer_module.collect_rollouts = lambda *a, **k: played.append(collect(*a, **k)) or played[-1]
    else:  # the global batch: both ranks' episodes, groups renumbered
        batches = [pickle.loads((out / f"batch-{r}.pkl").read_bytes()) for r in range(2)]
        trainer_module.collect_rollouts = lambda *a, **k: trainer_module._merge(*batches)
        # on-policy: what the ranks sampled from the gathered weights, scored by the starting model itself
        rows = [s for b in batches for s in b.samples() if any(s.mask)]
        logp, mask = token_logprobs(tiny_policy(seed=1).model, rows, CONFIG.temperature)
        recorded = torch.zeros_like(logp)
        for i, s in enumerate(rows):
            recorded[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
        on_policy_gap = float(((logp - recorded).abs() * mask).max().detach())
    policy = tiny_policy(seed=1)
    (step,) = train(policy, CONFIG, checkpoint=out / f"{mode}-state.pt")
    if mode == "sharded":
        (out / f"batch-{rank}.pkl").write_bytes(pickle.dumps(played[0]))
        # the checkpoint, read back into fresh shards, holds the step's weights
        fresh = sharding.shard(tiny_policy(seed=1).model)
        optimizer = torch.optim.AdamW(fresh.parameters(), lr=CONFIG.learning_rate)
        history = sharding.load_sharded_state(out / "sharded-state.pt", fresh, optimizer, np.random.default_rng(0))
        whole = dict(policy.model.named_parameters())
        gap = max(float((full - whole[name]).abs().max()) for name, full in sharding.full_parameters(fresh))
        passes.update(resumed_gap=gap, resumed_steps=len(history))
        (out / f"passes-{rank}.json").write_text(json.dumps(passes))
    if rank == 0:
        torch.save({"step": step, "weights": policy.model.state_dict()}, out / f"{mode}.pt")
        if mode == "single":
            (out / "on_policy.json").write_text(json.dumps({"max_gap": on_policy_gap}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
