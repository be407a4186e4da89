"""Synthetic token ids, packed as token keys (uint32 little-endian bytes).

Everything here works on ``bytes``: fresh tokens come from large numpy draws and are sliced
and concatenated as bytes, because building prompts from Python lists would dominate the
cost of simulating an hour of tree-of-thought traffic.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fairserve.core.types import TOKEN_BYTES
from fairserve.workloads.spec import VOCAB_SIZE

_BLOCK_TOKENS = 1024
"""Prefix sources grow by whole blocks so their content never depends on who asked first."""

# Stream purposes (a word of each stream's SeedSequence entropy, so the streams differ).
ARRIVALS = 0
PROGRAMS = 1
PREFIX = 2
DOCUMENTS = 3
NAMED_PREFIX = 4
"""A ``[[prefixes]]`` entry's tokens (the entry's name stands where a client's would)."""


def random_key(rng: np.random.Generator, n_tokens: int) -> bytes:
    """``n_tokens`` uniform token ids in ``[0, VOCAB_SIZE)`` as a token key."""
    ids = rng.integers(0, VOCAB_SIZE, size=n_tokens, dtype=np.uint32)
    return ids.astype("<u4", copy=False).tobytes()


def stream_seed(seed: int, client: str, purpose: int, index: int) -> np.random.SeedSequence:
    """Seed of one stream (``purpose``, ``index``) of one client.

    It depends on the workload seed and the client's *name*, never on the client's position
    in the file, so adding a client leaves the others' traffic unchanged. The entropy always
    has five words: SeedSequence ignores trailing zeros, so variable-length entropy could
    make two streams collide.
    """
    digest = hashlib.blake2b(client.encode(), digest_size=8).digest()
    name_words = [int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little")]
    return np.random.SeedSequence([seed, *name_words, purpose, index])


def stream_rng(seed: int, client: str, purpose: int, index: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(stream_seed(seed, client, purpose, index)))


class PrefixSource:
    """An endless deterministic token sequence; ``prefix(n)`` is its first ``n`` tokens.

    A client's shared prefix of any length comes from one source, so shorter prefixes are
    prefixes of longer ones (a system prompt followed by more shared context).
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._key = b""

    def prefix(self, n_tokens: int) -> bytes:
        need = n_tokens * TOKEN_BYTES
        if len(self._key) < need:
            missing = need - len(self._key)
            blocks = -(-missing // (_BLOCK_TOKENS * TOKEN_BYTES))
            parts = [random_key(self._rng, _BLOCK_TOKENS) for _ in range(blocks)]
            self._key += b"".join(parts)
        return self._key[:need]


class TokenPool:
    """Fresh token ids for one stream, drawn in large chunks and handed out as slices.

    One numpy draw per ``chunk_tokens`` instead of one per prompt: a draw costs several
    microseconds, which would dominate generating hundreds of thousands of short prompts.
    """

    def __init__(self, rng: np.random.Generator, chunk_tokens: int = 1 << 16) -> None:
        self._rng = rng
        self._chunk_tokens = chunk_tokens
        self._key = b""
        self._pos = 0

    def take(self, n_tokens: int) -> bytes:
        end = self._pos + n_tokens * TOKEN_BYTES
        if end > len(self._key):
            fresh = random_key(self._rng, max(n_tokens, self._chunk_tokens))
            self._key = self._key[self._pos :] + fresh
            self._pos, end = 0, n_tokens * TOKEN_BYTES
        piece = self._key[self._pos : end]
        self._pos = end
        return piece
