"""``envace experiment``'s report: the results table (mean ± std over seeds per condition), the paired
differences between conditions, the fidelity by tool and the learning curves."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .experiment import ExperimentConfig


def _mean_std_range(values: list[float], signed: bool = False) -> str:
    known = [v for v in values if v == v]  # NaN: a figure not measured
    if not known:
        return "n/a"
    mean = sum(known) / len(known)
    std = (sum((v - mean) ** 2 for v in known) / max(1, len(known) - 1)) ** 0.5 if len(known) > 1 else 0.0
    return f"{mean:{'+' if signed else ''}.3f} ± {std:.3f} (±{(max(known) - min(known)) / 2:.3f})"


def _evaluated_on(config: ExperimentConfig) -> str:
    if config.eval_on == "validation":
        return f"{config.val_tasks} validation tasks (the last training tasks, never trained on)"
    return f"{config.eval_tasks} held-out test tasks"


# The table's measured columns (header, record key); a column no record holds is left out (records from before
# its measure existed). Wall times and the real executions in training follow them.
_COLUMNS = (
    ("success (greedy)", "success"),
    ("success (sampled)", "success_sampled"),
    ("mean reward (greedy)", "mean_reward"),
    ("valid real calls / episode", "valid_real_calls_per_episode"),
    ("rehearsal = real, own result in prompt (copying)", "rehearsal_equal_copying"),
    ("rehearsal = real, own result withheld (simulation)", "rehearsal_equal_withheld"),
    ("rehearsal = real, the policy's own calls (simulation)", "rehearsal_equal_own_calls"),
    ("fields right, own result withheld", "rehearsal_fields_withheld"),
    ("fields right, the policy's own calls", "rehearsal_fields_own_calls"),
    ("groups with a reward spread at the start", "groups_with_spread"),
)


# Paired differences: "a − b" for a before b here (the trained against what it was trained from or compared with).
_FIRST = ("sft+envace-inline", "sft+envace-separate", "sft+envace-frozen-sim", "sft+grpo-real-tools", "sft", "base")
_DIFFERENCES = (
    ("success (greedy)", "success"),
    ("success (sampled)", "success_sampled"),
    ("mean reward (greedy)", "mean_reward"),
)


def paired_differences(records: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """Markdown: each pair of conditions on the seeds both hold, the difference taken seed by seed (a seed's
    stages share its SFT start and its evaluation tasks, so the start's own spread drops out), then mean ± std
    (± half the range) over those seeds, each seed's difference after it."""
    held = [c for c in _FIRST if records.get(c)]
    rows = []
    for i, a in enumerate(held):
        for b in held[i + 1 :]:
            seeds = sorted(set(records[a]) & set(records[b]))
            if not seeds:
                continue
            cells = []
            for _, key in _DIFFERENCES:
                diffs = [float(records[a][s].get(key, "nan")) - float(records[b][s].get(key, "nan")) for s in seeds]
                each = ", ".join("n/a" if d != d else f"{d:+.3f}" for d in diffs)
                cells.append(f"{_mean_std_range(diffs, signed=True)} [{each}]")
            rows.append(f"| {a} − {b} | {', '.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    head = "| difference | seeds | " + " | ".join(h for h, _ in _DIFFERENCES) + " |"
    return ["Differences on the same seed: mean ± std over the seeds (± half the range) [each seed's]:", "", head,
            "|---" * (len(_DIFFERENCES) + 2) + "|", *rows]  # fmt: skip


# The by-tool table's passes (the record's pass, the measure its cells show, the rows' name): copying is scored
# whole, the others by fields right, a graded share that a rehearsal scored wrong whole can still move.
_BY_TOOL = (
    ("copying", "equal", "rehearsal = real, own result in prompt (copying)"),
    ("withheld", "fields", "fields right, own result withheld"),
    ("own_calls", "fields", "fields right, the policy's own calls (rehearsals)"),
)


def fidelity_by_tool(records: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """Markdown: each fidelity pass split by tool (a call after one that changed the world counted apart), a
    column per condition: the mean over its seeds, and for the policy's own calls the rehearsals measured, which
    differ between models because each makes its own calls."""
    held = {c: {s: r for s, r in by.items() if "rehearsal_by_tool" in r} for c, by in records.items()}
    held = {c: by for c, by in held.items() if by}  # a record from before the split is left out (see the header)
    if not held:
        return []
    lines = [
        "Rehearsal fidelity by tool, greedy (each cell: the mean over the seeds in its column's header):",
        "",
        "| pass | tool | " + " | ".join(f"{c} ({', '.join(map(str, sorted(by)))})" for c, by in held.items()) + " |",
        "|---" * (len(held) + 2) + "|",
    ]
    for key, measure, name in _BY_TOOL:
        passes = {c: [r["rehearsal_by_tool"].get(key, {}) for r in by.values()] for c, by in held.items()}
        for tool in sorted({t for runs in passes.values() for run in runs for t in run}):
            cells = []
            for runs in passes.values():
                found = [run[tool] for run in runs if tool in run]
                if not found:
                    cells.append("—")
                    continue
                mean = f"{sum(f[measure] for f in found) / len(found):.3f}"
                cells.append(mean + (f" ({sum(f['rehearsals'] for f in found)})" if key == "own_calls" else ""))
            lines.append(f"| {name} | `{tool}` | " + " | ".join(cells) + " |")
    return lines


def format_results(
    config: ExperimentConfig, records: dict[str, dict[int, dict[str, Any]]], budget: int, domain_id: str, command: str
) -> str:
    """Markdown: the ``command`` that regenerates it, the settings (the domain by the versioned id it was made
    from), one row per condition (mean ± std over seeds, then half the range), then the paired differences and
    the fidelity by tool."""
    lines = [
        "Generated by `envace experiment`; regenerate with:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Domain `{domain_id}`, {_evaluated_on(config)}, real execution; greedy and sampled "
        f"(T {config.eval_temperature}, top-p {config.eval_top_p}, seed {config.eval_seed}). Seeds {config.seeds}; "
        f"each cell: mean ± standard deviation over the row's seeds (± half the range). RL: {config.rl_steps} steps "
        f"of {config.tasks_per_step} tasks × G={config.group_size}, reward `{config.reward}`, on_invalid "
        f"`{config.on_invalid}`, {budget} new tokens per generation.",
        "",
    ]
    measured = [(head, key) for head, key in _COLUMNS if any(key in r for by in records.values() for r in by.values())]
    lines += ["| condition | seeds | " + " | ".join(head for head, _ in measured) + " | real tool executions in "
              "training | train s | eval s |", "|---" * (len(measured) + 5) + "|"]  # fmt: skip
    for condition, by_seed in records.items():
        rows = list(by_seed.values())
        if not rows:
            continue
        keys = [key for _, key in measured] + ["real_tool_executions", "train_seconds", "eval_seconds"]
        cells = [_mean_std_range([float(r.get(key, float("nan"))) for r in rows]) for key in keys]
        cells[-3] = "/".join(map(str, sorted({int(r.get("real_tool_executions", 0)) for r in rows})))
        seeds = ", ".join(map(str, sorted(by_seed)))  # a study cut short may hold a condition on fewer seeds
        lines.append(f"| {condition} | {seeds} | " + " | ".join(cells) + " |")
    for section in (paired_differences(records), fidelity_by_tool(records)):
        lines += [""] + section if section else []
    return "\n".join(lines) + "\n"


def plot_learning_curves(
    records: dict[str, dict[int, dict[str, Any]]], path: Path, title: str, evaluated_on: str = "test"
) -> str | None:
    """Held-out success (greedy and sampled) against RL step: a thin line per seed, a thick mean per condition."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    curves = {c: [r["curve"] for r in by_seed.values() if r.get("curve")] for c, by_seed in records.items()}
    curves = {c: v for c, v in curves.items() if v}
    if not curves:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained", sharey=True)
    for ax, key, label in zip(axes, ("success", "success_sampled"), ("greedy", "sampled"), strict=True):
        for k, (condition, runs) in enumerate(sorted(curves.items())):
            color = f"C{k}"
            for run in runs:
                ax.plot([p["step"] for p in run], [p[key] for p in run], color=color, lw=0.7, alpha=0.45)
            steps = sorted({p["step"] for run in runs for p in run})
            mean = [
                sum(p[key] for run in runs for p in run if p["step"] == s)
                / max(1, sum(1 for run in runs for p in run if p["step"] == s))
                for s in steps
            ]
            ax.plot(steps, mean, color=color, lw=2.5, label=f"{condition} ({len(runs)} seeds)")
        ax.set_title(f"{'validation' if evaluated_on == 'validation' else 'held-out'} success, {label}")
        ax.set_xlabel("RL step (0: the SFT model)")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate (real execution)")
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(f"Learning on {title}")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
