"""``envace train``: one command for the three ways to train, on TRL's trainers.

* ``mode="sft"``: warm start on the domain's reference trajectories, both roles (:mod:`envace_gym.training.sft`);
* ``mode="rehearsal"``: EnvACE, role-wise GRPO on world-rehearsal rollouts (:class:`EnvACEGRPOTrainer`);
* ``mode="real-tools"``: the baseline, standard GRPO with the domain's real tools in TRL's tool loop.

Checkpoints (model, optimizer, scheduler and RNG states) are TRL's; ``resume=True`` continues from the last
one in ``output_dir``. At the end the model is saved to ``output_dir/final``, the logged metrics to
``output_dir/metrics.jsonl`` and, when matplotlib is installed, the reward and success curves to
``output_dir/curves.png``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..domains.registry import make_domain
from ..episode.config import EpisodeSettings
from ..policy.precision import DTYPES, dtype_name, resolve_dtype
from ..training.memory import return_freed_memory
from ..training.options import checkpointing, lora_config, train_top_layers, use_cpu
from ..training.sft import FROM_SCRATCH_WARM_START, PRETRAINED_WARM_START, WarmStartSettings
from ..training.trainer import TrainerConfig

MODES = ("rehearsal", "real-tools", "sft")
WARM_STARTS = ("none", "sft")
VLLM_MODES = ("colocate", "server")
REAL_TOOLS_SETTINGS = ("max_turns", "on_invalid", "reward")  # the episode settings TRL's tool loop honours
DEFAULT_GRPO_STEPS = 20


def _as_trainer(name: str, help: str | None = None, **metadata: Any) -> Any:
    """A setting the pure-torch trainer's :class:`~envace_gym.training.trainer.TrainerConfig` declares: its default
    and help, declared there once (``help`` where this command says more; ``metadata`` adds ``choices``)."""
    declared = TrainerConfig.__dataclass_fields__[name]
    metadata = {**declared.metadata, **({"help": help} if help else {}), **metadata}
    return field(default=declared.default, metadata=metadata)


@dataclass
class TrainConfig(EpisodeSettings):
    """``envace train`` settings (a YAML file given with ``--config`` sets them too; flags win), grouped as in
    TRL's configs. Shared knobs carry TRL's names (``beta``, ``epsilon``, ``delta``, ``learning_rate``);
    ``group_size`` is TRL's ``num_generations``, ``max_new_tokens`` its ``max_completion_length`` (per generation)
    and ``steps`` its ``max_steps``.

    How episodes are played are the inherited :class:`~envace_gym.episode.EpisodeSettings`. Mode ``rehearsal``
    honours them all; ``real-tools`` runs TRL's tool loop, which takes ``reward``, ``max_turns`` (its rounds of tool
    calls) and ``on_invalid="feedback"`` (its default there: the loop answers a schema error as the tool's
    response) and refuses the others; ``sft`` plays no episode and refuses them all.
    """

    # Parameters that control what is trained, and where it goes
    mode: str = field(
        default="rehearsal",
        metadata={"help": "rehearsal (EnvACE), real-tools (baseline GRPO) or sft.", "choices": MODES},
    )
    domain: str = field(
        default="bank", metadata={"help": "Domain to train on: a name, a folder or a dataset file (docs/datasets.md)."}
    )
    model: str | None = field(
        default=None, metadata={"help": "Path or hub id; default: the embedded SmolLM2-135M; 'tiny' for a test model."}
    )
    output_dir: str = field(
        default="runs/envace", metadata={"help": "Where checkpoints, metrics and the final model go."}
    )

    # Parameters that control the rollouts
    tasks_per_step: int = _as_trainer(
        "tasks_per_step",
        "Tasks per GRPO batch, over all processes; each gives a group of group_size episodes (under accelerate, "
        "tasks_per_step x group_size must divide by the number of processes).",
    )
    group_size: int = _as_trainer("group_size")
    max_new_tokens: int = _as_trainer(
        "max_new_tokens",
        "Token budget of each Act turn and rehearsal (TRL's max_completion_length). real-tools: TRL spends its "
        "completion budget on the whole multi-turn completion, so it gets max_new_tokens x max_turns.",
    )
    temperature: float = _as_trainer("temperature")
    # Parameters that control the training
    steps: int | None = field(
        default=None,
        metadata={
            "help": "Optimizer steps (TRL's max_steps; GRPO: one per batch of rollouts, default 20). SFT: a limit on "
            "top of --sft_epochs (default: none, the epochs rule)."
        },
    )
    learning_rate: float = _as_trainer("learning_rate")
    lr_scheduler_type: str = field(
        default="linear",
        metadata={"help": "transformers' schedule: linear (to 0 at the last step), constant, constant_with_warmup, ..."},
    )
    warmup_steps: float = field(
        default=0,
        metadata={"help": "transformers' warmup: steps (an integer) or a share of all steps (a float below 1)."},
    )
    beta: float = _as_trainer("beta")
    epsilon: float = _as_trainer("epsilon")
    delta: float | None = _as_trainer("delta")
    seed: int = _as_trainer("seed")

    # Parameters that control which weights train
    lora: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft) instead of all weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    train_layers: int | None = field(
        default=None,
        metadata={"help": "Train only the top N decoder layers (and the final norm): a CPU budget option."},
    )

    # Parameters that control SFT (mode sft)
    sft_tasks: int = field(default=200, metadata={"help": "SFT: how many training tasks' reference trajectories."})
    sft_epochs: float = field(default=1.0, metadata={"help": "SFT: epochs over those rows."})
    sft_batch_size: int = field(default=4, metadata={"help": "SFT: rows per step."})

    # Parameters that control the warm start (GRPO modes): a short SFT first, so the first steps can learn
    warm_start: str = field(
        default="none",
        metadata={
            "help": "sft: before GRPO, a short SFT on the domain's reference rows (both roles), so the model writes "
            "calls and rehearsals and its groups get a reward spread (docs/training.md, 'The quick run'); none: off.",
            "choices": WARM_STARTS,
        },
    )
    warm_start_steps: int | None = field(
        default=None, metadata={"help": "Warm start: SFT steps (default: 20 for a pretrained model, 500 for tiny)."}
    )
    warm_start_learning_rate: float | None = field(
        default=None,
        metadata={"help": "Warm start: learning rate, constant (default: 2e-4 for a pretrained model, 1e-3 for tiny)."},
    )
    warm_start_batch_size: int | None = field(
        default=None, metadata={"help": "Warm start: rows per step (default: 4 for a pretrained model, 8 for tiny)."}
    )
    warm_start_tasks: int | None = field(
        default=None, metadata={"help": "Warm start: how many training tasks' reference rows (default: 200)."}
    )

    # Parameters that control speed and memory
    use_vllm: bool = field(
        default=False,
        metadata={
            "help": "Generate the rollouts with vLLM (vllm_mode): TRL's colocated engine in this process, or "
            "servers, given the trainer's weights once per step, its sampling corrected for (needs envace-gym[vllm]; "
            "docs/training.md)."
        },
    )
    vllm_mode: str = field(
        default="colocate",
        metadata={
            "help": "With use_vllm: colocate (an engine in this process) or server (vLLM servers you start; mode "
            "rehearsal: vLLM's OpenAI-compatible server, docs/training.md; mode real-tools: TRL's `trl vllm-serve`, "
            "CUDA only).",
            "choices": VLLM_MODES,
        },
    )
    vllm_server_base_urls: list[str] | None = field(
        default=None,
        metadata={
            "help": "vllm_mode server: the servers' base URLs (e.g. http://host:8000); mode rehearsal spreads its "
            "requests over several, real-tools takes one. Default: TRL's, http://0.0.0.0:8000."
        },
    )
    vllm_server_weights_dir: str | None = field(
        default=None,
        metadata={
            "help": "vllm_mode server, mode rehearsal: the folder the trainer writes its weights to once per step "
            "for the servers to reload; every server must read it at this path (default: a temporary folder)."
        },
    )
    dtype: str = _as_trainer(
        "dtype",
        "Compute dtype: auto (bfloat16 where the hardware has native bfloat16: a GPU that supports it, a CPU with "
        "avx512_bf16 or AMX; float32 elsewhere), float32, bfloat16. The resolved one is recorded.",
        choices=DTYPES,
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "Recompute layers in the backward pass (TRL's activation_checkpointing), and return freed "
            "memory to the OS at once: far less memory, some more time (docs/performance.md)."
        },
    )
    shared_prefix: bool = _as_trainer("shared_prefix")
    pack_tokens: int = _as_trainer("pack_tokens", "Positions per packed forward (bounds one pack's memory).")

    # Parameters that control checkpoints and logging
    save_steps: int = field(default=10, metadata={"help": "Checkpoint every this many steps."})
    logging_steps: int = field(default=1, metadata={"help": "Log every this many steps."})
    report_to: str = field(default="none", metadata={"help": "TRL/transformers report_to: none, tensorboard, ..."})
    resume: bool = field(default=False, metadata={"help": "Resume from the last checkpoint in output_dir."})

    def __post_init__(self) -> None:
        super().__post_init__()  # the episode settings
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")
        for name, least in (("tasks_per_step", 1), ("group_size", 2), ("save_steps", 1), ("max_new_tokens", 1)):
            if getattr(self, name) < least:  # GRPO compares a group's episodes: at least two
                raise ValueError(f"{name} must be at least {least}, got {getattr(self, name)}")
        if self.warmup_steps >= 1 and self.warmup_steps != int(self.warmup_steps):
            raise ValueError(f"warmup_steps is a share below 1 or a whole number of steps, got {self.warmup_steps}")
        from transformers import SchedulerType

        schedules = [s.value for s in SchedulerType]
        if self.lr_scheduler_type not in schedules:
            raise ValueError(f"lr_scheduler_type must be one of {schedules}, got {self.lr_scheduler_type!r}")
        changed = self.changed_episode_settings()
        if self.mode == "sft" and (changed or self.use_vllm):
            raise ValueError(
                f"{', '.join(changed + ['use_vllm'] * self.use_vllm)} set how rollouts are played or generated: mode sft "
                "plays none"
            )
        refused = sorted(set(changed) - set(REAL_TOOLS_SETTINGS))
        if self.mode == "real-tools" and refused:
            raise ValueError(
                f"mode real-tools runs TRL's tool loop, which takes {', '.join(REAL_TOOLS_SETTINGS)} of the episode "
                f"settings; it cannot honour {', '.join(refused)}"
            )
        if self.mode == "real-tools" and self.on_invalid is None:
            self.on_invalid = "feedback"
        if self.mode == "real-tools" and self.on_invalid == "terminate":
            raise ValueError(
                "mode real-tools answers a schema error as the tool's response (TRL's tool loop cannot end the episode "
                "there): use on_invalid='feedback', and the same for the rehearsal runs it is compared with"
            )
        if self.warm_start not in WARM_STARTS:
            raise ValueError(f"warm_start must be one of {WARM_STARTS}, got {self.warm_start!r}")
        if self.warm_start != "none" and self.mode == "sft":
            raise ValueError("warm_start is an SFT before GRPO; mode sft is that SFT already: leave warm_start out")
        if self.warm_start_steps is not None and self.warm_start_steps < 1:
            raise ValueError(f"warm_start_steps must be at least 1, got {self.warm_start_steps}")
        self._check_vllm_server()
        if self.mode != "sft":
            _episodes_per_process(self)  # refused here, so the CLI says it in one line before anything loads

    def _check_vllm_server(self) -> None:
        """Refuses the vLLM server settings that cannot take effect, before anything loads."""
        if self.vllm_mode not in VLLM_MODES:
            raise ValueError(f"vllm_mode must be one of {VLLM_MODES}, got {self.vllm_mode!r}")
        server = self.vllm_mode == "server"
        given = [n for n in ("vllm_server_base_urls", "vllm_server_weights_dir") if getattr(self, n)]
        if self.mode == "sft" and (server or given):
            raise ValueError("vllm_mode and the vllm_server settings choose how rollouts are generated: mode sft "
                             "plays none")  # fmt: skip
        if server and not self.use_vllm:
            raise ValueError("vllm_mode server generates with vLLM servers: add use_vllm")
        if given and not server:
            raise ValueError(f"{', '.join(given)} name vLLM servers: set vllm_mode server (and use_vllm)")
        if not (server and self.mode == "real-tools"):
            return
        # the baseline runs TRL's own tool loop and server client: one `trl vllm-serve`, weights over NCCL
        if len(self.vllm_server_base_urls or []) > 1:
            raise ValueError("mode real-tools generates through TRL's server client, which talks to one server: "
                             "give one vllm_server_base_urls")  # fmt: skip
        if self.vllm_server_weights_dir:
            raise ValueError("vllm_server_weights_dir is how mode rehearsal moves weights to its servers; mode "
                             "real-tools moves them with TRL's client (NCCL): leave it out")  # fmt: skip
        if use_cpu():
            raise ValueError("mode real-tools in vllm_mode server needs a CUDA device (TRL's server client moves "
                             "the weights over NCCL): on a CPU use vllm_mode colocate")  # fmt: skip

    @property
    def grpo_steps(self) -> int:
        return self.steps if self.steps is not None else DEFAULT_GRPO_STEPS


def _model_source(config: TrainConfig, domain: Any) -> tuple[str, Any]:
    """A path TRL can load (it builds reference models from paths) and the tokenizer. ``tiny`` is made once for
    the domain, as ``envace experiment`` makes it: a from-scratch 2-layer model whose tokenizer is learnt from the
    domain's own texts (words as whole tokens), so a short warm start teaches it the domain's calls."""
    if config.model in (None, "default"):
        from ..policy.default_model import ensure_default_model

        path = str(ensure_default_model())
    elif config.model == "tiny":
        from ..training.sft import tiny_start_model

        path = str(Path(config.output_dir) / "initial_model")
        if os.environ.get("RANK", "0") == "0":  # one writer under `accelerate launch`; the others wait below
            tiny_start_model(domain, path, seed=config.seed)
        _wait_for_everyone()
    else:
        path = config.model
    from transformers import AutoTokenizer

    return path, AutoTokenizer.from_pretrained(path)


def warm_start_settings(config: TrainConfig) -> WarmStartSettings:
    """The warm start's settings: the user's flags, the rest from the defaults measured for the model's kind
    (``tiny``, made from scratch, has everything to learn; a pretrained model only the domain)."""
    base = FROM_SCRATCH_WARM_START if config.model == "tiny" else PRETRAINED_WARM_START
    chosen = {
        "steps": config.warm_start_steps, "learning_rate": config.warm_start_learning_rate,
        "batch_size": config.warm_start_batch_size, "tasks": config.warm_start_tasks,
    }  # fmt: skip
    return replace(base, **{k: v for k, v in chosen.items() if v is not None})


def _wait_for_everyone() -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        PartialState().wait_for_everyone()


def _load_model(path: str, train_layers: int | None, instance: bool = False) -> Any:
    """The model to train: the path itself where a path will do (TRL's GRPO loads it and can build a reference
    copy from it), else an instance, with all but the top ``train_layers`` decoder layers frozen if set."""
    if train_layers is None and not instance:
        return path
    from transformers import AutoModelForCausalLM

    return train_top_layers(AutoModelForCausalLM.from_pretrained(path), train_layers)


def _warm_start(config: TrainConfig, path: str, domain: Any, out: Path, dtype: str) -> tuple[str, Any]:
    """``--warm_start sft``: the short SFT of :func:`~envace_gym.training.sft.warm_start` into
    ``output_dir/warm_start`` (reused when it was made with the same settings); GRPO starts from there."""
    from transformers import AutoTokenizer

    from ..training.sft import warm_start

    target, settings = out / "warm_start", warm_start_settings(config)
    if os.environ.get("RANK", "0") == "0":  # one writer under `accelerate launch`; the others wait below
        print(
            f"envace train: warm start: {settings.steps} SFT steps (batches of {settings.batch_size} rows, lr "
            f"{settings.learning_rate:g}) on the reference rows of {settings.tasks} training tasks, both roles -> "
            f"{target}",
            flush=True,
        )
        started = time.perf_counter()
        warm_start(
            path, domain, target, settings, seed=config.seed, dtype=dtype,
            log=lambda h: print(f"envace train: warm start step {h['step']}: loss {h['loss']:.3f}", flush=True)
            if h["step"] % max(1, settings.steps // 10) == 0 or h["step"] == settings.steps else None,
        )  # fmt: skip
        print(f"envace train: warm start done in {time.perf_counter() - started:.0f} s", flush=True)
    _wait_for_everyone()
    return str(target), AutoTokenizer.from_pretrained(target)


def _resume_point(out: Path) -> str | None:
    """The newest *complete* checkpoint (the Trainer writes ``trainer_state.json`` last). A newer one cut short
    by a crash is renamed ``incomplete-checkpoint-N`` (``-2``, ... after another crash at the same step) so that
    nothing resumes from it; under ``accelerate launch`` the first process renames, the others only skip it."""
    best: tuple[int, Path] | None = None
    for path in sorted(out.glob("checkpoint-*")):
        step = int(path.name.split("-")[-1]) if path.name.split("-")[-1].isdigit() else -1
        if not (path / "trainer_state.json").is_file():
            if os.environ.get("RANK", "0") == "0":
                target, n = path.with_name(f"incomplete-{path.name}"), 1
                while target.exists():
                    n += 1
                    target = path.with_name(f"incomplete-{path.name}-{n}")
                path.rename(target)
        elif best is None or step > best[0]:
            best = (step, path)
    if best is None:
        print(f"envace train: no complete checkpoint in {out}; starting from the beginning", flush=True)
        return None
    print(f"envace train: resuming from {best[1]}", flush=True)
    return str(best[1])


def _episodes_per_process(config: TrainConfig) -> int:
    """``tasks_per_step`` is the global batch: under ``accelerate launch`` each process plays its share."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    episodes = config.tasks_per_step * config.group_size
    if episodes % processes:
        raise ValueError(
            f"tasks_per_step x group_size = {episodes} episodes per step cannot be shared by {processes} processes; "
            "make it a multiple of the number of processes"
        )
    return episodes // processes


