"""Deterministic stand-ins for a tokenizer and a model's output text: the simulated worker's.

The simulated worker must never download a tokenizer, yet prefix caching only works if
equal text prefixes give equal token prefixes. So text is split into word and punctuation
*pieces* (leading whitespace attached, as byte-pair tokenizers do) and each piece maps to a
stable id: ``blake2b(piece) mod VOCAB_SIZE``. The same text gives the same ids in every
process and on every machine (``hash()`` would not: it is salted per process).

The router does not tokenize: it keys text prompts by their text blocks
(:mod:`fairserve.core.prefix_key`, whose units are estimated tokens) and learns the real
counts from the worker's ``usage``. This module is the simulated worker's, off the router's
path (and the tests', to count what the worker will report).

Output text is synthetic: words drawn from a fixed list by a generator seeded with the
request id, so a request's output is reproducible. Each output token *is* one such piece,
and its id is the piece's id, so a follow-up call that quotes an answer (a chat's next
turn) tokenises it back to exactly the output tokens the engine cached.

Chat messages are rendered with one fixed template (:func:`fairserve.core.openai_api.render_chat`,
``<|role|> content\\n`` per message and a trailing ``<|assistant|>``); an answer is generated as
`` word word ...`` (leading space), so the next turn's rendering ``<|assistant|> word word ...``
repeats the generated tokens.
"""

from __future__ import annotations

import hashlib
import re
from itertools import islice

import numpy as np

from fairserve.core.types import TOKEN_BYTES, key_to_tokens, tokens_to_key
from fairserve.core.words import WORDS

VOCAB_SIZE = 32000
"""Token ids are in ``[0, VOCAB_SIZE)``, like a Llama-2-sized vocabulary."""

_PIECE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")
"""A word or a punctuation mark with its leading whitespace, or trailing whitespace."""


MAX_CACHED_PIECES = 1 << 18
"""Pieces whose ids are remembered; past this many the memo starts over (a service's
working vocabulary is far smaller, so this only bounds memory against odd traffic)."""
MAX_CACHED_PIECE_CHARS = 64
"""Longer pieces (a run of characters without a space or punctuation) are not remembered."""


def _hash_id(piece: str) -> int:
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % VOCAB_SIZE


class _PieceIds(dict[str, int]):
    """piece -> id, each hashed once. A dict looked up through ``map`` keeps the
    per-piece work in C: the worker tokenizes every prompt, and prompts run to thousands
    of pieces (a per-piece Python call was most of the cost of a long prompt)."""

    def __missing__(self, piece: str) -> int:
        value = _hash_id(piece)
        if len(piece) <= MAX_CACHED_PIECE_CHARS:
            if len(self) >= MAX_CACHED_PIECES:
                self.clear()
            self[piece] = value
        return value


_PIECE_IDS = _PieceIds()


def piece_id(piece: str) -> int:
    """The token id of one piece (stable across processes)."""
    return _PIECE_IDS[piece]


def pieces(text: str) -> list[str]:
    """``text`` split into pieces; joining them gives ``text`` back."""
    return _PIECE.findall(text)


CHUNK_CHARS = 512
"""Texts are tokenized in chunks of at least this many characters (see :func:`token_key`)."""
MAX_CACHED_CHUNK_CHARS = 2 * CHUNK_CHARS
"""A longer chunk (text with no place to cut) is tokenized without being remembered."""
MAX_CACHED_CHUNKS = 1 << 13
"""Chunk keys remembered: some 10 MB with their text for prose, at most about 70 MB
whatever the text (4-byte characters, a token per character); when full, the older half
is dropped."""

_CHUNK_END = re.compile(r"\S(?=\s)")
"""A non-space followed by a space: no piece spans the position between them."""


