"""The compute dtype: bfloat16 where the hardware has native bfloat16 kernels, float32 otherwise.

Training keeps float32 master weights and optimizer states either way; ``bfloat16`` means the forward and
backward passes (and rollout generation) run under ``torch.autocast``. ``auto`` decides by capability, so every
process on a machine decides alike: on a GPU, bfloat16 when it runs it natively (compute capability 8.0 and
later; not torch's emulation on older GPUs); on a CPU, bfloat16 when torch reports native bfloat16 instructions
(x86 ``avx512_bf16`` or AMX), since only those run it fast (forward and backward of the default model: 2.4x
faster than float32 on an AMD EPYC with ``avx512_bf16``; a matmul ~14x slower on an AVX2-only Intel). ``envace bench --train`` measures both side by side.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

DTYPES = ("auto", "float32", "bfloat16")


def native_bf16(device_type: str = "cpu") -> bool:
    """Whether ``device_type`` has native bfloat16 kernels (the same answer in every process on a machine)."""
    if device_type == "cuda":
        # not emulated: before Ampere (compute capability 8.0) torch's default answer is True, yet bfloat16 runs
        # there only through float32 kernels, slower than float32 itself
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device_type == "cpu":
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return False


def resolve_dtype(choice: str | torch.dtype | None, device: torch.device | str = "cpu") -> torch.dtype:
    """``"auto"`` (or ``None``), ``"float32"`` or ``"bfloat16"`` as the dtype to compute in on ``device``."""
    if isinstance(choice, torch.dtype):
        return choice
    choice = choice or "auto"
    if choice not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {choice!r}")
    if choice == "auto":
        return torch.bfloat16 if native_bf16(torch.device(device).type) else torch.float32
    return getattr(torch, choice)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` as ``"bfloat16"``: how run records name a resolved dtype."""
    return str(dtype).removeprefix("torch.")


def autocast(dtype: torch.dtype | None, device: torch.device | str = "cpu") -> Any:
    """``torch.autocast`` to ``dtype`` on ``device`` when it is a half type, else a no-op context."""
    if dtype in (torch.bfloat16, torch.float16):
        return torch.autocast(torch.device(device).type, dtype=dtype)
    return contextlib.nullcontext()


__all__ = ["DTYPES", "autocast", "dtype_name", "native_bf16", "resolve_dtype"]
