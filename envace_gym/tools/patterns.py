"""The regular expressions of untrusted schemas, run in linear time.

A tool schema's ``pattern`` or ``patternProperties`` comes from wherever the tool came from (a dataset, an MCP
server, a benchmark), and the strings it is matched against come from the policy. jsonschema matches them with
Python's ``re``, which backtracks: ``^(a+)+$`` against 34 ``a`` and a ``!`` takes minutes. Here they run on RE2
(``google-re2``), whose matching is linear in the input, hooked into jsonschema as its own keywords:

* :func:`check_patterns` walks a schema when it is built and refuses, naming the place, what RE2 cannot run
  (backreferences, lookaround), a ``$ref`` that points outside the schema (nothing is ever retrieved) and
  ``unevaluatedProperties`` beside ``patternProperties`` (jsonschema would match those keys with ``re``);
* :func:`linear_time` gives a jsonschema validator class whose ``pattern``, ``patternProperties`` and
  ``additionalProperties`` match with RE2, and whose ``format: regex`` asks whether RE2 can compile the text;
* :data:`LOCAL_REFERENCES` is the only registry validators resolve ``$ref`` against: the JSON Schema
  metaschemas, with no retrieval (jsonschema's default fetches unknown URLs over the network).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache, lru_cache
from typing import Any

import jsonschema
import re2
from jsonschema_specifications import REGISTRY as LOCAL_REFERENCES

from ..text import clean_text

# Keywords whose value is a schema, a list of schemas, or a mapping of names to schemas (JSON Schema 2020-12
# and earlier drafts); everything else (enum, const, default, examples, ...) is data and is not walked.
_ONE = ("additionalProperties", "additionalItems", "items", "contains", "not", "if", "then", "else",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


class PatternError(ValueError):
    """A schema that cannot be checked in bounded time; ``where`` is its JSON pointer in the schema."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"at {where or '(root)'}: {message}")
        self.where = where


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print every refused pattern to stderr
    return options


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (cached); ``re2.error`` where RE2 cannot run it."""
    return re2.compile(pattern, _options())


def check_patterns(schema: Any, where: str = "") -> None:
    """Raise :class:`PatternError` for the first thing in ``schema`` that cannot be checked in bounded time."""
    if not isinstance(schema, Mapping):
        return
    for ref in ("$ref", "$dynamicRef"):
        target = schema.get(ref)
        if isinstance(target, str) and not target.startswith("#"):
            raise PatternError(
                f"{where}/{ref}", f"{target!r} points outside the schema; only references inside it (#/...) are "
                "resolved, nothing is retrieved: inline the schema it names",
            )  # fmt: skip
    patterns = [("pattern", schema["pattern"])] if isinstance(schema.get("pattern"), str) else []
    named = schema.get("patternProperties")
    if isinstance(named, Mapping):
        patterns += [(f"patternProperties/{p}", p) for p in named]
        if "unevaluatedProperties" in schema:
            raise PatternError(
                f"{where}/unevaluatedProperties", "is not supported beside patternProperties (jsonschema would "
                "match the arguments' keys with a backtracking regex); use additionalProperties",
            )  # fmt: skip
    for place, pattern in patterns:
        try:
            compile_pattern(pattern)
        except re2.error as exc:
            raise PatternError(
                f"{where}/{place}", f"the pattern {pattern!r} needs a backtracking regex engine ({_reason(exc)}); "
                "patterns are matched in linear time (RE2), without backreferences or lookaround",
            ) from None  # fmt: skip
    for key, sub in subschemas(schema):
        check_patterns(sub, f"{where}/{key}")


def _reason(exc: Exception) -> str:
    text = exc.args[0] if exc.args else exc
    return text.decode(errors="replace") if isinstance(text, bytes) else str(text)


def subschemas(schema: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """``(place, subschema)`` for each schema directly inside ``schema`` (``properties/name``, ``anyOf/0``, ...)."""
    for key in _ONE:
        if isinstance(schema.get(key), Mapping):
            yield key, schema[key]
    for key in _MANY:
        if isinstance(schema.get(key), list):
            yield from ((f"{key}/{i}", sub) for i, sub in enumerate(schema[key]))
    for key in _NAMED:
        if isinstance(schema.get(key), Mapping):
            yield from ((f"{key}/{name}", sub) for name, sub in schema[key].items())


# -- the keywords, matched with RE2 (jsonschema's own match with `re`) ---------------------------------------
def _search(pattern: str, text: str) -> bool:
    # RE2 reads UTF-8: a lone surrogate (which no UTF-8 holds) is matched as U+FFFD, as the chat would show it
    return compile_pattern(pattern).search(clean_text(text)) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, named: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in named.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _extra_keys(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    known, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
    return [k for k in instance if k not in known and not any(_search(p, k) for p in patterns)]


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    keys = _extra_keys(instance, schema)
    if validator.is_type(extra, "object"):
        for key in keys:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and keys:
        listed = ", ".join(repr(k) for k in sorted(keys))
        if "patternProperties" in schema:
            regexes = sorted(schema["patternProperties"])
            yield jsonschema.ValidationError(f"{listed} do(es) not match any of the regexes: {regexes}")
        else:
            yield jsonschema.ValidationError(f"Additional properties are not allowed ({listed} unexpected)")


def _is_regex(instance: Any) -> bool:
    if isinstance(instance, str):  # model text: compiled uncached, so no argument stays in memory
        re2.compile(clean_text(instance), _options())
    return True


def _linear_formats(checker: jsonschema.FormatChecker) -> jsonschema.FormatChecker:
    """``checker`` with ``format: regex`` decided by RE2 (jsonschema's compiles the argument with ``re``)."""
    formats = jsonschema.FormatChecker(())
    formats.checkers = dict(checker.checkers)
    if "regex" in formats.checkers:
        formats.checkers["regex"] = (_is_regex, re2.error)
    return formats


@cache
def linear_time(cls: type) -> type:
    """``cls`` (a jsonschema validator class) with its regex keywords matched by RE2."""
    return jsonschema.validators.extend(
        cls,
        {"pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties},
        format_checker=_linear_formats(cls.FORMAT_CHECKER),
    )


__all__ = ["LOCAL_REFERENCES", "PatternError", "check_patterns", "compile_pattern", "linear_time", "subschemas"]
