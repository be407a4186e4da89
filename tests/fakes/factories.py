"""Request factories for policy and dispatcher tests: deterministic, prefix-structured.

Token ids are derived from names with CRC-32, so the same arguments always build the same
prompt, requests with the same ``prefix_id`` share exactly ``prefix_tokens`` leading
tokens, and suffixes differ between request ids (the suffix of request ``rid`` never
matches another request's suffix in practice: 32-bit hashes of distinct strings).
"""

from __future__ import annotations

import zlib
from typing import Any

from fairserve.core.types import Request, make_request


def _token(label: str) -> int:
    return zlib.crc32(label.encode())


def prefix_tokens_of(prefix_id: int | str, count: int) -> list[int]:
    """The shared prefix ``prefix_id`` as ``count`` token ids."""
    return [_token(f"prefix/{prefix_id}/{i}") for i in range(count)]


def suffix_tokens_of(rid: str, count: int) -> list[int]:
    """The private part of request ``rid`` as ``count`` token ids."""
    return [_token(f"suffix/{rid}/{i}") for i in range(count)]


def prefix_request(
    rid: str,
    client: str,
    prefix_id: int | str,
    prefix_tokens: int,
    suffix_tokens: int,
    output_len: int,
    **extra: Any,
) -> Request:
    """A request whose prompt is a shared prefix followed by a private suffix.

    ``max_output_tokens`` equals ``output_len`` (the request runs to its maximum)."""
    tokens = prefix_tokens_of(prefix_id, prefix_tokens) + suffix_tokens_of(rid, suffix_tokens)
    return make_request(rid, client, tokens, output_len, output_len=output_len, **extra)


def unique_request(
    rid: str, client: str, input_tokens: int, output_len: int, **extra: Any
) -> Request:
    """A request sharing no prefix with any other."""
    return prefix_request(rid, client, f"unique/{rid}", 0, input_tokens, output_len, **extra)
