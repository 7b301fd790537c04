"""The learning check: does EnvACE training, with no real tool execution at all, raise held-out success
measured with the real tools? (Meant to become a test in `make test` once a setting passes it on every seed;
docs/results.md has what it measured so far.)

A from-scratch 2-layer model (``tiny_start_model``) is warmed up by SFT on reference trajectories of the easy
``lights`` variant, then trained by the pure-torch EnvACE trainer: the policy rehearses every call
(``executor="rehearsal"``), episodes are scored on the task's reference (``reward="reference"``), so the real
executor never runs. Held-out success is measured before and after with the real executor, sampled at the
paper's evaluation setting (T 0.6, top-p 0.95) with a fixed seed.

Run it to see the gain over seeds, and what a broken learner does:

    python benchmarks/learning_check.py --seeds 0 1 2 3 4
    python benchmarks/learning_check.py --seeds 0 --broken flip-advantage
    python benchmarks/learning_check.py --seeds 0 --broken no-rehearse-rows
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

SFT_STEPS, SFT_LR = 200, 1e-3
RL_STEPS, RL_LR, RL_TEMPERATURE = 40, 1e-4, 0.7
EVAL_TASKS, EVAL_SEED = 64, 1234


def learning_domain():
    from envace_gym import make_domain

    return make_domain("lights:easy")


def held_out_success(policy, domain) -> float:
    from envace_gym.evaluation import evaluate

    result = evaluate(
        policy, domain, "test", EVAL_TASKS, max_new_tokens=96, temperature=0.6, top_p=0.95, seed=EVAL_SEED,
        fidelity=False,
    )  # fmt: skip
    return result.success_rate


def learn(seed: int, workdir: Path, broken: str | None = None) -> dict[str, float]:
    """SFT, then EnvACE; held-out success before and after, and the real tool calls made while training."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_gym.policy.transformers import TransformersPolicy
    from envace_gym.training import trainer as trainer_module
    from envace_gym.training.sft import sft_steps, tiny_start_model
    from envace_gym.training.trainer import TrainerConfig, train

    domain = learning_domain()
    start = tiny_start_model(domain, workdir / "start", seed=seed)
    sft_steps(start, domain, workdir / "sft", tasks=200, steps=SFT_STEPS, learning_rate=SFT_LR, seed=seed)
    policy = TransformersPolicy(
        AutoModelForCausalLM.from_pretrained(workdir / "sft"), AutoTokenizer.from_pretrained(workdir / "sft")
    )
    before = held_out_success(policy, domain)
    config = TrainerConfig(
        domain=domain, executor="rehearsal", reward="reference", on_invalid="feedback", tasks_per_step=4,
        group_size=8, max_new_tokens=96, temperature=RL_TEMPERATURE, steps=RL_STEPS, learning_rate=RL_LR,
        seed=seed, dtype="float32",
    )  # fmt: skip
    advantages = trainer_module.rolewise_advantages
    if broken == "flip-advantage":
        trainer_module.rolewise_advantages = lambda *a: [-x for x in advantages(*a)]
    elif broken == "no-rehearse-rows":
        trainer_module.rolewise_advantages = lambda g, roles, r: [
            0.0 if role == "rehearse" else x for x, role in zip(advantages(g, roles, r), roles, strict=True)
        ]
    try:
        history = train(policy, config)
    finally:
        trainer_module.rolewise_advantages = advantages
    return {
        "before": before,
        "after": held_out_success(policy, domain),
        "real_tool_calls": sum(h["real_tool_calls"] for h in history),
        "rows_rehearse": sum(h["rows_rehearse"] for h in history),
    }


if __name__ == "__main__":
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--broken", choices=["flip-advantage", "no-rehearse-rows"], default=None)
    args = parser.parse_args()
    for seed in args.seeds:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            got = learn(seed, Path(tmp), args.broken)
        gain = got["after"] - got["before"]
        print(f"seed {seed}: before {got['before']:.3f} after {got['after']:.3f} gain {gain:+.3f} "
              f"real tool calls {got['real_tool_calls']} ({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
