"""``envace experiment``: the learning comparison behind ``docs/results.md``.

For each seed: evaluate the base model; SFT it on reference trajectories (both roles); from that SFT model,
train for the same number of steps with (a) standard GRPO with the real tools, (b) EnvACE ``separate`` and
(c) EnvACE ``inline``; evaluate every model on the same held-out tasks with the **real** executor. Each
stage writes its model and its evaluation under ``output_dir/seed-<s>/<condition>/`` and is skipped when
already done, so an interrupted experiment resumes where it stopped. The table (mean ± spread over seeds,
wall time per stage) is written to ``results_file``.
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CONDITIONS = ("base", "sft", "sft+grpo-real-tools", "sft+envace-separate", "sft+envace-inline")


@dataclass
class ExperimentConfig:
    """Settings of ``envace experiment`` (``--config`` YAML works too), grouped as in TRL's configs; the names
    it shares with ``envace train`` (:class:`~envace_gym.recipes.train.TrainConfig`) mean the same there."""

    # Parameters that control what is compared, and where it goes
    domain: str = field(default="bank", metadata={"help": "A stateful domain to learn on."})
    model: str | None = field(default=None, metadata={"help": "Starting model; default: the embedded SmolLM2-135M."})
    output_dir: str = field(default="runs/experiment", metadata={"help": "Where every stage's model and eval go."})
    seeds: list[int] = field(default_factory=lambda: [0, 1], metadata={"help": "Training seeds (>= 2 for a spread)."})
    conditions: list[str] = field(
        default_factory=lambda: list(CONDITIONS), metadata={"help": "Which conditions to run.", "choices": CONDITIONS}
    )

    # Parameters that control the SFT stage
    sft_tasks: int = field(default=24, metadata={"help": "Training tasks whose reference trajectories feed SFT."})
    sft_epochs: float = field(default=2.0, metadata={"help": "SFT epochs."})
    sft_learning_rate: float = field(default=1e-4, metadata={"help": "SFT learning rate."})

    # Parameters that control the RL stages
    rl_steps: int = field(default=6, metadata={"help": "Optimizer steps of every RL condition (equal for all)."})
    tasks_per_step: int = field(default=2, metadata={"help": "Tasks per RL batch."})
    group_size: int = field(default=4, metadata={"help": "Episodes per task: the G of GRPO (TRL's num_generations)."})
    rl_learning_rate: float = field(default=2e-5, metadata={"help": "RL learning rate."})
    max_new_tokens: int = field(default=64, metadata={"help": "Token budget of each Act turn and rehearsal."})
    train_layers: int | None = field(
        default=6, metadata={"help": "Train only the top N decoder layers (CPU budget); None: all."}
    )

    # Parameters that control the evaluation
    eval_tasks: int = field(default=30, metadata={"help": "Held-out test tasks per evaluation."})
    results_file: str = field(default="docs/results.md", metadata={"help": "Where the table is written."})


def _stage(config: ExperimentConfig, seed: int, condition: str) -> Path:
    return Path(config.output_dir) / f"seed-{seed}" / condition


def run_experiment(config: ExperimentConfig, log: Any = print) -> dict[str, Any]:
    """Run (or resume) every stage; returns all evaluations and writes the results table."""
    from ..domains.registry import make_domain
    from ..evaluation.evaluate import evaluate
    from ..policy.factory import make_policy
    from ..policy.transformers import TransformersPolicy, check_model_source
    from .train import TrainConfig, train

    unknown = set(config.conditions) - set(CONDITIONS)
    if unknown:
        raise ValueError(f"unknown conditions {sorted(unknown)}; choose from {CONDITIONS}")
    check_model_source(config.model)  # mistakes fail here, before the first stage loads anything
    make_domain(config.domain)
    results: dict[str, dict[int, dict[str, Any]]] = {c: {} for c in config.conditions}
    for seed in config.seeds:
        for condition in config.conditions:
            stage = _stage(config, seed, condition)
            done = stage / "eval.json"
            if done.is_file():
                results[condition][seed] = _with_timing(stage, json.loads(done.read_text()))
                log(f"[seed {seed}] {condition}: done before, skipped")
                continue
            stage.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            if condition == "base":
                model_path = config.model
            elif (stage / "train_summary.json").is_file() and (stage / "final" / "config.json").is_file():
                model_path = str(stage / "final")  # trained before an interruption: only the evaluation is left
                log(f"[seed {seed}] {condition}: trained before, evaluating")
            else:
                start_from = config.model if condition == "sft" else str(_stage(config, seed, "sft") / "final")
                mode = {"sft": "sft", "sft+grpo-real-tools": "real-tools"}.get(condition, "rehearsal")
                log(f"[seed {seed}] {condition}: training ({mode}) ...")
                train(
                    TrainConfig(
                        mode=mode,
                        domain=config.domain,
                        model=start_from,
                        output_dir=str(stage),
                        steps=None if mode == "sft" else config.rl_steps,
                        tasks_per_step=config.tasks_per_step,
                        group_size=config.group_size,
                        rehearsal_mode="inline" if condition.endswith("inline") else "separate",
                        learning_rate=config.sft_learning_rate if mode == "sft" else config.rl_learning_rate,
                        max_new_tokens=config.max_new_tokens,
                        sft_tasks=config.sft_tasks,
                        sft_epochs=config.sft_epochs,
                        train_layers=config.train_layers,
                        save_steps=10_000,
                        seed=seed,
                    )
                )
                model_path = str(stage / "final")
            trained_s = time.perf_counter() - started
            log(f"[seed {seed}] {condition}: evaluating on {config.eval_tasks} test tasks ...")
            policy = make_policy(model_path)
            assert isinstance(policy, TransformersPolicy)
            result = evaluate(policy, config.domain, "test", config.eval_tasks, max_new_tokens=config.max_new_tokens)
            eval_s = time.perf_counter() - started - trained_s
            record = {**result.to_dict(), "train_seconds": trained_s, "eval_seconds": eval_s}
            record.pop("per_task")
            done.write_text(json.dumps(record, indent=2))
            results[condition][seed] = record = _with_timing(stage, record)
            log(
                f"[seed {seed}] {condition}: success {result.success_rate:.3f}, reward {result.mean_reward:.3f}, rehearsal equal-to-real {result.equal_to_real:.3f}"
            )
    table = format_results(config, results)
    Path(config.results_file).parent.mkdir(parents=True, exist_ok=True)
    Path(config.results_file).write_text(table)
    log(table)
    return {"results": results, "table": table}


def _with_timing(stage: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Training time from the stage's own summary (right even when the model was trained by an earlier,
    interrupted run), evaluation time from the record."""
    record = dict(record)
    if "eval_seconds" not in record:  # records written before eval time was stored separately
        record["eval_seconds"] = record.get("total_seconds", 0.0) - record.get("train_seconds", 0.0)
    summary = stage / "train_summary.json"
    if summary.is_file():
        record["train_seconds"] = float(json.loads(summary.read_text())["seconds"])
    return record


