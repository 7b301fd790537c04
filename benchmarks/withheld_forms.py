"""The withheld-result fidelity pass in both forms, side by side: with the call's own result withheld, the
rehearse prompt shows nothing in its place (bare) or one execution of the same tool from another task (the
answer's format, not this task's data; the default of ``evaluate``). On a single-call domain the bare form
leaves no example of the answer at all, so its parse rate, not simulation, decides the figure.

    python benchmarks/withheld_forms.py --domain units-v0 --model default --num-tasks 20

Prints one line per form: rehearsals compared, parse rate, equal to real, fields right (numbers within 1%),
for the reference's calls (withheld) and the policy's own calls; ``--out`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from envace_gym import make_policy
from envace_gym.evaluation import evaluate


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="units-v0")
    parser.add_argument("--model", default="default", help="default, tiny, a folder or a hub id")
    parser.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--split", default="test")
    parser.add_argument("--num-tasks", "--num_tasks", type=int, default=20)
    parser.add_argument("--max-new-tokens", "--max_new_tokens", type=int, default=96)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    policy = make_policy(args.model, backend=args.backend)
    forms = {}
    for name, example in (("bare", False), ("format example", True)):
        started = time.perf_counter()
        r = evaluate(policy, args.domain, args.split, args.num_tasks, max_new_tokens=args.max_new_tokens,
                     format_example=example)  # fmt: skip
        forms[name] = {
            "withheld": {"rehearsals": r.rehearsals, "parsed": r.parsed_withheld, "equal": r.equal_to_real_withheld,
                         "fields": r.fields_withheld},
            "own_calls": {"rehearsals": r.own_calls, "parsed": r.parsed_own_calls,
                          "equal": r.equal_to_real_own_calls, "fields": r.fields_own_calls},
            "copying_equal": r.equal_to_real,
            "seconds": round(time.perf_counter() - started, 1),
        }  # fmt: skip
        w, o = forms[name]["withheld"], forms[name]["own_calls"]
        print(f"{name:>14}: withheld {w['rehearsals']} rehearsals, parse {w['parsed']:.3f}, equal {w['equal']:.3f}, "
              f"fields {w['fields']:.3f} | own calls {o['rehearsals']}, parse {o['parsed']:.3f}, equal "
              f"{o['equal']:.3f}, fields {o['fields']:.3f}", flush=True)  # fmt: skip
    record = {"domain": args.domain, "model": args.model, "backend": args.backend, "split": args.split,
              "num_tasks": args.num_tasks, "machine": platform.processor() or platform.machine(), "forms": forms}  # fmt: skip
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    return record


if __name__ == "__main__":
    main()
