"""Shared-prefix forward for training rows: every distinct prefix encoded once, exactly.

Training rows begin alike: the G Act rows of one task share the system prompt, the tools and the user turn;
an episode's Act row at turn 2 extends its row at turn 1; the rehearsal rows of one task share the simulator
prompt, the tools and the reference executions; the SFT rows of one task share most of their prompts. A plain
batched forward encodes each row whole, so a shared prefix is paid once per row.

Here the rows of a micro-batch are laid out as one **prefix tree** in a single sequence: rows are sorted, and
each adds only the tokens after its longest common prefix with the row before it. A token attends exactly to
its ancestors in the tree (a 4-D attention mask) at the position it has in its own row (position ids = depth),
so every token sees the same context, at the same positions, as in the plain per-row forward: the
log-probabilities, the loss and every gradient are the same up to float rounding. Logits are computed only
where a row scores a token (no vocabulary projection for prompt tokens) and the log-softmax runs in chunks,
recomputed in the backward pass, so memory holds one chunk of full-vocabulary logits at a time.

Layout facts the mask relies on: with rows sorted, the rows through any tree node are consecutive, so a node's
subtree is one contiguous span ``[node, end[node])`` and "j is an ancestor of i" is ``j <= i < end[j]``.

A node predicts one next token. Where two rows score different next tokens after the same node (G completions
that diverge right after a shared prompt), the later row gets its own copy of that node: one extra token.

Models whose attention cannot take such a mask (flash-attention kernels without custom masks, sliding-window
or chunked attention layers, position schemes that ignore ``position_ids``) fall back to the plain forward,
with the reason logged once; :func:`packing_support` checks the configuration and runs a small probe that
compares both forwards on the model itself.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)

LOGIT_CHUNK = 1024  # positions per chunk of full-vocabulary logits in the log-softmax
DEFAULT_PACK_TOKENS = 4096  # positions per packed forward: bounds the activations (and the N x N mask) of one pack


@dataclass
class PackingSettings:
    """The shared-prefix forward's two settings, for a TRL config to inherit (``PackedSFTConfig``,
    ``PackedGRPOConfig``; as ``envace train --shared_prefix --pack_tokens``)."""

    shared_prefix: bool = field(
        default=True,
        metadata={"help": "Encode the prefix that rows share once (exact; see envace_gym.training.packing)."},
    )
    pack_tokens: int = field(
        default=DEFAULT_PACK_TOKENS,
        metadata={"help": "Positions per packed forward; more packs than one are recomputed in the backward."},
    )
_MASKABLE = ("sdpa", "eager")  # attention implementations that take a custom 4-D mask as is


# ----------------------------------------------------------------------------------------------------
# The prefix tree
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrefixTree:
    """Rows laid out as a prefix tree in one sequence of ``len(tokens)`` positions.

    Attributes:
        tokens: The token at each position.
        depth: Its position in its own row(s): the position id.
        end: One past the last position of its subtree; position ``i`` attends to ``j`` iff ``j <= i < end[j]``.
        scored: The positions whose next-token log-probability is needed, ascending.
        targets: The token each scored position predicts.
        row_scores: Per input row, the index into ``scored`` of each of its scored tokens, in order.
        segments: The runs of positions each row added, in layout order (they tile the sequence), each with
            the positions of its ancestors: ``(start, end, ancestors)``. Attention can run run by run: a run's
            queries see its ancestors and, causally, itself.
    """

    tokens: np.ndarray
    depth: np.ndarray
    end: np.ndarray
    scored: np.ndarray
    targets: np.ndarray
    row_scores: tuple[np.ndarray, ...]
    segments: tuple[tuple[int, int, np.ndarray], ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    def visible(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``(N, N)`` booleans: ``[i, j]`` is True when position ``i`` attends to position ``j``."""
        j = torch.arange(len(self.tokens), device=device)
        end = torch.as_tensor(self.end, device=device)
        return (j[None, :] <= j[:, None]) & (j[:, None] < end[None, :])


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def build_tree(rows: Sequence[Sequence[int]], starts: Sequence[int]) -> PrefixTree:
    """Lay out ``rows`` as a prefix tree; row ``i`` scores its tokens from ``starts[i]`` on (each predicted from
    the token before it, so ``1 <= starts[i]``)."""
    if len(rows) != len(starts):
        raise ValueError("rows and starts must have the same length")
    arrays = [np.asarray(r, dtype=np.int64) for r in rows]
    for a, s in zip(arrays, starts, strict=True):
        if not 1 <= s <= len(a):
            raise ValueError(f"a row of {len(a)} tokens cannot score from position {s}: it needs a context token")
    total = sum(len(a) for a in arrays)
    tokens = np.empty(total, dtype=np.int64)
    depth = np.empty(total, dtype=np.int64)
    end = np.empty(total, dtype=np.int64)
    target = np.full(total, -1, dtype=np.int64)  # the next token a node must predict, once a row scores it
    paths: list[np.ndarray | None] = [None] * len(arrays)
    segments: list[tuple[int, int, np.ndarray]] = []
    size, prev, prev_path = 0, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    for i in _sorted(rows):
        row, start = arrays[i], starts[i]
        shared = _common_prefix(row, prev)
        # Shared nodes whose next token this row scores must not already predict another one.
        for d in range(start - 1, min(shared, len(row) - 1)):
            if target[prev_path[d]] not in (-1, row[d + 1]):
                shared = d
                break
        new = len(row) - shared
        if new:
            segments.append((size, size + new, prev_path[:shared]))
        tokens[size : size + new] = row[shared:]
        depth[size : size + new] = np.arange(shared, len(row))
        path = np.concatenate([prev_path[:shared], np.arange(size, size + new)])
        size += new
        end[path] = size  # every node on this row's path now spans up to here
        scoring = path[start - 1 : len(row) - 1]
        target[scoring] = row[start:]
        paths[i], prev, prev_path = path, row, path
    scored = np.flatnonzero(target[:size] >= 0)
    row_scores = tuple(
        np.searchsorted(scored, p[s - 1 : len(a) - 1]) for p, s, a in zip(paths, starts, arrays, strict=True)
    )
    return PrefixTree(tokens[:size], depth[:size], end[:size], scored, target[scored], row_scores, tuple(segments))


