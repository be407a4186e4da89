"""Request and client types seen by every policy and dispatcher.

A request's prompt is kept as a *token key*: the token ids packed as little-endian uint32
``bytes``. Comparing keys is a ``memcmp`` in C, which is what makes radix matching fast
enough for a DLPM decision over thousands of waiting requests (DESIGN §8).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fairserve.core.errors import ConfigError

TOKEN_BYTES = 4
"""Bytes per token in a token key (uint32, little-endian)."""

ANONYMOUS_CLIENT = "anonymous"


def tokens_to_key(tokens: Iterable[int]) -> bytes:
    """Pack token ids into a token key (4 bytes per token); ids must fit in uint32."""
    try:
        packed = array("I", tokens)
    except OverflowError:
        raise ConfigError("token ids must be integers within 0..2**32-1") from None
    if packed.itemsize != TOKEN_BYTES:  # pragma: no cover - exotic platforms only
        raise RuntimeError("array('I') is not 32-bit on this platform")
    return packed.tobytes()


def key_to_tokens(key: bytes) -> list[int]:
    """Unpack a token key into token ids."""
    if len(key) % TOKEN_BYTES:
        raise ConfigError(f"token key length {len(key)} is not a multiple of {TOKEN_BYTES}")
    return array("I", key).tolist()


def key_len(key: bytes) -> int:
    """Number of tokens in a token key."""
    return len(key) // TOKEN_BYTES


@dataclass(frozen=True, slots=True)
class Client:
    """A tenant of the shared service; ``weight`` scales its fair share (VTC weights)."""

    name: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        validate_weight(self.name, self.weight)


def validate_weight(client: str, weight: float) -> None:
    """Reject zero, negative and non-finite weights with a message that names the client."""
    if not math.isfinite(weight) or weight <= 0:
        raise ConfigError(f"weight of client {client!r} must be a positive number, got {weight}")


@dataclass(slots=True, eq=False)
class Request:
    """One inference call as the scheduling core sees it.

    Identity semantics (``eq=False``): two requests are the same only if they are the
    same object, so they can live in sets and dicts keyed by object.

    ``output_len`` is the true output length where a host knows it (simulation, oracle
    prediction); live hosts leave it ``None`` and only ``max_output_tokens`` is known.
    """

    id: str
    client: str
    prompt_key: bytes
    max_output_tokens: int
    arrival_s: float = 0.0
    app: str | None = None
    app_type: str | None = None
    output_len: int | None = None
    cached_tokens: int = 0
    output_tokens: int = 0
    admit_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_output_tokens < 0:
            raise ConfigError(
                f"request {self.id!r}: max_output_tokens must be >= 0, got {self.max_output_tokens}"
            )
        if len(self.prompt_key) % TOKEN_BYTES:
            raise ConfigError(f"request {self.id!r}: prompt key is not a whole number of tokens")

    @property
    def input_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.prompt_key) // TOKEN_BYTES

    @property
    def expected_output_tokens(self) -> int:
        """The true output length when known, else the requested maximum."""
        return self.output_len if self.output_len is not None else self.max_output_tokens

    @property
    def extend_tokens(self) -> int:
        """Prompt tokens that must be computed (not served from the prefix cache)."""
        return max(0, self.input_tokens - self.cached_tokens)


def make_request(
    rid: str,
    client: str,
    tokens: Sequence[int],
    max_output_tokens: int,
    arrival_s: float = 0.0,
    **extra: object,
) -> Request:
    """Build a request from token ids (convenience for hosts and tests)."""
    return Request(
        id=rid,
        client=client,
        prompt_key=tokens_to_key(tokens),
        max_output_tokens=max_output_tokens,
        arrival_s=arrival_s,
        **extra,  # type: ignore[arg-type]
    )