class _ChunkKeys(dict[str, bytes]):
    """chunk -> its token key, tokenized once."""

    def __missing__(self, chunk: str) -> bytes:
        if len(self) >= MAX_CACHED_CHUNKS:
            for old in list(islice(self, len(self) // 2)):
                del self[old]
        self[chunk] = key = _chunk_key(chunk)
        return key


def _chunk_key(chunk: str) -> bytes:
    return tokens_to_key(map(_PIECE_IDS.__getitem__, _PIECE.findall(chunk)))


_CHUNK_KEYS = _ChunkKeys()


def token_key(text: str) -> bytes:
    """The token key (:func:`~fairserve.core.types.tokens_to_key`) of ``text``.

    Why chunks: the simulated worker tokenizes every prompt, prompts run to
    thousands of pieces, and most of a prompt is usually a prefix seen before (a shared
    system prompt or document, the earlier turns of a conversation). A text is cut where no
    piece can span the cut (between a non-space and a space), at the first such place at
    least ``CHUNK_CHARS`` characters after the previous cut; cuts therefore depend only on
    the text before them, so texts that share a long prefix share its chunks, and each
    chunk is tokenized once (the per-piece regular expression is most of the cost of a long
    prompt). Tokenizing the chunks apart gives exactly the pieces of the whole.
    """
    if len(text) <= CHUNK_CHARS:
        return _CHUNK_KEYS[text]
    keys, start, end_of_text = [], 0, len(text)
    while start < end_of_text:
        cut = _CHUNK_END.search(text, start + CHUNK_CHARS - 1)
        end = cut.end() if cut is not None else end_of_text
        chunk = text[start:end]
        keys.append(
            _CHUNK_KEYS[chunk] if end - start <= MAX_CACHED_CHUNK_CHARS else _chunk_key(chunk)
        )
        start = end
    return b"".join(keys)


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``; a text that extends another extends its token ids too,
    except possibly at the last piece of the shorter one (a word cut in the middle)."""
    return key_to_tokens(token_key(text))


_OUTPUT_PIECES = tuple(" " + word for word in WORDS)
_OUTPUT_IDS = np.array([piece_id(p) for p in _OUTPUT_PIECES], dtype="<u4")


OUTPUT_BLOCK_TOKENS = 256
"""Output tokens are drawn in blocks of this many, each from its own seeded generator."""


class SyntheticOutput:
    """The output a request will produce: up to ``max_tokens`` pieces chosen by its id.

    Drawn lazily, block by block as tokens are asked for: a request may ask for millions of
    tokens (as much as the context allows) and creating its output must cost the same as a
    small one's, or one request stalls the worker's event loop. Block ``b`` comes from a
    generator seeded with (the rid's hash, ``b``), so any token range is reproducible on
    its own and a longer output extends a shorter one with the same rid."""

    __slots__ = ("_blocks", "_seed", "max_tokens")

    def __init__(self, rid: str, max_tokens: int) -> None:
        self._seed = int.from_bytes(hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest())
        self.max_tokens = max_tokens
        self._blocks: list[np.ndarray] = []

    def _choices(self, start: int, stop: int) -> np.ndarray:
        """Word indices of output tokens ``start .. stop-1`` (clipped to the output)."""
        stop = max(0, min(stop, self.max_tokens))
        start = max(0, min(start, stop))
        last = -(-stop // OUTPUT_BLOCK_TOKENS)
        while len(self._blocks) < last:
            rng = np.random.default_rng((self._seed, len(self._blocks)))
            block = rng.integers(0, len(_OUTPUT_PIECES), size=OUTPUT_BLOCK_TOKENS, dtype=np.uint16)
            self._blocks.append(block)
        first = start // OUTPUT_BLOCK_TOKENS
        if first >= last:
            return np.empty(0, dtype=np.uint16)
        joined = np.concatenate(self._blocks[first:last])
        offset = first * OUTPUT_BLOCK_TOKENS
        return joined[start - offset : stop - offset]

    def token_ids(self, count: int | None = None) -> list[int]:
        """The first ``count`` output token ids (all of them by default)."""
        chosen = self._choices(0, self.max_tokens if count is None else count)
        ids: list[int] = _OUTPUT_IDS[chosen].tolist()
        return ids

    def key(self, start: int, stop: int) -> bytes:
        """Output tokens ``start .. stop-1`` as a token key (``tokens_to_key`` layout)."""
        key: bytes = _OUTPUT_IDS[self._choices(start, stop)].tobytes()
        return key

    def token_key(self) -> bytes:
        """All output token ids as a token key (``core.types.tokens_to_key`` layout)."""
        return self.key(0, self.max_tokens)

    def lazy_key(self) -> LazyOutputKey:
        """The output's token key as a view that computes only the part that is read."""
        return LazyOutputKey(self)

    def text(self, start: int, stop: int) -> str:
        """The text of output tokens ``start .. stop-1`` (starts with a space)."""
        return "".join(_OUTPUT_PIECES[i] for i in self._choices(start, stop).tolist())


class LazyOutputKey:
    """A request's whole output key as the simulated engine uses it: its length in bytes
    and slices (the engine caches prompt + the output produced when a request finishes,
    ``sim.kvpool``), computed only for the bytes sliced."""

    __slots__ = ("_output",)

    def __init__(self, output: SyntheticOutput) -> None:
        self._output = output

    def __len__(self) -> int:
        return self._output.max_tokens * TOKEN_BYTES

    def __getitem__(self, index: slice) -> bytes:
        if not isinstance(index, slice):
            raise TypeError("an output key is read in slices")
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("an output key is read in contiguous slices")
        if start >= stop:
            return b""
        first, last = start // TOKEN_BYTES, -(-stop // TOKEN_BYTES)
        raw = self._output.key(first, last)
        skip = first * TOKEN_BYTES
        return raw[start - skip : stop - skip]