def _sorted(rows: Sequence[Sequence[int]]) -> list[int]:
    keys = [tuple(int(t) for t in r) for r in rows]
    return sorted(range(len(rows)), key=keys.__getitem__)


def tree_size(rows: Sequence[Sequence[int]]) -> int:
    """Positions a prefix tree of ``rows`` takes (not counting the rare copied branch node)."""
    size, prev = 0, np.empty(0, dtype=np.int64)
    for i in _sorted(rows):
        row = np.asarray(rows[i], dtype=np.int64)
        size += len(row) - _common_prefix(row, prev)
        prev = row
    return size


def plan_packs(rows: Sequence[Sequence[int]], budget: int) -> list[list[int]]:
    """Split row indices into packs whose prefix trees take at most ``budget`` positions each (a longer row is
    a pack of its own). Rows are taken in sorted order, so rows that share prefixes land in the same pack."""
    packs: list[list[int]] = []
    size, prev = 0, np.empty(0, dtype=np.int64)
    for i in _sorted(rows):
        row = np.asarray(rows[i], dtype=np.int64)
        grow = len(row) - _common_prefix(row, prev) + 1  # +1: a possibly copied branch node
        if packs and size + grow <= budget:
            packs[-1].append(i)
            size += grow
        else:
            packs.append([i])
            size = len(row) + 1
        prev = row
    return packs


# ----------------------------------------------------------------------------------------------------
# Scores of chosen tokens, from logits, in chunks
# ----------------------------------------------------------------------------------------------------
class Scores(NamedTuple):
    """Per row, one value per scored token: log-probability (differentiable), entropy of the next-token
    distribution (differentiable) and whether the token was the most likely one."""

    logprobs: list[torch.Tensor]
    entropies: list[torch.Tensor]
    top1: list[torch.Tensor]


