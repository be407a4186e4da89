"""What a workload asks of a cluster: per-client programs, calls and tokens per second.

Used to size workloads against a cluster's capacity (DESIGN §1: the load condition is
λ·(mean prompt + mean output) < capacity) and by the CLI to describe a workload. With
``ideal_cache`` the prompt tokens are split into *extend* tokens (not found in an unbounded
prefix cache shared by everyone, filled with each call's prompt and output in start order)
and cached ones: the least prefill work any scheduler can get away with.
"""

from __future__ import annotations

from dataclasses import dataclass

from fairserve.core.radix import RadixTree
from fairserve.workloads.model import Workload


@dataclass(slots=True)
class ClientLoad:
    """Totals of one client over the summarised window."""

    programs: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    extend_tokens: int = 0
    """Prompt tokens missing from an ideal cache (equals ``prompt_tokens`` without one)."""
    output_tokens: int = 0

    def demand_tokens(self) -> int:
        """Tokens an engine must process (extend + decode) under the ideal cache."""
        return self.extend_tokens + self.output_tokens

    def service(self, w_e: float = 1.0, w_q: float = 2.0) -> float:
        """DLPM's service measure, w_e per extend token and w_q per output token."""
        return w_e * self.extend_tokens + w_q * self.output_tokens


@dataclass(frozen=True, slots=True)
class WorkloadSummary:
    duration_s: float
    clients: dict[str, ClientLoad]

    def total(self) -> ClientLoad:
        out = ClientLoad()
        for load in self.clients.values():
            out.programs += load.programs
            out.calls += load.calls
            out.prompt_tokens += load.prompt_tokens
            out.extend_tokens += load.extend_tokens
            out.output_tokens += load.output_tokens
        return out

    def per_s(self, value: float) -> float:
        return value / self.duration_s


def summarize(
    workload: Workload,
    seed: int | None = None,
    duration_s: float | None = None,
    *,
    ideal_cache: bool = False,
) -> WorkloadSummary:
    """Generate the workload's programs and total them per client (not lazy in time)."""
    horizon_s = workload.duration_s if duration_s is None else duration_s
    loads = {client.name: ClientLoad() for client in workload.clients}
    tree = RadixTree() if ideal_cache else None
    for program in workload.programs(seed, horizon_s):
        load = loads[program.client]
        load.programs += 1
        for call in program.calls:
            prompt = call.input_tokens
            load.calls += 1
            load.prompt_tokens += prompt
            load.output_tokens += call.output_tokens
            if tree is None:
                load.extend_tokens += prompt
                continue
            load.extend_tokens += prompt - tree.match_len(call.prompt_key)
            tree.insert(call.prompt_key + call.output_key)
    return WorkloadSummary(horizon_s, loads)


def describe(summary: WorkloadSummary) -> list[str]:
    """Human-readable lines, one per client then the total (for docs and the CLI)."""
    rows = [*summary.clients.items(), ("total", summary.total())]
    lines = []
    for name, load in rows:
        per_s = summary.per_s
        lines.append(
            f"{name}: {per_s(load.programs):.2f} programs/s, {per_s(load.calls):.2f} calls/s, "
            f"prompt {per_s(load.prompt_tokens):.0f} tok/s (extend "
            f"{per_s(load.extend_tokens):.0f}), output {per_s(load.output_tokens):.0f} tok/s"
        )
    return lines