def trl_args(config: TrainConfig, turns: int, dtype: str) -> Any:
    """The TRL config that ``config``'s mode trains with (every TRL setting of ``envace train`` is set here):
    :func:`~envace_gym.integrations.trl.sft_config`'s ``PackedSFTConfig`` for ``sft``, an ``EnvACEGRPOConfig`` (the
    paper's objective is its defaults) for ``rehearsal``, a ``PackedGRPOConfig`` with that same objective
    (:func:`~envace_gym.integrations.trl.paper_objective`) for ``real-tools``. ``turns``: the Act turns of an
    episode; ``dtype``: the resolved compute dtype."""
    from ..integrations.trl import EnvACEGRPOConfig, PackedGRPOConfig, paper_objective, sft_config

    warmup = int(config.warmup_steps) if config.warmup_steps >= 1 else config.warmup_steps
    common = dict(
        learning_rate=config.learning_rate, lr_scheduler_type=config.lr_scheduler_type, warmup_steps=warmup,
        logging_steps=config.logging_steps, save_steps=config.save_steps, report_to=config.report_to,
        seed=config.seed, shared_prefix=config.shared_prefix, pack_tokens=config.pack_tokens,
    )  # fmt: skip
    if config.mode == "sft":
        return sft_config(
            str(Path(config.output_dir)), epochs=config.sft_epochs, batch_size=config.sft_batch_size, max_steps=config.steps or -1,
            dtype=dtype, gradient_checkpointing=config.gradient_checkpointing, **common,
        )  # fmt: skip
    # TRL's tool loop spends `max_completion_length` on the whole multi-turn completion (tool results included);
    # the collector spends `max_new_tokens` on each generation. Give the baseline a whole episode's worth so both
    # get the same budget per Act turn, and as many rounds of tool calls as an EnvACE episode has Act turns (TRL's
    # default: no bound).
    real_tools = config.mode == "real-tools"
    grpo = dict(
        output_dir=str(Path(config.output_dir)),
        per_device_train_batch_size=_episodes_per_process(config),
        num_generations=config.group_size,
        max_completion_length=config.max_new_tokens * (turns if real_tools else 1),
        **({"max_tool_calling_iterations": turns} if real_tools else {}),
        temperature=config.temperature,
        beta=config.beta,
        epsilon=config.epsilon,
        delta=config.delta,
        max_steps=config.grpo_steps,
        save_strategy="steps",
        use_cpu=use_cpu(),
        bf16=dtype == "bfloat16",
        **checkpointing(config.gradient_checkpointing),
        use_vllm=config.use_vllm,
        vllm_mode=config.vllm_mode,
        **common,
    )
    urls = config.vllm_server_base_urls or []
    if real_tools:  # TRL's own server client: one server (TrainConfig refuses more)
        server = {"vllm_server_base_url": urls[0]} if urls else {}
        return PackedGRPOConfig(**{**paper_objective(), **grpo, **server})  # the user's delta over the paper's
    servers = dict(vllm_server_base_urls=urls or None, vllm_server_weights_dir=config.vllm_server_weights_dir)
    return EnvACEGRPOConfig(domain=config.domain, **config.episode_settings(), **servers, **grpo)