def _chunk_scores(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> tuple[torch.Tensor, ...]:
    scaled = logits.float() / temperature
    norm = torch.logsumexp(scaled, dim=-1)
    chosen = scaled.gather(-1, targets[:, None]).squeeze(-1)
    entropy = norm - (torch.softmax(scaled, dim=-1) * scaled).sum(-1)
    return chosen - norm, entropy, scaled.argmax(-1) == targets


def token_scores(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, chunk: int = LOGIT_CHUNK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For ``(K, V)`` logits and ``K`` targets: ``log_softmax(logits / T)[target]``, the entropy of
    ``softmax(logits / T)``, and whether the target is the arg-max.

    Chunks of ``chunk`` positions are recomputed in the backward pass, so besides the logits themselves at
    most one chunk's float copy of them is alive at a time."""
    temperature = temperature if temperature > 0 else 1.0
    if logits.shape[0] == 0:
        empty = logits.new_zeros(0, dtype=torch.float32)
        return empty, empty, torch.zeros(0, dtype=torch.bool, device=logits.device)
    parts = []
    for lo in range(0, logits.shape[0], chunk):
        piece, goal = logits[lo : lo + chunk], targets[lo : lo + chunk]
        if torch.is_grad_enabled() and piece.requires_grad:
            parts.append(checkpoint(_chunk_scores, piece, goal, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_scores(piece, goal, temperature))
    return tuple(torch.cat([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------------
# Which models can take the mask
# ----------------------------------------------------------------------------------------------------
_SUPPORT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {compute dtype or None: reason}


def unwrap(model: Any) -> Any:
    """The model inside distributed wrappers (DDP, FSDP, DeepSpeed expose it as ``.module``)."""
    while not hasattr(model, "config") and hasattr(model, "module"):
        model = model.module
    return model


def checkpoints_layers(model: Any) -> bool:
    """Whether the model recomputes its own layers in the backward pass (gradient checkpointing)."""
    model = unwrap(model)
    name = (
        "is_activation_checkpointing"
        if hasattr(type(model), "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    return bool(getattr(model, name, False))


def _text_config(model: Any) -> Any:
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _config_reason(model: Any) -> str | None:
    if getattr(model, "config", None) is None:
        return "the model has no transformers config"
    text = _text_config(model)
    impl = getattr(text, "_attn_implementation", None) or getattr(model.config, "_attn_implementation", None)
    if impl not in _MASKABLE:
        return f"attention implementation {impl!r} does not take a custom 4-D mask (only {', '.join(_MASKABLE)})"
    layer_types = getattr(text, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types):
        return f"layers of types {sorted(set(layer_types) - {'full_attention'})} would lose their own masks"
    if not layer_types and getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return "sliding-window attention would lose its window"
    return None


def _attention_dtype(model: Any, device: torch.device) -> torch.dtype:
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype


def _dense_mask(tree: PrefixTree, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``(1, 1, N, N)`` additive floats: 0 where a position attends, the dtype's minimum elsewhere. One tensor
    that every layer keeps for its backward (a boolean mask would be converted, and kept, once per layer)."""
    additive = torch.zeros((len(tree), len(tree)), dtype=dtype, device=device)
    return additive.masked_fill_(~tree.visible(device), torch.finfo(dtype).min)[None, None]


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_METADATA = (torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.device.__get__, torch.Tensor.dim)


class TreeMask(torch.Tensor):
    """The prefix tree's attention mask as the model sees it: a ``(1, 1, N, N)`` tensor that SDPA computes run
    by run (:attr:`PrefixTree.segments`), so attention costs what the tree needs, not ``N x N``.

    ``scaled_dot_product_attention`` called with it as ``attn_mask`` runs one SDPA per run: the run's queries
    against its ancestors' keys and, causally, its own. Any other operation on it (a model that slices or adds
    its mask) gets the dense additive mask, built on first use, so the result is right either way.
    """

    tree: PrefixTree
    _dense: torch.Tensor | None
    _runs: list[tuple[int, int, torch.Tensor | None, torch.Tensor | None]] | None

    @staticmethod
    def __new__(cls, tree: PrefixTree, dtype: torch.dtype, device: torch.device) -> TreeMask:
        shell = torch.zeros((), dtype=dtype, device=device).expand(1, 1, len(tree), len(tree))  # no N x N memory
        mask = torch.Tensor._make_subclass(cls, shell)
        mask.tree, mask._dense, mask._runs = tree, None, None
        return mask

    def dense(self) -> torch.Tensor:
        if self._dense is None:
            self._dense = _dense_mask(self.tree, self.dtype, self.device)
        return self._dense

    def runs(self) -> list[tuple[int, int, torch.Tensor | None, torch.Tensor | None]]:
        """Per run: its span, the positions of the keys it sees (ancestors, then itself) and its additive mask
        (``None`` for a root run, which is plain causal attention). Built once, used by every layer."""
        if self._runs is None:
            dtype, device, low = self.dtype, self.device, torch.finfo(self.dtype).min
            self._runs = []
            for start, end, ancestors in self.tree.segments:
                if len(ancestors) == 0:
                    self._runs.append((start, end, None, None))
                    continue
                own = torch.arange(start, end, device=device)
                index = torch.cat([torch.as_tensor(ancestors, device=device), own])
                mask = torch.zeros((end - start, len(index)), dtype=dtype, device=device)
                mask[:, len(ancestors) :] = torch.full((end - start,) * 2, low, dtype=dtype, device=device).triu(1)
                self._runs.append((start, end, index, mask))
        return self._runs

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            call = {**dict(zip(_SDPA_ARGS, args, strict=False)), **kwargs}
            mask = call.pop("attn_mask", None)
            if isinstance(mask, TreeMask) and not call.get("is_causal", False):
                return _tree_attention(mask, **call)
        with torch._C.DisableTorchFunctionSubclass():
            if func in _METADATA:
                return func(*args, **kwargs)
            plain = lambda x: x.dense() if isinstance(x, TreeMask) else x  # noqa: E731
            return func(*[plain(a) for a in args], **{k: plain(v) for k, v in kwargs.items()})


def _tree_attention(
    mask: TreeMask,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """SDPA over the tree, one run at a time: the run's queries see its ancestors' keys and, causally, its own."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    outputs = []
    for start, end, index, run_mask in mask.runs():
        q = query[:, :, start:end]
        if index is None:  # a root run
            k, v = key[:, :, start:end], value[:, :, start:end]
        else:
            k, v = key.index_select(2, index), value.index_select(2, index)
        outputs.append(
            sdpa(
                q,
                k,
                v,
                attn_mask=run_mask,
                dropout_p=dropout_p,
                is_causal=index is None,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        )
    return torch.cat(outputs, dim=2)


def _mask_for(model: Any, tree: PrefixTree, device: torch.device) -> torch.Tensor:
    """The mask in the form the model's attention takes it: a :class:`TreeMask` for SDPA (attention at the
    tree's cost), the dense additive mask for eager attention."""
    dtype = _attention_dtype(model, device)
    if getattr(_text_config(model), "_attn_implementation", None) == "sdpa":
        return TreeMask(tree, dtype, device)
    return _dense_mask(tree, dtype, device)


def packing_support(model: Any, compute_dtype: torch.dtype | None = None) -> str | None:
    """``None`` when ``model`` gives the same log-probabilities packed as plain, else the reason it cannot.

    Checks the configuration, then compares both forwards on a small probe (two rows sharing a prefix and
    diverging right after it, one row sharing nothing) once per model and compute dtype; a reason is logged the
    first time. ``compute_dtype`` is the dtype the forwards will run in under autocast (default: the ambient
    autocast's, where one is on for the model's device, else the model's own): the probe then also runs in it
    (see :func:`_probe`)."""
    model = unwrap(model)
    if compute_dtype is None:
        compute_dtype = _ambient_autocast(model)
    try:
        return _SUPPORT[model][compute_dtype]
    except (KeyError, TypeError):
        pass
    reason = _config_reason(model)
    if reason is None:
        reason = _probe(model, compute_dtype)
    if reason is not None:
        logger.warning("envace-gym: shared-prefix packing is off for this model (%s); using the plain forward", reason)
    try:
        _SUPPORT.setdefault(model, {})[compute_dtype] = reason
    except TypeError:
        pass
    return reason


def _ambient_autocast(model: Any) -> torch.dtype | None:
    """The autocast dtype in force for the model's device, or ``None`` when autocast is off there."""
    try:
        device_type = _device(model).type
    except StopIteration:  # no parameters: nothing runs in another dtype
        return None
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


_HALF = (torch.bfloat16, torch.float16)
EXACT_TOLERANCE = 1e-3  # packed vs plain in float32: the same sums in another order
HALF_TOLERANCE = 5e-2  # the least tolerance in a half dtype (its rounding alone, 8 bits of mantissa in bfloat16)
NOISE_FACTOR = 4  # in a half dtype, packed vs plain may differ by this many times its rounding noise


def probe_tolerance(dtype: torch.dtype, noise: float = 0.0) -> float:
    """How far packed and plain log-probabilities may be apart on the probe when the forwards run in ``dtype``:
    float32's rounding, or in a half dtype ``NOISE_FACTOR`` times ``noise`` (how far the plain forward in that
    dtype lies from the float32 one: the rounding of the model at hand) and at least ``HALF_TOLERANCE``."""
    if dtype in _HALF:
        return max(HALF_TOLERANCE, NOISE_FACTOR * noise)
    return EXACT_TOLERANCE


def _probe(model: Any, compute_dtype: torch.dtype | None = None) -> str | None:
    """Packed against plain on a small probe: first in the model's own dtype (autocast off), where a float32
    model must agree to float32 rounding, so that a layout mismatch cannot hide in a looser tolerance; then, when
    the forwards will run under autocast to a half dtype (``compute_dtype``, e.g. bfloat16 training on a GPU),
    in that dtype too, within its own rounding (:func:`probe_tolerance`): a kernel that takes the mask in float32
    but not in bfloat16 switches packing off, bfloat16's rounding does not."""
    vocab = int(getattr(_text_config(model), "vocab_size", 64))
    ids = [x % vocab for x in (11, 23, 5, 17, 29, 3, 31, 7, 13, 19, 2, 37)]
    prompts = [ids[:6], ids[:6], ids[6:9]]
    completions = [ids[6:10], ids[9:12], ids[1:5]]
    own = next(model.parameters()).dtype
    device_type = _device(model).type
    half = compute_dtype if compute_dtype in _HALF and compute_dtype != own else None
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device_type, enabled=False):  # an ambient autocast would blur it
            plain = plain_scores(model, prompts, completions).logprobs
            packed = _packed_scores(model, prompts, completions, 1.0, budget=1 << 30).logprobs
        if half is not None:
            with torch.no_grad(), torch.autocast(device_type, dtype=half):
                plain_half = plain_scores(model, prompts, completions).logprobs
                packed_half = _packed_scores(model, prompts, completions, 1.0, budget=1 << 30).logprobs
    except Exception as exc:  # a forward that rejects the mask or the position ids
        return f"its forward rejected the packed inputs ({type(exc).__name__}: {exc})"
    finally:
        model.train(was_training)
    worst = _farthest(plain, packed)
    if not worst <= probe_tolerance(own):
        return f"packed and plain log-probabilities differ by {worst:.1e} on a probe"
    if half is not None:
        worst, noise = _farthest(plain_half, packed_half), _farthest(plain, plain_half)
        if not worst <= probe_tolerance(half, noise):
            return (
                f"packed and plain log-probabilities differ by {worst:.1e} on a probe under {half} autocast (its "
                f"rounding moves the plain ones by {noise:.1e})"
            )
    return None


def _farthest(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------------------------------
# The forwards
# ----------------------------------------------------------------------------------------------------
def _device(model: Any) -> torch.device:
    return next(unwrap(model).parameters()).device


def _tree_flat(model: Any, tree: PrefixTree, temperature: float) -> tuple[torch.Tensor, ...]:
    """One forward over ``tree``: the scores of its scored positions, in layout order."""
    inner, device = unwrap(model), _device(model)
    out = model(
        input_ids=torch.as_tensor(tree.tokens, device=device)[None],
        attention_mask=_mask_for(inner, tree, device),
        position_ids=torch.as_tensor(tree.depth, device=device)[None],
        logits_to_keep=torch.as_tensor(tree.scored, device=device),
        use_cache=False,
    )
    return token_scores(out.logits[0], torch.as_tensor(tree.targets, device=device), temperature)


def _packed_scores(
    model: Any,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    budget: int,
) -> Scores:
    rows = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    packs = plan_packs(rows, budget)
    out: list[list[Any]] = [[None] * len(rows) for _ in range(3)]
    # Several packs under autograd: each is recomputed in the backward pass, so memory holds one pack's
    # activations at a time (not needed with one pack, nor when the model checkpoints its own layers).
    recompute = len(packs) > 1 and torch.is_grad_enabled() and not checkpoints_layers(model)
    forward, anchor = _ddp_safe(model)
    for pack in packs:
        tree = build_tree([rows[i] for i in pack], [len(prompts[i]) for i in pack])
        if recompute:
            flat = checkpoint(_tree_flat, forward, tree, temperature, use_reentrant=False)
        else:
            flat = _tree_flat(forward, tree, temperature)
        for k, i in enumerate(pack):
            index = torch.as_tensor(tree.row_scores[k], device=flat[0].device)
            for column in range(3):
                out[column][i] = flat[column][index]
    if anchor is not None and rows:
        out[0][0] = out[0][0] + anchor  # zero: it only joins the DDP forward's graph to the loss's
    return Scores(*out)


def _ddp_safe(model: Any) -> tuple[Any, torch.Tensor | None]:
    """What the packs run through, and a zero to add to the scores: under DDP, the inner module, plus one
    forward of a single token through the DDP wrapper (when gradients are taken).

    Every DDP forward is a collective (it broadcasts the buffers and prepares the gradient reducer), so one DDP
    forward per pack, and again per recomputed pack in the backward pass, desynchronises ranks whose rows make
    different numbers of packs (a hang, under gloo as under NCCL). The packs go through the inner module: no
    collective, whatever their number. The gradient all-reduce still happens once, in the backward pass: DDP's
    hooks sit on the parameters and fire whatever forward used them, once the reducer is prepared, which the one
    forward through the wrapper does on every rank alike (and under ``no_sync()`` leaves undone, as DDP would)."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return model, None
    if not torch.is_grad_enabled():  # no gradients to reduce; the buffers are the same on every rank
        return model.module, None
    token = torch.zeros((1, 1), dtype=torch.long, device=_device(model))
    logits = model(input_ids=token, use_cache=False, logits_to_keep=1).logits
    return model.module, logits.float().sum() * 0.0


def plain_scores(
    model: Any, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], temperature: float = 1.0
) -> Scores:
    """The plain per-row forward (TRL's layout): prompts left-padded, completions right-padded, one padded batch,
    logits for the completion columns only, each row's positions counted from its first token."""
    device = _device(model)
    width_p = max(len(p) for p in prompts)
    width_c = max(len(c) for c in completions)
    ids = torch.zeros((len(prompts), width_p + width_c), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, width_p - len(p) : width_p] = torch.as_tensor(list(p), dtype=torch.long)
        ids[i, width_p : width_p + len(c)] = torch.as_tensor(list(c), dtype=torch.long)
        attention[i, width_p - len(p) : width_p + len(c)] = 1
    ids, attention = ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # from each row's first token: absolute embeddings need it
    logits = model(
        input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=width_c + 1, use_cache=False
    ).logits
    flat = token_scores(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, width_p:].reshape(-1), temperature)
    grids = [x.view(len(prompts), width_c) for x in flat]
    return Scores(*([g[i, : len(c)] for i, c in enumerate(completions)] for g in grids))


def completion_scores(
    model: Any,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float = 1.0,
    *,
    budget: int = DEFAULT_PACK_TOKENS,
    packing: bool = True,
) -> Scores:
    """Per row, the :class:`Scores` of its completion tokens, each given everything before it, at ``temperature``.

    With ``packing`` (and a model that takes it, see :func:`packing_support`) rows are packed into prefix trees
    of at most ``budget`` positions each; otherwise the plain padded forward runs. Rows with an empty prompt or
    an empty completion score nothing (empty tensors)."""
    device = _device(model)
    keep = [i for i, (p, c) in enumerate(zip(prompts, completions, strict=True)) if len(p) and len(c)]
    out: list[list[torch.Tensor]] = [[torch.zeros(0, device=device)] * len(prompts) for _ in range(3)]
    if keep:
        ps, cs = [prompts[i] for i in keep], [completions[i] for i in keep]
        if packing and packing_support(model) is None:
            got = _packed_scores(model, ps, cs, temperature, budget)
        else:
            got = plain_scores(model, ps, cs, temperature)
        for field in range(3):
            for k, i in enumerate(keep):
                out[field][i] = got[field][k]
    return Scores(*out)


def completion_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float = 1.0,
    **kwargs: Any,
) -> list[torch.Tensor]:
    """Per row, ``log p(completion token | everything before it)`` (see :func:`completion_scores`)."""
    return completion_scores(model, prompts, completions, temperature, **kwargs).logprobs


__all__ = [
    "PackingSettings",
    "DEFAULT_PACK_TOKENS",
    "PrefixTree",
    "Scores",
    "build_tree",
    "completion_logprobs",
    "completion_scores",
    "packing_support",
    "plain_scores",
    "plan_packs",
    "token_scores",
    "tree_size",
    "unwrap",
]
