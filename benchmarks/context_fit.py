"""How many gold replays of each benchmark fit the default model's context (8,192 tokens).

Replays every task's reference solution (real executor, no generation) with the default model's tokenizer and
context, and counts the episodes that end at the context guard. Needs `make benchmarks`. Run:

    python benchmarks/context_fit.py            # bfcl:multi_turn_base tau2:retail tau2:airline
"""

from __future__ import annotations

import argparse

from transformers import AutoTokenizer

from envace_gym import make_domain
from envace_gym.policy.default_model import ensure_default_model
from envace_gym.rollout import collect_rollouts
from envace_gym.testing import ScriptedPolicy

BENCHMARKS = ("bfcl:multi_turn_base", "tau2:retail", "tau2:airline")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("domains", nargs="*", default=list(BENCHMARKS))
    parser.add_argument("--max-context", type=int, default=8192, help="the default model's context")
    args = parser.parse_args()
    policy = ScriptedPolicy([], AutoTokenizer.from_pretrained(ensure_default_model(verbose=False)))
    policy.max_context = args.max_context
    print("| benchmark | gold replays | fit the context | end at the context guard | full reward |")
    print("|---|---|---|---|---|")
    for name in args.domains:
        domain = make_domain(name)
        tasks = list(domain.tasks("train")) + list(domain.tasks("test"))
        batch = collect_rollouts(policy, domain, tasks, executor="real", act="reference", progress=name)
        cut = sum(e.truncation == "context" for e in batch.episodes)
        full = sum(e.reward == 1.0 for e in batch.episodes)
        print(f"| `{name}` | {len(tasks)} | {len(tasks) - cut} | {cut} | {full} |", flush=True)


if __name__ == "__main__":
    main()
