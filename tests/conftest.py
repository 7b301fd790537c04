"""Shared fixtures. Tests run offline on tiny in-process models; the default model has its own marked tests."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from envace_gym.testing import tiny_policy, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
    """A random 2-layer Llama with the tiny byte-level tokenizer (shared: tests must not train it)."""
    return tiny_policy()


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()
