"""The quick run in TRL: warm-start a model on your own domain's reference rows, then role-wise GRPO with
``EnvACEGRPOTrainer`` (or TRL's own ``GRPOTrainer`` with ``make_rollout_func``). What ``envace train
--warm_start sft`` does, as a script to copy (docs/training.md, "The quick run").

By default the model is ``tiny``: a from-scratch 2-layer model whose tokenizer is learnt from the domain's own
texts, warm-started with ``FROM_SCRATCH_WARM_START`` (minutes on a CPU). ``--model`` takes a pretrained model's
path or hub id instead (``default``: the embedded SmolLM2-135M), warm-started with the pretrained defaults.
The folder layout is ``envace train``'s (``initial_model/``, ``warm_start/``), so either reuses the other's
warm start in the same ``--output_dir``.

``--trainer rollout_func`` plays ``separate`` rehearsal (what the warm start teaches): the policy rehearses every
call, and the episode's one row trains its Act tokens (``EnvACEGRPOTrainer`` trains the rehearsals as rows too).

Run:  python examples/calendar_quick_run.py                      # EnvACEGRPOTrainer, the tiny model
      python examples/calendar_quick_run.py --trainer rollout_func --steps 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transformers import AutoTokenizer

from envace_gym.domains.registry import make_domain
from envace_gym.integrations.trl import (
    FROM_SCRATCH_WARM_START,
    EnvACEGRPOConfig,
    EnvACEGRPOTrainer,
    envace_reward,
    make_rollout_func,
    task_dataset,
    tiny_start_model,
    warm_start,
)
from envace_gym.policy.default_model import ensure_default_model

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from calendar_domain import CalendarDomain  # noqa: E402


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (made here), default (SmolLM2-135M), a path or hub id")
    parser.add_argument("--trainer", choices=("envace", "rollout_func"), default="envace")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps")
    parser.add_argument("--output_dir", default="runs/calendar-quick")
    args = parser.parse_args(argv)
    out = Path(args.output_dir)
    domain = CalendarDomain()
    # 1. the short SFT on the domain's reference rows, both roles
    if args.model == "tiny":
        start = warm_start(tiny_start_model(domain, out / "initial_model"), domain, out / "warm_start",
                           FROM_SCRATCH_WARM_START)  # fmt: skip
    else:
        model = str(ensure_default_model()) if args.model == "default" else args.model
        start = warm_start(model, domain, out / "warm_start")
    tokenizer = AutoTokenizer.from_pretrained(start)
    common = dict(
        output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=128, learning_rate=1e-5, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True,
    )  # fmt: skip
    # 2. GRPO from the warm-started model
    if args.trainer == "envace":
        config = EnvACEGRPOConfig(domain=f"{HERE / 'calendar_domain.py'}:CalendarDomain", **common)
        trainer = EnvACEGRPOTrainer(model=str(start), args=config, processing_class=tokenizer)
    else:
        from trl import GRPOConfig, GRPOTrainer

        trainer = GRPOTrainer(
            model=str(start), reward_funcs=[envace_reward], args=GRPOConfig(**common), processing_class=tokenizer,
            train_dataset=task_dataset(make_domain(domain)),
            # separate, as the warm start taught (inline rehearsals, written in the chat's tool turn, it never saw):
            # the policy rehearses every call; the episode's row trains its Act tokens
            rollout_func=make_rollout_func(domain, rehearsal_mode="separate"),
        )  # fmt: skip
    trainer.train()
    steps = [entry for entry in trainer.state.log_history if "reward" in entry]
    for entry in steps:  # what to look for: rows of both roles, and a reward spread (frac_reward_zero_std < 1)
        print({k: entry[k] for k in ("step", "reward", "frac_reward_zero_std", "rows/act", "rows/rehearse") if k in entry})
    return steps


if __name__ == "__main__":
    main()
