"""DDP with unequal pack counts per rank (issue 53, item 7g): the shared-prefix forward runs one model forward per
pack, and every DDP forward is a collective (buffers broadcast, reducer prepared); ranks whose rows make a
different number of packs must neither hang nor desynchronise, and their gradients must be those of the union."""

from __future__ import annotations

import time

import pytest
import torch

from envace_gym.testing import tiny_model, tiny_tokenizer
from envace_gym.training.packing import completion_logprobs, plain_scores, plan_packs

BUDGET = 40  # positions per pack: rank 0's rows make one pack, rank 1's three (checked below)


def _rows(rank: int) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(100 + rank)

    def r(n: int) -> list[int]:
        return torch.randint(3, 500, (n,), generator=g).tolist()

    if rank == 0:  # two rows sharing a prompt: one pack
        prompt = r(10)
        return [prompt, prompt], [r(4), r(5)]
    return [r(14), r(15), r(16)], [r(6), r(5), r(7)]  # nothing shared, each alone fills a pack


def _loss(logps: list[torch.Tensor]) -> torch.Tensor:
    return sum(lp.sum() * (i + 1) for i, lp in enumerate(logps))


def _ddp_worker(rank: int, world: int, store: str, checkpointing: bool) -> None:
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from envace_gym.training.distributed import end_distributed
    from envace_gym.training.options import enable_checkpointing

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    inner = tiny_model(tiny_tokenizer(), seed=0)
    if checkpointing:
        enable_checkpointing(inner)
    model = DistributedDataParallel(inner)
    model.train()
    prompts, completions = _rows(rank)
    for step in range(2):  # a second step: the reducer must be ready again after the first
        model.zero_grad(set_to_none=True)
        _loss(completion_logprobs(model, prompts, completions, budget=BUDGET)).backward()
        torch.save({n: p.grad for n, p in inner.named_parameters()}, f"{store}.rank{rank}.step{step}.pt")
    del model
    end_distributed()


def _reference() -> dict[str, torch.Tensor]:
    """One process, the plain forward: the mean over ranks of each rank's loss (what DDP's all-reduce averages)."""
    model = tiny_model(tiny_tokenizer(), seed=0)
    model.train()
    total = sum(_loss(plain_scores(model, *_rows(rank)).logprobs) for rank in range(2)) / 2
    total.backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_the_rows_make_unequal_pack_counts():
    counts = [len(plan_packs([p + c for p, c in zip(*_rows(rank), strict=True)], BUDGET)) for rank in range(2)]
    assert counts == [1, 3]


@pytest.mark.slow  # two spawned ranks, ~25 s each on 2 cores
@pytest.mark.parametrize("checkpointing", [False, True], ids=["packs-recomputed", "layers-checkpointed"])
def test_ddp_ranks_with_unequal_pack_counts_stay_in_step(tmp_path, checkpointing):
    import subprocess
    import sys

    store = tmp_path / "store"
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = (  # in a subprocess: a hung rank is ended with it, by the timeout
        "import sys, torch.multiprocessing as mp\n"
        f"sys.path.insert(0, {str(root / 'tests')!r})\n"
        "from test_ddp_packs import _ddp_worker\n"
        f"mp.start_processes(_ddp_worker, args=(2, {str(store)!r}, {checkpointing}), nprocs=2, start_method='spawn')\n"
    )
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the two DDP ranks hung (no result within {time.monotonic() - started:.0f} s)")
    assert done.returncode == 0, done.stderr[-3000:]
    want = _reference()
    scale = max(float(g.abs().max()) for g in want.values())
    for rank in range(2):
        for step in range(2):
            got = torch.load(f"{store}.rank{rank}.step{step}.pt")
            worst = max(float((got[name] - grad).abs().max()) for name, grad in want.items())
            assert scale > 0 and worst <= 1e-5 * max(1.0, scale), (rank, step, worst, scale)
