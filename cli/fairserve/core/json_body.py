"""Reading a request body as JSON: one object, or a 400 that says what is wrong with it.

Shared by the router and the simulated worker (every body they parse comes through
:func:`parse_json`). The standard library's decoder is the reference for every value and
every message; orjson reads long bodies faster as an accelerator only (issue 23: a
2,000-word prompt's body took the router ~17 µs to decode, ~10 µs with orjson). Bodies
nested deeper than :data:`MAX_JSON_DEPTH` and ``NaN``/``Infinity`` literals are refused, so
no later layer (the upstream ``json.dumps``, an error message's ``repr``) fails on them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from typing import Any, Final, cast

import orjson

from fairserve.core.openai_api import bad_request, excerpt, type_name

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a body (generation bodies nest a few
levels; tools' JSON schemas a few more)."""


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it.

    orjson reads it where it can (about 2.5 times faster than the standard library's C
    scanner on a long prompt, issue 23), as an accelerator only: the answer is always the
    standard library's (:func:`parse_json_stdlib`). Whatever orjson refuses goes to the
    standard library, which accepts some of it (lone surrogates, a byte order mark, UTF-16,
    floats beyond the double range) and words every error; of what orjson accepts, the one
    value it reads differently is an integer beyond 64 bits (a float), so a body holding a
    float of magnitude 2**63 or more (such an integer, or a float literal that large, never
    seen in a request) goes to the standard library too. Depth is checked as that path does.
    A short body (:data:`ORJSON_MIN_BYTES`) goes to the standard library at once."""
    if len(raw) < ORJSON_MIN_BYTES:
        return parse_json_stdlib(raw)
    try:
        body = orjson.loads(raw)
    except Exception:  # any refusal: the standard library answers (value or message)
        return parse_json_stdlib(raw)
    if type(body) is not dict:  # the standard library's message
        return parse_json_stdlib(raw)
    verdict = _too_deep_or_big_float(body)
    if verdict == _BIG_FLOAT:
        return parse_json_stdlib(raw)
    if verdict == _DEEP:
        raise bad_request(_TOO_DEEP)
    return cast(dict[str, Any], body)


ORJSON_MIN_BYTES = 2048
"""Bodies shorter than this are read by the standard library alone: orjson's gain grows
with the body (its scan of a long prompt), its checks (:func:`_too_deep_or_big_float`) do
not, and on a one-sentence completion the router spent as much or more with them (request
JSON decode 4.5 against 4.3 and 3.7 against 3.0 us per request, bench_router --profile)."""


def parse_json_stdlib(raw: bytes) -> dict[str, Any]:
    """:func:`parse_json` with the standard library only: what it answers for every body
    (its reference; callers use :func:`parse_json`). Named ``parse_json*`` so the router
    bench's profile counts it as request JSON decoding, as it does :func:`parse_json`.

    ``RecursionError`` is the C parser's answer to very deep nesting; a body that parses
    but nests deeper than :data:`MAX_JSON_DEPTH` is refused too, so no later step (the
    upstream ``json.dumps``, an error message's ``repr``) runs out of stack on it."""
    try:
        # A body that starts with "{" and a non-zero byte is UTF-8 (json.detect_encoding's
        # rule, without its calls on the hot path).
        utf8 = raw[:1] == b"{" and raw[1:2] != b"\0"
        text = raw.decode("utf-8" if utf8 else json.detect_encoding(raw), "surrogatepass")
        body = decode_whole(_DECODER, text)
    except RecursionError:
        raise bad_request(_TOO_DEEP) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {excerpt(str(exc))}") from None
    if not isinstance(body, dict):
        raise bad_request(f"request body: expected a JSON object, got {type_name(body)}")
    # A short body with fewer brackets than the limit cannot nest deeper than it (no walk);
    # a long one is walked: counting scans every byte of a long prompt (~17 us for 17 KB),
    # the walk only the body's few containers (~2 us for a completion, ~6 for a chat).
    if (
        len(raw) > _COUNT_BRACKETS_BYTES or raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH
    ) and _too_deep(body):
        raise bad_request(_TOO_DEEP)
    return body


_COUNT_BRACKETS_BYTES = 2048
"""Bodies up to this size are checked for depth by counting brackets first (cheaper there
than the walk of :func:`_too_deep`); longer ones are walked at once."""


_TOO_DEEP = f"request body is nested too deeply (the most is {MAX_JSON_DEPTH} levels)"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (standard JSON has no NaN or Infinity)")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
"""Made once: ``json.loads`` with any option builds a decoder per call (what
``json.loads`` does with bytes is done by hand in :func:`parse_json`)."""


def decode_whole(decoder: json.JSONDecoder, text: str) -> Any:
    """``decoder.decode(text)``: the common case (a value from the first character to the
    last) in one call of the C scanner, without ``decode``'s Python layers and whitespace
    matches; anything else (whitespace around, extra data, an error) goes through
    ``decode`` itself, so the result or the exception is exactly its own."""
    scan: Callable[[str, int], tuple[Any, int]] = decoder.scan_once  # type: ignore[attr-defined]
    try:
        value, end = scan(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return decoder.decode(text)
    return value if end == len(text) else decoder.decode(text)


# What :func:`_too_deep_or_big_float` finds (plain ints: an enum's members cost ~0.1 us a
# lookup on the router's hot path).
_FINE: Final = 0
_DEEP: Final = 1
_BIG_FLOAT: Final = 2

_BIG_FLOAT_MAGNITUDE = 2.0**63
"""orjson reads an integer outside [-2**63, 2**64) as a float, whose magnitude is this or
more; an integer inside it is read exactly (:func:`parse_json`)."""


def _too_deep(body: dict[str, Any]) -> bool:
    """Whether ``body`` nests deeper than :data:`MAX_JSON_DEPTH`."""
    return _too_deep_or_big_float(body, floats=False) == _DEEP


def _too_deep_or_big_float(body: dict[str, Any], floats: bool = True) -> int:
    """Whether ``body`` nests deeper than :data:`MAX_JSON_DEPTH` or (with ``floats``) holds
    a float of magnitude 2**63 or more, whichever is seen first, level by level with the
    per-node work mostly in C (``map``, ``chain``, ``set``): a body of half a million
    messages is checked in a fraction of what parsing it took."""
    values = body.values()
    kinds = set(map(type, values))
    if floats and float in kinds and _big_float(values):
        return _BIG_FLOAT
    if dict not in kinds and list not in kinds:  # a completion's usual body: one level
        return _FINE
    dicts: list[dict[str, Any]] = [body]
    lists: list[list[Any]] = []
    for _ in range(MAX_JSON_DEPTH):
        children = [
            *itertools.chain.from_iterable(map(dict.values, dicts)),
            *itertools.chain.from_iterable(lists),
        ]
        kinds = set(map(type, children))
        if floats and float in kinds and _big_float(children):
            return _BIG_FLOAT
        if kinds == {dict}:
            dicts, lists = cast(list[dict[str, Any]], children), []
        elif kinds == {list}:
            dicts, lists = [], cast(list[list[Any]], children)
        elif dict in kinds or list in kinds:
            dicts = [c for c in children if type(c) is dict]
            lists = [c for c in children if type(c) is list]
        else:
            return _FINE
    return _DEEP


def _big_float(values: Iterable[Any]) -> bool:
    big = _BIG_FLOAT_MAGNITUDE
    return any(type(v) is float and not -big < v < big for v in values)
