"""Parsing and validating the bodies of the OpenAI and SGLang generation endpoints.

Shared by the simulated worker and the router (pure: standard library; the bodies are read
as JSON by :mod:`fairserve.core.json_body`), so a body the router accepts is one the worker
accepts, with the same 400 messages. A text prompt is kept as text
(``GenerationSpec.prompt_text``, a chat rendered by :func:`render_chat`) and keyed by its
text blocks (:mod:`fairserve.core.prefix_key`): the router never tokenizes it, and the
worker tokenizes it with its own tokenizer; token ids a client sends are the key as they are.

Every route turns its JSON body into one :class:`GenerationSpec`, so the runtime and the
response writers never see route-specific shapes. Validation is strict about what the
simulator uses (prompt, output length, identity) and lenient about the rest: SGLang and
OpenAI clients (and routers such as ``sglang-router``) send many sampling and logging fields
(``temperature``, ``top_p``, ``model: null``, ``log_metrics``...) that a simulated engine
accepts and ignores, within the ranges the OpenAI API documents (a value outside them is
a client's bug, and a real engine would refuse it). Every error says which field is wrong
and what was expected, and shows at most a short excerpt of the value.

Nothing a client sends may raise anything but :class:`ApiError`: bodies nested too deeply,
``NaN``/``Infinity`` literals (both refused by the JSON reading), integers too long to
convert, lone surrogates in text (valid JSON escapes, invalid Unicode) are all 400s,
because the layers after parsing (tokenizing, ``json.dumps`` of the upstream body, hashing
a rid) would otherwise fail with an internal error.
"""

from __future__ import annotations

import itertools
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard, cast

from fairserve.core.prefix_key import text_key
from fairserve.core.types import ANONYMOUS_CLIENT, TOKEN_BYTES, key_to_tokens, tokens_to_key

Route = Literal["generate", "completions", "chat"]

DEFAULT_MAX_NEW_TOKENS = 128
"""``/generate`` and chat default (SGLang's ``max_new_tokens`` default)."""
DEFAULT_COMPLETION_TOKENS = 16
"""``/v1/completions`` default (the OpenAI API's ``max_tokens`` default)."""
MAX_TOKEN_ID = 2**32 - 1
MAX_OUTPUT_TOKENS = 2**31 - 1
"""The most output tokens a request may ask for whatever the model (the context check,
:func:`check_context`, is usually far stricter)."""
MIN_TEXT_PROMPT_TOKENS = 1
"""What a text prompt certainly costs before a tokenizer counts it (it is never empty)."""
MAX_RID_CHARS = 256
"""Longest request id a client may give (SGLang's are 32 hex digits)."""

CLIENT_HEADER = "X-Fairserve-Client"
APP_HEADER = "X-Fairserve-App"

_BATCHED = "batched requests are not supported: send one prompt per request"


