"""``envace experiment``: the learning comparison behind ``docs/results.md``.

Per seed: warm-start the model by SFT on reference trajectories (both roles), then train every RL condition
from that SFT model for the same number of steps and episodes with the readable trainer
(:mod:`envace_gym.training.trainer`). The RL conditions differ only in who answers the tool calls and which
rows train:

* ``sft+grpo-real-tools``: standard GRPO, the domain's real tools answer (``executor="real"``);
* ``sft+envace-separate``: EnvACE, the policy rehearses every call with a fresh prompt, both roles train;
* ``sft+envace-inline``: EnvACE, the policy writes tool results in its own chat, both roles train;
* ``sft+envace-frozen-sim``: the paper's ablation, the frozen SFT weights rehearse and only Act rows train.

All of them score episodes with the same reward (``reward``; ``"reference"``: the task's reference calls and
answer facts, no tool run, so EnvACE trains with zero real executions) and treat a bad call the same way
(``on_invalid``). Every ``eval_every`` steps the model is evaluated on held-out tasks with the **real**
executor, greedy and sampled (T 0.6, top-p 0.95, the paper's), which draws the learning curve.

Every stage resumes: a finished stage is skipped, an RL stage cut off continues from its last checkpoint
(saved after every step), SFT from its own; a finished SFT stage whose model is gone (only its record was kept,
say in a repository, while the machine that ran it was not) has its model trained again for the RL stages that
start from it. A folder keeps the settings it was run with (``settings.json``):
resuming it with settings that change results is refused, so a table never mixes runs. What was measured goes
to ``output_dir/experiment.json``; the table to ``results_file`` and a learning-curve PNG beside it.
"""

from __future__ import annotations

import json
import platform
import re
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..episode.config import EpisodeSettings, setting
from ..errors import EnvACEError
from ..policy.device import default_device, place
from ..policy.precision import DTYPES, dtype_name, resolve_dtype
from .experiment_report import format_results, plot_learning_curves
from .workers import print_now, worker_init

RL_CONDITIONS: dict[str, dict[str, Any]] = {
    "sft+grpo-real-tools": {"executor": "real"},
    "sft+envace-separate": {"executor": "rehearsal", "rehearsal_mode": "separate"},
    "sft+envace-inline": {"executor": "rehearsal", "rehearsal_mode": "inline"},
    "sft+envace-frozen-sim": {"executor": "rehearsal", "rehearsal_mode": "separate", "frozen_simulator": True},
}
CONDITIONS = ("base", "sft", *RL_CONDITIONS)
CONDITION_SETS = ("executor", "rehearsal_mode", "p_real")  # the episode settings each condition chooses
BACKENDS = ("transformers", "vllm")
EVAL_ON = ("test", "validation")


