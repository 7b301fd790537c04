"""Quickstart: one episode of the `bank` domain, played twice: once with the real tools, once rehearsed.

The Act turns come from the task's reference solution, so the episode is the same in both runs and you
can compare what the real executor answers with what the policy (the embedded SmolLM2-135M by default)
rehearses. Run:  python examples/quickstart.py [--model tiny]
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import envace_gym  # noqa: F401  (registers EnvACE-Rehearsal-v0)
from envace_gym import RehearsalConfig


def play(executor: str, model: str | None, task_id: str) -> None:
    env = gym.make(
        "EnvACE-Rehearsal-v0",
        domain="bank",
        policy=model,
        executor=executor,
        on_invalid="feedback",  # show every call, even after a broken rehearsal
        rehearsal=RehearsalConfig(max_new_tokens=64, temperature=0.0),
    )
    obs, info = env.reset(options={"task": task_id})
    task = env.unwrapped.episode.task
    print(f"\n--- executor={executor}: {task.prompt}")
    for turn in task.reference:
        obs, reward, terminated, truncated, info = env.step(turn.text)
        for call in info["calls"]:
            answer = call["result"] if call["error"] is None else call["error"]["code"]
            print(f"{call['route']:>9}: {call['name']}({call['arguments']}) -> {answer}")
        if terminated or truncated:
            print(f"reward {reward:.2f}  checks {info['reward_checks']}")
            break


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M; 'tiny' for a random model")
    parser.add_argument("--task", default="bank/000")
    args = parser.parse_args()
    play("real", args.model, args.task)
    play("rehearsal", args.model, args.task)