def _mean_spread(values: list[float]) -> str:
    known = [v for v in values if v == v]  # drop NaN (a figure an older record did not store)
    if not known:
        return "n/a"
    mean = sum(known) / len(known)
    spread = (max(known) - min(known)) / 2
    return f"{mean:.3f} ± {spread:.3f}" + (
        f" ({len(known)} of {len(values)} seeds)" if len(known) < len(values) else ""
    )


def format_results(config: ExperimentConfig, results: dict[str, dict[int, dict[str, Any]]]) -> str:
    """Markdown: the command, the settings, and one row per condition (mean ± half-range over seeds)."""
    command = "envace experiment " + " ".join(
        f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in asdict(config).items()
        if v is not None
    )
    lines = [
        "# Learning results",
        "",
        "Generated by `envace experiment`; regenerate with:",
        "",
        "```bash",
        shlex.join(command.split()) if len(command) < 10_000 else command,
        "```",
        "",
        f"Machine: {platform.machine()}, Python {sys.version.split()[0]}. Domain `{config.domain}`, held-out test tasks "
        f"({config.eval_tasks}), real execution, greedy decoding. Seeds: {config.seeds}. Spread: half the range over seeds.",
        "",
        "| condition | success rate | mean reward | valid real calls per episode | rehearsal parses "
        "| rehearsal equal to real | train time (s) | eval time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for condition, by_seed in results.items():
        rows = list(by_seed.values())
        if not rows:
            continue
        lines.append(
            f"| {condition} | {_mean_spread([r['success_rate'] for r in rows])} | {_mean_spread([r['mean_reward'] for r in rows])} "
            f"| {_mean_spread([r.get('real_calls', float('nan')) / max(1, r['episodes']) for r in rows])} "
            f"| {_mean_spread([r['parsed'] for r in rows])} | {_mean_spread([r['equal_to_real'] for r in rows])} "
            f"| {_mean_spread([r['train_seconds'] for r in rows])} | {_mean_spread([r['eval_seconds'] for r in rows])} |"
        )
    return "\n".join(lines) + "\n"