def train(config: TrainConfig) -> dict[str, Any]:
    """Run the training ``config`` describes; returns where things were written and the last metrics."""
    from ..policy.transformers import check_model_source

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    check_model_source(config.model)  # a mistyped model or domain fails here, before anything loads
    domain = make_domain(config.domain)
    if config.gradient_checkpointing:  # the setting that asks for less memory (envace_gym.training.memory says why)
        return_freed_memory()
    started = time.perf_counter()
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # "auto" resolved once, by capability, and recorded beside the setting: every process of the run agrees
    compute_dtype = dtype_name(resolve_dtype(config.dtype, "cpu" if use_cpu() else "cuda"))
    (out / "train_config.json").write_text(json.dumps({**asdict(config), "resolved_dtype": compute_dtype}, indent=2))
    path, tokenizer = _model_source(config, domain)
    if config.warm_start == "sft":
        path, tokenizer = _warm_start(config, path, domain, out, compute_dtype)
    args = trl_args(config, config.max_turns or domain.max_turns, compute_dtype)
    peft_config = lora_config(config.lora_r) if config.lora else None
    if config.mode == "sft":
        from ..integrations.trl.packed_sft_trainer import run_sft
        from ..training.sft import sft_dataset

        dataset = sft_dataset(domain, tokenizer, "train", config.sft_tasks)
        trainer = run_sft(
            _load_model(path, config.train_layers, instance=True), tokenizer, dataset, args=args, lora=config.lora,
            lora_r=config.lora_r, resume=(_resume_point(out) or False) if config.resume else False,
        )  # fmt: skip
    else:
        from ..integrations.trl import EnvACEGRPOTrainer, PackedGRPOTrainer, RealToolsBaseline

        if config.mode == "rehearsal":
            trainer = EnvACEGRPOTrainer(
                model=_load_model(path, config.train_layers), args=args, processing_class=tokenizer,
                peft_config=peft_config,
            )  # fmt: skip
        else:
            trainer = PackedGRPOTrainer(
                model=_load_model(path, config.train_layers), args=args, processing_class=tokenizer,
                peft_config=peft_config, **RealToolsBaseline(domain, config.reward).trainer_kwargs(),
            )  # fmt: skip
        trainer.train(resume_from_checkpoint=_resume_point(out) if config.resume else None)
    from ..integrations.trl.colocated_vllm import engine_dtype, shutdown_engine

    final = out / "final"
    model = trainer.accelerator.unwrap_model(trainer.model)
    if config.lora and hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    history = list(trainer.state.log_history)
    plot = None
    if trainer.accelerator.is_main_process:  # one writer under `accelerate launch`
        model.save_pretrained(final)
        tokenizer.save_pretrained(final)
        trainer.create_model_card(model_name=out.name)  # names the base model (envace_gym.integrations.trl.model_card)
        if (out / "README.md").is_file():
            shutil.copyfile(out / "README.md", final / "README.md")  # so a run started from final/ names it too
        with open(out / "metrics.jsonl", "w", encoding="utf-8") as f:
            for entry in history:
                f.write(json.dumps(entry) + "\n")
        plot = plot_curves(history, out / "curves.png", title=f"{config.mode} on {config.domain}")
    summary = {
        "final_model": str(final),
        "metrics": str(out / "metrics.jsonl"),
        "plot": plot,
        "num_processes": trainer.accelerator.num_processes,
        "seconds": time.perf_counter() - started,
        # episodes whose verifier could not judge them (reward masked) in this run, over all processes
        "masked_episodes": _masked_episodes(trainer, config.mode),
        "dtype": compute_dtype,
        "engine_dtype": engine_dtype(trainer),
        "last": history[-1] if history else {},
    }
    if trainer.accelerator.is_main_process:
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    trainer.accelerator.wait_for_everyone()  # no process returns while the main one is still writing
    shutdown_engine(trainer)  # a vLLM engine, while its process group exists (else a traceback at exit)
    return summary


