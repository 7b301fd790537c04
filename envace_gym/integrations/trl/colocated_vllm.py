"""Generating with TRL's colocated vLLM engine (``use_vllm=True, vllm_mode="colocate"``): what makes it train on
vLLM's CPU backend too, the correction for sampling with other kernels than the trainer's, the settings
world-rehearsal rollouts refuse, and, in server mode, the swap of TRL's server client for the package's
(:mod:`.server_vllm`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import socket
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from ...errors import TrainingConfigError
from ...policy.precision import dtype_name


def refuse_vllm_settings(args: Any, what: str) -> None:
    """The vLLM settings rollouts cannot honour, refused by name. An episode is many generations from growing
    token-id prompts, played in this process: a colocated tensor-parallel engine needs its ranks to generate
    together. Sleep mode is honoured around a step's whole rollout batch (:func:`.trainer_policy.rollout_weights`).
    In server mode (:mod:`.server_vllm`) the servers' own flags say how they run."""
    if not getattr(args, "use_vllm", False):
        return
    mode = getattr(args, "vllm_mode", "colocate")
    if mode not in ("colocate", "server"):
        raise TrainingConfigError(f"{what}: vllm_mode must be 'colocate' or 'server', got {mode!r}")
    if getattr(args, "vllm_tensor_parallel_size", 1) != 1:
        instead = " (in vllm_mode='server', start each server with --tensor-parallel-size instead)."
        raise TrainingConfigError(
            f"{what} cannot shard a colocated engine (vllm_tensor_parallel_size={args.vllm_tensor_parallel_size}): "
            "each process plays its own episodes, so the ranks of a tensor-parallel group would not generate "
            "together. Leave it at 1"
            + (instead if mode == "server" else ".")
        )
    if mode == "server" and getattr(args, "vllm_enable_sleep_mode", False):
        raise TrainingConfigError(
            f"{what}: sleep mode is a colocated engine's (it frees this process's GPU memory for the optimizer step); "
            "vllm_enable_sleep_mode=True does nothing to a server. Leave it off, or start the servers with vLLM's "
            "--enable-sleep-mode."
        )


def _on_vllm_cpu(args: Any) -> bool:
    """Whether ``args`` asks for a colocated engine and vLLM runs on this machine's CPU."""
    if not (getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "colocate"):
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _refuse_sleep_without_platform(args: Any) -> None:
    """vLLM has sleep mode on CUDA, ROCm and XPU only; said here, by name, before the engine starts."""
    if not (getattr(args, "use_vllm", False) and getattr(args, "vllm_enable_sleep_mode", False)):
        return
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        raise TrainingConfigError(
            f"vllm_enable_sleep_mode=True needs vLLM's sleep mode, which its {current_platform.device_name} "
            "backend does not have (CUDA, ROCm and XPU do). Leave it off here."
        )


@contextlib.contextmanager
def _cpu_kv_cache(args: Any):
    """On vLLM's CPU backend ``vllm_gpu_memory_utilization`` is a share of the machine's memory for this whole
    process (the trainer's model and optimizer included), so TRL's default can leave the engine no room at all;
    unless the user set it (or ``VLLM_CPU_KVCACHE_SPACE``), the colocated engine gets a KV cache of its own size
    (``VLLMPolicy``'s default), set while it starts."""
    default = GRPOConfig.__dataclass_fields__["vllm_gpu_memory_utilization"].default
    chosen = "VLLM_CPU_KVCACHE_SPACE" in os.environ or getattr(args, "vllm_gpu_memory_utilization", default) != default
    if chosen or not _on_vllm_cpu(args):
        yield
        return
    from ...policy.vllm import DEFAULT_KV_CACHE_GIB

    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(round(DEFAULT_KV_CACHE_GIB))
    try:
        yield
    finally:
        del os.environ["VLLM_CPU_KVCACHE_SPACE"]


def trainer_dtype(args: Any) -> torch.dtype:
    """The dtype a TRL trainer computes its forward passes in (float32 master weights either way)."""
    return torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32


@contextlib.contextmanager
def _engine_in_trainer_dtype(args: Any):
    """TRL builds the colocated engine with vLLM's ``dtype="auto"``, which serves a float32 checkpoint in
    bfloat16 whatever the trainer computes in: the engine's log-probs then differ from the trainer's (a mean
    0.037 nats on the default model, importance ratios down to 0), and the first step is already off-policy.
    TRL has no setting for it, so while the engine starts, TRL's ``LLM`` is handed the trainer's dtype."""
    if not (getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "colocate"):
        yield
        return
    from trl.generation import vllm_generation

    llm = vllm_generation.LLM
    vllm_generation.LLM = functools.partial(llm, dtype=trainer_dtype(args))
    try:
        yield
    finally:
        vllm_generation.LLM = llm


