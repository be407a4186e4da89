"""Defaults and choice lists that both the hosts and the command line need.

One place for each, below ``sim`` and ``commands``: the command line builds its options
and help from these names without importing the simulator (numpy) at start, and the
simulator validates against the same tuples, so there is no copy to keep equal. Standard
library only, and nothing imported at all: ``fairserve --version`` may load this module.
"""

from __future__ import annotations

DEFAULT_PROFILE = "a100-llama-3-8b"
"""The batch-time profile a simulated worker or simulation uses unless told otherwise."""

BATCHING_DISCIPLINES = ("sarathi", "orca", "vllm-v0", "fastertransformer")
"""The engine model's batching disciplines (``fairserve.sim.engine`` describes each)."""

DEFAULT_BATCHING = "sarathi"
"""Decode-first chunked prefill with mixed batches: SGLang's default."""

ENGINES = ("sim", "sglang")
"""What ``fairserve launch`` runs as workers: simulated engines or SGLang servers."""

DEFAULT_MAX_IN_FLIGHT = 1024
"""``fairserve bench``'s requests in flight per client: high enough that the generator does
not cap a client's share below what the service gives it (at 256 each, two clients of
``vtc-constant`` never queued at the workers, so every policy looked fair); still bounded,
so a runaway workload cannot open sockets without limit."""
