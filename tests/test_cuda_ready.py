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


# -- a. one device rule ---------------------------------------------------------------------------------
@pytest.fixture
def fake_cuda(monkeypatch):
    """torch sees a GPU; moving a module records where it was sent and leaves it on the CPU."""
    sent: list[str] = []

    def to(self, *args, **kwargs):
        sent.append(str(args[0] if args else kwargs.get("device")))
        return self

    monkeypatch.delenv("ENVACE_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.nn.Module, "to", to)
    return sent


def test_default_device_rule(monkeypatch):
    from envace_gym.errors import PolicyError
    from envace_gym.policy.device import default_device

    monkeypatch.delenv("ENVACE_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device() == torch.device("cpu")
    with pytest.raises(PolicyError, match="CUDA"):
        default_device("cuda")
    with pytest.raises(PolicyError, match="unknown device"):
        default_device("gpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == torch.device("cuda")
    monkeypatch.setenv("ENVACE_DEVICE", "cpu")
    assert default_device() == torch.device("cpu")  # the environment overrides the rule
    assert default_device("cuda:1") == torch.device("cuda:1")  # and an argument overrides both


def test_loaders_place_the_model_on_the_gpu(fake_cuda, tiny_path):
    from envace_gym.policy import make_policy
    from envace_gym.policy.transformers import TransformersPolicy
    from envace_gym.recipes import experiment

    TransformersPolicy.from_pretrained(tiny_path)
    assert fake_cuda == ["cuda"]
    TransformersPolicy.from_pretrained(tiny_path, device="cpu")  # already there: not moved
    make_policy("tiny")
    experiment._load(tiny_path, None)
    experiment._load(tiny_path, 1, "cuda:1")
    assert fake_cuda == ["cuda", "cuda", "cuda", "cuda:1"]


def test_sft_trains_on_the_gpu(fake_cuda, tiny_path, tmp_path):
    from envace_gym.training.sft import sft_steps

    sft_steps(tiny_path, "lights:easy", tmp_path / "out", tasks=2, steps=1, batch_size=2)
    assert fake_cuda == ["cuda"]


def test_experiment_resolves_auto_dtype_for_its_device(monkeypatch):
    from envace_gym.recipes import experiment

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precision, "native_bf16", lambda device_type="cpu": device_type == "cuda")
    monkeypatch.delenv("ENVACE_DEVICE", raising=False)
    config = experiment.ExperimentConfig(dtype="auto")
    assert experiment._compute_dtype(config) is torch.bfloat16  # the GPU's answer, not the host CPU's
    monkeypatch.setenv("ENVACE_DEVICE", "cpu")
    assert experiment._compute_dtype(config) is torch.float32


# -- b. GPU memory beside RSS -----------------------------------------------------------------------------
def test_peak_gpu_memory_only_where_cuda_is_in_use(monkeypatch):
    from envace_gym.recipes.bench import Measure, format_table
    from envace_gym.training import memory

    assert memory.peak_gpu_memory() is None  # this machine: no CUDA
    cpu_table = format_table([Measure("m", "1", "1", 1.0, "", 10.0)])
    assert "GPU" not in cpu_table
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    assert memory.peak_gpu_memory() == 3072.0 and memory.peak_gpu_memory(2**30) == 3.0
    table = format_table([Measure("m", "1", "1", 1.0, "", 10.0, peak_gpu_mib=memory.peak_gpu_memory())])
    assert "peak GPU (MiB)" in table and "| 3,072 |" in table
