"""The tuner's and the sweep's defaults, in one place for them and ``fairserve tune``.

Standard library only and free of imports, so that the command can show them as its
options' defaults without loading the tuner when the CLI starts.
"""

from __future__ import annotations

DEFAULT_MIN_QUANTUM = 64.0
DEFAULT_MAX_QUANTUM = 65536.0
DEFAULT_STEP_FACTOR = 2.0
"""The largest multiplicative change of one step (``--max-step``)."""
DEFAULT_MAX_STEPS = 12

SWEEP_GRID = (128.0, 512.0, 2048.0, 8192.0, 32768.0, 131072.0, 524288.0)
"""The sweep's quanta Q^u without ``--grid``: x4 apart."""
SWEEP_DURATION_S = 60.0
"""Simulated seconds per setting without ``--duration`` (at most the workload's)."""
SWEEP_TARGET_JAIN = 0.9
