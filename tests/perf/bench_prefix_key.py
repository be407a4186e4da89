"""Key derivation for text prompts: the tokenizer the router used (before) against the text
blocks it uses now (after), in microseconds per prompt (issue 23).

    python tests/perf/bench_prefix_key.py

Three prompts, as ``bench_router.py`` sends them: one sentence; about 2,000 words (~14 KB)
all alike, which the tokenizer's chunk memo serves; as long but no two alike (1,024
documents, more than the memo holds), its worst case. "parse" is the whole body parse
(``parse_json`` and ``parse_completion``) as the router runs it now. Best of five runs;
not a test, nothing asserts a speed.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "cli") not in sys.path:  # runnable as a script from any directory
    sys.path.insert(0, str(ROOT / "cli"))

from fairserve.core.json_body import parse_json  # noqa: E402
from fairserve.core.openai_api import parse_completion  # noqa: E402
from fairserve.core.prefix_key import text_key  # noqa: E402
from fairserve.core.tokenizer import token_key  # noqa: E402

SENTENCE = "What is the capital of France? Answer in one word."
FILLER = ("the quick brown fox jumps over a lazy dog", "while seven wizards quietly judge")
"""Filler words, two phrases."""
_WORDS = " ".join(FILLER).split(" ")
WORDS = 2000
DOCUMENTS = 1024


def document(rng: random.Random | None) -> str:
    """About ``WORDS`` words; with ``rng`` each gets a random number, so no two documents
    share text anywhere."""
    words = [_WORDS[i % len(_WORDS)] for i in range(WORDS)]
    if rng is not None:
        words = [word + str(rng.randrange(100)) for word in words]
    return " ".join(words) + ". "


def best_us(call: Callable[[Any], object], texts: Sequence[object], reps: int) -> float:
    for text in texts[:8]:
        call(text)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for i in range(reps):
            call(texts[i % len(texts)])
        best = min(best, (time.perf_counter() - started) / reps * 1e6)
    return best


def parse_body(body: bytes) -> object:
    return parse_completion(parse_json(body), {})


def main() -> None:
    rng = random.Random(0)
    cases = {
        "one sentence": ([SENTENCE], 20_000),
        "2,000 words, shared": (["[0] " + document(None)], 2_000),
        "2,000 words, no two alike": ([f"[{i}] " + document(rng) for i in range(DOCUMENTS)], 1_024),
    }
    print(f"{'prompt':28s} {'bytes':>6s} {'before':>10s} {'after':>8s} {'ratio':>7s} {'parse':>8s}")
    for name, (texts, reps) in cases.items():
        before = best_us(token_key, texts, reps)
        after = best_us(text_key, texts, reps)
        bodies = [json.dumps({"prompt": text}).encode() for text in texts]
        parse = best_us(parse_body, bodies, reps)
        size = len(texts[0].encode())
        print(
            f"{name:28s} {size:6d} {before:8.2f}us {after:6.2f}us {before / after:6.1f}x"
            f" {parse:6.1f}us"
        )


if __name__ == "__main__":
    main()
