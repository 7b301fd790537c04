"""Token-level chat bookkeeping: a conversation grows by appending ids, never by re-tokenizing it.

The first Act prompt is rendered by the tokenizer's chat template and tokenized once. After that, each
turn appends (1) the ids the model generated and (2) the ids of a *suffix*: the template's text that
closes the assistant turn, holds the tool (or user) messages, and opens the next assistant turn. The
suffix is found as TRL's tool loop finds it: render a small dummy conversation with and without the new
messages and keep the difference, which requires a prefix-preserving template (checked with TRL's own
``is_chat_template_prefix_preserving``). For ``inline`` rehearsal, the same diff with sentinel contents
splits the tool turn into the scaffolding around each tool response.

Families differ in how a turn ends (ChatML's ``<|im_end|>``, Llama's ``<|eot_id|>``, GLM's next role token,
gpt-oss's ``<|call|>``/``<|return|>`` that the history writes as ``<|end|>``): the end of an assistant turn is
the first stop token (or family end token) after it in the rendering, and a suffix starts just after it.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import PolicyError
from ..parsing.formats import detect_format
from ..policy.tokens import stop_token_ids

logger = logging.getLogger("envace_gym")
_CONTROL = re.compile(r"<\|[^|<>\s]+\|>|<｜[^｜<>\s]+｜>")  # <|...|> and <｜...｜>: chat control tokens
_DUMMY = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
_SENTINEL = "\u2063ENVACE_TOOL_CONTENT_{}\u2063"
_CACHE: weakref.WeakKeyDictionary[Any, ChatFormat] = weakref.WeakKeyDictionary()


class ChatFormat:
    """How one tokenizer's chat template lays out turns, found once and cached per tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

        self.tokenizer = tokenizer
        if not supports_tool_calling(tokenizer):
            raise PolicyError("the tokenizer's chat template cannot render tool calls and tool messages")
        if not is_chat_template_prefix_preserving(tokenizer):
            raise PolicyError(
                "the tokenizer's chat template is not prefix-preserving (earlier turns render differently once "
                "later ones are added), so a conversation cannot grow by appending ids; use a training template "
                "such as trl.chat_template_utils.get_training_chat_template(tokenizer)"
            )
        self.stop_ids = stop_token_ids(tokenizer)
        self.eos_id = self.stop_ids[0]
        self.eos_text = tokenizer.convert_ids_to_tokens(self.eos_id)
        self.tool_format = detect_format(_template_text(tokenizer))  # the format the template itself writes
        self.special_ids = frozenset(tokenizer.all_special_ids) | frozenset(
            i for i, t in tokenizer.added_tokens_decoder.items() if t.special
        )
        # Control tokens a tokenizer adds without the special flag (DeepSeek's <｜User｜> on the Hub) are treated
        # as special too: text must never spell them either.
        controls = {i for i, t in tokenizer.added_tokens_decoder.items() if _CONTROL.fullmatch(t.content)}
        self.special_ids = self.special_ids | frozenset(controls)
        self.special_strings = sorted(
            {tokenizer.convert_ids_to_tokens(i) for i in self.special_ids} - {None, ""}, key=len, reverse=True
        )
        # What ends an assistant turn: the stop tokens, and the family's other end-of-message tokens (gpt-oss
        # writes <|end|> in the history where the model stopped on <|return|>).
        ends = [tokenizer.convert_ids_to_tokens(i) for i in self.stop_ids]
        ends += [t for t in self.tool_format.turn_ends if t in self.special_strings]
        self.end_texts = tuple(dict.fromkeys(t for t in ends if t))
        self._head = self.render(_DUMMY[:2], add_generation_prompt=True)  # up to an assistant turn's opening
        self._tool_pieces: dict[tuple[str, ...], tuple[str, list[str]]] = {}
        self._before: dict[tuple[str, ...], str] = {}  # suffix callers pass calls by name only (arguments {})
        self._kept: dict[tuple[str, ...], frozenset[int]] = {}
        call = {"type": "function", "function": {"name": "t", "arguments": {}}}
        self.suffix([{"role": "tool", "name": "t", "content": "r"}], [call])  # fails here, clearly, on a template
        # that cannot grow by a tool turn; a user turn is checked by an episode that has one (user_turns_ok)
        if self.rewrites_chained_calls:
            logger.warning(
                "this chat template renders a tool turn differently once another tool call follows it (DeepSeek-V3 "
                "does): after the first tool turn an episode's ids are what the model generated on, not a fresh "
                "render of the structured conversation (docs/environment.md, 'Model families')"
            )

    @functools.cached_property
    def end_opens_turn(self) -> bool:
        """True when the token that ends an assistant turn is the next message's opening (GLM's ``<|observation|>``
        and ``<|user|>``): the template's own must then be written even when the model stopped on another."""
        end, rest = self.suffix([{"role": "user", "content": "u"}]) if self.user_turns_ok is None else ("", "x")
        return bool(end) and not rest.lstrip().startswith(tuple(self.special_strings))

    @functools.cached_property
    def error_role(self) -> str:
        """The role that carries the error of a malformed Act turn back to the model: ``tool``, or ``user`` where
        the template renders no tool message without a call to answer (gpt-oss names its author from the call)."""
        try:
            self.suffix([{"role": "tool", "name": "", "content": "e"}])
        except Exception:  # the template's own refusal (a jinja TemplateError)
            return "user"
        return "tool"

    @functools.cached_property
    def rewrites_chained_calls(self) -> bool:
        """True when the template renders a tool turn differently once another tool-calling turn follows it
        (DeepSeek-V3 merges the second call into the first one's output block): a conversation grown by ids is
        then what the model generated on, as in TRL's tool loop, but not a fresh render's tokens after that point."""
        call = [{"type": "function", "function": {"name": "t", "arguments": {}}}]
        base = [*_DUMMY[:2], self._assistant(call), {"role": "tool", "name": "t", "content": "r"}]
        grown = self.render(base, add_generation_prompt=True)
        return not self.render([*base, self._assistant(call)], add_generation_prompt=False).startswith(grown)

    @functools.cached_property
    def user_turns_ok(self) -> str | None:
        """``None`` when a user turn can follow a final answer by appending ids; else why not."""
        try:
            self.suffix([{"role": "user", "content": "u"}])
        except PolicyError as exc:
            return str(exc)
        return None

    @classmethod
    def of(cls, tokenizer: Any) -> ChatFormat:
        try:
            return _CACHE[tokenizer]
        except KeyError:
            _CACHE[tokenizer] = fmt = cls(tokenizer)
            return fmt

    def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Any = None, add_generation_prompt: bool = True
    ) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def encode_text(self, text: str) -> list[int]:
        """Tokenize untrusted text: special-token strings in it stay plain text, so text can never open,
        close or re-role a turn."""
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] if text else []

    def neutralize(self, text: str, keep: Sequence[str] = ()) -> str:
        """``text`` with every special-token string broken by a zero-width space, for untrusted text that must
        go through a template rendering (whose output is tokenized with special tokens recognised). The
        strings in ``keep`` (a tool-call format's own tokens in an Act turn; a sequence such as gpt-oss's
        ``<|end|><|start|>assistant`` is kept only as that sequence) are left whole."""
        kept = sorted((k for k in keep if k and k in text), key=len, reverse=True)
        if kept:  # split around the kept strings, break specials everywhere else
            parts = re.split("(" + "|".join(map(re.escape, kept)) + ")", text)
            return "".join(p if i % 2 else self.neutralize(p) for i, p in enumerate(parts))
        for special in self.special_strings:
            if special in text:
                text = text.replace(special, special[:1] + "\u200b" + special[1:])
        return text

    def safe_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Messages as the template renders them into the ids: :func:`render_for_model`, with special-token
        strings in their text broken (:meth:`neutralize`) so no content can open or close a turn."""
        out = []
        for m in render_for_model(messages):
            m = {**m, "content": self.neutralize(m["content"])} if isinstance(m.get("content"), str) else m
            out.append({**m, "name": self.neutralize(m["name"])} if isinstance(m.get("name"), str) else m)
        return out

    def act_view(self, ids: Sequence[int], keep: Sequence[str]) -> str:
        """A generated Act turn as text for its parser: special tokens dropped, except those in ``keep`` (the
        tokens a tool-call format writes calls with, such as Mistral's ``[TOOL_CALLS]``)."""
        if "*" in keep:  # the tokenizer's own parser reads the turn as generated, end token included
            return self.decode(ids)
        key = tuple(keep)
        if key not in self._kept:  # once per format, not per turn
            token = self.tokenizer.convert_ids_to_tokens
            self._kept[key] = frozenset(i for i in self.special_ids if any(token(i) in k for k in keep))
        return self.decode([i for i in ids if i not in self.special_ids or i in self._kept[key]])

    def strip_end(self, text: str) -> str:
        """``text`` without a trailing end-of-turn token (a reference Act text carries one)."""
        for end in self.end_texts:
            if text.endswith(end):
                return text[: -len(end)]
        return text

    def first_end(self, text: str) -> tuple[int, str]:
        """(index, token) of the first end-of-turn token in ``text``."""
        return self._turn_end(text, 0)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def display(self, ids: Sequence[int]) -> str:
        """``ids`` as text that spells a special token only where ``ids`` hold one: the text between special
        tokens is decoded and :meth:`neutralize` d, so tokenizing the result cannot open or re-role a turn."""
        parts: list[str] = []
        run: list[int] = []
        for i in ids:
            if i in self.special_ids:
                parts += [self.neutralize(self.decode(run)) if run else "", self.decode([i])]
                run = []
            else:
                run.append(i)
        parts.append(self.neutralize(self.decode(run)) if run else "")
        return "".join(parts)

    def _assistant(self, calls: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        if calls:
            return {"role": "assistant", "content": "", "tool_calls": list(calls)}
        return dict(_DUMMY[2])

    def _turn_end(self, full: str, start: int) -> tuple[int, str]:
        """Where the first assistant turn after ``start`` ends in ``full``: (index of its end token, the token)."""
        found = [(at, t) for t in self.end_texts if (at := full.find(t, start)) != -1]
        if not found:
            raise PolicyError(
                f"the chat template does not end an assistant turn with any of the stop tokens {list(self.end_texts)}"
            )
        return min(found)

    def suffix(self, messages: Sequence[Mapping[str, Any]], calls: Sequence[Mapping[str, Any]] = ()) -> tuple[str, str]:
        """``(end, rest)`` after an assistant turn's content: ``end`` is the token that closes that turn as the
        template writes it (appended only when the model's own turn lacks a stop token), ``rest`` runs from just
        after it through ``messages`` to the next assistant turn's opening (the generation prompt). ``calls``
        are the turn's tool calls in OpenAI form (some templates name the tool's author from them)."""
        base = [*_DUMMY[:2], self._assistant(calls)]
        names = tuple(c["function"]["name"] for c in calls)  # all the templates see of the calls here
        if names not in self._before:  # rendered once per call names, not every turn
            self._before[names] = self.render(base, add_generation_prompt=False)
        before = self._before[names]
        full = self.render([*base, *messages], add_generation_prompt=True)
        if not full.startswith(self._user_head):
            raise PolicyError("the chat template rendered an earlier turn differently once later ones were added")
        cut, end = self._turn_end(full, len(self._user_head))
        # Up to the assistant turn's end both renderings must agree; the end itself may differ (a gpt-oss
        # conversation's last turn ends with <|return|>, an earlier one with <|end|>; GLM writes none).
        if full[:cut] != before[:cut]:
            raise PolicyError("the chat template rendered an earlier turn differently once later ones were added")
        return end, full[cut + len(end) :]

    def act_text(self, content: str, calls: Sequence[Mapping[str, Any]] = ()) -> str:
        """The text of an assistant turn that writes ``content`` and ``calls`` (OpenAI form) as this template
        writes it, through its end token: what a model of this family generates for that turn. A turn whose
        template end is not a stop token (a gpt-oss final answer shows ``<|end|>``) ends with the EOS token."""
        return "".join(self._act_parts(content, calls))

    def _act_parts(self, content: str, calls: Sequence[Mapping[str, Any]] = ()) -> tuple[str, str]:
        # The content and the arguments are data: no special-token string in them may end or open a turn.
        calls = [{**c, "function": {**c["function"], "arguments": json.loads(self.neutralize(json.dumps(
            c["function"].get("arguments", {}), ensure_ascii=False)))}} for c in calls]  # fmt: skip
        content = self.neutralize(content)
        turn = {"role": "assistant", "content": content, **({"tool_calls": list(calls)} if calls else {})}
        follow = [{"role": "tool", "name": c["function"]["name"], "content": "r"} for c in calls] or [_DUMMY[1]]
        full = self.render([*_DUMMY[:2], turn, *follow], add_generation_prompt=False)
        cut, end = self._turn_end(full, len(self._user_head))
        # The turn starts after the generation prompt; a template that pre-fills part of it in the prompt (Qwen3.5's
        # empty <think></think>) but not in the history starts it after the history's own opening instead.
        start = len(self._head) if full.startswith(self._head) else len(self._user_head) + len(self.history_opening)
        stops = {self.tokenizer.convert_ids_to_tokens(i) for i in self.stop_ids}
        return full[start:cut], (end if end in stops else self.eos_text)

    @functools.cached_property
    def prefill(self) -> str:
        """What the generation prompt writes into an assistant turn that the history does not show (DeepSeek's
        training template opens ``<think>``): the conversation's ids keep it, as TRL's tool loop does; empty for
        most templates."""
        opening, gp = self.history_opening, self.generation_prompt
        return gp[len(opening) :] if gp.startswith(opening) else ""

    @functools.cached_property
    def history_opening(self) -> str:
        """The text between a user turn and an assistant turn's content, as the history shows it."""
        mark = _SENTINEL.format("opening")
        full = self.render([*_DUMMY[:2], {"role": "assistant", "content": mark}], add_generation_prompt=False)
        head, found, _ = full.partition(mark)
        if not found or not head.startswith(self._user_head):
            raise PolicyError("the chat template does not show an assistant turn's content verbatim")
        return head[len(self._user_head) :]

    @functools.cached_property
    def _user_head(self) -> str:
        return self.render(_DUMMY[:2], add_generation_prompt=False)

    @functools.cached_property
    def generation_prompt(self) -> str:
        """The text that opens an assistant turn (what ``add_generation_prompt=True`` adds)."""
        return self._head[len(self._user_head) :]

    @functools.cached_property
    def generation_prompt_ids(self) -> list[int]:
        return self.encode(self.generation_prompt)

    def insertion(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Text that adds ``messages`` after a user or tool turn, before the next generation prompt."""
        head = self._user_head
        full = self.render([*_DUMMY[:2], *messages], add_generation_prompt=False)
        if not full.startswith(head):
            raise PolicyError("the chat template rendered an earlier turn differently once later ones were added")
        return full[len(head) :]

    def tool_pieces(self, names: Sequence[str]) -> tuple[str, list[str]]:
        """``(end, pieces)``: the token that closes the Act turn (as :meth:`suffix`) and the ``len(names) + 1``
        scaffolding pieces around that many consecutive tool responses (the last piece opens the next assistant
        turn). Refused for a template that does not show a tool response verbatim (Llama 3 quotes it as a JSON
        string), since the model could not write one in place."""
        key = tuple(names)
        if key not in self._tool_pieces:
            marks = [_SENTINEL.format(i) for i in range(len(key))]
            calls = [{"type": "function", "function": {"name": n, "arguments": {}}} for n in key]
            end, text = self.suffix(
                [{"role": "tool", "name": n, "content": m} for n, m in zip(key, marks, strict=True)], calls
            )
            pieces = []
            for mark in marks:
                head, found, text = text.partition(mark)
                if not found or (head.endswith('"') and text.startswith('"')):
                    raise PolicyError(
                        "the chat template does not show tool responses verbatim (it quotes or rewrites them), so "
                        "the policy cannot write one inside the chat: use rehearsal_mode='separate'"
                    )
                pieces.append(head)
            self._tool_pieces[key] = (end, [*pieces, text])
        end, pieces = self._tool_pieces[key]
        return end, list(pieces)

    def closing(self, piece_after: str) -> str:
        """What the model writes to end a tool response in ``inline`` mode: the text of the scaffolding
        that follows the content, up to its first line break or special token (e.g. ``</tool_response>``), or
        that special token itself when the scaffolding starts with one that is not a stop token (DeepSeek's
        ``<｜tool▁output▁end｜>``); empty when the content ends with the end-of-turn token itself."""
        head = piece_after.lstrip()
        if head.startswith(self.end_texts):
            return ""
        for special in self.special_strings:
            if head.startswith(special):
                return special
        for special in self.special_strings:
            if special and special in head:
                head = head.split(special, 1)[0]
        return head.split("\n", 1)[0].strip()

    def act_end(self, calls: bool) -> str:
        """The token that ends an Act turn with (``calls``) or without tool calls: the template's own end when
        it is a stop token (GLM ends a calling turn with ``<|observation|>``), else the EOS token."""
        return self._act_ends[bool(calls)]

    @functools.cached_property
    def _act_ends(self) -> tuple[str, str]:
        call = {"type": "function", "function": {"name": "t", "arguments": {}}}
        return self._act_parts("a")[1], self._act_parts("", [call])[1]


def render_for_model(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the chat template should see them: an assistant turn is shown exactly as the model
    wrote it (its raw text already holds the ``<tool_call>`` blocks), so structured ``tool_calls`` are dropped."""
    return [{k: v for k, v in m.items() if k != "tool_calls"} for m in messages]


def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("tool_use") or template.get("default")
    return template if isinstance(template, str) else ""
