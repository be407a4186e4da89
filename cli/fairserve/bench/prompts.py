"""How a workload call becomes a request body, so that shared prefixes stay shared on the wire.

Workload prompts are token ids (``Call.prompt_key``). The engine behind the URL can only
reuse its prefix cache if two prompts that share leading ids also share leading *wire*
tokens, so every encoding here maps each id to the same wire piece wherever it appears:

* ``generate`` (SGLang native): the ids themselves, as ``input_ids``;
* ``completions``: text, one common English word per id (`` the``, `` of``...): one token
  per id on the simulated worker's tokenizer, one or two on a real BPE tokenizer, and equal
  id prefixes are equal text prefixes either way;
* ``chat``: the same text as ``user`` messages.

Closed-loop programs quote their ancestors' answers (a chat's next turn contains the last
reply; a tree-of-thought child extends its parent's output). The workload writes the planned
answer ids (``Call.output_key``) into the child's prompt; here they are replaced by what the
server *actually* answered, as a real client would send, so the child's prompt extends
exactly what the engine cached (prompt + output) and the cache can serve it. In chat, a
quoted answer becomes an ``assistant`` message, which the chat template renders as the same
tokens the engine generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairserve.api import paths
from fairserve.core.openai_api import Route
from fairserve.core.types import TOKEN_BYTES
from fairserve.core.words import WORDS
from fairserve.workloads.model import Call, Program

Api = Route
APIS: tuple[Api, ...] = ("completions", "chat", "generate")

PATHS: dict[Api, str] = paths.GENERATION

_NOT_PROMPT_WORDS = frozenset({"states", "united", "john"})
"""Left out of prompt text since bench first wrote it: keeping the selection keeps the text,
and so the token ids, that a given workload sends."""
_WORDS = tuple(word for word in WORDS if word not in _NOT_PROMPT_WORDS)[:256]
_PIECES = np.array([" " + word for word in _WORDS], dtype=object)


@dataclass(frozen=True, slots=True)
class Answer:
    """What the server returned for a call: the text, and its token ids when it said them."""

    text: str
    ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of a prompt: planned tokens, or (``answer`` set) an ancestor's real answer."""

    key: bytes
    answer: Answer | None = None


def key_ids(key: bytes) -> list[int]:
    ids: list[int] = np.frombuffer(key, dtype="<u4").tolist()
    return ids


def key_text(key: bytes) -> str:
    """`` word word ...``: one word per token id, each id always the same word."""
    if not key:
        return ""
    ids = np.frombuffer(key, dtype="<u4") % len(_PIECES)
    return "".join(_PIECES[ids].tolist())


def ancestors(program: Program) -> dict[str, tuple[str, ...]]:
    """Every call's transitive ``after`` set, in program order (calls are topological)."""
    order = {call.id: i for i, call in enumerate(program.calls)}
    found: dict[str, set[str]] = {}
    for call in program.calls:
        mine: set[str] = set()
        for parent in call.after:
            mine.add(parent)
            mine.update(found.get(parent, ()))
        found[call.id] = mine
    return {cid: tuple(sorted(ids, key=order.__getitem__)) for cid, ids in found.items()}


def segments(call: Call, quoted: Sequence[tuple[bytes, Answer]]) -> list[Segment]:
    """``call``'s prompt split at each ancestor's planned answer (``quoted``: planned output
    key and real answer, in program order), the answers swapped in."""
    prompt, pos, out = call.prompt_key, 0, []
    for planned, answer in quoted:
        at = _find_aligned(prompt, planned, pos)
        if at < 0:
            continue
        if at > pos:
            out.append(Segment(prompt[pos:at]))
        out.append(Segment(planned, answer))
        pos = at + len(planned)
    if pos < len(prompt) or not out:
        out.append(Segment(prompt[pos:]))
    return out


def _find_aligned(haystack: bytes, needle: bytes, start: int) -> int:
    """The first token-aligned occurrence of ``needle`` at or after ``start``, or -1."""
    if not needle:
        return -1
    at = haystack.find(needle, start)
    while at >= 0 and at % TOKEN_BYTES:
        at = haystack.find(needle, at + 1)
    return at


def request_body(api: Api, parts: Sequence[Segment], max_tokens: int) -> dict[str, Any]:
    """The JSON body for ``api``: streamed, ``max_tokens`` exactly (``ignore_eos``), usage on."""
    if api == "generate":
        return {
            "input_ids": generate_ids(parts),
            "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True},
            "stream": True,
        }
    body: dict[str, Any] = {
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        body["messages"] = chat_messages(parts)
    else:
        body["prompt"] = "".join(_text(p) for p in parts)
    return body


def generate_ids(parts: Sequence[Segment]) -> list[int]:
    ids: list[int] = []
    for part in parts:
        real = part.answer.ids if part.answer is not None else None
        ids.extend(real if real is not None else key_ids(part.key))
    return ids


def chat_messages(parts: Sequence[Segment]) -> list[dict[str, str]]:
    """Planned runs as ``user`` turns, quoted answers as ``assistant`` turns (merged when
    adjacent with the same role)."""
    messages: list[dict[str, str]] = []
    for part in parts:
        role = "user" if part.answer is None else "assistant"
        text = _text(part) if part.answer is None else part.answer.text.lstrip(" ")
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += text if role == "user" else " " + text
        else:
            messages.append({"role": role, "content": text.lstrip(" ")})
    return messages


def _text(part: Segment) -> str:
    return part.answer.text if part.answer is not None else key_text(part.key)
