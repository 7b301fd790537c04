"""The policy: one model that writes both the Act turns and the rehearsed tool responses.

:class:`Policy` is the small protocol the environment needs: batched generation from token ids,
returning completion ids and per-token log-probabilities. :class:`TransformersPolicy` implements it
over any causal LM from ``transformers``; :func:`make_policy` builds one from whatever a user passes
(``None`` for the embedded default, a path or hub id, a ``(model, tokenizer)`` pair, or a Policy).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

from ..errors import PolicyError
from .device import place
from .precision import autocast
from .protocol import Generation, SamplingParams
from .sessions import GenerationSession, cache_argument
from .tokens import stop_token_ids


class _LogprobRecorder(LogitsProcessor):
    """Records log p(chosen token) step by step, holding a single step's distribution at a time.

    ``generate`` calls processors before its sampling warpers, so the scores seen here are the raw
    logits; the chosen token of step t is the last column of ``input_ids`` at step t+1.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature if temperature > 0 else 1.0
        self.steps: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None

    def _gather(self, chosen: torch.Tensor) -> None:
        assert self._pending is not None
        self.steps.append(self._pending.gather(1, chosen[:, None]).squeeze(1))
        self._pending = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self._gather(input_ids[:, -1])
        self._pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        if self._pending is not None:
            self._gather(last_tokens)
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(last_tokens.shape[0], 0)


@contextlib.contextmanager
def _own_sampling(model: Any) -> Any:
    """Generate with none of the model's own ``generation_config`` defaults.

    ``generate`` fills every setting left unset from the model's generation config (a checkpoint's top-k,
    top-p, min-p, repetition penalty, ...). Those would change what is sampled, and a penalty would change
    the scores the log-prob recorder sees, so the stored log-probs would no longer be those the loss models.
    Sampling is exactly what :class:`SamplingParams` says: the model's config is swapped for a neutral one
    for the call."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model's base generates
    own = getattr(model, "generation_config", None)
    if own is None:
        yield
        return
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = own


class _StopStrings(StoppingCriteria):
    """Ends a row once its recent text contains a stop string, and remembers at which step.

    ``generate`` pads finished rows (often with the EOS id), so the recorded step, not the ids, says
    where a row that stopped on a string really ended.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: Sequence[str], prompt_length: int) -> None:
        self.tokenizer, self.stops, self.start = tokenizer, list(stops), prompt_length
        self.window = max(len(s) for s in stops) + 2  # every token holds at least one character
        self.ended: dict[int, int] = {}

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        steps = input_ids.shape[1] - self.start
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row in range(input_ids.shape[0]):
            if row in self.ended:
                done[row] = True
                continue
            tail = self.tokenizer.decode(input_ids[row, max(self.start, input_ids.shape[1] - self.window) :])
            if any(stop in tail for stop in self.stops):
                self.ended[row] = steps
                done[row] = True
        return done


