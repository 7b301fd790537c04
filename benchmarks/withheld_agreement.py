"""Why the withheld fidelity pass can give several models the same figures: play it once per model (the reference
acts; each call is rehearsed greedy with its own result withheld and, for a tool left with no execution in the
prompt, another task's execution of it shown for the format, as ``evaluate`` plays it) and compare the rehearsed
results call by call.

    python benchmarks/withheld_agreement.py --domain bank-v0 --models runs/a/final runs/b/final --num-tasks 50

Prints, per model, the rehearsals and how many of them repeat verbatim a result the prompt showed (another call's
execution of this task, or the example); then, per pair of models, how many rehearsals are the same (the same
parsed result, or the same error). ``--out`` writes every rehearsal as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from dataclasses import replace
from itertools import combinations

from envace_gym import make_policy
from envace_gym.domains.registry import make_domain
from envace_gym.evaluation.evaluate import format_examples
from envace_gym.rehearsal.prompt import rollout_sampling, shown_executions
from envace_gym.rollout import collect_rollouts
from envace_gym.tools import canonical_json


def rehearsals(model: str, domain: str, num_tasks: int, max_new_tokens: int, backend: str) -> list[dict]:
    """The withheld pass's rehearsals of ``model``: one entry per rehearsed call, in the tasks' order."""
    dom = make_domain(domain)
    tasks = list(dom.tasks("test")[:num_tasks])
    _, rehearsal = rollout_sampling(max_new_tokens, 0.0, 1.0)
    examples = format_examples(dom, tasks)
    withheld = replace(rehearsal, withhold_own_result=True, format_examples=examples)
    policy = make_policy(model, backend=backend)
    batch = collect_rollouts(
        policy, dom, tasks, executor="rehearsal", act="reference", on_invalid="feedback", rehearsal=withheld, seed=0
    )
    del policy
    gc.collect()
    by_id = {t.id: t for t in tasks}
    out = []
    for episode in batch.episodes:
        pairs = by_id[episode.task_id].reference_pairs()
        for index, record in enumerate(episode.calls):
            if record.route != "rehearsal" or record.call is None:
                continue
            kept, example = shown_executions(record.call, pairs, withheld)  # what its prompt showed
            shown = [r for _, r in kept + example]
            answer = canonical_json(record.result) if record.error is None else f"error {record.error.code}"
            out.append({"task": episode.task_id, "index": index, "tool": record.call.name, "answer": answer,
                        "repeats_shown": answer in {canonical_json(r) for r in shown}})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="bank-v0")
    parser.add_argument("--models", nargs="+", required=True, help="two or more: default, tiny, folders, hub ids")
    parser.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--num-tasks", "--num_tasks", type=int, default=50)
    parser.add_argument("--max-new-tokens", "--max_new_tokens", type=int, default=95)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    found = {m: rehearsals(m, args.domain, args.num_tasks, args.max_new_tokens, args.backend) for m in args.models}
    for model, rows in found.items():
        print(f"{model}: {len(rows)} rehearsals, {sum(r['repeats_shown'] for r in rows)} repeat a result the "
              "prompt showed", flush=True)  # fmt: skip
    pairs = {}
    for a, b in combinations(args.models, 2):
        answers = {(r["task"], r["index"]): r["answer"] for r in found[b]}
        both = [(r["answer"], answers[r["task"], r["index"]]) for r in found[a] if (r["task"], r["index"]) in answers]
        pairs[f"{a} | {b}"] = {"compared": len(both), "same": sum(x == y for x, y in both)}
        print(f"{a} vs {b}: {pairs[f'{a} | {b}']['same']} of {len(both)} rehearsals the same", flush=True)
    record = {"domain": args.domain, "backend": args.backend, "num_tasks": args.num_tasks,
              "machine": platform.processor() or platform.machine(), "seconds": round(time.perf_counter() - started),
              "same_by_pair": pairs, "rehearsals": found}  # fmt: skip
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    return record


if __name__ == "__main__":
    main()
