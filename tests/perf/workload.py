"""Realistic prompts for the scheduler benchmarks: long shared documents, short private tails.

A prompt is ``system prompt + document + question``: 8 system prompts (64-256 tokens), 200
documents of 2,000 tokens (each document always follows the same system prompt, as in a
RAG or long-document QA service) and a private question of 50-200 tokens. Clients favour
a few documents each, so a busy client's requests share long prefixes with each other and
with other clients' requests. Everything is seeded: the same arguments build the same
prompts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fairserve.core.types import Request, make_request, tokens_to_key

VOCAB = 32_000
SYSTEM_PROMPTS = 8
DOCUMENTS = 200
DOCUMENT_TOKENS = 2_000
SUFFIX_TOKENS = (50, 200)
DOCS_PER_CLIENT = 12


@dataclass
class PromptSource:
    """Deterministic generator of prompt keys and requests over shared documents."""

    seed: int = 1
    documents: int = DOCUMENTS
    document_tokens: int = DOCUMENT_TOKENS

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self._rng = random.Random(self.seed + 1)
        self.system = [
            [rng.randrange(VOCAB) for _ in range(rng.randint(64, 256))]
            for _ in range(SYSTEM_PROMPTS)
        ]
        self.doc_prefix = [
            tokens_to_key(
                self.system[d % SYSTEM_PROMPTS]
                + [rng.randrange(VOCAB) for _ in range(self.document_tokens)]
            )
            for d in range(self.documents)
        ]
        self._count = 0

    def prompt(self, doc: int | None = None) -> bytes:
        """One prompt on document ``doc`` (random when None) with a fresh private question."""
        rng = self._rng
        if doc is None:
            doc = rng.randrange(self.documents)
        tail = [rng.randrange(VOCAB) for _ in range(rng.randint(*SUFFIX_TOKENS))]
        return self.doc_prefix[doc] + tokens_to_key(tail)

    def client_doc(self, client: int) -> int:
        """A document the client favours (each client has a few, overlapping others')."""
        return (client * 7 + self._rng.randrange(DOCS_PER_CLIENT)) % self.documents

    def request(self, client: int, arrival_s: float = 0.0, output_len: int = 128) -> Request:
        """A request of ``client{client}`` on one of its favourite documents."""
        self._count += 1
        req = make_request(
            f"r{self._count}",
            f"client{client}",
            [],
            max_output_tokens=512,
            arrival_s=arrival_s,
            output_len=output_len,
        )
        req.prompt_key = self.prompt(self.client_doc(client))
        return req
