"""Shared fixtures. Tests run offline on tiny in-process models; the default model has its own marked tests."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Under pytest-xdist (`make test` runs two workers) each worker takes its share of the cores: two workers using
# every core each would fight over them. Subprocesses the tests start inherit the same share.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # taskset's
    share = max(1, cores // workers)
    torch.set_num_threads(share)
    os.environ.setdefault("OMP_NUM_THREADS", str(share))

from envace_gym.testing import tiny_model, tiny_policy, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
    """A random 2-layer Llama with the tiny byte-level tokenizer (shared: tests must not train it)."""
    return tiny_policy()


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    """A tiny model saved to disk, for code that loads models by path (TRL trainers, the CLI); tests that
    train write their outputs elsewhere, so it stays as saved."""
    path = tmp_path_factory.mktemp("tiny") / "model"
    policy = tiny_policy(seed=2)
    policy.model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_vllm_folder(tmp_path_factory):
    """The tiny test model, wide enough for vLLM's CPU attention (head size >= 32), saved to a folder."""
    folder = tmp_path_factory.mktemp("tiny-vllm")
    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer, hidden_size=128, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def pytest_collection_modifyitems(config, items):
    """A default-model test is a slow one too (the 135M model on CPU; the first converts the GGUF): `make
    test-fast` (``-m "not slow"``) leaves them out with the other slow tests, without each marking both."""
    for item in items:
        if item.get_closest_marker("default_model") is not None:
            item.add_marker(pytest.mark.slow)


def pytest_sessionfinish(session, exitstatus):
    """With ``ENVACE_RELIABILITY_REPORT=path``, write how many fuzz cases each property test ran (for
    docs/reliability.md)."""
    path = os.environ.get("ENVACE_RELIABILITY_REPORT")
    module = sys.modules.get("test_reliability")
    if path and module is not None:
        import json

        with open(path, "w", encoding="utf-8") as f:
            json.dump({**module.CASES, "exit_status": int(exitstatus)}, f, indent=2)
