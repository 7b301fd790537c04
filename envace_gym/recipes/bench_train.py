"""``envace bench --train``: training throughput and memory, the shared-prefix path against the plain forward.

Every comparison runs both sides on the same rows, one after the other in one run, each side in a fresh
worker process (so its peak resident memory is its own) and prints their ratio; these machines are noisy, so
compare ratios, not absolute figures.

1. **SFT**: the SFT rows of a domain, trained for a few optimizer steps by :class:`~envace_gym.integrations.trl.PackedSFTTrainer`
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
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ..training.memory import peak_gpu_memory
from .bench import Measure

DEFAULT_SFT_STEPS = 4


# -- workers (each runs in its own process) --------------------------------------------------------------
def _peak_rss_mib() -> float:
    """The worker's peak resident memory, MiB (beside it, ``peak_gpu``: training.memory.peak_gpu_memory)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")  # pragma: no cover - Linux only


def _sft_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ..integrations.trl.packed_sft_trainer import TaskGroupedSampler, run_sft
    from ..policy.factory import make_policy
    from ..training.memory import return_freed_memory
    from ..training.sft import sft_dataset

    torch.manual_seed(0)
    if spec["checkpointing"]:  # as `envace train --gradient_checkpointing` does
        return_freed_memory()
    policy = make_policy(spec["model"])
    dataset = sft_dataset(spec["domain"], policy.tokenizer, "train", spec["tasks"])
    steps, batch, accumulate = spec["steps"], spec["batch_size"], spec.get("accumulate", 1)
    used = list(TaskGroupedSampler(dataset["task_id"], seed=0))[: steps * batch * accumulate]
    trained = sum(sum(dataset[i]["completion_mask"]) for i in used)
    encoded_plain = sum(len(dataset[i]["input_ids"]) for i in used)
    with tempfile.TemporaryDirectory() as out:
        trainer = run_sft(
            policy.model, policy.tokenizer, dataset, out, max_steps=steps, batch_size=batch, learning_rate=1e-5,
            logging_steps=steps, shared_prefix=spec["packed"], gradient_checkpointing=spec["checkpointing"],
            dtype="float32", gradient_accumulation_steps=accumulate,
        )  # fmt: skip
    seconds = next(h["train_runtime"] for h in trainer.state.log_history if "train_runtime" in h)
    return {"seconds": seconds, "trained": trained, "rows": len(used), "tokens": encoded_plain, "peak": _peak_rss_mib(),
            "peak_gpu": peak_gpu_memory()}  # fmt: skip