class ApiError(Exception):
    """A request a server refuses; ``status`` is the HTTP status to answer with."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str = "invalid_request_error",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


def internal_error(logger: logging.Logger, exc: BaseException, where: str) -> ApiError:
    """The 500 for a server's own failure: the client learns only an error id; the cause
    goes to ``logger`` as one line with that id (the traceback at debug level)."""
    error_id = uuid.uuid4().hex[:12]
    logger.error(
        "internal error %s in %s: %s: %s",
        error_id,
        where,
        type(exc).__name__,
        excerpt(str(exc), 300),
    )
    logger.debug("traceback of internal error %s", error_id, exc_info=exc)
    return ApiError(500, f"internal error (error id {error_id}); the details are in the log")


def error_body(error: ApiError) -> dict[str, Any]:
    """``{"error": {"message", "type", "code"}}`` (OpenAI's shape; ``code`` = HTTP status)."""
    kind = _ERROR_TYPES.get(error.status, "server_error" if error.status >= 500 else error.code)
    return {"error": {"message": error.message, "type": kind, "code": error.status}}


@dataclass(slots=True)
class GenerationSpec:
    """One generation request, whatever route it came through.

    Not frozen, though nothing assigns to it after parsing: a frozen dataclass sets each of
    its eleven fields through ``object.__setattr__``, ~1.6 µs more per request on the
    router's hot path (issue 23)."""

    route: Route
    rid: str
    client: str
    prompt_key: bytes
    """The prompt's prefix key: its token ids (:func:`~fairserve.core.types.tokens_to_key`)
    when the client sent ids, else its text blocks (:func:`~fairserve.core.prefix_key.text_key`);
    a key unit is a token either way, exact or estimated."""
    max_new_tokens: int
    stream: bool
    app: str | None = None
    include_usage: bool = False
    model: str | None = None
    max_tokens_field: str = "max_tokens"
    """The field that set ``max_new_tokens`` (for error messages)."""
    prompt_text: str | None = None
    """The prompt as text (a chat rendered with :func:`render_chat`); None when the client
    sent token ids. A worker tokenizes it with its own tokenizer."""

    @property
    def prompt_tokens(self) -> int:
        """The prompt's tokens as the router knows them before any worker answers: exact for
        token ids, estimated for text (one per key unit, see :mod:`~fairserve.core.prefix_key`)."""
        return len(self.prompt_key) // TOKEN_BYTES

    @property
    def prompt_ids(self) -> list[int]:
        """The token ids the client sent (unpacked on demand: the hot paths use the key)."""
        if self.prompt_text is not None:
            raise ValueError("a text prompt has no token ids before a worker tokenizes it")
        return key_to_tokens(self.prompt_key)


def check_context(
    spec: GenerationSpec, context_tokens: int | None, prompt_tokens: int | None = None
) -> None:
    """400 when the prompt and the requested output exceed the model's context length
    (``None``: unknown, nothing to check), with the message vLLM and SGLang give.

    ``prompt_tokens``: the prompt's tokens where the caller counted them (a worker, with its
    tokenizer). Without a count, token ids are counted exactly, but a text prompt's tokens
    are unknown (the router keys text by bytes and estimates, :mod:`fairserve.core.prefix_key`)
    and the check uses the one certain bound, one token: the router refuses only what no
    tokenizer could fit (an output as long as the context), and a prompt near the limit is
    left to the worker's exact count, whose 400 the router passes on. Refusing on the
    estimate would refuse prompts the model takes."""
    if context_tokens is None:
        return
    if prompt_tokens is not None or spec.prompt_text is None:
        prompt = spec.prompt_tokens if prompt_tokens is None else prompt_tokens
        at_least = ""
    else:
        prompt, at_least = MIN_TEXT_PROMPT_TOKENS, "at least "
    total = prompt + spec.max_new_tokens
    if total > context_tokens:
        raise bad_request(
            f"This model's maximum context length is {context_tokens} tokens. However, you "
            f"requested {at_least}{total} tokens ({at_least}{prompt} in the prompt, "
            f"{spec.max_new_tokens} for the completion). Please reduce the length of the "
            f"prompt or of the completion ({spec.max_tokens_field})."
        )


def parse_generate(body: Mapping[str, Any], headers: Mapping[str, str]) -> GenerationSpec:
    """SGLang's native ``POST /generate``: ``text`` or ``input_ids``, ``sampling_params``."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is not None and input_ids is not None:
        raise bad_request("give either 'text' or 'input_ids', not both")
    if text is None and input_ids is None:
        raise bad_request("missing field: 'text' or 'input_ids' is required")
    if isinstance(text, list) or (isinstance(input_ids, list) and _is_nested(input_ids)):
        raise bad_request(_BATCHED)
    if text is not None:
        key, prompt_text = _prompt_from_text(text, "text"), cast(str, text)
    else:
        key, prompt_text = _token_ids(input_ids), None
    params = body.get("sampling_params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise bad_request(f"sampling_params: expected a JSON object, got {type_name(params)}")
    # SGLang accepts max_new_tokens = 0 (a prefill only); OpenAI's fields need >= 1.
    max_new = _output_tokens(
        params.get("max_new_tokens"), "sampling_params.max_new_tokens", DEFAULT_MAX_NEW_TOKENS, 0
    )
    _optional_bool(params.get("ignore_eos"), "sampling_params.ignore_eos")
    _check_sampling(params, "sampling_params.", _NATIVE_RANGES)
    rid = body.get("rid")
    if isinstance(rid, list):
        raise bad_request(_BATCHED)
    return GenerationSpec(
        route="generate",
        rid=_rid(rid, "rid"),
        client=_client(body.get("routing_key"), "routing_key", headers, None),
        prompt_key=key,
        max_new_tokens=max_new,
        stream=_optional_bool(body.get("stream"), "stream"),
        app=headers.get(APP_HEADER),
        max_tokens_field="max_new_tokens",
        prompt_text=prompt_text,
    )


def parse_completion(body: Mapping[str, Any], headers: Mapping[str, str]) -> GenerationSpec:
    """OpenAI ``POST /v1/completions``: ``prompt`` as a string or token ids."""
    if "prompt" not in body:
        raise bad_request("missing field: 'prompt'")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one is one prompt
    if isinstance(prompt, list) and _is_nested_or_text(prompt):
        raise bad_request(_BATCHED)
    if isinstance(prompt, list):
        return _openai_spec("completions", body, headers, _token_ids(prompt, "prompt"), None)
    key = _prompt_from_text(prompt, "prompt")
    return _openai_spec("completions", body, headers, key, cast(str, prompt))


def parse_chat(body: Mapping[str, Any], headers: Mapping[str, str]) -> GenerationSpec:
    """OpenAI ``POST /v1/chat/completions``: messages rendered with a fixed template."""
    messages = body.get("messages")
    if messages is None:
        raise bad_request("missing field: 'messages'")
    if not isinstance(messages, list) or not messages:
        raise bad_request(
            f"messages: expected a non-empty list of messages, got {type_name(messages)}"
        )
    text = render_chat([_message(m, f"messages[{i}]") for i, m in enumerate(messages)])
    return _openai_spec("chat", body, headers, text_key(text), text)


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """The prompt text of a chat: ``<|role|> content`` lines, then ``<|assistant|>``.

    One fixed template (the simulated worker has no model's): an answer generated as
    `` word word ...`` (leading space, :mod:`fairserve.core.tokenizer`) is rendered back in
    the next turn as ``<|assistant|> word word ...``, the text the worker cached."""
    lines = "".join(f"<|{role}|> {content}\n" for role, content in messages)
    return lines + "<|assistant|>"


def _openai_spec(
    route: Route,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    key: bytes,
    text: str | None,
) -> GenerationSpec:
    default = DEFAULT_COMPLETION_TOKENS if route == "completions" else DEFAULT_MAX_NEW_TOKENS
    field = "max_tokens"
    value = body.get("max_tokens")
    if route == "chat" and body.get("max_completion_tokens") is not None:
        field, value = "max_completion_tokens", body["max_completion_tokens"]
    max_new = _output_tokens(value, field, default, 1)
    n = body.get("n", 1)
    if n is not None and (not _is_int(n) or n != 1):
        raise bad_request(f"n: only n = 1 is supported (one choice per request), got {_show(n)}")
    _check_sampling(body, "", _OPENAI_RANGES)
    options = body.get("stream_options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise bad_request(f"stream_options: expected a JSON object, got {type_name(options)}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"model: expected a string, got {type_name(model)}")
    if model is not None:
        _unicode(model, "model")
    return GenerationSpec(
        route=route,
        rid=_rid(body.get("rid"), "rid"),
        client=_client(body.get("routing_key"), "routing_key", headers, body.get("user")),
        prompt_key=key,
        max_new_tokens=max_new,
        stream=_optional_bool(body.get("stream"), "stream"),
        app=headers.get(APP_HEADER),
        include_usage=_optional_bool(options.get("include_usage"), "stream_options.include_usage"),
        model=model,
        max_tokens_field=field,
        prompt_text=text,
    )


# ------------------------------------------------------------------ fields
def _prompt_from_text(text: object, field: str) -> bytes:
    """The prefix key of a text prompt (its text blocks: no tokenizing on the router)."""
    if not isinstance(text, str):
        raise bad_request(f"{field}: expected a string, got {type_name(text)}")
    try:
        key = text_key(text)
    except UnicodeEncodeError:
        _unicode(text, field)  # raises the 400 that names the lone surrogate
        raise
    if not key:
        raise bad_request(f"{field}: the prompt is empty")
    return key


def _token_ids(value: object, field: str = "input_ids") -> bytes:
    """The token key of a client's token ids, checked. The common case (all valid) is
    checked in C: the ``type`` of each id (``bool`` is not ``int``), then the smallest and
    largest; only a list that fails is walked in Python, to name the first bad id."""
    if not isinstance(value, list) or not value:
        raise bad_request(f"{field}: expected a non-empty list of token ids")
    if set(map(type, value)) == {int} and min(value) >= 0 and max(value) <= MAX_TOKEN_ID:
        return tokens_to_key(value)
    i, token = next(
        (i, t) for i, t in enumerate(value) if not _is_int(t) or not 0 <= t <= MAX_TOKEN_ID
    )
    raise bad_request(
        f"{field}[{i}]: expected a token id (an integer in 0..{MAX_TOKEN_ID}), got {_show(token)}"
    )


def _message(message: object, where: str) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise bad_request(f"{where}: expected an object with 'role' and 'content'")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise bad_request(f"{where}.role: expected a non-empty string, got {_show(role)}")
    _unicode(role, f"{where}.role")
    content = message.get("content")
    if content is None:
        return role, ""
    if isinstance(content, str):
        return role, _unicode(content, f"{where}.content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
                raise bad_request(f"{where}.content[{j}]: expected a text part {{'text': ...}}")
            texts.append(_unicode(part.get("text", ""), f"{where}.content[{j}].text"))
        return role, "".join(texts)
    raise bad_request(
        f"{where}.content: expected a string or a list of text parts, got {type_name(content)}"
    )


def _output_tokens(value: object, field: str, default: int, least: int) -> int:
    """An output length: an integer from ``least`` to :data:`MAX_OUTPUT_TOKENS`."""
    if value is None:
        return default
    if not _is_int(value) or not least <= value <= MAX_OUTPUT_TOKENS:
        kind = "a positive integer" if least == 1 else "a non-negative integer"
        raise bad_request(
            f"{field}: expected {kind}, got {_show(value)} (the most is {MAX_OUTPUT_TOKENS})"
        )
    return value


_Range = tuple[float, float, bool]
"""(lowest, highest, whether the lowest itself is excluded)."""
_OPENAI_RANGES: dict[str, _Range] = {
    "temperature": (0.0, 2.0, False),
    "top_p": (0.0, 1.0, True),
    "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
}
_NATIVE_RANGES: dict[str, _Range] = {**_OPENAI_RANGES, "temperature": (0.0, math.inf, False)}
"""SGLang's own checks: a temperature above 2 is allowed there."""


def _check_sampling(fields: Mapping[str, Any], prefix: str, ranges: dict[str, _Range]) -> None:
    """Sampling fields the simulation ignores must still be numbers in their ranges."""
    if fields.keys().isdisjoint(ranges):  # none given: one check in C
        return
    for name, (low, high, open_low) in ranges.items():
        value = fields.get(name)
        if value is None:
            continue
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if (
            number is None
            or not (low < number if open_low else low <= number)
            or not (number <= high and math.isfinite(number))
        ):
            bounds = f"{'(' if open_low else '['}{low:g}, {high:g}{']' if high < math.inf else ')'}"
            raise bad_request(f"{prefix}{name}: expected a number in {bounds}, got {_show(value)}")


def _optional_bool(value: object, field: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"{field}: expected true or false, got {_show(value)}")
    return value


def _unicode(text: str, field: str) -> str:
    """``text`` if it is valid Unicode: JSON's ``\\ud800`` escapes give lone surrogates,
    which no UTF-8 encoder (the tokenizer's hash, a log, a header) accepts."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise bad_request(
            f"{field}: not valid Unicode: a lone surrogate (U+{code:04X}) at character {exc.start}"
        ) from None
    return text


_RID_PREFIX = uuid.uuid4().hex[:16]
_rid_counter = itertools.count()


def _rid(value: object, field: str) -> str:
    """The caller's rid, else a process-unique one: a random prefix drawn once and a counter
    (``uuid4`` per request costs a system call on the router's hot path)."""
    if value is None:
        return f"{_RID_PREFIX}{next(_rid_counter):016x}"  # 32 hex digits, like uuid4().hex
    if not isinstance(value, str) or not value or len(value) > MAX_RID_CHARS:
        raise bad_request(
            f"{field}: expected a non-empty string of at most {MAX_RID_CHARS} characters,"
            f" got {_show(value)}"
        )
    return _unicode(value, field)


def _client(value: object, field: str, headers: Mapping[str, str], user: object) -> str:
    """Client identity: ``routing_key``, then the fairserve header, then OpenAI's ``user``."""
    for candidate, where in ((value, field), (headers.get(CLIENT_HEADER), CLIENT_HEADER)):
        if candidate is not None:
            if not isinstance(candidate, str) or not candidate:
                raise bad_request(f"{where}: expected a non-empty string, got {_show(candidate)}")
            return _unicode(candidate, where)
    if isinstance(user, str) and user:
        return _unicode(user, "user")
    if user is not None and not isinstance(user, str):
        raise bad_request(f"user: expected a string, got {type_name(user)}")
    return ANONYMOUS_CLIENT


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_nested(values: list[Any]) -> bool:
    return any(isinstance(v, list) for v in values)


def _is_nested_or_text(values: list[Any]) -> bool:
    return any(isinstance(v, list | str) for v in values)


def _show(value: object) -> str:
    """A short rendering of a client's value for an error message: a huge value is not
    echoed (``repr`` of an integer over 4,300 digits even raises), containers are named."""
    if isinstance(value, dict | list):
        return type_name(value)
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "an integer too large"
    return excerpt(repr(value))


def excerpt(text: str, limit: int = 60) -> str:
    """``text``, cut to ``limit`` characters (an error message shows a client's value so)."""
    return text if len(text) <= limit else text[:limit] + "..."


def type_name(value: object) -> str:
    """What a JSON value is, in an error message's words (``an object``, ``a number``...)."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return names.get(type(value), type(value).__name__)
