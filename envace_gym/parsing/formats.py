"""Tool-call formats: how each model family writes tool calls in its Act turn, read back into calls.

A format turns the text of one Act turn into a :class:`~envace_gym.parsing.ParsedAct` under the same contract
as :func:`~envace_gym.parsing.parse_act`: bounded, never raising, never evaluating, a malformed call reported as
``INVALID_TOOL_CALL_FORMAT`` (``LIMIT_EXCEEDED`` past a bound). Built in:

==============  ===================================================================================
``hermes``      ``<tool_call>{"name", "arguments"}</tool_call>`` (Hermes, Qwen2.5, SmolLM2 here): :func:`parse_act`
``qwen3``       the same after a ``<think>…</think>`` block (Qwen3's thinking templates)
``llama3_json`` a bare ``{"name", "parameters"}`` object (Llama 3.1 / 3.2), ``<|python_tag|>`` optional
``mistral``     ``[TOOL_CALLS][{...}]`` (v3 tokenizers) or ``[TOOL_CALLS]name[ARGS]{...}`` (v11 and later)
``glm45``       ``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`` (GLM-4.5 / 4.6)
``qwen3_xml``   ``<tool_call><function=name><parameter=k>v</parameter></function></tool_call>`` (Qwen3-Coder, 3.5)
``gptoss``      harmony channels: ``to=functions.name<|channel|>commentary json<|message|>{...}<|call|>``
``deepseekv3``  ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name```json {...}```…``
==============  ===================================================================================

:func:`tool_call_format` picks one: the name given, else the tokenizer's own ``parse_response`` when it carries a
``response_template``/``response_schema``, else the built-in format whose marks the chat template holds, else
``hermes``. The XML formats write a string argument as bare text, so ``"7"`` and ``7`` look alike: the tool's
JSON Schema decides (a parameter typed ``string`` keeps the text, any other is read as JSON when it parses).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ErrorCode, PolicyError, ToolError
from ..text import clean_text
from ..tools.schema import ToolCall, call_from_json
from .act import DEFAULT_LIMITS, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, Limits, ParsedAct, loads_json

#: ``act_tokens`` value that keeps every special token of a generated turn (the tokenizer's own parser reads them).
ALL_SPECIAL_TOKENS = ("*",)
#: ``name -> parameters schema`` of the tools the turn may call (``None``: no schemas known).
Schemas = Callable[[str], Mapping[str, Any] | None]
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)
_TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
_CALL_OPENINGS = ("<think>", "<tool_call>", "[TOOL_CALLS]", "<｜tool▁calls▁begin｜>", "<|python_tag|>", "to=functions.")


@dataclass(frozen=True)
class ToolCallFormat:
    """One family's way of writing tool calls.

    Attributes:
        name: The name ``tool_call_format=`` takes.
        read: ``(text, limits, schemas) -> ParsedAct`` for a turn already within ``max_action_chars``.
        act_tokens: Special-token strings an Act turn in this format legitimately holds (kept when an Act
            turn's ids are decoded or a text action is tokenized; every other special token stays plain text).
        marks: Strings whose presence in a chat template selects this format.
        turn_ends: Special tokens that end an assistant turn in this family besides the tokenizer's stop tokens
            (``<|end|>`` ends a gpt-oss message in the history although the model stops on ``<|return|>``).
    """

    name: str
    read: Callable[[str, Limits, Schemas | None], ParsedAct]
    act_tokens: tuple[str, ...] = ()
    marks: tuple[str, ...] = ()
    turn_ends: tuple[str, ...] = ()

    def parse(self, text: Any, limits: Limits = DEFAULT_LIMITS, schemas: Schemas | None = None) -> ParsedAct:
        """Read one Act turn (see the module docstring for the contract)."""
        return _refused(text, limits) or self.read(text, limits, schemas)


def parse_act(text: Any, limits: Limits = DEFAULT_LIMITS) -> ParsedAct:
    """Read an Act turn written in the Hermes/Qwen format (the ``hermes`` format's :meth:`ToolCallFormat.parse`).

    Accepts any number of ``<tool_call>`` blocks, each holding one call object or a JSON list of them;
    ``"parameters"`` is an alias of ``"arguments"``. Text outside the blocks is the turn's ``content``;
    a turn without blocks is a final answer.
    """
    return _refused(text, limits) or _read_hermes(text, limits, None)


# ----------------------------------------------------------------------------------------------------
# Shared pieces
# ----------------------------------------------------------------------------------------------------
def _bad(text: str, calls: list[ToolCall], message: str, code: ErrorCode = ErrorCode.INVALID_TOOL_CALL_FORMAT):
    return ParsedAct(text, "", tuple(calls), ToolError(code, message[:300]))


def _refused(text: Any, limits: Limits) -> ParsedAct | None:
    """The refusals every format shares: a turn that is not text, or longer than ``max_action_chars``."""
    if not isinstance(text, str):
        return ParsedAct(str(text), "", error=ToolError(ErrorCode.INVALID_TOOL_CALL_FORMAT, "an action must be text"))
    if len(text) > limits.max_action_chars:
        return ParsedAct(
            text[:200],
            "",
            error=ToolError(
                ErrorCode.LIMIT_EXCEEDED,
                f"action of {len(text)} characters exceeds the limit of {limits.max_action_chars}",
                {"limit": "max_action_chars", "value": len(text)},
            ),
        )
    return None


def strip_think(text: str) -> str:
    """``text`` without its leading reasoning: a ``<think>…</think>`` block, or the rest of one that the prompt
    opened (DeepSeek and Qwen3 thinking templates pre-fill ``<think>``)."""
    closing = text.find("</think>")
    if closing != -1 and not any(mark in text[:closing] for mark in _CALL_OPENINGS):
        return text[closing + len("</think>") :].lstrip()
    return _THINK.sub("", text, count=1)


class _Calls:
    """Collects the calls of one turn, enforcing ``max_calls_per_turn``; ``error`` is set by the first fault."""

    def __init__(self, text: str, limits: Limits) -> None:
        self.text, self.limits, self.calls, self.error = text, limits, [], None

    def add(self, call: ToolCall | ToolError) -> bool:
        if isinstance(call, ToolError):
            self.error = call
        elif len(self.calls) >= self.limits.max_calls_per_turn:
            self.error = ToolError(
                ErrorCode.LIMIT_EXCEEDED,
                f"more than {self.limits.max_calls_per_turn} tool calls in one turn",
                {"limit": "max_calls_per_turn"},
            )
        else:
            self.calls.append(call)
        return self.error is None

    def add_json(self, body: str) -> bool:
        """A JSON call object (or list of them)."""
        value, error = loads_json(body.strip(), self.limits)
        if error is not None:
            self.error = error
            return False
        for obj in value if isinstance(value, list) else [value]:
            if not self.add(call_from_json(obj, lambda text: loads_json(text, self.limits))):
                return False
        if isinstance(value, list) and not value:
            self.error = ToolError(ErrorCode.INVALID_TOOL_CALL_FORMAT, "empty list of tool calls")
        return self.error is None

    def add_named(self, name: str, args_json: str) -> bool:
        """A call whose name stands outside its JSON arguments."""
        name = name.strip()
        if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,128}", name):
            self.error = ToolError(ErrorCode.INVALID_TOOL_CALL_FORMAT, f"invalid tool name {name[:80]!r}")
            return False
        args, error = loads_json(args_json.strip() or "{}", self.limits)
        if error is not None:
            self.error = ToolError(error.code, f"arguments of {name!r}: {error.message}"[:300], {"tool": name})
            return False
        return self.add(call_from_json({"name": name, "arguments": args}))

    def result(self, content: str) -> ParsedAct:
        if self.error is not None:
            return ParsedAct(self.text, "", tuple(self.calls), self.error)
        return ParsedAct(self.text, content.strip(), tuple(self.calls))


def _typed_value(raw: str, schema: Mapping[str, Any] | None, limits: Limits) -> tuple[Any, ToolError | None]:
    """An XML-written argument value: text where the schema wants a string, else JSON when it parses; a value
    past ``max_json_chars`` or ``max_json_depth`` is ``LIMIT_EXCEEDED``, as a JSON call's would be."""
    if len(raw) > limits.max_json_chars:
        return None, ToolError(ErrorCode.LIMIT_EXCEEDED, f"an argument of {len(raw)} characters exceeds the limit "
                               f"of {limits.max_json_chars}", {"limit": "max_json_chars", "value": len(raw)})  # fmt: skip
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind == "string" or (isinstance(kind, list) and kind == ["string"]):
        return raw, None
    if not raw.strip():
        return raw, None
    value, error = loads_json(raw, limits)
    if error is not None and error.code is ErrorCode.LIMIT_EXCEEDED:
        return None, error
    return (raw, None) if error is not None else (value, None)


def _xml_args(name: str, pairs: list[tuple[str, str]], schemas: Schemas | None, limits: Limits, calls: _Calls) -> bool:
    params = (schemas(name) if schemas else None) or {}
    properties = params.get("properties", {}) if isinstance(params, Mapping) else {}
    args: dict[str, Any] = {}
    for key, raw in pairs:
        key = key.strip()
        if key in args:
            calls.error = ToolError(ErrorCode.INVALID_TOOL_CALL_FORMAT, f"argument {key!r} of {name!r} given twice")
            return False
        value, error = _typed_value(raw, properties.get(key) if isinstance(properties, Mapping) else None, limits)
        if error is not None:
            calls.error = error
            return False
        args[key] = value
    return calls.add(call_from_json({"name": name.strip(), "arguments": args}))


def _blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], list[str], str | None]:
    """Split ``text`` into the content outside ``open…close`` blocks and the blocks' bodies (or an error)."""
    content, bodies, pos = [], [], 0
    while True:
        start, stray = text.find(open_tag, pos), text.find(close_tag, pos)
        if stray != -1 and (start == -1 or stray < start):
            return content, bodies, f"{close_tag} without a matching {open_tag}"
        if start == -1:
            content.append(text[pos:])
            return content, bodies, None
        content.append(text[pos:start])
        end = text.find(close_tag, start + len(open_tag))
        if end == -1:
            return content, bodies, f"{open_tag} is never closed by {close_tag}"
        body = text[start + len(open_tag) : end]
        if open_tag in body:
            return content, bodies, f"nested {open_tag} blocks"
        bodies.append(body)
        pos = end + len(close_tag)