@dataclass
class ExperimentConfig(EpisodeSettings):
    """Settings of ``envace experiment`` (``--config`` YAML works too), grouped as in TRL's configs. The
    defaults are the small scale that fits a 2-core CPU: a from-scratch tiny model on ``lights:easy``.

    The inherited :class:`~envace_gym.episode.EpisodeSettings` hold for every RL condition and the reward-spread
    measure, with ``on_invalid`` feedback and ``reward`` reference by default here; the conditions choose
    ``executor`` and ``rehearsal_mode`` (so those are refused). The evaluations play with the same settings but the
    training ones: real tools, the domain's own reward, ``on_invalid`` terminate; ``user="rehearse"`` (which trains
    the user's turns) is evaluated as ``llm``.
    """

    # Parameters that control what is compared, and where it goes
    domain: str = field(
        default="lights:easy", metadata={"help": "Domain to learn on (a name, a folder, file.py:Class)."}
    )
    model: str | None = field(
        default="tiny",
        metadata={
            "help": "Starting model: 'tiny' (a fresh Llama of ~0.4M parameters with a tokenizer learnt from the "
            "domain's texts), 'default' (the embedded SmolLM2-135M), or a path / hub id."
        },
    )
    output_dir: str = field(default="runs/experiment", metadata={"help": "Where every stage's model and eval go."})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "Seeds (>= 2 for a spread)."})
    conditions: list[str] = field(
        default_factory=lambda: ["sft", "sft+grpo-real-tools", "sft+envace-separate"],
        metadata={"help": "Which conditions to run.", "choices": CONDITIONS},
    )

    # Parameters that control the SFT stage
    sft_tasks: int = field(default=200, metadata={"help": "Training tasks whose reference trajectories feed SFT."})
    sft_steps: int = field(default=200, metadata={"help": "SFT optimizer steps (batch sft_batch_size rows)."})
    sft_batch_size: int = field(default=8, metadata={"help": "SFT rows per step."})
    sft_learning_rate: float = field(default=1e-3, metadata={"help": "SFT learning rate (constant)."})

    # Parameters that control the RL stages (the same for every condition)
    rl_steps: int = field(default=30, metadata={"help": "Optimizer steps of every RL condition."})
    tasks_per_step: int = field(default=4, metadata={"help": "Tasks per RL batch."})
    group_size: int = field(default=8, metadata={"help": "Episodes per task: the G of GRPO (TRL's num_generations)."})
    rl_learning_rate: float = field(default=1e-3, metadata={"help": "RL learning rate (constant, AdamW)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of training rollouts."})
    max_new_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Token budget of each Act turn and rehearsal; default: the longest reference turn or result of "
            "the training tasks (measured with the model's tokenizer) plus a quarter."
        },
    )
    on_invalid: str | None = setting("on_invalid", "feedback")
    reward: str = setting("reward", "reference")
    train_layers: int | None = field(
        default=None, metadata={"help": "Train only the top N decoder layers (CPU budget); None: all."}
    )
    # Parameters that control the evaluation
    eval_tasks: int = field(default=100, metadata={"help": "Held-out test tasks per evaluation."})
    val_tasks: int = field(
        default=0,
        metadata={
            "help": "Validation tasks: the last N training tasks, which neither SFT (the first sft_tasks) nor RL (drawn "
            "from the ones before them) ever sees; for choosing settings before looking at test tasks."
        },
    )
    eval_on: str = field(
        default="test",
        metadata={
            "help": "What every evaluation scores: test (eval_tasks held-out test tasks: the figures to report) or "
            "validation (the val_tasks: to choose settings by).",
            "choices": EVAL_ON,
        },
    )
    eval_every: int = field(
        default=10, metadata={"help": "Evaluate every this many RL steps (every step is checkpointed)."}
    )
    eval_temperature: float = field(default=0.6, metadata={"help": "Sampled evaluation: temperature (paper: 0.6)."})
    eval_top_p: float = field(default=0.95, metadata={"help": "Sampled evaluation: top-p (paper: 0.95)."})
    eval_seed: int = field(default=1234, metadata={"help": "Seed of the sampled evaluation (the same for all)."})
    results_file: str | None = field(
        default=None, metadata={"help": "Where the table is written; default: output_dir/results.md."}
    )
    report_only: bool = field(
        default=False,
        metadata={
            "help": "Run no stage: write experiment.json, the table and the curves over the stages of these seeds "
            "and conditions that have finished (a study cut short); the ones that have not are named and left out.",
            "flag": True,
        },
    )
    threads: int | None = field(
        default=None, metadata={"help": "torch threads (default: torch's; 1 per worker with workers > 1)."}
    )
    workers: int = field(
        default=1,
        metadata={
            "help": "Stages run side by side in this many worker processes (an RL stage starts once its seed's SFT "
            "stage has ended), each with --threads torch threads. Each stage needs its own memory."
        },
    )
    backend: str = field(
        default="transformers",
        metadata={
            "help": "What generates rollouts and evaluations, in every condition: transformers, or vllm (an engine in "
            "this process, loaded with the trainer's weights after every optimizer step; needs envace-gym[vllm]).",
            "choices": BACKENDS,
        },
    )
    dtype: str = field(
        default="float32",
        metadata={
            "help": "Compute dtype of SFT and RL (float32 master weights either way): float32, bfloat16, or auto "
            "(bfloat16 where the hardware has it natively). The resolved one is in experiment.json.",
            "choices": DTYPES,
        },
    )
    gradient_checkpointing: bool = field(
        default=True,
        metadata={
            "help": "Recompute each layer in the backward pass of SFT and RL (the same gradients, a fraction of "
            "the memory, some more time), and return freed memory to the system at once: what lets two stages "
            "share a machine (an EnvACE stage of the default model went past 14 GB without it)."
        },
    )

    def __post_init__(self) -> None:
        unknown = set(self.conditions) - set(CONDITIONS)
        if unknown:
            raise ValueError(f"unknown conditions {sorted(unknown)}; choose from {CONDITIONS}")
        super().__post_init__()  # the episode settings
        chosen = sorted(set(self.changed_episode_settings()) & set(CONDITION_SETS))
        if chosen:
            raise ValueError(f"the conditions choose {', '.join(CONDITION_SETS)}: drop {', '.join(chosen)}")
        if self.eval_on not in EVAL_ON:
            raise ValueError(f"eval_on must be one of {EVAL_ON}, got {self.eval_on!r}")
        if self.val_tasks < 0 or (self.eval_on == "validation" and self.val_tasks < 1):
            raise ValueError(f"eval_on='validation' needs val_tasks >= 1 (and val_tasks >= 0), got {self.val_tasks}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.eval_every < 1 or self.rl_steps < 1 or self.sft_steps < 1 or self.workers < 1:
            raise ValueError("eval_every, rl_steps, sft_steps and workers must be at least 1")
        if self.model is None:  # spelled out, so that the command that reproduces a run names it
            self.model = "default"
        self.conditions = sorted(self.conditions, key=CONDITIONS.index)  # an RL condition starts from the SFT model

    @property
    def results_path(self) -> Path:
        return Path(self.results_file) if self.results_file else Path(self.output_dir) / "results.md"


# How an invocation runs, not what the study is: left out of its command and experiment.json, so that a report over
# the finished stages writes the very file the whole run writes.
_INVOCATION = ("report_only",)


def command_line(config: ExperimentConfig) -> str:
    """The ``envace experiment`` command that reproduces ``config``."""
    parts = ["envace", "experiment"]
    settings = [f.name for f in fields(EpisodeSettings) if f.name not in CONDITION_SETS]  # its own first, then these
    own = [f.name for f in fields(config) if f.name not in settings and f.name not in (*CONDITION_SETS, *_INVOCATION)]
    for key in own + settings:
        value = getattr(config, key)
        if value is None:
            continue
        parts += [f"--{key}", *(map(str, value) if isinstance(value, list) else [str(value)])]
    return shlex.join(parts)


def run_experiment(config: ExperimentConfig, log: Any = print) -> dict[str, Any]:
    """Run (or resume) every stage; writes ``experiment.json``, the table and the learning curves."""
    import torch

    from ..domains.registry import make_domain
    from ..policy.transformers import check_model_source

    if config.threads:
        torch.set_num_threads(config.threads)
    if config.model not in (None, "tiny", "default"):
        check_model_source(config.model)  # mistakes fail here, before the first stage loads anything
    domain = make_domain(config.domain)
    _check_validation(config, domain)
    out = Path(config.output_dir)
    if not config.report_only:
        _check_sft_models(config, out)
    out.mkdir(parents=True, exist_ok=True)
    _check_settings(config, out)
    start = _starting_model(config, domain, out)
    budget = config.max_new_tokens or _token_budget(domain, start, config.sft_tasks)
    log(f"envace experiment: {domain.id}, model {start}, {budget} new tokens per generation")
    records: dict[str, dict[int, dict[str, Any]]] = {c: {} for c in config.conditions}
    pending = []
    for seed in config.seeds:
        todo = []
        for condition in config.conditions:
            done = out / f"seed-{seed}" / condition / "record.json"
            if done.is_file():
                records[condition][seed] = json.loads(done.read_text())
                log(f"[seed {seed}] {condition}: done before, skipped")
            else:
                todo.append((seed, condition))
        sft = out / f"seed-{seed}" / "sft"
        kept = (sft / "record.json").is_file() and not (sft / "final" / "config.json").is_file()
        if kept and not config.report_only and any(c in RL_CONDITIONS for _, c in todo):
            log(f"[seed {seed}] sft: finished before, but its model is not here: trained again (its record kept)")
            todo.insert(0, (seed, "sft"))  # (only a kept record gets here: _check_sft_models refused the rest)
        pending += todo
    if config.report_only:
        if not any(records.values()):
            raise EnvACEError(f"{out} holds no finished stage of seeds {config.seeds}, conditions {config.conditions}")
        if pending:
            log("not finished, left out: " + ", ".join(f"seed {s} {c}" for s, c in pending))
    elif config.workers > 1:
        _run_in_workers(config, start, budget, pending, records)
    else:
        for seed, condition in pending:
            records.setdefault(condition, {})[seed] = _run_stage(config, domain, start, budget, seed, condition, log)
    summary = {
        "command": command_line(config),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, Python {sys.version.split()[0]}",
        "config": {k: v for k, v in asdict(config).items() if k not in _INVOCATION},
        "dtype": dtype_name(_compute_dtype(config)),
        "device": str(default_device()),  # where the models ran: the GPU when there is one, or $ENVACE_DEVICE
        "backend": config.backend,
        "max_new_tokens": budget,
        "records": [r for by_seed in records.values() for r in by_seed.values()],
    }
    (out / "experiment.json").write_text(json.dumps(summary, indent=2))
    table = format_results(config, records, budget, domain.id, command_line(config))
    config.results_path.parent.mkdir(parents=True, exist_ok=True)
    config.results_path.write_text(table)
    filename = "curve-" + re.sub(r"[^A-Za-z0-9_.-]", "-", domain.name) + ".png"  # "lights:easy" -> lights-easy
    plot = plot_learning_curves(records, config.results_path.with_name(filename), domain.id, config.eval_on)
    log(table)
    return {"records": records, "table": table, "plot": plot}


def _run_stage(
    config: ExperimentConfig, domain: Any, start: str, budget: int, seed: int, condition: str, log: Any
) -> dict[str, Any]:
    """Run one seed's stage of one condition; its record goes to ``record.json`` in the stage's folder."""
    out = Path(config.output_dir)
    stage = out / f"seed-{seed}" / condition
    stage.mkdir(parents=True, exist_ok=True)
    if config.gradient_checkpointing:
        from ..training.memory import return_freed_memory

        return_freed_memory()  # (envace_gym.training.memory says why it goes with recomputing layers)
    started = time.time()
    if condition == "sft" and (stage / "record.json").is_file():
        return _rebuild_sft_model(config, domain, start, stage, seed, log)
    if condition == "base":
        record = {"train_seconds": 0.0, "curve": [], **_evaluate(config, domain, start, budget)}
    elif condition == "sft":
        record = _sft_stage(config, domain, start, stage, seed, log)
        policy = _policy(config, str(stage / "final"))
        try:
            record.update(_evaluate(config, domain, policy, budget))
            if config.val_tasks:
                record.update(group_spread(config, domain, policy, budget, seed))
        finally:
            _release(policy)
    else:
        record = _rl_stage(config, domain, out / f"seed-{seed}" / "sft", stage, seed, condition, budget, log)
    # wall clock of the whole stage (evaluations included), Unix seconds: when stages ran side by side; the
    # process's peak resident memory so far (with --workers, a fresh process per stage: the stage's own peak), and
    # beside it the peak GPU memory of torch's tensors so far (None without CUDA)
    from ..training.memory import peak_gpu_memory

    record.update(condition=condition, seed=seed, domain=domain.id, started=started, ended=time.time(),
                  process_peak_rss_gib=_peak_rss_gib(), process_peak_gpu_gib=peak_gpu_memory(2**30))  # fmt: skip
    (stage / "record.json").write_text(json.dumps(record, indent=2))
    log(f"[seed {seed}] {condition}: success {record['success']:.3f} (greedy), "
        f"{record['success_sampled']:.3f} (sampled)")  # fmt: skip
    return record


def _rebuild_sft_model(
    config: ExperimentConfig, domain: Any, start: str, stage: Path, seed: int, log: Any
) -> dict[str, Any]:
    """Train a finished SFT stage's model again, for the RL stages that start from it: a study that runs in
    pieces on machines that keep only the stages' records (in a repository, say). SFT is seeded, so this is the
    same model where the arithmetic is the same; its final loss, beside the recorded one, goes into the record
    (``rebuilt``) and the log, so a start that came out different (another CPU's float rounding) is on record."""
    file = stage / "record.json"
    record = json.loads(file.read_text())
    rebuilt = _sft_stage(config, domain, start, stage, seed, log)
    record.setdefault("rebuilt", []).append(
        {"sft_loss": rebuilt["sft_loss"], "train_seconds": rebuilt["train_seconds"], "ended": time.time()}
    )
    file.write_text(json.dumps(record, indent=2))
    log(f"[seed {seed}] sft: model trained again, final loss {rebuilt['sft_loss']:.6f} "
        f"(recorded: {record['sft_loss']:.6f})")  # fmt: skip
    return record


def _peak_rss_gib() -> float | None:
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # KiB on Linux


def _run_in_workers(
    config: ExperimentConfig, start: str, budget: int, pending: list[tuple[int, str]], records: dict[str, Any]
) -> None:
    """Run the ``pending`` stages in ``config.workers`` processes side by side, each stage as soon as what it
    starts from is there (an RL stage waits for its seed's SFT stage); records are filled as stages end."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    waiting, running = list(pending), {}
    # A fresh interpreter for every stage: its own torch threads, vLLM state and memory, all returned at its end
    # (Python 3.10's pool cannot renew its workers: there a worker runs stage after stage).
    context = multiprocessing.get_context("spawn")
    renew = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}
    with ProcessPoolExecutor(config.workers, mp_context=context, initializer=worker_init,
                             initargs=(config.threads or 1,), **renew) as pool:  # fmt: skip
        while waiting or running:
            busy = {seed for seed, condition in (*waiting, *running.values()) if condition == "sft"}
            ready = [(s, c) for s, c in waiting if c in ("base", "sft") or s not in busy]
            for seed, condition in ready[: config.workers - len(running)]:
                waiting.remove((seed, condition))
                running[pool.submit(_stage_job, config, start, budget, seed, condition)] = (seed, condition)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                seed, condition = running.pop(future)
                records.setdefault(condition, {})[seed] = future.result()  # a stage that failed raises here


def _stage_job(config: ExperimentConfig, start: str, budget: int, seed: int, condition: str) -> dict[str, Any]:
    from ..domains.registry import make_domain

    return _run_stage(config, make_domain(config.domain), start, budget, seed, condition, print_now)


# The settings that do not change what a stage measures: where things go, how many threads and workers, which
# seeds and conditions run (each stage is one seed and one condition), recomputing layers for memory, and how the
# invocation runs.
_NOT_MEASURED = (
    "output_dir", "results_file", "threads", "workers", "seeds", "conditions", "gradient_checkpointing", *_INVOCATION
)  # fmt: skip


def _check_settings(config: ExperimentConfig, out: Path) -> None:
    """Keep the folder's settings in ``settings.json``; refuse to resume it with settings that change results."""
    from ..domains.registry import registered_id

    now = {k: v for k, v in asdict(config).items() if k not in _NOT_MEASURED}
    # a domain by its registered id: "units" and "units-v0" are one domain (folders written before ids had versions)
    now["domain"] = registered_id(config.domain) or config.domain
    file = out / "settings.json"
    if file.is_file():
        # a setting added since the folder was written ran at its default then
        before = {**{f.name: f.default for f in fields(ExperimentConfig) if f.name in now}, **json.loads(file.read_text())}
        before["domain"] = registered_id(str(before["domain"])) or before["domain"]
        changed = sorted(k for k in now.keys() | before.keys() if before.get(k) != now.get(k))
        if changed:
            what = ", ".join(f"{k}: {before.get(k)!r} then, {now.get(k)!r} now" for k in changed)
            raise EnvACEError(
                f"{out} holds an experiment run with other settings ({what}); its finished stages would be mixed "
                "with new ones. Use another --output_dir, or the same settings."
            )
    file.write_text(json.dumps(now, indent=2))


def _check_validation(config: ExperimentConfig, domain: Any) -> None:
    """The validation tasks are held back from training: SFT's tasks and RL's draw must leave them out."""
    available = len(domain.tasks("train")) - config.val_tasks
    if config.val_tasks and (config.sft_tasks > available or config.tasks_per_step > available):
        raise EnvACEError(
            f"{domain.name} has {len(domain.tasks('train'))} training tasks: with the last {config.val_tasks} held back "
            f"for validation, sft_tasks ({config.sft_tasks}) and tasks_per_step ({config.tasks_per_step}) must be at "
            f"most {available}"
        )


def _validation_tasks(config: ExperimentConfig, domain: Any) -> list[Any]:
    train = domain.tasks("train")
    return [train[i] for i in range(len(train) - config.val_tasks, len(train))]


def _holds_sft_model(sft: Path) -> bool:
    """The SFT stage's folder holds its model, or the record it is trained again from."""
    return (sft / "final" / "config.json").is_file() or (sft / "record.json").is_file()


def _check_sft_models(config: ExperimentConfig, out: Path) -> None:
    """An RL condition starts from its seed's SFT model: refuse, before anything loads, a run that has neither it
    (nor the SFT record it is trained again from) nor the 'sft' condition."""
    if "sft" in config.conditions or not set(config.conditions) & set(RL_CONDITIONS):
        return
    missing = [s for s in config.seeds if not _holds_sft_model(out / f"seed-{s}" / "sft")]
    if missing:
        raise EnvACEError(
            f"the RL conditions start from each seed's SFT model, which {out} does not hold for seeds {missing}: "
            "add the 'sft' condition"
        )


# -- the stages --------------------------------------------------------------------------------------------
def _starting_model(config: ExperimentConfig, domain: Any, out: Path) -> str:
    """A folder with the starting model: ``tiny`` is made once for the domain (its tokenizer learnt from the
    domain's own texts, words as whole tokens), ``default`` is the embedded model."""
    if config.model in (None, "default"):
        from ..policy.default_model import ensure_default_model

        return str(ensure_default_model())
    if config.model != "tiny":
        return config.model
    from ..training.sft import tiny_start_model

    return str(tiny_start_model(domain, out / "initial_model"))


def _token_budget(domain: Any, model: str, num_tasks: int) -> int:
    """The longest reference Act turn or rehearsed result of the first training tasks, in the model's own
    tokens (end token included), plus a quarter: a correct turn is never cut."""
    from transformers import AutoTokenizer

    from ..training.sft import sft_rows

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = sft_rows(domain, tokenizer, domain.tasks("train")[: min(num_tasks, len(domain.tasks("train")))])
    longest = max(sum(r["completion_mask"]) for r in rows)
    return longest + max(8, longest // 4)


def _sft_stage(config: ExperimentConfig, domain: Any, start: str, stage: Path, seed: int, log: Any) -> dict[str, Any]:
    from ..training.sft import sft_steps

    log(f"[seed {seed}] sft: {config.sft_steps} steps on {config.sft_tasks} tasks' references ...")
    started = time.perf_counter()

    def progress(h: dict[str, float]) -> None:
        if h["step"] % 10 == 0 or h["step"] == config.sft_steps:
            log(f"[seed {seed}] sft: step {h['step']}/{config.sft_steps}, loss {h['loss']:.3f}")

    history = sft_steps(
        start, domain, stage / "final", tasks=config.sft_tasks, steps=config.sft_steps,
        batch_size=config.sft_batch_size, learning_rate=config.sft_learning_rate, seed=seed,
        train_layers=config.train_layers, checkpoint=stage / "checkpoint.pt", log=progress, dtype=config.dtype,
        gradient_checkpointing=config.gradient_checkpointing,
    )  # fmt: skip
    tasks = domain.tasks("train")[: min(config.sft_tasks, len(domain.tasks("train")))]
    replayed = sum(len(turn.calls) for task in tasks for turn in task.reference)  # sft_rows lays rows out by replay
    return {"train_seconds": time.perf_counter() - started, "sft_loss": history[-1]["loss"], "curve": [],
            "real_tool_executions": replayed if domain.make_executor(tasks[0]) is not None else 0,
            "trained_on": "reference trajectories (SFT; the reference calls replayed on the real tools)"}  # fmt: skip


def _rl_stage(
    config: ExperimentConfig, domain: Any, sft: Path, stage: Path, seed: int, condition: str, budget: int, log: Any
) -> dict[str, Any]:
    from ..training import metrics
    from ..training.options import enable_checkpointing
    from ..training.trainer import TrainerConfig, train

    if not (sft / "final" / "config.json").is_file():  # checked at the start; an SFT stage that wrote no model
        raise EnvACEError(f"{condition} starts from the SFT model of seed {seed}, which {sft} does not hold")
    settings = RL_CONDITIONS[condition]
    trainer = TrainerConfig(
        domain=domain, tasks_per_step=config.tasks_per_step, group_size=config.group_size, max_new_tokens=budget,
        temperature=config.temperature, steps=config.rl_steps, learning_rate=config.rl_learning_rate, seed=seed,
        dtype=config.dtype, train_tasks=len(domain.tasks("train")) - config.val_tasks if config.val_tasks else None,
        **{**config.episode_settings(), **settings},
    )  # fmt: skip
    policy = _load(str(sft / "final"), config.train_layers)
    if config.gradient_checkpointing:
        enable_checkpointing(policy.model)
    # on vLLM: one engine plays the rollouts and the evaluations (the trainer's weights loaded into it after
    # every step), and the frozen simulator is an engine of its own, never loaded again; on a GPU each takes its
    # share of the memory the trainer leaves (engine_share)
    share = engine_share(condition)
    engine = _engine(config, str(sft / "final"), share) if config.backend == "vllm" else None
    if settings.get("frozen_simulator"):
        simulator = _load(str(sft / "final"), None) if engine is None else _engine(config, str(sft / "final"), share)
    else:
        simulator = None
    generator = policy if engine is None else engine
    curve_file = stage / "curve.json"
    curve: list[dict[str, Any]] = json.loads(curve_file.read_text()) if curve_file.is_file() else []
    if not curve:  # step 0: the SFT model itself, evaluated like every later point (or already, by its stage)
        sft_record = sft / "record.json"
        sft_eval = (
            json.loads(sft_record.read_text()) if sft_record.is_file() else _evaluate(config, domain, generator, budget, False)
        )
        curve.append({"step": 0, **{k: sft_eval[k] for k in _EVAL_KEYS}})

    def evaluate_now(step: int) -> None:
        curve[:] = [p for p in curve if p["step"] != step]  # a resumed run re-evaluates the step it redid
        curve.append({"step": step, **_evaluate(config, domain, generator, budget, fidelity=step == config.rl_steps)})
        curve_file.write_text(json.dumps(curve, indent=2))
        log(f"[seed {seed}] {condition}: step {step}: success {curve[-1]['success']:.3f} greedy, "
            f"{curve[-1]['success_sampled']:.3f} sampled")  # fmt: skip

    log(f"[seed {seed}] {condition}: {config.rl_steps} steps of {config.tasks_per_step} tasks x {config.group_size} ...")
    def progress(m: dict[str, Any]) -> None:
        log(f"[seed {seed}] {condition}: step {m[metrics.STEP]}/{config.rl_steps}, reward {m[metrics.REWARD]:.3f}, "
            f"success {m[metrics.SUCCESS]:.3f}, zero-variance groups {_zero_std_groups(m)}, "
            f"{m[metrics.STEP_TIME]:.0f} s")  # fmt: skip

    def save_final() -> None:
        policy.model.save_pretrained(stage / "final")
        policy.tokenizer.save_pretrained(stage / "final")

    def at_checkpoint(step: int) -> None:  # every step is saved (a run cut off loses one step at most)
        if step == config.rl_steps:  # the model is usable (`envace eval`) while its long final evaluation runs
            save_final()
        if step % config.eval_every == 0 or step == config.rl_steps:
            evaluate_now(step)

    try:
        history = train(
            policy, trainer, progress, checkpoint=stage / "checkpoint.pt", checkpoint_every=1,
            on_checkpoint=at_checkpoint, simulator=simulator, engine=engine,
        )  # fmt: skip
    finally:  # the next stage's engines start in this process (workers=1): this stage's go first
        _release(engine, simulator)
    save_final()  # again: a resumed stage whose steps were all checkpointed ran no hook
    (stage / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    final = next(p for p in curve if p["step"] == config.rl_steps)
    return {
        **final,
        "curve": curve,
        "train_seconds": sum(h[metrics.STEP_TIME] for h in history),  # rollouts and updates, evaluations left out
        "real_tool_executions": sum(h[metrics.REAL_TOOL_CALLS] for h in history),
        "zero_std_groups": sum(_zero_std_groups(h) for h in history),
        "trained_on": f"reward={config.reward}, executor={settings['executor']}",
    }


def _zero_std_groups(step: dict[str, Any]) -> int:
    """How many of a step's groups had no reward spread (the trainer logs their share)."""
    from ..training import metrics

    return round(step[metrics.ZERO_STD] * step[metrics.GROUPS]) if step[metrics.GROUPS] else 0


def _load(path: str, train_layers: int | None, device: str | None = None) -> Any:
    """The model at ``path`` as a policy, on ``device`` (:func:`~envace_gym.policy.device.default_device`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..policy.transformers import TransformersPolicy
    from ..training.options import train_top_layers

    model = train_top_layers(place(AutoModelForCausalLM.from_pretrained(path), device), train_layers)
    return TransformersPolicy(model, AutoTokenizer.from_pretrained(path))


def _compute_dtype(config: ExperimentConfig) -> Any:
    """The compute dtype, ``auto`` resolved for the device the models run on (not the host CPU)."""
    return resolve_dtype(config.dtype, default_device())


def engine_share(condition: str) -> float:
    """On a GPU, each vLLM engine's ``gpu_memory_utilization`` in a stage of ``condition``: an RL stage holds the
    trainer's model and its rollout engine (and a frozen simulator's engine), an evaluation stage (``base``,
    ``sft`` after training, whose model is gone by then) one engine alone. Engines never outlive their stage."""
    from ..policy.vllm import gpu_memory_share

    engines = 1 + bool(RL_CONDITIONS.get(condition, {}).get("frozen_simulator"))
    return gpu_memory_share(engines, trainer=condition in RL_CONDITIONS)


def _engine(config: ExperimentConfig, path: str, share: float | None = None) -> Any:
    """A vLLM engine over the model at ``path``, in the experiment's compute dtype (the trainer's), taking
    ``share`` of the GPU's memory (on a GPU; default: an engine alone)."""
    from ..policy.vllm import VLLMPolicy

    _empty_gpu_cache()  # memory torch freed (an SFT model) is free for the engine to take
    share = engine_share("base") if share is None else share
    return VLLMPolicy(path, dtype=dtype_name(_compute_dtype(config)), seed=0, gpu_memory_utilization=share)


def _release(*policies: Any) -> None:
    """Shut down the vLLM engines among ``policies`` (their GPU memory goes back before the next engine)."""
    for policy in policies:
        if hasattr(policy, "release"):
            policy.release()
    _empty_gpu_cache()


def _empty_gpu_cache() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


_EVAL_KEYS = ("success", "mean_reward", "success_sampled", "mean_reward_sampled", "valid_real_calls_per_episode",
              "eval_episodes", "eval_seconds")  # fmt: skip


def _policy(config: ExperimentConfig, path: str) -> Any:
    """The model at ``path`` on the experiment's backend, for evaluation."""
    return _engine(config, path) if config.backend == "vllm" else _load(path, None)


# Validation tasks of the start's reward-spread measure: four batches' worth of groups at the default 4 tasks.
SPREAD_TASKS = 16


def group_spread(config: ExperimentConfig, domain: Any, policy: Any, budget: int, seed: int) -> dict[str, Any]:
    """How much a start leaves RL to learn from: ``group_size`` episodes of each of the first ``SPREAD_TASKS``
    validation tasks at the training temperature, real tools, the RL reward and ``on_invalid``; the share of
    groups whose episodes earn different rewards (a group that all succeeds or all fails gives no gradient)."""
    from ..rehearsal.prompt import rollout_sampling
    from ..rollout.collector import collect_rollouts

    tasks = _validation_tasks(config, domain)[:SPREAD_TASKS]
    sampling, rehearsal = rollout_sampling(budget, config.temperature)
    batch = collect_rollouts(
        policy, domain, tasks, config.group_size, config.episode_config(act_sampling=sampling, rehearsal=rehearsal),
        executor="real", seed=seed,
    )  # fmt: skip
    spread = batch.reward_spread()
    return {
        "groups_with_spread": sum(spread.values()) / max(1, len(spread)),
        "spread_groups": len(spread),
        "spread_success": sum(e.success for e in batch.episodes) / max(1, len(batch.episodes)),
    }


def _evaluate(
    config: ExperimentConfig, domain: Any, model: Any, budget: int, fidelity: bool = True
) -> dict[str, Any]:
    """Held-out success with real tools, greedy and sampled; rehearsal fidelity (greedy pass) when asked."""
    from ..evaluation.evaluate import evaluate

    policy = _policy(config, model) if isinstance(model, str) else model
    started = time.perf_counter()
    # every setting but the training ones: the domain's own reward, evaluation's on_invalid and its executor
    played = {k: v for k, v in config.episode_settings().items() if k not in ("on_invalid", "reward", *CONDITION_SETS)}
    played["user"] = "llm" if config.user == "rehearse" else config.user
    if config.eval_on == "validation":  # held-back training tasks, named "validation" in the results
        where = {"split": "validation", "tasks": _validation_tasks(config, domain)}
    else:
        where = {"split": "test", "num_tasks": config.eval_tasks}
    try:
        greedy = evaluate(policy, domain, **where, max_new_tokens=budget, fidelity=fidelity, **played)
        sampled = evaluate(
            policy, domain, **where, max_new_tokens=budget, temperature=config.eval_temperature,
            top_p=config.eval_top_p, seed=config.eval_seed, fidelity=False, **played,
        )  # fmt: skip
    finally:
        if isinstance(model, str):  # an engine started here goes with the evaluation
            _release(policy)
    return {
        "success": greedy.success_rate,
        "mean_reward": greedy.mean_reward,
        "success_sampled": sampled.success_rate,
        "mean_reward_sampled": sampled.mean_reward,
        "valid_real_calls_per_episode": greedy.real_calls / max(1, greedy.episodes),
        "rehearsal_parses": greedy.parsed,
        "rehearsal_equal_copying": greedy.equal_to_real,  # the call's own result was in the prompt
        "rehearsal_equal_withheld": greedy.equal_to_real_withheld,  # it was not: simulation
        "rehearsal_equal_own_calls": greedy.equal_to_real_own_calls,  # the policy's own calls: simulation
        "rehearsal_fields_withheld": greedy.fields_withheld,  # graded: fields right, numbers within 1%
        "rehearsal_fields_own_calls": greedy.fields_own_calls,
        # pass -> tool ("<tool> after a state change" apart) -> rehearsals, parsed, equal, fields
        "rehearsal_by_tool": {p: {t: asdict(f) for t, f in by.items()} for p, by in greedy.fidelity_by_tool.items()},
        "withheld_format_example": True,  # the withheld passes showed another task's execution of the tool
        "eval_episodes": greedy.episodes,
        "evaluated_on": config.eval_on,
        "eval_seconds": time.perf_counter() - started,
    }
