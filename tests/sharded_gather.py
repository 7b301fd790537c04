"""What TRL's colocated engine is loaded with under FSDP2, for tests/test_vllm.py: a model whose weights moved
away from its checkpoint, sharded by ``fully_shard`` across two gloo processes, then gathered by TRL's own
``VLLMGeneration._iter_named_params`` (the iterator its ``sync_weights`` and our CPU reload both read). Rank 0
writes the gathered stream, in order, for the test to load into an engine.

    python -m torch.distributed.run --nproc_per_node 2 tests/sharded_gather.py MODEL_FOLDER OUT_FILE
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM
from trl.generation.vllm_generation import VLLMGeneration

from envace_gym.training import sharding


def moved(folder: str) -> torch.nn.Module:
    """The checkpoint's model with seeded noise added (the same on every rank, and in the test)."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        noise = torch.Generator().manual_seed(7)
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise) * 0.05)
    return model


def main(folder: str, out: str) -> None:
    dist.init_process_group("gloo")
    sharded = sharding.shard(moved(folder))
    assert all(type(p).__name__ == "DTensor" for p in sharded.parameters())  # nothing whole on any rank
    generation = VLLMGeneration.__new__(VLLMGeneration)  # TRL's methods, without starting an engine here
    generation.model = sharded
    generation.accelerator = SimpleNamespace(device=torch.device("cpu"))
    generation._dist = SimpleNamespace(is_fsdp=True, fsdp_version=2, is_zero3=False)
    stream = [(name, tensor.clone()) for name, tensor in generation._iter_named_params()]  # every rank gathers
    if dist.get_rank() == 0:
        torch.save(stream, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
