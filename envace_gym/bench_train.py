"""``envace bench --train``: training throughput and memory, the shared-prefix path against the plain forward.

Every comparison runs both sides on the same rows, one after the other in one run, each side in a fresh
worker process (so its peak resident memory is its own) and prints their ratio; these machines are noisy, so
compare ratios, not absolute figures.

1. **SFT**: the SFT rows of a domain, trained for a few optimizer steps by :class:`~envace_gym.sft.PackedSFTTrainer`
   (batches of one task's rows), with the shared-prefix forward against TRL's own per-row forward over the
   same batches; and once more with gradient checkpointing, for memory.
2. **GRPO batches**: the training rows of one batch of rollouts (``tasks x G`` episodes played by the model):
   (b) EnvACE ``separate`` (Act rows and rehearsal rows), (c) EnvACE ``inline`` (one row per episode),
   (d) the real-tools baseline's rows on the same episodes as (b) (each episode as one row, its Act tokens
   trained, the tool results context). One forward and backward of the clipped loss over the batch, in
   micro-batches of the same token budget, packed against padded; and (b) against (d) with our path, the
   cost of training the Rehearse role.
3. **dtype**: one forward and backward of a short pack in bfloat16 (autocast) against float32.

"Trained tokens" are the tokens the loss trains (completion tokens); "tok/s" is trained tokens per second of
forward + backward (+ optimizer step for SFT).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .bench import Measure

DEFAULT_SFT_STEPS = 4


# -- workers (each runs in its own process) --------------------------------------------------------------
def _peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")  # pragma: no cover - Linux only


def _sft_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from .policy import make_policy
    from .sft import TaskGroupedSampler, run_sft, sft_dataset

    torch.manual_seed(0)
    policy = make_policy(spec["model"])
    dataset = sft_dataset(spec["domain"], policy.tokenizer, "train", spec["tasks"])
    steps, batch = spec["steps"], spec["batch_size"]
    used = list(TaskGroupedSampler(dataset["task_id"], seed=0))[: steps * batch]
    trained = sum(sum(dataset[i]["completion_mask"]) for i in used)
    encoded_plain = sum(len(dataset[i]["input_ids"]) for i in used)
    with tempfile.TemporaryDirectory() as out:
        trainer = run_sft(
            policy.model, policy.tokenizer, dataset, out, max_steps=steps, batch_size=batch, learning_rate=1e-5,
            logging_steps=steps, shared_prefix=spec["packed"], gradient_checkpointing=spec["checkpointing"],
            dtype="float32",
        )  # fmt: skip
    seconds = next(h["train_runtime"] for h in trainer.state.log_history if "train_runtime" in h)
    return {"seconds": seconds, "trained": trained, "rows": len(used), "tokens": encoded_plain, "peak": _peak_rss_mib()}


def _grpo_worker(spec: dict[str, Any]) -> dict[str, Any]:
    from dataclasses import replace

    from .policy import make_policy
    from .trainer import TrainerConfig, _micro_batches, grpo_loss

    with open(spec["rows"], "rb") as f:
        rows = pickle.load(f)[spec["workload"]]
    policy = make_policy(spec["model"])
    model = policy.model.train()
    config = TrainerConfig(
        packing=spec["packed"], micro_batch_tokens=spec["budget"], temperature=1.0, dtype=spec.get("dtype", "float32")
    )
    if spec.get("limit"):  # a short pack: the first row, its prompt cut
        first = rows[0]
        rows = [replace(first, prompt_ids=first.prompt_ids[-max(1, spec["limit"] - len(first.completion_ids)) :])]
    pairs = [(r, 0.5 if i % 2 else -0.5) for i, r in enumerate(rows)]  # fixed advantages: timing only
    trained = sum(sum(r.mask) for r in rows)
    warm = pairs[:1]
    grpo_loss(model, [warm[0][0]], [warm[0][1]], config, trained)[0].backward()  # load kernels once
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    for micro in _micro_batches(model, pairs, config):
        loss, _ = grpo_loss(model, [r for r, _ in micro], [a for _, a in micro], config, trained)
        loss.backward()
    seconds = time.perf_counter() - start
    encoded = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    return {"seconds": seconds, "trained": trained, "rows": len(rows), "tokens": encoded, "peak": _peak_rss_mib()}


def _worker_main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    result = (_sft_worker if spec["kind"] == "sft" else _grpo_worker)(spec)
    print("ENVACE_BENCH_RESULT " + json.dumps(result), flush=True)


def _run_worker(spec: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-m", "envace_gym.bench_train", json.dumps(spec)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("ENVACE_BENCH_RESULT "):
            return json.loads(line.split(" ", 1)[1])
    log(proc.stdout[-2000:] + proc.stderr[-4000:])
    raise RuntimeError(f"benchmark worker failed ({spec['kind']}, exit {proc.returncode})")


# -- rollouts for the GRPO workloads ------------------------------------------------------------------------
def _collect_rows(model: str | None, domain: str, tasks: int, group: int, tokens: int, seed: int, path: Path) -> dict:
    """One batch of rollouts per rehearsal mode, played by the model; the rows of each workload, pickled."""
    import numpy as np

    from .domains import make_domain
    from .policy import SamplingParams, make_policy
    from .rollout import Sample, collect_rollouts
    from .simulator import RehearsalConfig

    policy, dom = make_policy(model), make_domain(domain)
    chosen = [dom.tasks("train")[int(i)] for i in np.random.default_rng(seed).choice(len(dom.tasks("train")), tasks)]
    act, rehearse = SamplingParams(max_new_tokens=tokens, temperature=1.0), RehearsalConfig(max_new_tokens=tokens)
    rows: dict[str, list[Sample]] = {}
    for mode in ("separate", "inline"):
        batch = collect_rollouts(
            policy, dom, chosen, group, rehearsal_mode=mode, act_sampling=act, rehearsal=rehearse, seed=seed,
            on_invalid="feedback",
        )  # fmt: skip
        rows[mode] = [s for s in batch.samples() if any(s.mask)]
        if mode == "separate":  # the same episodes as the baseline trains them: one row each, Act tokens only
            rows["real-tools"] = [
                Sample("episode", e.group, e.index, r.prompt_ids, r.completion_ids, r.logprobs, r.mask, e.reward)
                for e in batch.episodes
                for r in [e.episode_row]
                if any(r.mask)
            ]
    with open(path, "wb") as f:
        pickle.dump(rows, f)
    return {k: len(v) for k, v in rows.items()}


# -- the run --------------------------------------------------------------------------------------------
def run_train_bench(
    model: str | None = None,
    domain: str = "bank",
    sft_tasks: int = 8,
    sft_steps: int = DEFAULT_SFT_STEPS,
    sft_batch_size: int = 4,
    tasks_per_step: int = 2,
    group_size: int = 4,
    max_new_tokens: int = 128,
    budget: int = 4096,
    dtype_tokens: int = 128,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[Measure]:
    """Run the training measures and return them (``log`` gets progress lines)."""
    spec = {"model": model, "domain": domain}
    measures: list[Measure] = []

    log(f"[a] SFT: {sft_steps} steps of {sft_batch_size} rows ({domain}), packed vs TRL's forward ...")
    sft = {}
    for name, packed, ckpt in (("packed", True, False), ("plain", False, False), ("packed+ckpt", True, True)):
        sft[name] = _run_worker(
            {**spec, "kind": "sft", "tasks": sft_tasks, "steps": sft_steps, "batch_size": sft_batch_size,
             "packed": packed, "checkpointing": ckpt},
            log,
        )  # fmt: skip
        log(f"    {name}: {sft[name]['seconds']:.1f} s, peak {sft[name]['peak']:,.0f} MiB")
    rate = {k: v["trained"] / v["seconds"] for k, v in sft.items()}
    note = f"{sft['packed']['rows']} rows, {sft['packed']['trained']} trained of {sft['packed']['tokens']} tokens"
    measures.append(
        Measure(
            f"(a) SFT steps, batch {sft_batch_size}: shared-prefix vs TRL's per-row forward",
            f"{rate['packed']:.1f} tok/s", f"{rate['plain']:.1f} tok/s", rate["packed"] / rate["plain"], ">= 3",
            sft["packed"]["peak"],
            f"{note}; {sft['packed']['seconds']:.1f} s vs {sft['plain']['seconds']:.1f} s; plain peak "
            f"{sft['plain']['peak']:,.0f} MiB",
        )  # fmt: skip
    )
    measures.append(
        Measure(
            "(a) SFT steps: shared-prefix with vs without gradient checkpointing",
            f"{rate['packed+ckpt']:.1f} tok/s", f"{rate['packed']:.1f} tok/s", rate["packed+ckpt"] / rate["packed"],
            "peak <= 4,096 MiB", sft["packed+ckpt"]["peak"],
            f"{sft['packed+ckpt']['seconds']:.1f} s vs {sft['packed']['seconds']:.1f} s",
        )  # fmt: skip
    )

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.pkl"
        log(f"collecting one batch of rollouts per mode ({tasks_per_step} tasks x G={group_size}, {domain}) ...")
        counts = _collect_rows(model, domain, tasks_per_step, group_size, max_new_tokens, seed, path)
        log(f"    rows: {counts}")
        grpo: dict[tuple[str, bool], dict[str, Any]] = {}
        labels = {"separate": "(b) EnvACE separate", "inline": "(c) EnvACE inline", "real-tools": "(d) real tools"}
        for workload, label in labels.items():
            log(f"{label[:3]} GRPO batch, {label[4:]}: forward + backward, packed vs padded ...")
            for packed in (True, False):
                grpo[workload, packed] = _run_worker(
                    {**spec, "kind": "grpo", "rows": str(path), "workload": workload, "packed": packed,
                     "budget": budget},
                    log,
                )  # fmt: skip
                r = grpo[workload, packed]
                log(f"    {'packed' if packed else 'padded'}: {r['seconds']:.1f} s, peak {r['peak']:,.0f} MiB")
            ours, plain = grpo[workload, True], grpo[workload, False]
            measures.append(
                Measure(
                    f"{label} GRPO batch: shared-prefix vs per-row forward",
                    f"{ours['trained'] / ours['seconds']:.1f} tok/s", f"{plain['trained'] / plain['seconds']:.1f} tok/s",
                    plain["seconds"] / ours["seconds"], ">= 3" if workload == "separate" else "",
                    ours["peak"],
                    f"{ours['rows']} rows, {ours['trained']} trained of {ours['tokens']} tokens; "
                    f"{ours['seconds']:.1f} s vs {plain['seconds']:.1f} s; padded peak {plain['peak']:,.0f} MiB",
                )  # fmt: skip
            )
        for packed in (True, False):
            sep, real = grpo["separate", packed], grpo["real-tools", packed]
            side = "shared-prefix" if packed else "per-row"
            measures.append(
                Measure(
                    f"EnvACE separate step / real-tools step, same episodes, both {side}",
                    f"{sep['seconds']:.1f} s", f"{real['seconds']:.1f} s", sep["seconds"] / real["seconds"],
                    "<= 1.3", sep["peak"], f"{sep['trained']} vs {real['trained']} trained tokens",
                )  # fmt: skip
            )
        sep, real = grpo["separate", True], grpo["real-tools", False]
        measures.append(
            Measure(
                "EnvACE separate step (shared-prefix) / real-tools step (TRL's per-row forward)",
                f"{sep['seconds']:.1f} s", f"{real['seconds']:.1f} s", sep["seconds"] / real["seconds"], "<= 1.3",
                sep["peak"], "what a TRL user pays for the Rehearse role",
            )  # fmt: skip
        )

        log(f"[e] dtype: a {dtype_tokens}-token pack, bfloat16 vs float32 ...")
        by_dtype = {
            name: _run_worker(
                {**spec, "kind": "grpo", "rows": str(path), "workload": "separate", "packed": True, "budget": budget,
                 "dtype": name, "limit": dtype_tokens},
                log,
            )  # fmt: skip
            for name in ("bfloat16", "float32")
        }
        b16, f32 = by_dtype["bfloat16"], by_dtype["float32"]
        measures.append(
            Measure(
                f"bfloat16 (autocast) vs float32, forward + backward of a {dtype_tokens}-token pack",
                f"{b16['seconds']:.2f} s", f"{f32['seconds']:.2f} s", f32["seconds"] / b16["seconds"], "> 1 to use it",
                b16["peak"], "`--dtype auto` picks bfloat16 only where it is faster",
            )  # fmt: skip
        )
    return measures


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