def _grpo_worker(spec: dict[str, Any]) -> dict[str, Any]:
    from ..policy.factory import make_policy
    from ..episode.types import Role, Row
    from ..training.trainer import TrainerConfig, _micro_batches, grpo_loss

    with open(spec["rows"], encoding="utf-8") as f:
        rows = [Row(**{k: Role(v) if k == "role" else tuple(v) if isinstance(v, list) else v for k, v in r.items()})
                for r in json.load(f)[spec["workload"]]]  # fmt: skip
    policy = make_policy(spec["model"])
    model = policy.model.train()
    config = TrainerConfig(
        shared_prefix=spec["packed"], pack_tokens=spec["budget"], temperature=1.0, dtype=spec.get("dtype", "float32")
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
    return {"seconds": seconds, "trained": trained, "rows": len(rows), "tokens": encoded, "peak": _peak_rss_mib(),
            "peak_gpu": peak_gpu_memory()}  # fmt: skip


def _worker_main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    result = (_sft_worker if spec["kind"] == "sft" else _grpo_worker)(spec)
    print("ENVACE_BENCH_RESULT " + json.dumps(result), flush=True)


class _Runner:
    """Runs workers one at a time; with a work folder, keeps each result (keyed by its settings) so that an
    interrupted benchmark resumes where it stopped. A worker killed by the kernel (out of memory) gives an
    ``error`` instead of a figure."""

    def __init__(self, work_dir: Path | None, log: Callable[[str], None]) -> None:
        self.file = work_dir / "results.json" if work_dir is not None else None
        self.done = json.loads(self.file.read_text()) if self.file is not None and self.file.is_file() else {}
        self.log = log

    def __call__(self, spec: dict[str, Any]) -> dict[str, Any]:
        key = json.dumps(spec, sort_keys=True)
        if key not in self.done:
            self.done[key] = self._run(spec)
            if self.file is not None:
                self.file.write_text(json.dumps(self.done, indent=1))
        return self.done[key]

    def _run(self, spec: dict[str, Any]) -> dict[str, Any]:
        env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run(
            [sys.executable, "-m", "envace_gym.recipes.bench_train", json.dumps(spec)],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        for line in proc.stdout.splitlines():
            if line.startswith("ENVACE_BENCH_RESULT "):
                return json.loads(line.split(" ", 1)[1])
        if proc.returncode in (-9, 137):
            return {"error": "killed by the kernel (out of memory)"}
        self.log(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise RuntimeError(f"benchmark worker failed ({spec['kind']}, exit {proc.returncode})")


# -- rollouts for the GRPO workloads ------------------------------------------------------------------------
def _act_rows(episode: Any) -> list[Any]:
    """The Act rows of an episode whose Act turns were given (not generated): each Act turn in its context,
    cut from the episode row (its trained runs are the Act turns)."""
    from ..episode.types import Role, Row

    row, rows, start = episode.episode_row, [], None
    for i, m in enumerate((*row.mask, 0)):
        if m and start is None:
            start = i
        elif not m and start is not None:
            prompt = row.prompt_ids + row.completion_ids[:start]
            rows.append(
                Row(Role.ACT, prompt, row.completion_ids[start:i], row.logprobs[start:i], (1,) * (i - start),
                    episode.group, episode.index, episode.reward)
            )  # fmt: skip
            start = None
    return rows


def _collect_rows(
    model: str | None, domain: str, tasks: int, group: int, tokens: int, seed: int, path: Path, settings: dict
) -> dict:
    """One GRPO batch per workload, written as JSON: ``tasks x group`` episodes in which the reference solution acts
    and the model rehearses every call at temperature 1 (so the G episodes of a task diverge at their first
    rehearsed result, and every call gives a rehearsal row, as in a warm-started batch)."""
    import numpy as np

    from ..domains.registry import make_domain
    from ..policy.factory import make_policy
    from ..rehearsal.prompt import RehearsalConfig
    from ..episode.types import Role, Row
    from ..rollout.collector import collect_rollouts

    policy, dom = make_policy(model), make_domain(domain)
    picks = np.random.default_rng(seed).choice(len(dom.tasks("train")), tasks, replace=False)
    chosen = [dom.tasks("train")[int(i)] for i in picks]
    rehearse = RehearsalConfig(max_new_tokens=tokens, temperature=1.0)  # reference acts: only the Rehearse role samples
    rows: dict[str, list[Row]] = {}
    for mode in ("separate", "inline"):
        batch = collect_rollouts(
            policy, dom, chosen, group, act="reference", rehearsal_mode=mode, rehearsal=rehearse, seed=seed,
            on_invalid="feedback",
        )  # fmt: skip
        if mode == "separate":
            rows["separate"] = [r for e in batch.episodes for r in _act_rows(e)] + batch.samples([Role.REHEARSE])
            # The same episodes as the real-tools baseline trains them: one row each, the Act tokens trained.
            rows["real-tools"] = [
                replace(e.episode_row, group=e.group, episode=e.index, reward=e.reward)
                for e in batch.episodes
            ]  # fmt: skip
        else:
            rows["inline"] = batch.samples()
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"settings": settings, **{k: [asdict(r) for r in v] for k, v in rows.items()}}, f)
    return {k: len(v) for k, v in rows.items()}


# -- the run --------------------------------------------------------------------------------------------
def _rate(result: dict[str, Any]) -> str:
    return result["error"] if "error" in result else f"{result['trained'] / result['seconds']:.1f} tok/s"


def _ratio(faster: dict[str, Any], slower: dict[str, Any]) -> float:
    """How many times less time ``faster`` took than ``slower`` for the same work (NaN if either failed)."""
    if "error" in faster or "error" in slower:
        return float("nan")
    return slower["seconds"] / faster["seconds"]


def _seconds(result: dict[str, Any]) -> str:
    if "error" in result:
        return result["error"]
    return f"{result['seconds']:.1f} s" if result["seconds"] >= 10 else f"{result['seconds']:.2f} s"


def run_train_bench(
    model: str | None = None,
    domain: str = "bank",
    sft_tasks: int = 8,
    sft_steps: int = DEFAULT_SFT_STEPS,
    sft_batch_sizes: tuple[int, ...] = (4, 8),
    plain_rows: int = 4,
    tasks_per_step: int = 2,
    group_size: int = 4,
    max_new_tokens: int = 128,
    budget: int = 4096,
    dtype_tokens: int = 128,
    seed: int = 0,
    work_dir: str | None = None,
    log: Callable[[str], None] = print,
) -> list[Measure]:
    """Run the training measures and return them (``log`` gets progress lines). ``plain_rows`` caps the rows of
    one plain forward (larger SFT batches accumulate gradients over several, as a TRL user would do to fit
    memory); ``work_dir`` keeps rollouts and results, so a rerun resumes."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(work_dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        run = _Runner(folder if work_dir else None, log)
        spec = {"model": model, "domain": domain}
        measures = _sft_measures(run, spec, sft_tasks, sft_steps, sft_batch_sizes, plain_rows, log)
        rows = folder / "rows.json"
        settings = {**spec, "tasks": tasks_per_step, "group": group_size, "tokens": max_new_tokens, "seed": seed}
        if not rows.is_file() or json.loads(rows.read_text()).get("settings") != settings:
            log(f"rollouts: {tasks_per_step} tasks x G={group_size} episodes per mode ({domain}), the model rehearsing")
            counts = _collect_rows(model, domain, tasks_per_step, group_size, max_new_tokens, seed, rows, settings)
            log(f"    rows: {counts}")
        measures += _grpo_measures(run, {**spec, "rows": str(rows), "budget": budget}, log)
        measures += _dtype_measures(run, {**spec, "rows": str(rows), "budget": budget}, dtype_tokens, log)
    return measures


def _sft_measures(run, spec, tasks, steps, batch_sizes, plain_rows, log) -> list[Measure]:
    out = []
    for batch in batch_sizes:
        accumulate = max(1, -(-batch // plain_rows))
        plain_batch = batch // accumulate
        log(f"[a] SFT: {steps} steps of {batch} rows ({spec['domain']}), packed vs TRL's forward ...")
        common = {**spec, "kind": "sft", "tasks": tasks, "steps": steps, "checkpointing": False}
        ours = run({**common, "batch_size": batch, "packed": True})
        plain = run({**common, "batch_size": plain_batch, "accumulate": accumulate, "packed": False})
        for name, r in (("packed", ours), ("plain", plain)):
            log(f"    {name}: {_seconds(r)}, peak {r.get('peak', float('nan')):,.0f} MiB")
        how = f"{accumulate} forwards of {plain_batch} rows" if accumulate > 1 else "one forward"
        out.append(
            Measure(
                f"(a) SFT steps, batch {batch}: shared-prefix (one forward) vs TRL's per-row forward ({how})",
                _rate(ours),
                _rate(plain),
                _ratio(ours, plain),
                ">= 3",
                ours["peak"],
                f"{ours['rows']} rows, {ours['trained']} trained of {ours['tokens']} tokens; {_seconds(ours)} vs "
                f"{_seconds(plain)}; plain peak {plain.get('peak', float('nan')):,.0f} MiB",
                peak_gpu_mib=ours.get("peak_gpu"),
            )  # fmt: skip
        )
        if batch == batch_sizes[0]:
            ckpt = run({**common, "batch_size": batch, "packed": True, "checkpointing": True})
            log(f"    packed + gradient checkpointing: {_seconds(ckpt)}, peak {ckpt['peak']:,.0f} MiB")
            out.append(
                Measure(
                    f"(a) SFT steps, batch {batch}: shared-prefix with vs without gradient checkpointing",
                    _rate(ckpt),
                    _rate(ours),
                    _ratio(ckpt, ours),
                    "peak <= 4,096 MiB",
                    ckpt["peak"],
                    f"{_seconds(ckpt)} vs {_seconds(ours)}",
                    peak_gpu_mib=ckpt.get("peak_gpu"),
                )  # fmt: skip
            )
    return out


def _grpo_measures(run, spec, log) -> list[Measure]:
    out, got = [], {}
    labels = {"separate": "(b) EnvACE separate", "inline": "(c) EnvACE inline", "real-tools": "(d) real tools"}
    for workload, label in labels.items():
        log(f"{label[:3]} GRPO batch, {label[4:]}: forward + backward, packed vs padded ...")
        for packed in (True, False):
            got[workload, packed] = r = run({**spec, "kind": "grpo", "workload": workload, "packed": packed})
            log(f"    {'packed' if packed else 'padded'}: {_seconds(r)}, peak {r.get('peak', float('nan')):,.0f} MiB")
        ours, plain = got[workload, True], got[workload, False]
        out.append(
            Measure(
                f"{label} GRPO batch: shared-prefix vs per-row forward",
                _rate(ours),
                _rate(plain),
                _ratio(ours, plain),
                ">= 3" if workload == "separate" else "",
                ours["peak"],
                f"{ours['rows']} rows, {ours['trained']} trained of {ours['tokens']} tokens; {_seconds(ours)} vs "
                f"{_seconds(plain)}; padded peak {plain.get('peak', float('nan')):,.0f} MiB",
                peak_gpu_mib=ours.get("peak_gpu"),
            )  # fmt: skip
        )
    pairs = (
        ("both shared-prefix", got["separate", True], got["real-tools", True]),
        ("both per-row", got["separate", False], got["real-tools", False]),
        ("EnvACE shared-prefix, real tools per-row (TRL)", got["separate", True], got["real-tools", False]),
    )
    for how, sep, real in pairs:
        out.append(
            Measure(
                f"EnvACE separate step / real-tools step, same episodes, {how}",
                _seconds(sep),
                _seconds(real),
                1 / _ratio(sep, real),
                "<= 1.3",
                sep["peak"],
                f"{sep['trained']} vs {real['trained']} trained tokens",
                peak_gpu_mib=sep.get("peak_gpu"),
            )  # fmt: skip
        )
    return out


def _dtype_measures(run, spec, tokens, log) -> list[Measure]:
    log(f"[e] dtype: a {tokens}-token pack, bfloat16 vs float32 ...")
    common = {**spec, "kind": "grpo", "workload": "separate", "packed": True, "limit": tokens}
    b16, f32 = run({**common, "dtype": "bfloat16"}), run({**common, "dtype": "float32"})
    from ..policy.precision import dtype_name, native_bf16, resolve_dtype

    auto = dtype_name(resolve_dtype("auto"))
    native = "native bfloat16" if native_bf16("cpu") else "no native bfloat16"
    return [
        Measure(
            f"bfloat16 (autocast) vs float32, forward + backward of a {tokens}-token pack",
            _seconds(b16),
            _seconds(f32),
            _ratio(b16, f32),
            "> 1 to use it",
            b16["peak"],
            f"this CPU has {native}: `--dtype auto` picks {auto}",
            peak_gpu_mib=b16.get("peak_gpu"),
        )  # fmt: skip
    ]


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
