"""Token-level chat bookkeeping: a conversation grows by appending ids, never by re-tokenizing it.

The first Act prompt is rendered by the tokenizer's chat template and tokenized once. After that, each
turn appends (1) the ids the model generated and (2) the ids of a *suffix*: the template's text that
closes the assistant turn, holds the tool (or user) messages, and opens the next assistant turn. The
suffix is found as TRL's tool loop finds it: render a small dummy conversation with and without the new
messages and keep the difference, which requires a prefix-preserving template (checked with TRL's own
``is_chat_template_prefix_preserving``). For ``inline`` rehearsal, the same diff with sentinel contents
splits the tool turn into the scaffolding around each tool response.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import PolicyError
from .policy import stop_token_ids

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
        self._prefix = self.render(_DUMMY, add_generation_prompt=False)
        cut = self._prefix.rfind(self.eos_text)
        if cut < 0:
            raise PolicyError(f"the chat template does not end an assistant turn with {self.eos_text!r}")
        self._cut = cut + len(self.eos_text)
        self._tool_pieces: dict[int, list[str]] = {}
        self.special_ids = frozenset(tokenizer.all_special_ids) | frozenset(
            i for i, t in tokenizer.added_tokens_decoder.items() if t.special
        )
        self._special_strings = sorted(
            {tokenizer.convert_ids_to_tokens(i) for i in self.special_ids} - {None, ""}, key=len, reverse=True
        )

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

    def neutralize(self, text: str) -> str:
        """``text`` with every special-token string broken by a zero-width space, for untrusted text that must
        go through a template rendering (whose output is tokenized with special tokens recognised)."""
        for special in self._special_strings:
            if special in text:
                text = text.replace(special, special[:1] + "\u200b" + special[1:])
        return text

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

    def suffix(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Text from just after an assistant turn's end token, through ``messages``, to the next
        assistant turn's opening (the generation prompt)."""
        full = self.render([*_DUMMY, *messages], add_generation_prompt=True)
        if not full.startswith(self._prefix):
            raise PolicyError("the chat template rendered an earlier turn differently once later ones were added")
        return full[self._cut :]

    @functools.cached_property
    def _user_head(self) -> str:
        return self.render(_DUMMY[:2], add_generation_prompt=False)

    @functools.cached_property
    def generation_prompt(self) -> str:
        """The text that opens an assistant turn (what ``add_generation_prompt=True`` adds)."""
        return self.render(_DUMMY[:2], add_generation_prompt=True)[len(self._user_head) :]

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

    def tool_pieces(self, n: int) -> list[str]:
        """The ``n + 1`` scaffolding pieces around ``n`` consecutive tool responses (after an assistant
        turn's end token; the last piece opens the next assistant turn)."""
        if n not in self._tool_pieces:
            marks = [_SENTINEL.format(i) for i in range(n)]
            text = self.suffix([{"role": "tool", "name": "tool", "content": m} for m in marks])
            pieces = []
            for mark in marks:
                head, found, text = text.partition(mark)
                if not found:
                    raise PolicyError("the chat template does not show tool message contents verbatim")
                pieces.append(head)
            self._tool_pieces[n] = [*pieces, text]
        return list(self._tool_pieces[n])

    def closing(self, piece_after: str) -> str:
        """What the model writes to end a tool response in ``inline`` mode: the text of the scaffolding
        that follows the content, up to its first line break or special token (e.g. ``</tool_response>``);
        empty when the content ends with the end-of-turn token itself."""
        head = piece_after.lstrip()
        if head.startswith(self.eos_text):
            return ""
        for special in self.tokenizer.all_special_tokens:
            if special and special in head:
                head = head.split(special, 1)[0]
        return head.split("\n", 1)[0].strip()
