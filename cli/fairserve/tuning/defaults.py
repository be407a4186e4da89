"""The auto-tuner's default bounds, in one place for the tuner and ``fairserve tune``.

Standard library only and free of imports, so that the command can show them as its
options' defaults without loading the tuner when the CLI starts.
"""

from __future__ import annotations

DEFAULT_MIN_QUANTUM = 64.0
DEFAULT_MAX_QUANTUM = 65536.0
DEFAULT_STEP_FACTOR = 2.0
"""The largest multiplicative change of one step (``--max-step``)."""
DEFAULT_MAX_STEPS = 12
