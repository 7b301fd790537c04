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
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert default_device() == torch.device("cuda")
    monkeypatch.setenv("LOCAL_RANK", "3")  # a launcher's fourth process: its own GPU
    assert default_device() == torch.device("cuda:3")
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


# -- c. CPU-only vLLM settings only on vLLM's CPU backend ---------------------------------------------------
def test_vllm_cpu_settings_only_on_the_cpu_platform():
    from envace_gym.policy.vllm import CPU_STEP_TOKENS, engine_settings

    cpu = engine_settings("m", on_cpu=True, kv_cache_gib=1.0)
    assert cpu["kv_cache_memory_bytes"] == 2**30 and cpu["max_num_batched_tokens"] == CPU_STEP_TOKENS
    assert cpu["dtype"] == "float32" and "gpu_memory_utilization" not in cpu
    gpu = engine_settings("m", on_cpu=False, kv_cache_gib=1.0, gpu_memory_utilization=0.2)
    # a fixed KV cache size would override gpu_memory_utilization on CUDA
    assert "kv_cache_memory_bytes" not in gpu and "max_num_batched_tokens" not in gpu
    assert gpu["gpu_memory_utilization"] == 0.2 and gpu["dtype"] == "auto"
    assert "gpu_memory_utilization" not in engine_settings("m", on_cpu=False)  # vLLM's own default
    mine = engine_settings("m", on_cpu=True, engine_kwargs={"max_num_batched_tokens": 4096, "dtype": "bfloat16"})
    assert mine["max_num_batched_tokens"] == 4096 and mine["dtype"] == "bfloat16"  # the caller's win


def test_vllm_policy_builds_its_engine_from_the_platform(monkeypatch):
    """VLLMPolicy asks vLLM's platform, then passes engine_settings' answer to vllm.LLM (faked: no engine)."""
    from envace_gym.policy import vllm as backend

    class Stop(Exception):
        pass

    seen = {}

    def fake_llm(**settings):
        seen.update(settings)
        raise Stop

    monkeypatch.setattr(backend, "_import_vllm", lambda: type("vllm", (), {"LLM": staticmethod(fake_llm)}))
    for on_cpu in (True, False):
        seen.clear()
        monkeypatch.setattr(backend, "on_cpu_platform", lambda on_cpu=on_cpu: on_cpu)
        with pytest.raises(backend.PolicyError, match="did not start"):
            backend.VLLMPolicy("m", tokenizer=object(), gpu_memory_utilization=0.3)
        assert ("kv_cache_memory_bytes" in seen) is on_cpu
        assert seen.get("gpu_memory_utilization") == (None if on_cpu else 0.3)


# -- d. the engines of one experiment fit one GPU together -------------------------------------------------
def test_engine_shares_fit_one_gpu():
    from envace_gym.policy.vllm import GPU_MEMORY_BUDGET, TRAINER_GPU_SHARE, gpu_memory_share
    from envace_gym.recipes.experiment import CONDITIONS, RL_CONDITIONS, engine_share

    assert gpu_memory_share(1) == GPU_MEMORY_BUDGET
    assert gpu_memory_share(2, trainer=True) == pytest.approx((GPU_MEMORY_BUDGET - TRAINER_GPU_SHARE) / 2)
    with pytest.raises(ValueError):
        gpu_memory_share(0)
    for condition in CONDITIONS:
        engines = 1 + bool(RL_CONDITIONS.get(condition, {}).get("frozen_simulator"))
        trainer = TRAINER_GPU_SHARE if condition in RL_CONDITIONS else 0.0
        assert engines * engine_share(condition) + trainer <= GPU_MEMORY_BUDGET + 1e-9, condition
    assert engine_share("sft+envace-frozen-sim") < engine_share("sft+envace-separate") < engine_share("sft")


