"""The one word list: its order is part of what the simulated worker and bench produce."""

from __future__ import annotations

import hashlib

from fairserve.bench.prompts import key_text
from fairserve.core.tokenizer import SyntheticOutput, tokenize
from fairserve.core.types import tokens_to_key
from fairserve.core.words import WORDS

# Digests of the lists as they stood when the two copies became one (issue 21): a changed
# digest means the simulated worker's outputs, or the text bench sends, have changed.
WORDS_SHA256 = "331ca33a0397ae76807e508d9a90869d361d3245f3592bf5a89dfce283499ef9"
PROMPT_WORDS_SHA256 = "fc3a2d53f24257cb34ae665196fc014cb932bc885ca6bc1eed4a5adbe898d39a"


def _digest(words: list[str] | tuple[str, ...]) -> str:
    return hashlib.sha256(" ".join(words).encode()).hexdigest()


def test_the_word_list_keeps_its_order() -> None:
    assert len(WORDS) == len(set(WORDS)) == 326
    assert _digest(WORDS) == WORDS_SHA256


def test_bench_text_keeps_its_256_words() -> None:
    words = key_text(tokens_to_key(list(range(256)))).split()
    assert len(set(words)) == 256
    assert set(words) <= set(WORDS)
    assert _digest(words) == PROMPT_WORDS_SHA256


def test_synthetic_output_is_made_of_the_list() -> None:
    text = SyntheticOutput("words", 64).text(0, 64)
    assert set(text.split()) <= set(WORDS)
    assert len(tokenize(text)) == 64