def _masked_episodes(trainer: Any, mode: str) -> int | None:
    """Episodes the verifier could not score: the rehearsal trainer counts them; in TRL's own tool loop (real-tools)
    the reward function does, per process."""
    if mode == "rehearsal":
        return getattr(trainer, "masked_episodes", None)
    if mode == "real-tools":
        from accelerate.utils import gather_object

        mine = sum(getattr(f, "masked_episodes", 0) for f in trainer.reward_funcs)
        return int(sum(gather_object([mine])))
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def plot_curves(history: list[dict[str, Any]], path: Path, title: str = "") -> str | None:
    """Reward and success per logged step (and the loss), as a PNG; ``None`` if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig = curves_figure(history, title)
    if fig is None:
        return None
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def curves_figure(history: list[dict[str, Any]], title: str = "") -> Any:
    """The figure of :func:`plot_curves`: one panel per logged key of reward, success and loss."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    keys = [k for k in ("reward", "success", "loss") if any(k in h for h in history)]
    if not keys:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.4), layout="constrained", squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        # a step whose every episode was masked logs no reward (None or NaN): no point, and a note if none is left
        points = [(h["step"], h[key]) for h in history if "step" in h and _is_number(h.get(key))]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
        if not points:
            ax.text(0.5, 0.5, "nothing to plot:\nevery episode's reward\nwas masked", ha="center", va="center",
                    transform=ax.transAxes)  # fmt: skip
        ax.set_xlabel("optimizer step")
        ax.set_title(key)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")  # values as they are, no "+1e-3" offset
        if key in ("reward", "success"):  # [0, 1] (wider if weighted rewards leave it): runs stay comparable
            values = [p[1] for p in points] or [0.0]
            ax.set_ylim(min(-0.05, min(values) - 0.05), max(1.05, max(values) + 0.05))
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return fig
