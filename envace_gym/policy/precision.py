"""The compute dtype: bfloat16 where the hardware runs it faster than float32, float32 otherwise.

Training keeps float32 master weights and optimizer states either way; ``bfloat16`` means the forward and
backward passes (and rollout generation) run under ``torch.autocast``. ``auto`` decides by the hardware: on a
GPU, bfloat16 when it supports it; on a CPU, by measurement, since only some CPUs have native bfloat16 (a
matmul that runs 2-3x faster in bfloat16 on one with ``avx512_bf16`` runs ~80x slower on one without).
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any

import torch

DTYPES = ("auto", "float32", "bfloat16")


@functools.cache
def bf16_speedup(device_type: str = "cpu") -> float:
    """How many times faster a bfloat16 matmul runs than a float32 one here (measured once per process)."""
    if device_type != "cpu":
        return 2.0 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 0.0
    a32, b32 = torch.randn(256, 576), torch.randn(576, 768)
    a16, b16 = a32.bfloat16(), b32.bfloat16()

    def best(a: torch.Tensor, b: torch.Tensor) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    best(a32, b32), best(a16, b16)  # warm up
    return best(a32, b32) / max(best(a16, b16), 1e-9)


def resolve_dtype(choice: str | torch.dtype | None, device: torch.device | str = "cpu") -> torch.dtype:
    """``"auto"`` (or ``None``), ``"float32"`` or ``"bfloat16"`` as the dtype to compute in on ``device``."""
    if isinstance(choice, torch.dtype):
        return choice
    choice = choice or "auto"
    if choice not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {choice!r}")
    if choice == "float32":
        return torch.float32
    if choice == "bfloat16":
        return torch.bfloat16
    device_type = torch.device(device).type
    return torch.bfloat16 if bf16_speedup(device_type) >= 1.2 else torch.float32


def autocast(dtype: torch.dtype | None, device: torch.device | str = "cpu") -> Any:
    """``torch.autocast`` to ``dtype`` on ``device`` when it is a half type, else a no-op context."""
    if dtype in (torch.bfloat16, torch.float16):
        return torch.autocast(torch.device(device).type, dtype=dtype)
    return contextlib.nullcontext()


__all__ = ["DTYPES", "autocast", "bf16_speedup", "resolve_dtype"]
