"""The learning check over seeds: held-out success before and after EnvACE training (no real tool executed),
the spread that sets the margin of tests/test_learning.py, and what a learner broken on purpose does.

    python benchmarks/learning_check.py --seeds 0 1 2 3 4
    python benchmarks/learning_check.py --seeds 0 1 2 3 4 --broken flip-advantage
    python benchmarks/learning_check.py --seeds 0 1 2 3 4 --broken no-rehearse-rows
    python benchmarks/learning_check.py --seeds 0 1 --validation   # another task set: where settings are tuned

The setting is :mod:`envace_gym.recipes.learning` (its docstring says why it is built so). ``--broken``
replaces the trainer's role-wise advantages: ``flip-advantage`` negates them (the policy is pushed away from
what the reward favours), ``no-rehearse-rows`` zeroes them on Rehearse rows (only the Act role learns).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def broken_advantages(kind: str | None):
    """The trainer's ``rolewise_advantages``, broken as ``kind`` says (None: unchanged)."""
    from envace_gym.training import trainer

    advantages = trainer.rolewise_advantages
    if kind == "flip-advantage":
        return lambda *args: [-a for a in advantages(*args)]
    if kind == "no-rehearse-rows":
        return lambda groups, roles, rewards: [
            0.0 if role == "rehearse" else a for a, role in zip(advantages(groups, roles, rewards), roles, strict=True)
        ]
    return advantages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--broken", choices=["flip-advantage", "no-rehearse-rows"], default=None)
    parser.add_argument(
        "--validation", action="store_true", help="score another task set (seed 1), not the held-out one"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--json", type=Path, default=None, help="also write every seed's record here")
    args = parser.parse_args()

    import torch

    from envace_gym.recipes.learning import learning_check
    from envace_gym.training import trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    intact = trainer.rolewise_advantages
    trainer.rolewise_advantages = broken_advantages(args.broken)
    records = []
    try:
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as tmp:
                got = learning_check(seed, tmp, domain_seed=1 if args.validation else None, log=print)
            records.append(got)
            print(f"seed {seed}: before {got['before']:.3f} after {got['after']:.3f} "
                  f"gain {got['after'] - got['before']:+.3f}; real tool calls in training {got['real_tool_calls']}, "
                  f"rehearse rows {got['rows_rehearse']} ({got['seconds']:.0f} s)", flush=True)  # fmt: skip
    finally:
        trainer.rolewise_advantages = intact
    gains = [r["after"] - r["before"] for r in records]
    print(f"{'validation' if args.validation else 'held-out'} tasks, broken: {args.broken or 'no'}; "
          f"gain over {len(gains)} seeds: min {min(gains):+.3f}, mean {statistics.mean(gains):+.3f}, "
          f"max {max(gains):+.3f}; after: min {min(r['after'] for r in records):.3f}")  # fmt: skip
    if args.json:
        report = {"broken": args.broken, "validation": args.validation, "records": records}
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
