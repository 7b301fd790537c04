"""vLLM's engine step on a CPU: one seeded rollout batch with vLLM's CPU default step (4,096 tokens) and with
``VLLMPolicy``'s (``CPU_STEP_TOKENS``), side by side in one process, in alternating order.

    .venv-vllm/bin/python benchmarks/vllm_step.py                      # the default model, units
    .venv-vllm/bin/python benchmarks/vllm_step.py --model runs/x/seed-0/sft/final --tasks 8 --group_size 8

A seeded batch is submitted in parts whose prompts fit one engine step (see ``envace_gym.policy.vllm``); with
a narrow step the parts run one after another, each decoding a few sequences. A wide step costs at start: the
engine's warm-up runs a forward of a whole step; both costs are printed. Needs ``make test-vllm``'s venv.
"""

from __future__ import annotations

import argparse
import time

from envace_gym import make_domain
from envace_gym.policy.default_model import ensure_default_model
from envace_gym.policy.vllm import CPU_STEP_TOKENS, VLLMPolicy
from envace_gym.rehearsal.prompt import rollout_sampling
from envace_gym.rollout import collect_rollouts

VLLM_CPU_DEFAULT_STEP = 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    parser.add_argument("--domain", default="units")
    parser.add_argument("--tasks", type=int, default=8, help="the last N training tasks")
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=63)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    model = args.model or str(ensure_default_model())
    domain = make_domain(args.domain)
    tasks = domain.tasks("train")[-args.tasks :]
    sampling, rehearsal = rollout_sampling(args.max_new_tokens, 1.0)
    engines = {}
    for step in (VLLM_CPU_DEFAULT_STEP, CPU_STEP_TOKENS):  # the engine's warm-up runs a forward of a whole step
        started = time.perf_counter()
        engines[step] = VLLMPolicy(model, dtype="float32", engine_kwargs={"max_num_batched_tokens": step})
        print(f"engine with a {step}-token step started in {time.perf_counter() - started:.1f} s", flush=True)
    seconds: dict[int, float] = dict.fromkeys(engines, 0.0)
    for k in range(args.rounds):
        for step in engines if k % 2 == 0 else reversed(engines):
            started = time.perf_counter()
            batch = collect_rollouts(
                engines[step], domain, tasks, args.group_size, executor="real", act_sampling=sampling,
                rehearsal=rehearsal, on_invalid="feedback", reward="reference", seed=k,
            )  # fmt: skip
            took = time.perf_counter() - started
            seconds[step] += took
            success = sum(e.success for e in batch.episodes) / len(batch.episodes)
            print(f"round {k}, step {step:>6} tokens: {took:6.1f} s, success {success:.3f}", flush=True)
    slow, fast = seconds[VLLM_CPU_DEFAULT_STEP], seconds[CPU_STEP_TOKENS]
    print(f"{VLLM_CPU_DEFAULT_STEP}-token step / {CPU_STEP_TOKENS}-token step: {slow / fast:.2f}x the time")


if __name__ == "__main__":
    main()