# ----------------------------------------------------------------------------------------------------
# The formats
# ----------------------------------------------------------------------------------------------------
def _read_hermes(text: str, limits: Limits, schemas: Schemas | None) -> ParsedAct:
    content, bodies, error = _blocks(text, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
    calls = _Calls(text, limits)
    for body in bodies:  # the blocks before a structural fault are read first: their calls go in the record
        if not body.strip():
            return _bad(text, calls.calls, "empty <tool_call> block")
        if not calls.add_json(body):
            return calls.result("")
    return _bad(text, calls.calls, error) if error else calls.result("".join(content))


def _read_qwen3(text: str, limits: Limits, schemas: Schemas | None) -> ParsedAct:
    return _read_hermes(strip_think(text), limits, schemas)  # Hermes calls after the thinking block


_LLAMA_CALL = re.compile(r'[\[{]\s*(?:\{\s*)?"(?:name|type)"\s*:')


def _read_llama3(text: str, limits: Limits, schemas: Schemas | None) -> ParsedAct:
    body = strip_think(text).strip()
    if not _LLAMA_CALL.match(body.removeprefix("<|python_tag|>").lstrip()):
        if "<|python_tag|>" in body:
            return _bad(text, [], "<|python_tag|> must open a JSON tool call")
        return ParsedAct(text, body)  # a final answer
    calls = _Calls(text, limits)
    calls.add_json(body.removeprefix("<|python_tag|>").lstrip())
    return calls.result("")


def _read_mistral(text: str, limits: Limits, schemas: Schemas | None) -> ParsedAct:
    body = strip_think(text)
    head, found, rest = body.partition("[TOOL_CALLS]")
    if not found:
        return ParsedAct(text, body.strip())
    calls = _Calls(text, limits)
    if rest.lstrip().startswith(("[", "{")):  # v3: one JSON list after the token
        calls.add_json(rest)
        return calls.result(head)
    for chunk in rest.split("[TOOL_CALLS]"):  # v11+: name[ARGS]{...}, one block per call
        name, has_args, args = chunk.partition("[ARGS]")
        name = name.split("[CALL_ID]", 1)[0]
        if not has_args:
            return _bad(text, calls.calls, "[TOOL_CALLS] must be followed by a name and [ARGS]")
        if not calls.add_named(name, args):
            break
    return calls.result(head)


def _tagged_pairs(text: str, key: tuple[str, str], value: tuple[str, str]) -> list[tuple[str, str]] | None:
    """``<k>…</k> <v>…</v>`` pairs read left to right in one pass (no backtracking regex), with nothing but
    whitespace between them (``value``'s opening may be empty: the value starts right after the key's close);
    ``None`` when the text is not exactly that."""
    pairs, pos = [], 0
    while True:
        rest = text[pos:].lstrip()
        if not rest:
            return pairs
        pos = len(text) - len(rest)
        k_end = text.find(key[1], pos + len(key[0]))
        if not rest.startswith(key[0]) or k_end == -1:
            return None
        v_start = k_end + len(key[1])
        if value[0]:
            after = text[v_start:].lstrip()
            if not after.startswith(value[0]):
                return None
            v_start = len(text) - len(after) + len(value[0])
        v_end = text.find(value[1], v_start)
        if v_end == -1:
            return None
        pairs.append((text[pos + len(key[0]) : k_end], text[v_start:v_end]))
        pos = v_end + len(value[1])


def _read_glm45(text: str, limits: Limits, schemas: Schemas | None) -> ParsedAct:
    content, bodies, error = _blocks(strip_think(text), "<tool_call>", "</tool_call>")
    if error:
        return _bad(text, [], error)
    calls = _Calls(text, limits)
    for body in bodies:
        name, found, rest = body.partition("<arg_key>")
        pairs = _tagged_pairs(
            "<arg_key>" + rest if found else "", ("<arg_key>", "</arg_key>"), ("<arg_value>", "</arg_value>")
        )
        if pairs is None:
            return _bad(text, calls.calls, "text between <arg_key>/<arg_value> pairs of a tool call")
        if not name.strip() or "\n" in name.strip():
            return _bad(text, calls.calls, "a <tool_call> block must start with the tool name")
        if not _xml_args(name, pairs, schemas, limits, calls):
            break
    return calls.result("".join(content))


def _read_qwen3_xml(text: str, limits: Limits, schemas: Schemas | None) -> ParsedAct:
    content, bodies, error = _blocks(strip_think(text), "<tool_call>", "</tool_call>")
    if error:
        return _bad(text, [], error)
    calls = _Calls(text, limits)
    for body in bodies:
        inner = body.strip()
        head_end = inner.find(">")
        if not inner.startswith("<function=") or head_end == -1 or not inner.endswith("</function>"):
            return _bad(text, calls.calls, "a <tool_call> block must hold one <function=name>…</function>")
        name = inner[len("<function=") : head_end]
        if not name.strip() or "\n" in name:
            return _bad(text, calls.calls, "a <function=…> tag must name the tool")
        pairs = _parameters(inner[head_end + 1 : -len("</function>")])
        if pairs is None:
            return _bad(text, calls.calls, f"text outside <parameter=…> tags in the call of {name.strip()!r}")
        if not _xml_args(name, pairs, schemas, limits, calls):
            break
    return calls.result("".join(content))


def _parameters(text: str) -> list[tuple[str, str]] | None:
    """``<parameter=k>\nv\n</parameter>`` pairs (one line break trimmed at each end of a value), or ``None``."""
    pairs = _tagged_pairs(text, ("<parameter=", ">"), ("", "</parameter>"))
    if pairs is None or any("\n" in k or "<" in k for k, _ in pairs):
        return None
    return [(k, v.removeprefix("\n").removesuffix("\n")) for k, v in pairs]


_HARMONY_END = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>")
_HARMONY_TO = re.compile(r"\bto=(\S+?)(?=<\||\s|$)")


def _read_gptoss(text: str, limits: Limits, schemas: Schemas | None) -> ParsedAct:
    # Messages: [header]<|message|>body(<|end|>|<|call|>|<|return|>); later ones reopen with <|start|>assistant.
    calls, content, pos = _Calls(text, limits), [], 0
    body_text = text.strip()
    if "<|message|>" not in body_text:
        if any(t in body_text for t in ("<|channel|>", "<|start|>", "to=functions.")):
            return _bad(text, [], "a harmony message header without <|message|>")
        return ParsedAct(text, body_text)  # no harmony structure at all: plain text, a final answer
    while pos < len(body_text):
        head_end = body_text.find("<|message|>", pos)
        if head_end == -1:
            return _bad(text, calls.calls, "a harmony message header without <|message|>")
        header = body_text[pos:head_end]
        if header.startswith("<|start|>") and not header.startswith("<|start|>assistant"):
            return _bad(text, calls.calls, "a harmony message must be the assistant's (<|start|>assistant)")
        header = header.removeprefix("<|start|>assistant")
        if "<|start|>" in header or "<|end|>" in header:
            return _bad(text, calls.calls, "a harmony message header holds another message's tokens")
        start = head_end + len("<|message|>")
        end = _HARMONY_END.search(body_text, start)
        stop = end.start() if end else len(body_text)
        message, pos = body_text[start:stop], (end.end() if end else len(body_text))
        recipient = _HARMONY_TO.search(header)
        if recipient:
            target = recipient.group(1)
            if not target.startswith("functions."):
                return _bad(text, calls.calls, f"unknown recipient {target[:80]!r}; tools are functions.<name>")
            if calls.calls:  # the template names every tool result after the turn's first call
                return _bad(text, calls.calls, "the gpt-oss format makes one tool call per turn")
            if not calls.add_named(target[len("functions.") :], message):
                break
        elif "<|channel|>" not in header:
            return _bad(text, calls.calls, "a harmony message without a <|channel|>")
        elif "final" in header.split("<|channel|>", 1)[1] or "commentary" in header:
            content.append(message)
        # analysis: the model's private reasoning, not part of the answer
        if pos < len(body_text) and not body_text.startswith("<|start|>", pos):
            rest = body_text[pos:].strip()
            if rest:
                return _bad(text, calls.calls, "text after a harmony message's end")
            break
    return calls.result("\n".join(content))


_DS = {k: f"<｜tool▁{k}｜>" for k in ("calls▁begin", "calls▁end", "call▁begin", "call▁end", "sep")}


def _read_deepseekv3(text: str, limits: Limits, schemas: Schemas | None) -> ParsedAct:
    body = strip_think(text)
    head, found, rest = body.partition(_DS["calls▁begin"])
    if not found:
        if _DS["call▁begin"] in body:
            return _bad(text, [], f"{_DS['call▁begin']} outside {_DS['calls▁begin']}")
        return ParsedAct(text, body.strip())
    inner, closed, tail = rest.partition(_DS["calls▁end"])
    if not closed:
        return _bad(text, [], f"{_DS['calls▁begin']} is never closed by {_DS['calls▁end']}")
    if tail.strip():
        return _bad(text, [], f"text after {_DS['calls▁end']}")
    outside, blocks, error = _blocks(inner, _DS["call▁begin"], _DS["call▁end"])
    if error or "".join(outside).strip():
        return _bad(text, [], error or "text between tool calls")
    calls = _Calls(text, limits)
    for block in blocks:
        kind, sep, call = block.partition(_DS["sep"])
        if not sep:
            return _bad(text, calls.calls, f"a tool call without {_DS['sep']}")
        if kind.strip() == "function":  # V3: the type, then the name and the arguments in a ```json fence
            name, _, fenced = call.lstrip().partition("\n")
            fenced = fenced.strip()
            if not (name.strip() and fenced.startswith("```") and fenced.endswith("```") and len(fenced) >= 6):
                return _bad(text, calls.calls, "a tool call must give its name, then its arguments in a ```json fence")
            args = fenced[3:-3].removeprefix("json")
        else:  # V3.1: name<｜tool▁sep｜>arguments
            name, args = kind, call
        if not calls.add_named(name, args):
            break
    return calls.result(head)


FORMATS: dict[str, ToolCallFormat] = {
    f.name: f
    for f in (
        ToolCallFormat("hermes", _read_hermes, marks=("<tool_call>",)),
        ToolCallFormat("qwen3", _read_qwen3, _TAGS, marks=("<tool_call>", "<think>")),
        ToolCallFormat(
            "llama3_json", _read_llama3, ("<|python_tag|>",), marks=('"parameters": dictionary of argument name',)
        ),
        ToolCallFormat("mistral", _read_mistral, ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"), marks=("[TOOL_CALLS]",)),
        # Tags a real tokenizer may hold as special tokens are kept in the Act turn's text (harmless where plain).
        ToolCallFormat(
            "glm45",
            _read_glm45,
            (*_TAGS, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
            marks=("<arg_key>",),
        ),
        ToolCallFormat("qwen3_xml", _read_qwen3_xml, _TAGS, marks=("<function=", "<parameter=")),
        ToolCallFormat(
            "gptoss",
            _read_gptoss,
            (
                "<|end|><|start|>assistant",
                "<|channel|>",
                "<|message|>",
                "<|constrain|>",
            ),  # <|start|> only as the assistant's
            marks=("<|channel|>",),
            turn_ends=("<|end|>",),
        ),
        ToolCallFormat("deepseekv3", _read_deepseekv3, tuple(_DS.values()), marks=(_DS["calls▁begin"],)),
    )
}
# Checked in this order: the more specific marks first (a GLM or Qwen3.5 template also holds "<tool_call>").
_DETECTION_ORDER = ("gptoss", "deepseekv3", "glm45", "qwen3_xml", "mistral", "llama3_json", "qwen3", "hermes")


def response_parser_format(tokenizer: Any, prefix: str = "", ends: tuple[str, ...] = ()) -> ToolCallFormat:
    """A format that reads Act turns with the tokenizer's own ``parse_response`` (its ``response_template`` or
    ``response_schema``), wrapped in the typed-error contract. ``prefix`` is the text that opens an assistant turn,
    which a response template anchors on; ``ends`` are the turn's possible end tokens, tried after the text when
    it ends with none (a template may close a call with one, as Llama's does with ``<|eot_id|>``)."""

    def read(text: str, limits: Limits, schemas: Schemas | None) -> ParsedAct:
        kwargs = {"prefix": prefix} if getattr(tokenizer, "response_template", None) is not None else {}
        tries = [text] if text.endswith(ends) or not ends else [text, *(text + end for end in ends)]
        message, failure = None, None
        for candidate in tries:
            try:
                message = tokenizer.parse_response(candidate, **kwargs)
                break
            except Exception as exc:  # the parser's own failure on model text is a malformed turn, never a crash
                failure = exc
        if message is None:
            return _bad(text, [], f"the tokenizer's response parser failed: {type(failure).__name__}: {failure}")
        if not isinstance(message, Mapping):
            return _bad(text, [], "the tokenizer's response parser returned no message")
        calls = _Calls(text, limits)
        for raw in message.get("tool_calls") or []:
            call = call_from_json(raw, lambda text: loads_json(text, limits))
            if isinstance(call, ToolCall):  # the same strict JSON as every format: no NaN, bounded depth, and text
                arguments, error = loads_json(_json_text(call.arguments), limits)  # UTF-8 can encode (U+FFFD)
                if error is not None:
                    call = ToolError(ErrorCode.INVALID_TOOL_CALL_FORMAT, f"arguments of {call.name!r}: {error.message}")
                else:
                    call = ToolCall(clean_text(call.name), arguments, call.id)
            if not calls.add(call):
                break
        content = message.get("content")
        return calls.result(clean_text(content) if isinstance(content, str) else "")

    return ToolCallFormat("response_parser", read, ALL_SPECIAL_TOKENS)


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return "not json"


def detect_format(chat_template: str | None) -> ToolCallFormat:
    """The built-in format whose marks ``chat_template`` holds (``hermes`` when none does)."""
    template = chat_template if isinstance(chat_template, str) else ""
    for name in _DETECTION_ORDER:
        if all(mark in template for mark in FORMATS[name].marks):
            return FORMATS[name]
    return FORMATS["hermes"]


def tool_call_format(
    tokenizer: Any, name: str | ToolCallFormat | None = None, prefix: str = "", ends: tuple[str, ...] = ()
) -> ToolCallFormat:
    """The format a tokenizer's model writes tool calls in: ``name`` when given (a built-in name,
    ``"response_parser"`` or a :class:`ToolCallFormat`), else the tokenizer's ``parse_response`` when it has a
    response template or schema, else the one its chat template shows (:func:`detect_format`)."""
    if isinstance(name, ToolCallFormat):
        return name
    if name == "response_parser" or (
        name is None and (getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None))
    ):
        if not (getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None)):
            raise PolicyError("tool_call_format='response_parser' needs a tokenizer with a response_template")
        return response_parser_format(tokenizer, prefix, ends)
    if name is not None:
        if name not in FORMATS:
            raise PolicyError(f"unknown tool_call_format {name!r}; choose from {sorted(FORMATS)} or 'response_parser'")
        return FORMATS[name]
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("tool_use") or template.get("default")
    return detect_format(template)


__all__ = [
    "FORMATS",
    "ToolCallFormat",
    "detect_format",
    "parse_act",
    "response_parser_format",
    "strip_think",
    "tool_call_format",
]
