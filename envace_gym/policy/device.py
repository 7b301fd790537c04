"""Where models run: the one rule every loader and recipe follows.

:func:`default_device` is ``cuda`` when torch sees a CUDA device (``cuda:$LOCAL_RANK`` in a process that
``torchrun`` or ``accelerate launch`` started, so each rank takes its own GPU) and ``cpu`` otherwise;
``$ENVACE_DEVICE`` (``cpu``, ``cuda``, ``cuda:1``, ...) or an explicit ``device`` argument
(``TransformersPolicy.from_pretrained(device=...)``, ``sft_steps(device=...)``) overrides it.
Loaders put the model there (:func:`place`); the trainers take the policy's model where it is and compute on its
device, and the compute dtype ``auto`` is resolved for that device (:mod:`.precision`).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import PolicyError

DEVICE_ENV = "ENVACE_DEVICE"


def default_device(override: str | torch.device | None = None) -> torch.device:
    """``override``, else ``$ENVACE_DEVICE``, else ``cuda`` (this rank's, under a launcher) when a CUDA device is
    visible, else ``cpu``."""
    local = os.environ.get("LOCAL_RANK")
    cuda = f"cuda:{local}" if local is not None and local.isdigit() else "cuda"
    choice = override or os.environ.get(DEVICE_ENV) or (cuda if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(choice)
    except (RuntimeError, TypeError) as exc:
        raise PolicyError(f"unknown device {choice!r} (from {_source(override)}): {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PolicyError(f"device {choice!r} (from {_source(override)}) asks for CUDA, which torch does not see here")
    return device


def _source(override: str | torch.device | None) -> str:
    return "the device argument" if override else f"${DEVICE_ENV}"


def place(model: Any, device: str | torch.device | None = None) -> Any:
    """``model`` moved to ``default_device(device)`` and returned; a model that ``transformers`` already spread
    over devices (``device_map``) is left where it is."""
    if getattr(model, "hf_device_map", None):
        return model
    target = default_device(device)
    if next(model.parameters()).device != target:
        model = model.to(target)
    return model


__all__ = ["DEVICE_ENV", "default_device", "place"]