class TransformersPolicy:
    """A :class:`Policy` over a ``transformers`` causal LM.

    Args:
        model: A causal LM (``AutoModelForCausalLM``); it is used as is: the same object is trained.
        tokenizer: Its tokenizer, with a chat template that accepts ``tools=``.
        max_batch_size: Prompts per ``generate`` call; longer lists are split.
        max_context: Token budget per sequence; defaults to the model's ``max_position_embeddings``.
        compute_dtype: Generate under ``torch.autocast`` to this dtype (e.g. ``torch.bfloat16``; see
            :mod:`envace_gym.policy.precision`); ``None`` runs in the model's own dtype. Recorded log-probabilities are
            then those of the autocast forward, which is what a trainer under the same autocast recomputes.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int = 32,
        max_context: int | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        if tokenizer.chat_template is None:
            raise PolicyError("the tokenizer has no chat_template; set one that accepts tools= (e.g. Qwen2.5's)")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.compute_dtype = compute_dtype
        self.max_context = max_context or int(getattr(model.config, "max_position_embeddings", 4096))
        self.stop_ids = stop_token_ids(tokenizer, model)
        if not self.stop_ids:
            raise PolicyError("the tokenizer defines no end-of-turn token (eos_token or <|im_end|>)")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, device: str | torch.device | None = None, **kwargs: Any
    ) -> TransformersPolicy:
        """Load a model and tokenizer from a local path or a hub id (which needs network access), the model on
        ``device`` (default: :func:`~envace_gym.policy.device.default_device`, the GPU when there is one)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        check_model_source(name_or_path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(name_or_path)
            model = AutoModelForCausalLM.from_pretrained(name_or_path)
        except OSError as exc:
            local = Path(name_or_path).expanduser().exists()
            where = "a local folder" if local else "no local folder of that name, so tried as a hub id"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PolicyError(f"cannot load model {name_or_path!r} ({where}): {first}") from exc
        return cls(place(model, device), tokenizer, **kwargs)

    def with_compute_dtype(self, dtype: torch.dtype | None) -> TransformersPolicy:
        """The same model and tokenizer, generating under autocast to ``dtype`` (``None``: the model's own)."""
        if dtype == self.compute_dtype:
            return self
        other = copy.copy(self)
        other.compute_dtype = dtype
        return other

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        out: list[Generation] = []
        for start in range(0, len(prompts), self.max_batch_size):
            out += self._generate_batch(prompts[start : start + self.max_batch_size], params)
        return out

    def _generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        self.check_fits(prompts, params)
        longest = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), longest), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding: every row ends where generation starts
            input_ids[row, longest - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
            attention[row, longest - len(prompt) :] = 1
        gens, _ = self.run(input_ids, attention, prompts, params)
        return gens

    def check_fits(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> None:
        if params.max_new_tokens < 1:
            raise PolicyError("max_new_tokens must be at least 1")
        longest = max(len(p) for p in prompts)
        if longest == 0:
            raise PolicyError("cannot generate from an empty prompt")
        if longest + params.max_new_tokens > self.max_context:
            raise PolicyError(
                f"prompt of {longest} tokens + {params.max_new_tokens} new tokens exceeds the context of {self.max_context}"
            )

    @torch.inference_mode()
    def run(
        self,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        cache: Any = None,
    ) -> tuple[list[Generation], Any]:
        """One ``model.generate`` call on ready-made (possibly padded, possibly cached) inputs.

        ``attention`` marks real tokens with 1; every row must end with its last prompt token (positions
        come from the mask, so padding may also sit between turns). ``cache`` holds the KV of the first
        columns, which are then not recomputed. Returns the generations and the cache after the call.
        """
        device = self.device
        width = input_ids.shape[1]
        greedy = params.temperature <= 0
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=params.min_new_tokens or None,
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy or params.top_p >= 1.0 else params.top_p,
            top_k=None if greedy or params.top_k <= 0 else params.top_k,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
        )
        recorder = _LogprobRecorder(params.temperature)
        stopper = _StopStrings(self.tokenizer, params.stop, width) if params.stop else None
        extra = {} if cache is None else {cache_argument(self.model): cache}
        devices = [device] if device.type == "cuda" else []
        with (
            torch.random.fork_rng(devices=devices, enabled=params.seed is not None),
            autocast(self.compute_dtype, device),
            _own_sampling(self.model),
        ):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            result = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]),
                stopping_criteria=StoppingCriteriaList([stopper] if stopper else []),
                **extra,
            )
        new_tokens = result.sequences[:, width:].cpu()
        logprobs = recorder.finish(result.sequences[:, -1]).cpu()
        stops = set(self.stop_ids)
        gens: list[Generation] = []
        for row, prompt in enumerate(prompts):
            ids = new_tokens[row].tolist()
            ends = [i + 1 for i, t in enumerate(ids) if t in stops][:1]
            if stopper is not None and row in stopper.ended:
                ends.append(stopper.ended[row])
            end = min(ends) if ends else None
            ids = ids if end is None else ids[:end]
            gens.append(
                Generation(
                    prompt_ids=tuple(int(t) for t in prompt),
                    completion_ids=tuple(ids),
                    logprobs=tuple(float(x) for x in logprobs[row, : len(ids)].tolist()),
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    finish_reason="stop" if end is not None else "length",
                )
            )
        return gens, getattr(result, "cache", None) or getattr(result, "past_key_values", None)

    def session(self) -> GenerationSession:
        """A :class:`~envace_gym.policy.sessions.GenerationSession` that keeps conversations' KV cache between calls."""
        return GenerationSession(self)


def check_model_source(spec: str | None) -> None:
    """Refuse, before anything is loaded, a model name that is neither a built-in name, a local model folder
    nor shaped like a hub id (``org/name``): a mistyped path fails here in one line, not in the hub client."""
    if spec is None or spec in ("default", "tiny"):
        return
    path = Path(spec).expanduser()
    if path.is_dir():
        if not any((path / name).is_file() for name in ("config.json", "adapter_config.json")):
            raise PolicyError(
                f"model folder {spec!r} has no config.json or adapter_config.json (save a model with save_pretrained)"
            )
        return
    if path.exists():
        raise PolicyError(f"model {spec!r} is a file; pass the folder a model was saved to (save_pretrained)")
    if spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec or not spec.strip():
        raise PolicyError(f"model path {spec!r} does not exist")
