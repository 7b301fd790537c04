"""A training run's state in one file: weights, optimizer, random state and the history so far, so that the
pure-torch loops (:mod:`~envace_gym.training.trainer`, :func:`~envace_gym.training.sft.sft_steps`) resume where
they stopped."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch


def save_state(
    path: str | Path, model: Any, optimizer: torch.optim.Optimizer, rng: np.random.Generator, history: list[Any]
) -> None:
    """Write the state; a run killed mid-save keeps the previous file (written aside, then renamed)."""
    write_state(path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                       "rng": rng.bit_generator.state, "history": history})  # fmt: skip


def write_state(path: str | Path, state: dict[str, Any]) -> None:
    """Write a state dict as :func:`save_state` does: aside, then renamed over the previous file."""
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def load_state(
    path: str | Path | None, model: Any, optimizer: torch.optim.Optimizer, rng: np.random.Generator
) -> list[Any]:
    """Restore the state saved at ``path`` into ``model``, ``optimizer`` and ``rng``; returns its history
    (empty, and nothing restored, when there is no such file)."""
    if path is None or not Path(path).is_file():
        return []
    # our own file: it holds the numpy random state. Read onto the CPU: a run saved on a GPU resumes anywhere (the
    # model's and optimizer's load_state_dict copy each tensor to its parameter's device)
    state = torch.load(path, weights_only=False, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    rng.bit_generator.state = state["rng"]
    return state["history"]