@contextlib.contextmanager
def _own_master_port(args: Any):
    """A colocated engine opens a process group on ``MASTER_PORT``. Unset, TRL takes the first of a few fixed
    ports that is free when it looks (29500 first), so two runs started together both take 29500 and the
    second dies (EADDRINUSE). Unless the user set one, each run gets a port the kernel picks."""
    if getattr(args, "use_vllm", False) and os.environ.get("MASTER_PORT", "").strip().lower() in ("", "0", "auto"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    yield


def shutdown_engine(trainer: Any) -> None:
    """Shut the trainer's colocated engine down now, while the process group it uses still exists. Left to
    vLLM's finalizer at interpreter exit, it runs after that group is gone and prints a traceback."""
    llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()


def engine_dtype(trainer: Any) -> str | None:
    """The dtype the trainer's colocated vLLM engine runs in (``"float32"``), or ``None`` without one."""
    llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    return None if llm is None else dtype_name(llm.model_config.dtype)


def _sync_vllm_on_cpu(trainer: Any) -> None:
    """TRL's colocated weight sync calls vLLM's per-parameter ``load_weights``, which vLLM's CPU backend cannot
    take (it drops each linear layer's weight once repacked); there, sync through vLLM's in-place reload
    instead (:func:`envace_gym.policy.vllm.load_weights`), with the parameters TRL's sync would send (LoRA
    merged, names mapped)."""
    if not _on_vllm_cpu(trainer.args):
        return
    from ...policy.vllm import load_weights

    generation = trainer.vllm_generation
    generation.sync_weights = lambda: load_weights(generation.llm, generation._iter_named_params())


def importance_sampling_ratio(
    trained: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor, args: Any
) -> torch.Tensor:
    """TRL's correction for sampling with vLLM (``vllm_importance_sampling_*``): the ratio between the trainer's
    and the engine's probability of each sampled token, per token or per row (the product over the row),
    truncated to or masked outside ``[clip_min, clip_max]``; tokens outside ``mask`` count as ratio 1."""
    diff = torch.nan_to_num((trained - sampled) * mask, nan=0.0)
    mode = args.vllm_importance_sampling_mode
    ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
    low, high = args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=low, max=high)
    low = low if low is not None else -float("inf")
    high = high if high is not None else float("inf")
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


@contextlib.contextmanager
def _episode_servers(args: Any, plays_episodes: bool):
    """In server mode, a trainer whose rollouts are world-rehearsal episodes gets
    :class:`~.server_vllm.ServerVLLMGeneration` where TRL would build its own ``VLLMGeneration`` (whose client opens
    an NCCL group, which raises off CUDA, and generates one TRL batch, not episodes): TRL's name for it is swapped
    while the trainer starts."""
    if not (plays_episodes and getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "server"):
        yield
        return
    from trl.trainer import grpo_trainer

    from .server_vllm import ServerVLLMGeneration, server_urls

    built = grpo_trainer.VLLMGeneration
    grpo_trainer.VLLMGeneration = functools.partial(
        ServerVLLMGeneration, base_urls=server_urls(args), weights_dir=getattr(args, "vllm_server_weights_dir", None)
    )
    try:
        yield
    finally:
        grpo_trainer.VLLMGeneration = built


class ColocatedVLLMMixin:
    """For a ``GRPOTrainer`` subclass: ``use_vllm=True, vllm_mode="colocate"`` with the engine in the trainer's
    dtype (:func:`_engine_in_trainer_dtype`) on a port of its own (:func:`_own_master_port`), and on vLLM's CPU backend too, where TRL's engine would get no
    memory for its KV cache and TRL's weight sync fails (see :func:`_cpu_kv_cache` and
    :func:`_sync_vllm_on_cpu`). Elsewhere TRL's own engine and sync, unchanged. With ``vllm_mode="server"``, a
    trainer that plays episodes (:meth:`_plays_episodes`) generates on vLLM servers (:func:`_episode_servers`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        arguments = inspect.signature(GRPOTrainer.__init__).bind(self, *args, **kwargs).arguments
        config = arguments.get("args")
        _refuse_sleep_without_platform(config)
        with (
            _cpu_kv_cache(config), _engine_in_trainer_dtype(config), _own_master_port(config),
            _episode_servers(config, self._plays_episodes(arguments)),
        ):  # fmt: skip
            super().__init__(*args, **kwargs)
        _sync_vllm_on_cpu(self)

    def _plays_episodes(self, arguments: dict[str, Any]) -> bool:
        """Whether this trainer's rollouts are world-rehearsal episodes (a ``rollout_func``; always for
        ``EnvACEGRPOTrainer``), which generate through a policy, not TRL's generation loop."""
        return arguments.get("rollout_func") is not None