def test_experiment_releases_its_engines_and_sizes_them(monkeypatch, tmp_path):
    """An RL stage on vLLM starts its engines with their shares and shuts them down when it ends (faked engines
    and trainer: what is checked is the bookkeeping, not vLLM)."""
    from envace_gym.policy import vllm as backend
    from envace_gym.recipes import experiment

    started, released = [], []

    class FakeEngine:
        def __init__(self, path, dtype=None, seed=0, gpu_memory_utilization=None):
            started.append(gpu_memory_utilization)

        def release(self):
            released.append(self)

    monkeypatch.setattr(backend, "VLLMPolicy", FakeEngine)
    monkeypatch.setattr(experiment, "_load", lambda path, layers: type("P", (), {"model": None})())

    def fake_train(*args, **kwargs):
        raise RuntimeError("stop after the engines started")

    import envace_gym.training.trainer as trainer

    monkeypatch.setattr(trainer, "train", fake_train)
    monkeypatch.setattr(experiment, "_evaluate", lambda *a, **k: dict.fromkeys(experiment._EVAL_KEYS, 0.0))
    sft = tmp_path / "sft"
    (sft / "final").mkdir(parents=True)
    (sft / "final" / "config.json").write_text("{}")
    config = experiment.ExperimentConfig(backend="vllm", gradient_checkpointing=False)
    from envace_gym.domains.registry import make_domain

    with pytest.raises(RuntimeError, match="stop after"):
        experiment._rl_stage(config, make_domain("lights:easy"), sft, tmp_path / "stage", 0, "sft+envace-frozen-sim",
                             16, lambda *_: None)  # fmt: skip
    assert started == [experiment.engine_share("sft+envace-frozen-sim")] * 2 and len(released) == 2


# -- f. the packing probe in the dtype the forwards run in -----------------------------------------------
_IDS = [11, 23, 5, 17, 29, 3, 31, 7, 13, 19, 2, 37]  # the probe's own rows
_PROMPTS, _COMPLETIONS = [_IDS[:6], _IDS[:6], _IDS[6:9]], [_IDS[6:10], _IDS[9:12], _IDS[1:5]]


def test_packing_probe_under_bf16_autocast_tolerates_rounding_not_a_mismatch(monkeypatch, tokenizer):
    from envace_gym.testing import tiny_model
    from envace_gym.training import packing

    model = tiny_model(tokenizer, seed=0)
    with torch.no_grad():
        exact = packing.plain_scores(model, _PROMPTS, _COMPLETIONS).logprobs
        with torch.autocast("cpu", dtype=torch.bfloat16):
            rounded = packing.plain_scores(model, _PROMPTS, _COMPLETIONS).logprobs
    # bfloat16's rounding alone is past float32's tolerance: a probe in bf16 held to it would turn packing off
    assert packing._farthest(exact, rounded) > packing.EXACT_TOLERANCE
    assert packing.packing_support(model, torch.bfloat16) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the ambient autocast is the dtype probed (cached)
        assert packing.packing_support(model) is None
    assert set(packing._SUPPORT[model]) == {torch.bfloat16}

    # a packed forward that goes wrong only in bfloat16 (a kernel that drops the mask there, say) is caught
    right = packing._tree_flat

    def wrong_in_bf16(model, tree, temperature):
        logprobs, *rest = right(model, tree, temperature)
        return (logprobs + 0.5 * torch.is_autocast_enabled("cpu"), *rest)

    monkeypatch.setattr(packing, "_tree_flat", wrong_in_bf16)
    other = tiny_model(tokenizer, seed=6)
    assert packing.packing_support(other) is None  # float32: right
    assert "under torch.bfloat16 autocast" in packing.packing_support(other, torch.bfloat16)


def test_packing_probe_catches_a_layout_mismatch_whatever_the_compute_dtype(tokenizer):
    from envace_gym.testing import tiny_model
    from envace_gym.training import packing

    class IgnoresPositions(torch.nn.Module):  # packed positions are wrong for it: a real mismatch
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, position_ids=None, **kwargs):
            return self.inner(**kwargs)

    assert "differ" in packing.packing_support(IgnoresPositions(tiny_model(tokenizer, seed=7)), torch.bfloat16)
    assert packing.probe_tolerance(torch.float32, noise=1.0) == packing.EXACT_TOLERANCE
    assert packing.probe_tolerance(torch.bfloat16) == packing.HALF_TOLERANCE
    assert packing.probe_tolerance(torch.bfloat16, noise=0.1) == pytest.approx(packing.NOISE_FACTOR * 0.1)


# -- item 6: the GPU check script builds its configs without a GPU ------------------------------------------
@pytest.mark.slow
def test_gpu_check_dry_run_builds_every_config():
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run"], cwd=root, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("gpu_check: dry run: every config built; nothing trained")
    built = json.loads(done.stdout[: done.stdout.rindex("}") + 1])["dry_run"]
    assert built["model_config"]["model_type"] == "qwen3" and built["model_config"]["num_hidden_layers"] == 28
    assert built["fsdp2_plugin"]["fsdp_version"] == 2 and built["trainer"]["steps"] == 2
    assert built["tokenizer"]["chat_template"] and built["variants"] == ["plain", "fsdp2"]
