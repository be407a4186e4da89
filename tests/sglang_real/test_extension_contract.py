"""The worker extension's contract (``tests/api/test_worker_extension_contract.py``), run
against the plugin's extension inside SGLang's real scheduler loop, and one script of
requests answered identically by it and by the simulated worker.

The contract's tests take a ``served`` fixture; here it is the real-object engine, whose
scheduler loop runs in its own thread (as SGLang's scheduler process), so changes travel
the real path: the leader's poll, then ``process_input_requests``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from tests.sglang_real.real import require_sglang

require_sglang()

from fairserve.sglang import hooks  # noqa: E402
from tests.api import test_worker_extension_contract as contract  # noqa: E402
from tests.api.test_worker_extension_contract import (  # noqa: E402, F401
    Served,
    test_an_oversized_body_is_413,
    test_bad_eviction_cursors_are_400,
    test_bad_writes_are_400_and_change_nothing,
    test_every_route_of_the_table_is_served,
    test_quantum_round_trip_to_the_policy,
    test_reads_have_the_shared_shapes,
    test_unknown_paths_and_methods_answer_in_the_error_shape,
    test_weights_round_trip_to_the_policy,
    test_writes_need_the_admin_token,
)
from tests.sglang_real.harness import Engine, set_policy  # noqa: E402


@contextmanager
def real_engine_extension(token: str | None) -> Iterator[Served]:
    set_policy("dlpm", contract.QUANTUM, extension=True, admin_token=token)
    engine = Engine(kv_tokens=600)
    engine.step()  # the leader's first poll starts the extension
    server = hooks.PLUGIN.server
    assert server is not None and engine.host is not None
    host = engine.host
    stop = threading.Event()

    def scheduler_loop() -> None:
        for _ in range(60_000):  # bounded: about 5 minutes at most
            if stop.wait(0.005):
                return
            engine.step()

    loop = threading.Thread(target=scheduler_loop, name="scheduler", daemon=True)
    loop.start()
    try:
        yield Served(server.url, lambda: host.policy)
    finally:
        stop.set()
        loop.join(timeout=10)


@pytest.fixture
def served() -> Iterator[Served]:
    with real_engine_extension(contract.TOKEN) as running:
        yield running


def test_the_simulated_worker_and_sglang_answer_one_script_identically() -> None:
    hosts: list[AbstractContextManager[Served]] = [
        contract.sim_worker(contract.TOKEN),
        real_engine_extension(contract.TOKEN),
    ]
    transcripts: list[list[tuple[int, Any]]] = []
    for host in hosts:
        with host as served:
            transcripts.append(
                [
                    contract.call(served.url + path, method, body, headers)
                    for method, path, body, headers in contract.SCRIPT
                ]
            )
    assert transcripts[0] == transcripts[1]
    assert [status for status, _ in transcripts[1]].count(200) == 6
