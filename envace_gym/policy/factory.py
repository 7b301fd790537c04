"""``make_policy``: a :class:`~envace_gym.policy.Policy` from whatever a user passes as ``policy=``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import (
    PreTrainedTokenizerBase,
)

from ..errors import PolicyError
from .protocol import Policy
from .transformers import TransformersPolicy


BACKENDS = ("transformers", "vllm")


def make_policy(
    spec: Any = None, tokenizer: PreTrainedTokenizerBase | None = None, *, backend: str = "transformers"
) -> Policy:
    """Build a :class:`Policy` from what a user passes as ``policy=``.

    Accepts ``None`` or ``"default"`` (the embedded SmolLM2-135M), ``"tiny"`` (a random in-process
    test model), a local path or hub id, a ``(model, tokenizer)`` pair, a model plus ``tokenizer=``,
    or an object that already satisfies :class:`Policy`.

    ``backend="vllm"`` (or a name written ``"vllm:<path, id or default>"``) generates with a vLLM engine
    (:class:`~envace_gym.policy.vllm.VLLMPolicy`, the optional ``vllm`` extra); it takes a name only.
    """
    if backend not in BACKENDS:
        raise PolicyError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if isinstance(spec, str) and spec.startswith("vllm:"):
        spec, backend = spec.removeprefix("vllm:"), "vllm"
    if backend == "vllm":
        return _vllm_policy(spec, tokenizer)
    if spec is None or spec == "default":
        from .default_model import load_default_policy

        return load_default_policy()
    if isinstance(spec, str):
        if spec == "tiny":
            from .device import place
            from .tiny import quick_look_policy

            tiny = quick_look_policy()
            tiny.model = place(tiny.model)  # as every loaded model: on the GPU when there is one
            return tiny
        return TransformersPolicy.from_pretrained(spec)
    if isinstance(spec, tuple) and len(spec) == 2:
        return TransformersPolicy(spec[0], spec[1])
    if isinstance(spec, Policy):
        return spec
    if tokenizer is not None and hasattr(spec, "generate"):
        return TransformersPolicy(spec, tokenizer)
    raise PolicyError(
        f"cannot make a policy from {type(spec).__name__}; pass None, 'default', 'tiny', a path, "
        "a (model, tokenizer) pair or an object with .tokenizer, .max_context and .generate()"
    )


def _vllm_policy(spec: Any, tokenizer: PreTrainedTokenizerBase | None) -> Policy:
    from .vllm import VLLMPolicy

    if spec is None or spec == "default":
        from .default_model import ensure_default_model

        return VLLMPolicy(ensure_default_model(), tokenizer)
    if not isinstance(spec, str | Path) or spec == "tiny":
        raise PolicyError(
            "the vllm backend loads a model by name: pass a folder, a hub id or 'default' "
            f"(got {spec if isinstance(spec, str) else type(spec).__name__!r}; save an in-process model with "
            "save_pretrained first)"
        )
    return VLLMPolicy(spec, tokenizer)
