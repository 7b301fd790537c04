"""How often the default model's rehearsals are well formed, per rehearsal sampling setting.

Plays the first N ``bank`` training tasks with the reference's own Act turns (every call valid) in
``rehearsal`` mode with ``on_invalid="feedback"``, so every call of every task is rehearsed, and counts the
rehearsals whose answer parses (``<execution_result>{json}</execution_result>``, within the token budget).

    python benchmarks/rehearsal_format.py                       # the default RehearsalConfig, 20 tasks
    python benchmarks/rehearsal_format.py --tasks 20 --setting 1.0:1.0 0.6:0.95 0.0:1.0   # temperature:top_p
"""

from __future__ import annotations

import argparse
import collections
import json
import time

from envace_gym import RehearsalConfig, make_policy
from envace_gym.domains import make_domain
from envace_gym.errors import ErrorCode
from envace_gym.rollout import collect_rollouts

MALFORMED = (ErrorCode.INVALID_REHEARSAL.value, ErrorCode.LIMIT_EXCEEDED.value)


def measure(policy, tasks, rehearsal: RehearsalConfig, seed: int = 0) -> dict:
    started = time.perf_counter()
    batch = collect_rollouts(
        policy, "bank", tasks, act="reference", on_invalid="feedback", rehearsal=rehearsal, seed=seed, progress=True
    )
    codes: collections.Counter[str] = collections.Counter()
    for episode in batch.episodes:
        for record in episode.calls:
            if record.route == "rehearsal" and record.validated:
                codes[record.error.code.value if record.error is not None else "OK"] += 1
    calls = sum(codes.values())
    return {
        "temperature": rehearsal.temperature,
        "top_p": rehearsal.top_p,
        "max_new_tokens": rehearsal.max_new_tokens,
        "calls": calls,
        "well_formed": sum(n for code, n in codes.items() if code not in MALFORMED),
        "codes": dict(codes),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20, help="the first N bank training tasks (default: 20)")
    parser.add_argument("--setting", nargs="*", default=[], help="temperature:top_p pairs (default: the defaults)")
    parser.add_argument("--model", default=None, help="model path; default: the embedded SmolLM2-135M")
    args = parser.parse_args()
    policy = make_policy(args.model)  # loaded before any timing
    tasks = make_domain("bank").tasks("train")[: args.tasks]
    default = RehearsalConfig()
    settings = [tuple(map(float, s.split(":"))) for s in args.setting] or [(default.temperature, default.top_p)]
    print("| temperature | top_p | rehearsed calls | well formed | rate | seconds |\n|---|---|---|---|---|---|")
    for temperature, top_p in settings:
        r = measure(policy, tasks, RehearsalConfig(temperature=temperature, top_p=top_p))
        print(
            f"| {r['temperature']} | {r['top_p']} | {r['calls']} | {r['well_formed']} | "
            f"{r['well_formed'] / max(1, r['calls']):.3f} | {r['seconds']} |",
            flush=True,
        )
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
