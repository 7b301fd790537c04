"""World rehearsal in TRL's own ``GRPOTrainer``: the ``rollout_func`` path, in three pieces.

* The dataset is **task ids**, not chats: ``task_dataset(domain)`` makes it (one row per task, ``prompt`` the
  task's id, e.g. ``"units/train/000"``). The rollout function looks each task up by its id; a chat prompt is
  refused ("world-rehearsal rollouts need task ids as prompts").
* ``make_rollout_func(domain, ...)`` plays each prompt to the end as one episode with the model being trained
  (Act turns, rehearsed tool results, the scripted user's turns) and hands TRL one row per episode.
* ``envace_reward`` is the reward function: each episode's task-success reward, scored by the domain when the
  episode ends (``None``, which TRL masks, where the verifier could not judge).

The paper's objective (A = R - group mean, dual-clip 3, token mean) is the ``GRPOConfig`` settings below.
Run:  python examples/trl_rollout_func.py [--model PATH] [--domain units] [--steps 2]
(default: the tiny random model built in process, for a look at the mechanics: it solves no task, so every
reward is 0 and the loss stays 0; start from a model that solves some tasks, e.g. after ``envace train --mode sft``).
"""

from __future__ import annotations

import argparse

import torch
from trl import GRPOConfig, GRPOTrainer

from envace_gym.integrations.trl import envace_reward, make_rollout_func, paper_objective, task_dataset
from envace_gym.policy.factory import make_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a model folder or hub id; 'tiny': built in process")
    parser.add_argument("--domain", default="units", help="a domain name, folder or dataset file")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps")
    parser.add_argument("--output_dir", default="runs/trl-rollout-func")
    args = parser.parse_args()

    policy = make_policy(args.model)  # a (model, tokenizer) for TRL; a path or hub id works as model= too
    config = GRPOConfig(
        output_dir=args.output_dir,
        per_device_train_batch_size=4,  # episodes per step: 2 tasks x num_generations
        num_generations=2,  # the G of GRPO: episodes per task
        max_completion_length=32,  # the token budget of each Act turn and rehearsal
        max_steps=args.steps,
        learning_rate=1e-5,
        # the paper's objective on one row per episode (EnvACEGRPOConfig's defaults): scale_rewards="none",
        # delta=3.0, loss_type="dapo", use_bias_correction_kl=False (epsilon 0.2 is GRPOConfig's own default)
        **paper_objective(),
        logging_steps=1, save_strategy="no", report_to="none", seed=0,
        use_cpu=not torch.cuda.is_available(), bf16=False,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=policy.model,
        processing_class=policy.tokenizer,
        args=config,
        train_dataset=task_dataset(args.domain),  # prompt = the task id
        rollout_func=make_rollout_func(args.domain, max_turns=2),  # max_turns: keep the look short
        reward_funcs=envace_reward,
    )
    trainer.train()
    for entry in trainer.state.log_history:
        if "reward" in entry:
            print(f"step {entry['step']}: reward {entry['reward']:.3f}, "
                  f"completion length {entry.get('completions/mean_length', float('nan')):.1f} tokens")  # fmt: skip


if __name__ == "__main__":
    main()
