"""Waiting on a running dashboard without sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.pilot import Pilot


async def until(pilot: Pilot[None], condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    """Let the app run until ``condition()`` holds (fails the test after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the dashboard"
        await pilot.pause(0.01)
