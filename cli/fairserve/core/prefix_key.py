"""Prefix keys of text prompts at the speed of a memory copy, and the token estimate they give.

The router's prefix trees answer "which worker holds the longest prefix of this prompt"; they
need keys in which equal text prefixes are equal key prefixes, not linguistic tokens. So the
router never tokenizes a text prompt: its key is the text cut into fixed-size blocks.

What a key unit means
---------------------
Every key has the layout of :mod:`fairserve.core.types`: 4-byte units (``TOKEN_BYTES``).

* For prompts a client sends as token ids (``input_ids``, a token-array ``prompt``) a unit
  is a token id: the key is exact, as before.
* For text prompts (``text``, a string ``prompt``, rendered chat ``messages``) a unit is the
  next ``TEXT_UNIT_BYTES`` (4) bytes of the prompt's UTF-8 encoding. A 4-byte block's perfect
  32-bit hash is the block itself (no collisions, no per-block work): deriving a 12 KB
  prompt's key is one ``encode`` and one copy, a few microseconds in C, against about a
  millisecond for the regular-expression tokenizer it replaces. Chaining, which vLLM's and
  llm-d's block hashes build into each hash, is the tree's path here: a block matches only
  after every block before it did. The last block is padded with ``0xFF`` bytes, which never
  occur in UTF-8, so distinct texts have distinct keys, and a text that extends another
  extends its key except possibly in the shorter text's last unit.

A unit is one *estimated token*: English runs about four bytes per token on the byte-pair
tokenizers of current models (the usual rule of thumb), and the simulated worker's word
pieces are of the same order. So every consumer of a key's length keeps reading it as a
token count, with no conversion anywhere: ``Request.input_tokens`` (router accounting and
cost estimates, the fair queue's charges), ``check_context``, the relay's usage fallback,
and the dispatchers' costs, where a match of ``m`` units in the global tree is ``m``
estimated cached tokens and ``input_tokens − m`` the estimated extend tokens (DoubleQ's and
cache-aware's costs compare requests keyed the same way, so a uniform error of the estimate
cancels out of their choices). The worker's ``usage`` replaces the estimate in the accounts
when the request ends. Workers keep their own tokens (the simulated worker tokenizes the
text with :mod:`fairserve.core.tokenizer`; SGLang with the model's tokenizer): two prompts
that share a long text prefix share both the router's key units and the worker's cached
tokens, up to the last partial unit. Evictions: the simulated worker publishes an evicted
prefix of a text prompt in these units (``fairserve.worker.evictions``), so the router's
tree forgets it; SGLang's extension publishes token ids, which name id-keyed prefixes
only, and the router's bound on each worker's share of its tree ages text prefixes out.
"""

from __future__ import annotations

from fairserve.core.types import TOKEN_BYTES

TEXT_UNIT_BYTES = TOKEN_BYTES
"""UTF-8 bytes of text per key unit (one estimated token)."""

_PADDING = tuple(b"\xff" * (-r % TEXT_UNIT_BYTES) for r in range(TEXT_UNIT_BYTES))
"""Padding after ``len % TEXT_UNIT_BYTES`` bytes: ``0xFF`` never occurs in UTF-8."""


def text_key(text: str) -> bytes:
    """The prefix key of a text prompt: its UTF-8 bytes, padded to whole 4-byte units.

    Raises ``UnicodeEncodeError`` for text that is not valid Unicode (lone surrogates)."""
    raw = text.encode("utf-8")
    pad = _PADDING[len(raw) % TEXT_UNIT_BYTES]
    return raw + pad if pad else raw


def estimate_tokens(text: str) -> int:
    """Estimated tokens of ``text``: its key units (:func:`text_key`), without building the
    key. For the router's fallbacks where an upstream reports no ``usage``."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return -(-size // TEXT_UNIT_BYTES)
