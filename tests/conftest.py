"""Shared test configuration.

Hypothesis runs with fixed seeds everywhere (``derandomize=True``), so a failure seen in CI
reproduces on a laptop and a passing run is not luck. ``CI`` selects the ``ci`` profile
(more examples, blob printed for reproduction); otherwise the lighter ``dev`` profile.
``deadline=None``: CI machines are slow and shared, and timing is what tests/perf measures.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=100, print_blob=True)
settings.register_profile("dev", derandomize=True, deadline=None, max_examples=50)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
