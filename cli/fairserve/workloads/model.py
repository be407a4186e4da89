"""What a workload hands to the simulator and the load generator: programs of calls.

A *program* is one application instance (a chat session, a tree-of-thought search, a
judge run) started by one client at ``start_s``. Its calls form a DAG: a call with no
``after`` is released at ``start_s + delay_s``; a call with ``after`` is released
``delay_s`` after the last of those calls finished. This is what makes tree-of-thought and
multi-turn chat *closed-loop*: a branch's next call exists only once its parent's answer
does, and its prompt extends the parent's prompt and output, so it can hit the prefix cache.

Token ids are synthetic and deterministic under the workload seed. ``output_key`` holds the
ids the call "generates" when a later call's prompt contains them; engines that cache
prompt + output on finish (SGLang does) then serve that later call from cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from fairserve.core.types import TOKEN_BYTES


@dataclass(frozen=True, slots=True)
class Call:
    """One inference call of a program."""

    id: str
    """Unique within a run, e.g. ``"alice/p12/c3"``."""
    prompt_key: bytes
    """Prompt token ids packed as uint32 (``core.types.tokens_to_key``)."""
    output_tokens: int
    """The true output length the engine generates (an oracle for Justitia's predictor)."""
    max_output_tokens: int
    """What the client asks for (``max_new_tokens``); never below ``output_tokens``."""
    after: tuple[str, ...] = ()
    """Ids of calls of the same program that must finish before this one is released."""
    delay_s: float = 0.0
    """Think time after release condition is met (program start, or last parent finished)."""
    output_key: bytes = b""
    """Empty, or exactly ``output_tokens`` ids that later prompts of the program reuse."""

    @property
    def input_tokens(self) -> int:
        return len(self.prompt_key) // TOKEN_BYTES


@dataclass(frozen=True, slots=True)
class Program:
    """One application instance of one client; ``calls`` in a valid topological order."""

    app: str
    """Unique program id, e.g. ``"alice/p12"`` (Justitia's application id)."""
    client: str
    app_type: str
    """The program kind: single, multi-turn, long-qa, tree-of-thought, judge."""
    start_s: float
    calls: tuple[Call, ...]


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """A workload client as hosts need it: its name and fair-share weight."""

    name: str
    weight: float = 1.0


class Workload(Protocol):
    """A workload: clients and a lazily generated stream of programs.

    ``programs(seed, duration_s)`` yields programs in non-decreasing ``start_s``, all with
    ``start_s < duration_s`` (the workload's own duration unless overridden); the same seed
    gives the same stream (tokens included); ``seed=None`` means the workload's seed.
    Generation is lazy so an hour of traffic never sits in memory at once.
    """

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def duration_s(self) -> float: ...

    @property
    def seed(self) -> int: ...

    @property
    def clients(self) -> tuple[ClientInfo, ...]: ...

    def programs(
        self, seed: int | None = None, duration_s: float | None = None
    ) -> Iterator[Program]: ...
