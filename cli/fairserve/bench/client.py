"""One call over HTTP: send it streamed, time its first token, read its usage, or say why not.

Every outcome is an :class:`Attempt` with a ``status``: ``ok``, ``http_<code>`` (429 over a
queue cap, 503 no worker...), ``timeout``, ``connection``, ``stream_error`` (the server sent
an error event mid-stream), ``bad_response``, and from the runner ``unfinished`` (still in
flight when the run ended) and ``skipped`` (a parent call failed, so this one never had a
prompt). Nothing is dropped: the report counts every status per client.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from fairserve.bench.prompts import PATHS, Answer, Api

OK = "ok"
UNFINISHED = "unfinished"
SKIPPED = "skipped"
_MAX_MESSAGE_CHARS = 300


@dataclass(slots=True)
class Attempt:
    """One call of the workload and what became of it; times are seconds since run start."""

    client: str
    app: str
    call_id: str
    arrival_s: float
    """When the call was due (program start or parents' answers + think time)."""
    input_tokens: int
    """The planned prompt length (the fallback when the server reports no usage)."""
    sent_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    status: str = "pending"
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass(slots=True)
class _Stream:
    """What has arrived so far of one streamed answer."""

    parts: list[str] = field(default_factory=list)
    cumulative: str | None = None
    ids: list[int] | None = None
    usage: dict[str, int] = field(default_factory=dict)
    chunks: int = 0

    def text(self) -> str:
        return self.cumulative if self.cumulative is not None else "".join(self.parts)


class StreamError(Exception):
    """The server reported an error inside a 200 stream."""


Clock = Callable[[], float]


async def send(
    session: aiohttp.ClientSession,
    url: str,
    api: Api,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    attempt: Attempt,
    clock: Clock,
) -> Answer | None:
    """POST ``body``; fill ``attempt`` in; the answer when it succeeded, else None."""
    attempt.sent_s = clock()
    try:
        async with session.post(url + PATHS[api], json=body, headers=dict(headers)) as resp:
            if resp.status != 200:
                _fail(attempt, f"http_{resp.status}", await _error_text(resp), clock)
                return None
            stream = await _read(resp, api, attempt, clock)
    except TimeoutError:
        _fail(attempt, "timeout", "no answer within the timeout", clock)
        return None
    except StreamError as exc:
        _fail(attempt, "stream_error", str(exc), clock)
        return None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
        _fail(attempt, "connection", f"{type(exc).__name__}: {exc}", clock)
        return None
    except (aiohttp.ClientError, ValueError) as exc:
        _fail(attempt, "bad_response", f"{type(exc).__name__}: {exc}", clock)
        return None
    return _finish(attempt, stream, clock)


def _fail(attempt: Attempt, status: str, message: str, clock: Clock) -> None:
    attempt.status = status
    attempt.message = message[:_MAX_MESSAGE_CHARS]
    attempt.finish_s = clock()


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    """The OpenAI-shaped ``error.message`` when there is one, else the raw body."""
    raw = await resp.text(errors="replace")
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return raw.strip()
    message = error.get("message") if isinstance(error, dict) else error
    return str(message) if message else raw.strip()


async def _read(resp: aiohttp.ClientResponse, api: Api, attempt: Attempt, clock: Clock) -> _Stream:
    """Read SSE events (or one JSON body, from a server that ignored ``stream``)."""
    stream = _Stream()
    if "text/event-stream" not in resp.headers.get("Content-Type", ""):
        _absorb(api, await resp.json(content_type=None), stream)
        attempt.first_token_s = clock()
        return stream
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[len(b"data:") :].strip()
        if data == b"[DONE]":
            break
        if _absorb(api, json.loads(data), stream) and attempt.first_token_s is None:
            attempt.first_token_s = clock()
    return stream


def _absorb(api: Api, payload: Any, stream: _Stream) -> bool:
    """Add one event to ``stream``; True when it carried generated text."""
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
    if "error" in payload:
        error = payload["error"]
        raise StreamError(str(error.get("message") if isinstance(error, dict) else error))
    stream.chunks += 1
    if api == "generate":
        return _absorb_native(payload, stream)
    usage = payload.get("usage")
    if isinstance(usage, dict):
        _take_usage(stream, usage)
    choices = payload.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    if api == "completions":
        text = choice.get("text") or ""
    else:
        message = choice.get("delta") or choice.get("message") or {}
        text = (message.get("content") or "") if isinstance(message, dict) else ""
    stream.parts.append(text)
    return bool(text)


def _absorb_native(payload: dict[str, Any], stream: _Stream) -> bool:
    """SGLang ``/generate`` chunks repeat the whole text so far and ``meta_info``."""
    before = len(stream.cumulative or "")
    stream.cumulative = str(payload.get("text") or "")
    ids = payload.get("output_ids")
    stream.ids = ids if isinstance(ids, list) else None
    meta = payload.get("meta_info")
    if isinstance(meta, dict):
        _take_usage(stream, meta)
    return len(stream.cumulative) > before or stream.usage.get("completion_tokens", 0) > 0


def _take_usage(stream: _Stream, usage: Mapping[str, Any]) -> None:
    """OpenAI ``usage`` or SGLang ``meta_info``: prompt, completion and cached tokens."""
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        value = usage.get(name)
        if isinstance(value, int):
            stream.usage[name] = value
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        stream.usage["cached_tokens"] = details["cached_tokens"]


def _finish(attempt: Attempt, stream: _Stream, clock: Clock) -> Answer:
    attempt.finish_s = clock()
    if attempt.first_token_s is None:
        attempt.first_token_s = attempt.finish_s
    text = stream.text()
    usage = stream.usage
    attempt.prompt_tokens = usage.get("prompt_tokens", attempt.input_tokens)
    attempt.completion_tokens = usage.get("completion_tokens", max(0, stream.chunks - 1))
    attempt.cached_tokens = usage.get("cached_tokens", 0)
    attempt.status = OK
    ids = stream.ids
    if ids is not None and len(ids) != attempt.completion_tokens:
        ids = None  # not the whole answer (an engine streaming increments): don't quote it
    return Answer(text, tuple(ids) if ids is not None else None)
