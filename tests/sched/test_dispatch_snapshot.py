"""A dispatcher's snapshot lists only the clients asked for: the router's state read shows
the busiest 1,000 of up to 10,000 tracked clients, and building every client's entries first
made that read cost a tenth of a second on the event loop."""

from __future__ import annotations

import pytest

from fairserve.core.types import make_request
from fairserve.sched.registry import make_dispatcher


@pytest.mark.parametrize("name", ["doubleq", "client-rr"])
def test_the_snapshot_lists_the_clients_asked_for_and_only_known_ones(name: str) -> None:
    dispatcher = make_dispatcher(name, ["w0", "w1"])
    for index in range(20):
        req = make_request(f"r{index}", f"c{index:02d}", [1, 2, index], 4)
        worker = dispatcher.dispatch(req)
        dispatcher.on_finish(req, worker, 4)
    everyone = dispatcher.snapshot()["clients"]
    assert sorted(everyone) == [f"c{i:02d}" for i in range(20)]
    some = dispatcher.snapshot(["c03", "c01", "nobody"])["clients"]
    assert list(some) == ["c01", "c03"]
    assert some["c01"] == everyone["c01"]
