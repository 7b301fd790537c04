"""The pure-torch trainer past one device: torch's FSDP2 (``fully_shard``, the engine torchtitan and torchtune
build on), when the script is launched with ``torchrun``.

What each rank holds (float32 master weights, AdamW):

* **the trained copy**, sharded: each decoder layer and the root are ``fully_shard``-ed over one mesh of every
  rank, so parameters, gradients and the optimizer's two moments are split W ways; forwards gather a layer at
  a time, backwards reduce-scatter its gradients;
* **the caller's model, whole**, for the rollouts: after each optimizer step (and after a resume) it is loaded
  from the gathered shards, once, so that every generation of a step runs locally and no rank waits on
  another, whatever number of turns its episodes take (TRL gathers a ZeRO-3 model once for its rollouts for the
  same reason). With a vLLM engine the engine is loaded from it. Its memory is the cost of generating from
  sharded weights without an engine of its own: one more copy of the weights per rank.

Each rank plays its share of a step's tasks; the role-wise advantages are taken over the global batch, the
token-mean divides by the global batch's trained tokens, and every rank runs as many forward and backward
passes as the busiest one (idle passes train nothing), so the collectives of FSDP never desynchronise.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .state import write_state


def launched_distributed() -> bool:
    """Whether this process is one of several (``torchrun``, ``accelerate launch``: ``WORLD_SIZE`` > 1)."""
    return dist.is_initialized() and dist.get_world_size() > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1


def join_process_group(device: torch.device) -> tuple[int, int]:
    """This process's rank and the world size, the default process group started if needed (NCCL for CUDA
    models, gloo otherwise; ``torchrun`` provides the rendezvous)."""
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules sharded one by one: transformers' own list of the blocks it never splits (``_no_split_modules``,
    the decoder layers), as accelerate's FSDP auto-wrap reads it; empty for a model without one (the root alone)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model``, ``fully_shard``-ed over every rank (each decoder layer, then the root)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    sharded = copy.deepcopy(model)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in decoder_layers(sharded):
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    return sharded


def full_parameters(sharded: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, whole tensor)`` per parameter, gathered one at a time (a collective: every rank iterates); tied
    weights once, as ``named_parameters`` gives them."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for name, p in sharded.named_parameters():
            yield name, p.full_tensor() if isinstance(p, DTensor) else p.detach()


def load_whole(model: torch.nn.Module, sharded: torch.nn.Module) -> None:
    """Load ``model`` (the rollouts' whole copy) from the shards of the trained copy."""
    own = dict(model.named_parameters())
    with torch.no_grad():
        for name, full in full_parameters(sharded):
            own[name].copy_(full)


def gathered(value: Any) -> list[Any]:
    """Every rank's ``value`` (any picklable object), in rank order (a collective)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def global_max(value: int) -> int:
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def save_sharded_state(
    path: str | Path, sharded: torch.nn.Module, optimizer: torch.optim.Optimizer, rng: np.random.Generator,
    history: list[Any],
) -> None:  # fmt: skip
    """The training state as one file of whole tensors (the format :func:`~.state.save_state` writes, so a run
    resumes on any number of ranks): gathered on rank 0, written by it alone."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optimizer_state = get_state_dict(
        sharded, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist.get_rank() == 0:
        write_state(path, {"model": model_state, "optimizer": optimizer_state, "rng": rng.bit_generator.state,
                           "history": history})  # fmt: skip
    dist.barrier()  # no rank reads the file before it is whole


def load_sharded_state(
    path: str | Path | None, sharded: torch.nn.Module, optimizer: torch.optim.Optimizer, rng: np.random.Generator
) -> list[Any]:
    """Restore a state file (whole tensors) into the shards; returns its history (empty without a file)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    if path is None or not Path(path).is_file():
        return []
    state = torch.load(path, weights_only=False, map_location="cpu")  # our own file: it holds the numpy state
    set_state_dict(
        sharded, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
        options=StateDictOptions(full_state_dict=True),
    )  # fmt: skip
    rng.bit_generator.state = state["rng"]
    return state["history"]


__all__ = [
    "decoder_layers",
    "full_parameters",
    "gathered",
    "global_max",
    "join_process_group",
    "launched_distributed",
    "load_sharded_state",
    "load_whole",
    "save_sharded_state",
    "shard",
]
