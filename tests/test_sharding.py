"""The pure-torch trainer past one device: one seeded step under FSDP2 (two gloo processes, float32, the tiny
model) equals the single-process step on the same global batch: loss, grad norm and every updated weight."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from envace_gym.policy.tiny import tiny_policy

WORKER = Path(__file__).with_name("sharded_step.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args: list[str], out: Path, mode: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([*args, str(WORKER), str(out), mode], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.slow
def test_one_fsdp2_step_on_two_processes_equals_the_single_process_step(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(_free_port())]  # fmt: skip
    _run(torchrun, tmp_path, "sharded")
    _run([sys.executable], tmp_path, "single")  # its batch: the two ranks' episodes (tests/sharded_step.py)
    sharded = torch.load(tmp_path / "sharded.pt", weights_only=False)
    single = torch.load(tmp_path / "single.pt", weights_only=False)
    a, b = sharded["step"], single["step"]
    assert a["episodes"] == b["episodes"] == 12 and a["tokens/trained"] == b["tokens/trained"] > 0
    assert a["reward"] == b["reward"] and a["frac_reward_zero_std"] < 1  # advantages to learn from
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], abs=1e-5) and b["grad_norm"] > 1e-3
    start = tiny_policy(seed=1).model.state_dict()
    for name, weight in single["weights"].items():
        assert torch.allclose(sharded["weights"][name], weight, rtol=0, atol=1e-5), name
    assert max(float((w - start[n]).abs().max()) for n, w in single["weights"].items()) > 1e-4  # the step moved them
    # the rollouts came from the gathered weights: their log-probs are the starting model's
    assert json.loads((tmp_path / "on_policy.json").read_text())["max_gap"] < 1e-4
    passes = [json.loads((tmp_path / f"passes-{r}.json").read_text()) for r in range(2)]
    assert passes[0]["all"] == passes[1]["all"] and max(p["idle"] for p in passes) > 0  # unequal shares, same passes
    assert all(p["resumed_steps"] == 1 and p["resumed_gap"] < 1e-6 for p in passes)  # the checkpoint reads back
