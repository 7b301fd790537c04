"""Private rehearsal with and without the generation session, side by side in one run.

The planner's forks, assessments and committed turns start with the same system prompt, tools and conversation;
through the session (``generate_fresh``) that shared prefix is encoded once per batch instead of once per row.

python benchmarks/planner_prefix.py            # default model, 4 bank test tasks, N=2 parallel, horizon 1
python benchmarks/planner_prefix.py --model tiny
"""

import argparse
import time

from envace_gym.domains import make_domain
from envace_gym.policy import SamplingParams, make_policy
from envace_gym.rollout import PlannerConfig, RehearsalPlanner, collect_rollouts
from envace_gym.testing import tiny_policy


class WithoutSession(RehearsalPlanner):
    """Rehearses exactly like the planner, but never hands the session to its generations."""

    def __call__(self, episodes, rng, session=None, keys=None):
        return super().__call__(episodes, rng, None, keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="path, hub id, or 'tiny'; default: the embedded SmolLM2-135M")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    policy = tiny_policy() if args.model == "tiny" else make_policy(args.model)
    act = SamplingParams(max_new_tokens=32, temperature=0)
    config = PlannerConfig(budget=2, mode="parallel", horizon=1, max_new_tokens=32)
    domain = make_domain("bank")
    tasks = list(domain.tasks("test")[: args.tasks])
    seconds: dict[str, list[float]] = {"without session": [], "with session": []}
    for _ in range(args.repeats):
        for name, cls in (("without session", WithoutSession), ("with session", RehearsalPlanner)):
            actor = cls(policy, config, act)
            start = time.perf_counter()
            batch = collect_rollouts(policy, domain, tasks, executor="real", act_sampling=act, seed=0, actor=actor)
            seconds[name].append(time.perf_counter() - start)
            print(
                f"{name:16s} {seconds[name][-1]:6.1f} s  rewards {[e.reward for e in batch.episodes]}  "
                f"rehearsal tokens {actor.stats['rehearsal_tokens']}  prompt tokens reused {batch.stats.kv_reused_tokens}",
                flush=True,
            )
    ratios = [a / b for a, b in zip(seconds["without session"], seconds["with session"], strict=True)]
    print("speed-up with the session, per repeat: " + ", ".join(f"{r:.2f}x" for r in ratios))


if __name__ == "__main__":
    main()
