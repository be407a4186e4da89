"""Response bodies in the shapes SGLang and OpenAI clients parse.

* native ``/generate``: ``{"text", "output_ids", "meta_info": {...}}``; a stream repeats
  that shape with the *cumulative* text so far (SGLang's behaviour);
* ``/v1/completions`` and ``/v1/chat/completions``: OpenAI objects with ``usage``; streams
  carry *deltas* (``chat.completion.chunk`` with ``delta.content``).

Everything here is a pure function of a :class:`~fairserve.worker.runtime.Ticket`, so the
handlers only decide *when* to write.
"""

from __future__ import annotations

from typing import Any

from fairserve.api.jsonsafe import dumps as dumps  # JSON text under the one non-finite rule
from fairserve.core.openai_api import error_body as error_body  # re-exported for handlers
from fairserve.worker.runtime import Ticket

SSE_DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + dumps(payload).encode() + b"\n\n"


def openai_finish(ticket: Ticket) -> str | None:
    reason = ticket.finish_reason
    return None if reason is None else str(reason["type"])


def usage(ticket: Ticket) -> dict[str, Any]:
    prompt = ticket.req.input_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": ticket.produced,
        "total_tokens": prompt + ticket.produced,
        "prompt_tokens_details": {"cached_tokens": ticket.req.cached_tokens},
    }


# ------------------------------------------------------------------ native
def native_body(ticket: Ticket) -> dict[str, Any]:
    """The ``/generate`` response (or stream chunk: cumulative text so far)."""
    req = ticket.req
    latency = ticket.latency_s
    return {
        "text": ticket.output.text(0, ticket.produced),
        "output_ids": ticket.output.token_ids(ticket.produced),
        "meta_info": {
            "id": req.id,
            "prompt_tokens": req.input_tokens,
            "completion_tokens": ticket.produced,
            "cached_tokens": req.cached_tokens,
            "finish_reason": ticket.finish_reason,
            "e2e_latency": latency if latency is not None else 0.0,
        },
    }


# ------------------------------------------------------------------ OpenAI
def completion_body(ticket: Ticket, model: str, created: int) -> dict[str, Any]:
    """The whole answer: the chunk shape over all produced tokens, plus usage."""
    body = completion_chunk(ticket, model, created, 0, ticket.produced)
    body["usage"] = usage(ticket)
    return body


def completion_chunk(
    ticket: Ticket, model: str, created: int, start: int, stop: int
) -> dict[str, Any]:
    return {
        "id": f"cmpl-{ticket.req.id}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": ticket.output.text(start, stop),
                "logprobs": None,
                "finish_reason": openai_finish(ticket),
            }
        ],
    }


def chat_content(ticket: Ticket, start: int, stop: int) -> str:
    """The answer text; the generated leading space belongs to the template, not the answer
    (see ``tokenizer``), so the first token's space is dropped."""
    text = ticket.output.text(start, stop)
    return text[1:] if start == 0 and text.startswith(" ") else text


def chat_body(ticket: Ticket, model: str, created: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{ticket.req.id}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": chat_content(ticket, 0, ticket.produced),
                },
                "logprobs": None,
                "finish_reason": openai_finish(ticket),
            }
        ],
        "usage": usage(ticket),
    }


def chat_chunk(
    ticket: Ticket,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish: str | None = None,
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{ticket.req.id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def usage_chunk(ticket: Ticket, model: str, created: int) -> dict[str, Any]:
    """The extra last chunk of ``stream_options.include_usage``: no choices, usage only."""
    prefix = "chatcmpl" if ticket.spec.route == "chat" else "cmpl"
    kind = "chat.completion.chunk" if ticket.spec.route == "chat" else "text_completion"
    return {
        "id": f"{prefix}-{ticket.req.id}",
        "object": kind,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(ticket),
    }
