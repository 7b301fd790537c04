"""CUDA-readiness checks that run without a GPU (issue 53, item 7): the device queries are faked."""

from __future__ import annotations

import pytest
import torch

from envace_gym.policy import precision


# -- e. auto dtype: native bfloat16 only ------------------------------------------------------------------
def test_auto_dtype_refuses_emulated_bf16(monkeypatch):
    """A pre-Ampere GPU: torch says bfloat16 is supported (emulated) unless asked for native support."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert precision.native_bf16("cuda") is False
    assert precision.resolve_dtype("auto", "cuda") is torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # Ampere or later
    assert precision.resolve_dtype("auto", "cuda") is torch.bfloat16
