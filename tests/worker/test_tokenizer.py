"""The stand-in tokenizer: stable ids, prefix-preserving, reproducible synthetic output."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core import tokenizer
from fairserve.core.openai_api import MAX_OUTPUT_TOKENS, render_chat
from fairserve.core.tokenizer import (
    CHUNK_CHARS,
    VOCAB_SIZE,
    SyntheticOutput,
    pieces,
    token_key,
    tokenize,
)
from fairserve.core.types import TOKEN_BYTES, tokens_to_key

# Fragments that make every kind of piece and every kind of cut: words, punctuation,
# runs of spaces, tabs and newlines, non-ASCII letters.
FRAGMENTS = st.sampled_from(["word", "x", " ", "  ", "\n", "\t", ",", ".", "?!", "é", "中文", "_9"])
LONG_TEXTS = st.lists(FRAGMENTS, max_size=1500).map("".join)


def reference_ids(text: str) -> list[int]:
    """blake2b(piece) mod VOCAB_SIZE per piece: the tokenizer's contract, no caches."""
    return [
        int.from_bytes(hashlib.blake2b(p.encode(), digest_size=8).digest(), "little") % VOCAB_SIZE
        for p in pieces(text)
    ]


@given(st.text(max_size=200))
def test_pieces_cover_the_text(text: str) -> None:
    assert "".join(pieces(text)) == text


@given(st.text(max_size=100), st.text(max_size=100))
def test_a_longer_text_extends_the_token_ids(head: str, tail: str) -> None:
    """Equal text prefixes give equal token prefixes (except the cut piece), which is what
    prefix caching needs."""
    short, long = tokenize(head), tokenize(head + tail)
    assert long[: max(0, len(short) - 1)] == short[: max(0, len(short) - 1)]


def test_whole_words_keep_their_tokens() -> None:
    system = "You are a helpful assistant. Answer briefly."
    assert tokenize(system + " What is 2+2?")[: len(tokenize(system))] == tokenize(system)


def test_ids_are_in_the_vocabulary_and_one_per_piece() -> None:
    ids = tokenize("Hello, world!  How are you?\n")
    assert len(ids) == len(pieces("Hello, world!  How are you?\n")) == 9
    assert all(0 <= i < VOCAB_SIZE for i in ids)


def test_ids_are_the_same_in_another_process() -> None:
    """Not ``hash()``: that is salted per process and would break caching across workers."""
    code = "from fairserve.core.tokenizer import tokenize; print(tokenize('same text, same ids'))"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert other.stdout.strip() == str(tokenize("same text, same ids"))


def test_output_is_reproducible_by_request_id() -> None:
    a, b, c = SyntheticOutput("rid-1", 20), SyntheticOutput("rid-1", 20), SyntheticOutput("x", 20)
    assert a.text(0, 20) == b.text(0, 20) != c.text(0, 20)
    assert a.text(0, 5) + a.text(5, 20) == a.text(0, 20)
    assert a.token_ids(7) == a.token_ids()[:7]


def test_output_is_drawn_lazily_and_a_longer_output_extends_a_shorter_one() -> None:
    """Issue 18 item 2: creating the largest output costs what a small one does, and the
    engine's view of the key (length and slices) matches the key computed in full."""
    huge = SyntheticOutput("big", MAX_OUTPUT_TOKENS)
    lazy = huge.lazy_key()
    assert len(lazy) == MAX_OUTPUT_TOKENS * TOKEN_BYTES
    small = SyntheticOutput("big", 1000)
    assert huge.token_ids(1000) == small.token_ids()
    assert huge.text(250, 700) == small.text(250, 700)
    full = small.token_key()
    assert full == tokens_to_key(small.token_ids())
    view = small.lazy_key()
    for stop in (0, 3, 4, 257 * TOKEN_BYTES, len(full)):
        assert view[:stop] == full[:stop]
    assert view[9:1030] == full[9:1030]
    assert small.text(990, 5000) == small.text(990, 1000)  # clipped to the output


def test_output_tokens_are_the_tokens_of_the_output_text() -> None:
    """A follow-up prompt that quotes the answer tokenises back to the cached output."""
    out = SyntheticOutput("r", 12)
    assert tokenize(out.text(0, 12)) == out.token_ids()


def test_next_chat_turn_repeats_prompt_and_answer_tokens() -> None:
    out = SyntheticOutput("turn-1", 6)
    first = render_chat([("user", "hi there")])
    answer = out.text(0, 6)[1:]  # chat content drops the leading space
    second = render_chat([("user", "hi there"), ("assistant", answer), ("user", "more")])
    expected = tokenize(first) + out.token_ids()
    assert tokenize(second)[: len(expected)] == expected


@given(LONG_TEXTS, st.sampled_from([1, 2, 5, 16, CHUNK_CHARS]))
def test_texts_tokenized_in_chunks_give_the_ids_of_their_pieces(
    text: str, chunk_chars: int
) -> None:
    """Cutting between a non-space and a space never splits a piece, so the chunks'
    tokens joined are the whole text's (small chunks: texts many chunks long)."""
    default = tokenizer.CHUNK_CHARS
    tokenizer.CHUNK_CHARS = chunk_chars
    try:
        assert token_key(text) == tokens_to_key(reference_ids(text))
        assert tokenize(text) == reference_ids(text)
    finally:
        tokenizer.CHUNK_CHARS = default


def test_a_shared_prefix_is_tokenized_once() -> None:
    """The next turn of a conversation re-tokenizes only what it added."""
    document = " ".join(f"w{i % 97}, and" for i in range(4000))
    token_key(document)
    before = len(tokenizer._CHUNK_KEYS)
    longer = document + " One more question?"
    assert token_key(longer) == tokens_to_key(reference_ids(longer))
    assert len(tokenizer._CHUNK_KEYS) - before <= 2
    assert len(document) > 20 * CHUNK_CHARS


def test_the_memo_of_chunks_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenizer, "MAX_CACHED_CHUNKS", 16)
    monkeypatch.setattr(tokenizer, "_CHUNK_KEYS", tokenizer._ChunkKeys())
    for i in range(200):
        text = f"request {i}: " + "some words " * 100
        assert tokenize(text) == reference_ids(text)
        assert len(tokenizer._CHUNK_KEYS) <= 16


def test_text_with_nowhere_to_cut_is_tokenized_but_not_remembered() -> None:
    """A huge run without spaces (say base64) must not pin its text in the memos."""
    blob = "A" * (20 * CHUNK_CHARS) + " tail"
    before_chunks, before_pieces = len(tokenizer._CHUNK_KEYS), len(tokenizer._PIECE_IDS)
    assert token_key(blob) == tokens_to_key(reference_ids(blob))
    assert not any(len(chunk) > tokenizer.MAX_CACHED_CHUNK_CHARS for chunk in tokenizer._CHUNK_KEYS)
    assert not any(len(piece) > tokenizer.MAX_CACHED_PIECE_CHARS for piece in tokenizer._PIECE_IDS)
    assert len(tokenizer._CHUNK_KEYS) <= before_chunks + 1
    assert len(tokenizer._PIECE_IDS) <= before_pieces + 1
