"""The parsed, validated form of a workload file (see ``workloads.parse`` for the format)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fairserve.workloads.arrivals import ArrivalSpec
from fairserve.workloads.dists import Constant, Dist

PROGRAMS = ("single", "multi-turn", "long-qa", "tree-of-thought", "judge")

VOCAB_SIZE = 32_000
"""Synthetic token ids are uniform in ``[0, VOCAB_SIZE)`` (a Llama-2-sized vocabulary)."""

# Sanity limits: beyond them a value is a typo, and generating it would exhaust memory.
MAX_TOKENS = 1 << 20
"""Longest length of any token field (above every model's context window)."""
MAX_TURNS = 1_000
MAX_CLIENT_COUNT = 10_000
MAX_FAN_OUT = 10_000
"""Largest ``branches``, ``dimensions`` and ``documents``."""
MAX_DEPTH = 64
MAX_TREE_CALLS = 10_000
"""Prompts of one tree sit in memory together."""


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """One ``[[clients]]`` entry (after ``count`` expansion).

    Several entries may share a ``name``: they are streams of one client (its phases, or
    programs of different kinds), with one weight, one shared prefix and one program
    numbering.
    """

    name: str
    program: str
    arrival: ArrivalSpec
    input_tokens: Dist
    """Fresh tokens per prompt: the question, user turn or article after the shared prefix."""
    output_tokens: Dist
    weight: float = 1.0
    shared_prefix_tokens: Dist = field(default_factory=lambda: Constant(0))
    """The client's shared prefix (system prompt); for long-qa each document's length."""
    max_output_tokens: Dist | None = None
    """What the client asks for; ``None`` means exactly the output length."""
    start_s: float = 0.0
    stop_s: float | None = None
    """End of the active window; ``None``: the workload's duration."""
    turns: Dist = field(default_factory=lambda: Constant(1))
    think_time_s: Dist = field(default_factory=lambda: Constant(0.0))
    step_tokens: Dist = field(default_factory=lambda: Constant(16))
    """New tokens a dependent call adds (tree-of-thought step, judge dimension and merge)."""
    branches: int = 2
    depth: int = 4
    dimensions: int = 2
    documents: int = 1
    occurrence: int = 0
    """Index of this entry among the entries of the same client (seeds its streams)."""
    shared_prefix: str | None = None
    """A named ``[[prefixes]]`` entry every prompt of the client starts with (before its own
    ``shared_prefix_tokens``): one system prompt shared by several clients."""


@dataclass(frozen=True, slots=True)
class PrefixSpec:
    """One ``[[prefixes]]`` entry: a named token sequence several clients share."""

    name: str
    tokens: int


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A whole workload file."""

    name: str
    duration_s: float
    clients: tuple[ClientSpec, ...]
    seed: int = 0
    description: str = ""
    source: str = "<memory>"
    prefixes: tuple[PrefixSpec, ...] = ()
