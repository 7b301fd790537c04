"""The quick run in TRL: warm-start a model on your own domain's reference rows, then role-wise GRPO with
``EnvACEGRPOTrainer`` (or TRL's own ``GRPOTrainer`` with ``make_rollout_func``). What ``envace train
--warm_start sft`` does, as a script to copy (docs/training.md, "The quick run").

Run:  python examples/calendar_quick_run.py                      # EnvACEGRPOTrainer, the default model
      python examples/calendar_quick_run.py --trainer rollout_func --steps 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transformers import AutoTokenizer

from envace_gym.domains.registry import make_domain
from envace_gym.integrations.trl import (
    EnvACEGRPOConfig,
    EnvACEGRPOTrainer,
    envace_reward,
    make_rollout_func,
    task_dataset,
    warm_start,
)
from envace_gym.policy.default_model import ensure_default_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calendar_domain import CalendarDomain  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a path or hub id (default: the embedded SmolLM2-135M)")
    parser.add_argument("--trainer", choices=("envace", "rollout_func"), default="envace")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps")
    parser.add_argument("--output_dir", default="runs/calendar-quick")
    args = parser.parse_args()
    out = Path(args.output_dir)
    domain = CalendarDomain()
    model = args.model or str(ensure_default_model())
    # 1. the short SFT on the domain's reference rows, both roles (envace_gym.training.sft.warm_start's defaults)
    start = warm_start(model, domain, out / "warm_start")
    tokenizer = AutoTokenizer.from_pretrained(start)
    common = dict(
        output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=128, learning_rate=1e-5, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True,
    )  # fmt: skip
    # 2. GRPO from the warm-started model
    if args.trainer == "envace":
        config = EnvACEGRPOConfig(domain=f"{Path(__file__).resolve().parent / 'calendar_domain.py'}:CalendarDomain",
                                  **common)  # fmt: skip
        trainer = EnvACEGRPOTrainer(model=str(start), args=config, processing_class=tokenizer)
    else:
        from trl import GRPOConfig, GRPOTrainer

        trainer = GRPOTrainer(
            model=str(start), reward_funcs=[envace_reward], args=GRPOConfig(**common), processing_class=tokenizer,
            train_dataset=task_dataset(make_domain(domain)), rollout_func=make_rollout_func(domain),
        )  # fmt: skip
    trainer.train()
    for entry in trainer.state.log_history:
        if "reward" in entry:
            print({k: entry.get(k) for k in ("step", "reward", "frac_reward_zero_std", "rows/act", "rows/rehearse")})


if __name__ == "__main__":
    main()
