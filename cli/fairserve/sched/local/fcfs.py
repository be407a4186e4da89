"""First come, first served: the baseline without isolation."""

from __future__ import annotations

from fairserve.sched.local.base import LocalPolicy, register_local


@register_local
class FCFS(LocalPolicy):
    """Admit in arrival order; skip what does not fit and keep going."""

    name = "fcfs"
    description = "first come, first served in arrival order (no isolation between clients)"
