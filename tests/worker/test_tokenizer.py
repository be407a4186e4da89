"""The stand-in tokenizer: stable ids, prefix-preserving, reproducible synthetic output."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.tokenizer import (
    VOCAB_SIZE,
    SyntheticOutput,
    pieces,
    render_chat,
    tokenize,
)


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
