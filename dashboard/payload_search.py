"""Search by payload: the search box's `key.path=value` terms and the API's `payload`
object, turned into the objects a todo's payload must contain (jsonb @>).

`customer.id=42 order.status=paid` asks for payloads that contain
{"customer": {"id": 42}} and {"order": {"status": "paid"}}. A value is read as JSON when
it is JSON (`42`, `true`, `null`, `"two words"`, `["vip"]`) and as a string otherwise
(`paid`); a bare number also matches the same digits as a string, since producers
send ids both ways. The terms, each a choice of values, become a list of whole objects
to contain, any one of which will do: one SQL condition, `payload @> ANY (…)`, that a
GIN index on payload answers. The API's object is a condition of its own (`payload @> …`),
sent once, never copied into each alternative.

A search is bounded before anything is built from it: each bare number doubles the
alternatives, so at most MAX_ALTERNATIVES of them (four bare numbers), and the alternatives
and the object are each at most MAX_SEARCH_BYTES as JSON (issue 25: 8 bare numbers times a
256 KiB object came to 64 MB per call).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
from typing import Any, NamedTuple

from dashboard.errors import InvalidInput, TooLarge
from dashboard.models import check_json_object, json_encode

MAX_TERMS = 8
MAX_ALTERNATIVES = 16  # a bare number doubles the objects to contain: four of them at most
MAX_SEARCH_BYTES = 16 * 1024  # the alternatives together, and the API's object, as JSON
_TERM = re.compile(r"([^\s=]*)(=?)")
_WORD = re.compile(r"\S*")
_SPACE = re.compile(r"\s*")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: not a number jsonb can hold, so a string
        raise ValueError(text)
    return value


def _not_json(text: str):
    raise ValueError(text)  # NaN and Infinity are Python's, not JSON's


_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_not_json)


class Term(NamedTuple):
    path: tuple[str, ...]
    values: tuple[Any, ...]  # any one of them will do


def parse_terms(text: str | None, field: str = "search") -> list[Term] | None:
    """The `key.path=value` terms of a search, all of which must match; None for a search
    without '=' (an id, an idempotency key or words of a title)."""
    if not text or "=" not in text:
        return None
    terms, pos = [], _SPACE.match(text).end()
    while pos < len(text):
        match = _TERM.match(text, pos)
        path, equals = match.groups()
        if not equals:
            word = _WORD.match(text, pos).group()
            raise InvalidInput(field, f"{word!r} is not key.path=value, as every term of a payload search is")
        segments = tuple(path.split("."))
        if not all(segments):
            raise InvalidInput(
                field, f"'{path}=' has an empty key: write key.path=value, like customer.id=42"
            )
        values, pos = _value(text, match.end(), path, field)
        terms.append(Term(segments, values))
        pos = _SPACE.match(text, pos).end()
    if len(terms) > MAX_TERMS:
        raise InvalidInput(field, f"at most {MAX_TERMS} key.path=value terms")
    if math.prod(len(term.values) for term in terms) > MAX_ALTERNATIVES:
        raise InvalidInput(
            field,
            f"too many bare numbers: each also matches as a string, doubling what is searched for (at "
            f'most {MAX_ALTERNATIVES} combinations: four bare numbers); quote the others ("42")',
        )
    return terms


def _value(text: str, start: int, path: str, field: str) -> tuple[tuple[Any, ...], int]:
    """The choices of a term's value from `start`, and where the value ends."""
    try:
        value, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        end = None
    if end is not None and (end == len(text) or text[end].isspace()):
        check_json_object({path: value}, field)  # no \u0000 in it, which jsonb cannot hold
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return ((value, text[start:end]) if number else (value,)), end
    word = _WORD.match(text, start).group()
    if not word:
        raise InvalidInput(field, f"'{path}=' needs a value (\"\" for the empty string)")
    return (word,), start + len(word)


def check_payload(value: Any, field: str = "payload") -> dict:
    """The API's `payload` query parameter: JSON text of an object."""
    try:
        found = _DECODER.decode(value)
    except (ValueError, RecursionError):
        found = None
    if not isinstance(found, dict):
        raise InvalidInput(field, 'must be a JSON object, like {"customer": {"id": 42}}')
    return check_search_object(found, field)


def check_search_object(value: Any, field: str = "payload") -> dict:
    """An object to search payloads for (the API's and MCP's `payload`), if it is within
    MAX_SEARCH_BYTES and one jsonb can hold. The size first: check_json_object's scan for an
    escaped NUL takes ~25 ns a byte (6 ms for a 240 KB object, every call)."""
    with contextlib.suppress(TypeError, ValueError):  # not JSON: check_json_object says why
        _check_size(json_encode(value), field)
    check_json_object(value, field)
    return value


def containments(terms: list[Term] | None) -> list[dict] | None:
    """The objects a matching payload contains at least one of; None for no terms. An
    empty list matches nothing (terms that contradict each other)."""
    if not terms:
        return None
    found = []
    for choice in itertools.product(*(term.values for term in terms)):
        whole: Any = {}
        for term, value in zip(terms, choice, strict=True):
            whole = _merged(whole, _nested(term.path, value))
        if whole is not _CONFLICT:
            found.append(whole)
    _check_size(json_encode(found), "search")
    return found


def _check_size(encoded: str, field: str) -> None:
    size = len(encoded.encode())
    if size > MAX_SEARCH_BYTES:
        raise TooLarge(field, f"is {size} bytes of JSON to search for; the limit is {MAX_SEARCH_BYTES}")


def _nested(path: tuple[str, ...], value: Any) -> dict:
    for key in reversed(path):
        value = {key: value}
    return value


_CONFLICT = object()


def _merged(a: Any, b: Any) -> Any:
    """What contains both a and b (in jsonb's sense), or _CONFLICT when nothing can."""
    if a is _CONFLICT or b is _CONFLICT:
        return _CONFLICT
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for key, value in b.items():
            out[key] = _merged(out[key], value) if key in out else value
            if out[key] is _CONFLICT:
                return _CONFLICT
        return out
    if isinstance(a, list) and isinstance(b, list):
        return a + b  # an array contains both lists' elements
    return a if _kind(a) == _kind(b) and a == b else _CONFLICT


def _kind(value: Any) -> str:
    """JSON's type of a value: 1 and 1.0 are the same number, True is not 1."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__
