"""Text prompts keyed by their 4-byte text blocks: what the router's prefix trees see."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.openai_api import parse_chat, parse_completion, parse_generate, render_chat
from fairserve.core.prefix_key import TEXT_UNIT_BYTES, estimate_tokens, text_key
from fairserve.core.radix import RadixTree
from fairserve.core.tokenizer import tokenize
from fairserve.core.types import TOKEN_BYTES, key_len, tokens_to_key

NO_HEADERS: dict[str, str] = {}
DOCUMENT = " ".join(f"word{i % 97}" for i in range(2000)) + ". "
"""A long shared document (about 13 KB), as in the router benchmark's prompts."""
TEXTS = st.text(st.characters(exclude_categories=["Cs"]), max_size=200)
"""Any valid Unicode text (lone surrogates are refused before keying)."""


def common_units(a: bytes, b: bytes) -> int:
    units = 0
    while (
        units < min(key_len(a), key_len(b))
        and a[units * 4 : units * 4 + 4] == b[units * 4 : units * 4 + 4]
    ):
        units += 1
    return units


def test_a_unit_is_four_bytes_of_utf8_and_the_last_is_padded_with_a_byte_utf8_never_has() -> None:
    assert TEXT_UNIT_BYTES == TOKEN_BYTES
    assert text_key("abcd") == b"abcd"
    assert text_key("abcde") == b"abcde\xff\xff\xff"
    assert text_key("é") == "é".encode() + b"\xff\xff"
    assert text_key("") == b""
    # A NUL (valid in JSON text) does not collide with the padding.
    assert text_key("abc") != text_key("abc\x00")


def test_shared_long_prefixes_share_router_blocks_and_worker_tokens() -> None:
    first, second = DOCUMENT + "Summarise it.", DOCUMENT + "Translate it."
    shared_bytes = len(DOCUMENT.encode())
    assert common_units(text_key(first), text_key(second)) >= shared_bytes // TEXT_UNIT_BYTES
    # The router's tree finds the shared document as a match of that many units...
    tree = RadixTree()
    tree.insert(text_key(first))
    assert tree.match_len(text_key(second)) == common_units(text_key(first), text_key(second))
    # ...and the simulated worker's cache shares the document's tokens too.
    worker_first, worker_second = tokenize(first), tokenize(second)
    assert (
        worker_first[: len(tokenize(DOCUMENT)) - 1] == worker_second[: len(tokenize(DOCUMENT)) - 1]
    )


def test_distinct_prompts_get_distinct_keys_from_their_first_difference() -> None:
    a, b = "[1] " + DOCUMENT, "[2] " + DOCUMENT
    assert text_key(a) != text_key(b)
    assert common_units(text_key(a), text_key(b)) == 0  # they differ in the first block


@given(TEXTS, TEXTS)
def test_distinct_texts_have_distinct_keys(a: str, b: str) -> None:
    assert (text_key(a) == text_key(b)) == (a == b)


@given(TEXTS, TEXTS)
def test_a_text_that_extends_another_extends_its_key_except_possibly_the_last_block(
    text: str, more: str
) -> None:
    short, long = text_key(text), text_key(text + more)
    whole = key_len(short) - (1 if len(text.encode()) % TEXT_UNIT_BYTES else 0)
    assert long.startswith(short[: whole * TOKEN_BYTES])
    assert len(long) >= len(short)


@given(TEXTS)
def test_the_token_estimate_is_the_number_of_key_units(text: str) -> None:
    assert estimate_tokens(text) == key_len(text_key(text))
    assert key_len(text_key(text)) == -(-len(text.encode()) // 4)


def test_a_chats_next_turn_extends_the_key_of_the_turn_before() -> None:
    turn = [("system", "Be brief."), ("user", DOCUMENT + "Summarise it.")]
    body = {"messages": [{"role": r, "content": c} for r, c in turn]}
    spec = parse_chat(body, NO_HEADERS)
    assert spec.prompt_text == render_chat(turn)
    assert spec.prompt_key == text_key(render_chat(turn))
    answer = " the cat sat"
    after = [*turn, ("assistant", answer.lstrip()), ("user", "Shorter.")]
    following = parse_chat({"messages": [{"role": r, "content": c} for r, c in after]}, NO_HEADERS)
    shared = common_units(spec.prompt_key, following.prompt_key)
    assert shared >= key_len(spec.prompt_key) - 1


def test_token_id_prompts_keep_their_ids_as_the_key() -> None:
    ids = [1, 2, 3, 70000, 2**32 - 1]
    assert parse_generate({"input_ids": ids}, NO_HEADERS).prompt_key == tokens_to_key(ids)
    spec = parse_completion({"prompt": ids}, NO_HEADERS)
    assert (spec.prompt_key, spec.prompt_text, spec.prompt_tokens) == (tokens_to_key(ids), None, 5)


def test_text_prompts_estimate_tokens_from_their_size() -> None:
    spec = parse_completion({"prompt": DOCUMENT}, NO_HEADERS)
    assert spec.prompt_tokens == -(-len(DOCUMENT.encode()) // 4)
    # Of the order of the simulated worker's count (word pieces), which its usage reports.
    assert 0.5 < spec.prompt_tokens / len(tokenize(DOCUMENT)) < 2.0


def test_the_router_never_loads_the_tokenizer() -> None:
    """Text prompts cost the router a copy, not a tokenization: the whole router, parsing
    a text and a chat prompt, runs without ``fairserve.core.tokenizer`` imported."""
    code = (
        "import sys\n"
        "import fairserve.router.server, fairserve.router.front, fairserve.router.relay\n"
        "from fairserve.router.handlers import PARSERS\n"
        "PARSERS['completions']({'prompt': 'some text'}, {})\n"
        "PARSERS['chat']({'messages': [{'role': 'user', 'content': 'hi'}]}, {})\n"
        "assert 'fairserve.core.tokenizer' not in sys.modules, 'the router loaded it'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
