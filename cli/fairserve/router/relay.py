"""Reading ``usage`` out of upstream answers, and filling it in where it is missing.

Accounting needs each request's prompt, cached and completion tokens. Upstreams report them
in ``usage`` (OpenAI), or ``meta_info`` (SGLang's ``/generate``). For streams the router
asks for the usage chunk upstream (``stream_options.include_usage``) and drops it again if
the client did not ask for it; an upstream that sends none gets one synthesised from the
router's estimate (prompt tokens from its prefix key, one token per content chunk).

The SSE relay is the hot path: events are split on blank lines and only the few that can
matter are parsed (the ones that mention ``usage``, and those before the first token).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fairserve.core.json_body import decode_whole
from fairserve.core.openai_api import Route
from fairserve.core.prefix_key import estimate_tokens
from fairserve.router.accounting import Usage

DONE = b"data: [DONE]"
_ANSWER_DECODER = json.JSONDecoder()
"""``json.loads``'s own rules for workers' answers (``NaN`` included)."""
_SEP = b"\n\n"


def _int(value: object, default: int = 0) -> int:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
    )


def usage_of(payload: Any, route: Route) -> Usage | None:
    """The usage an upstream reported in a body or chunk, or None."""
    if not isinstance(payload, dict):
        return None
    if route == "generate":
        meta = payload.get("meta_info")
        if not isinstance(meta, dict) or "completion_tokens" not in meta:
            return None
        return Usage(
            _int(meta.get("prompt_tokens")),
            _int(meta.get("cached_tokens")),
            _int(meta.get("completion_tokens")),
        )
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        _int(usage.get("prompt_tokens")), _int(cached), _int(usage.get("completion_tokens"))
    )


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


class InvalidAnswer(ValueError):
    """A worker's 200 answer that is not what the API promises (an HTML error page, broken
    JSON): never relayed to the client; the router tries another worker or answers 502."""


def complete_body(data: bytes, route: Route, prompt_tokens: int) -> tuple[bytes, Usage]:
    """A non-streamed answer with its usage; ``usage`` is added when the upstream left it
    out (completion tokens estimated from the answer's text as its prompt tokens were, one
    per key unit: :mod:`fairserve.core.prefix_key`). Raises
    :class:`InvalidAnswer` for a body that is not a JSON object."""
    try:
        # UTF-8, as workers send: no encoding sniffing
        payload = decode_whole(_ANSWER_DECODER, data.decode())
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidAnswer(f"a {len(data)}-byte body that is not JSON") from None
    if not isinstance(payload, dict):
        raise InvalidAnswer(f"JSON that is not an object ({type(payload).__name__})")
    usage = usage_of(payload, route)
    if usage is not None:
        return data, usage
    usage = Usage(prompt_tokens, 0, estimate_tokens(_answer_text(payload)))
    if route != "generate" and isinstance(payload, dict):
        payload["usage"] = usage_dict(usage)
        data = json.dumps(payload).encode()
    return data, usage


def _answer_text(payload: Any) -> str:
    if not isinstance(payload, dict):
        return ""
    if isinstance(payload.get("text"), str):
        return str(payload["text"])
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    message = choice.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return str(message["content"])
    return str(choice.get("text") or "")


@dataclass(slots=True)
class StreamState:
    """What the relay learned from a stream so far."""

    usage: Usage | None = None
    chunks: int = 0
    first_token: bool = False
    done: bool = False
    last_event: bytes = b""


class SseRelay:
    """Turns upstream SSE bytes into the bytes the client gets, watching for usage."""

    def __init__(self, route: Route, want_usage: bool, prompt_tokens: int) -> None:
        self.route = route
        self.want_usage = want_usage
        self.prompt_tokens = prompt_tokens
        self.state = StreamState()
        self._buf = b""

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward for ``chunk`` (whole events only; the rest is kept)."""
        buf = self._buf + chunk if self._buf else chunk
        if b"\r\n" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        end = buf.rfind(_SEP)
        if end < 0:
            self._buf = buf
            return b""
        self._buf = buf[end + 2 :]
        events = buf[:end].split(_SEP)
        out = [e for e in events if e and self._keep(e)]
        return _SEP.join(out) + _SEP if out else b""

    def close(self) -> bytes:
        """Bytes that end the stream: a pending partial event, a synthesised usage chunk
        when the client asked for one and the upstream sent none, and ``[DONE]``."""
        tail = self.feed(_SEP) if self._buf.strip() else b""
        if self.route == "generate":
            self._final_native()
        if self.state.usage is None and self.want_usage and self.route != "generate":
            chunk = {"object": "usage", "choices": [], "usage": usage_dict(self.usage())}
            tail += b"data: " + json.dumps(chunk).encode() + _SEP
        return tail + DONE + _SEP

    def usage(self) -> Usage:
        """Reported usage, else the estimate."""
        if self.state.usage is not None:
            return self.state.usage
        return Usage(self.prompt_tokens, 0, self.state.chunks)

    # ------------------------------------------------------------------ events
    def _keep(self, event: bytes) -> bool:
        state = self.state
        if event.startswith(DONE):
            state.done = True
            return False  # close() sends it, after a synthesised usage chunk if needed
        if not event.startswith(b"data:"):
            return True  # comments, event names: pass through
        if self.route == "generate":
            state.chunks += 1
            state.last_event = event
            if not state.first_token:
                state.first_token = _has_token(_json(event), self.route)
            return True
        if b'"usage"' in event:
            payload = _json(event)
            usage = usage_of(payload, self.route)
            if usage is not None:
                state.usage = usage
                if isinstance(payload, dict) and payload.get("choices") == []:
                    return self.want_usage
        state.chunks += 1
        if not state.first_token:
            state.first_token = _has_token(_json(event), self.route)
        return True

    def _final_native(self) -> None:
        if self.state.usage is None and self.state.last_event:
            self.state.usage = usage_of(_json(self.state.last_event), "generate")


def _json(event: bytes) -> Any:
    data = event[5:].strip() if event.startswith(b"data:") else event
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def _has_token(payload: Any, route: Route) -> bool:
    """Whether a chunk carries output (TTFT is when the first one arrives)."""
    if not isinstance(payload, dict):
        return False
    if route == "generate":
        meta = payload.get("meta_info")
        return isinstance(meta, dict) and _int(meta.get("completion_tokens")) > 0
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content"))
    return bool(choice.get("text"))
