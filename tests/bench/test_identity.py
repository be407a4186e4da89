"""Against a router that identifies clients by API key, calls sent with one key are one
client to the router, whatever ``X-Fairserve-Client`` the bench sends: the report says so
(``identity.merged``, a note) instead of presenting its own split as the router's."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from fairserve.bench import BenchOptions, bench_report, run_workload
from fairserve.commands.bench import _view
from fairserve.router.config import ClientEntry
from tests.bench.helpers import single, workload
from tests.router.helpers import sim_router
from tests.worker.helpers import run

KEYS = {"sk-a": ClientEntry("team-a"), "sk-b": ClientEntry("team-b")}
LOAD = workload(single("alice", 3) + single("bob", 3))


def _bench(options: BenchOptions, **router: Any) -> dict[str, Any]:
    async def body() -> dict[str, Any]:
        async with sim_router(2, **router) as (server, _, _):
            return bench_report(await run_workload(server.url, LOAD, options))

    return run(body())


def test_one_key_for_every_client_is_reported_as_merged() -> None:
    report = _bench(BenchOptions(timeout_s=5, token="sk-a"), clients=KEYS)
    identity = report["identity"]
    assert identity["auth_mode"] == "api-key"
    assert identity["merged"] == [["alice", "bob"]]
    assert "one client" in identity["note"] and "alice, bob" in identity["note"]
    console = Console(width=400, record=True)
    console.print(*_view(report, {}))
    assert "note: the router identifies clients by API key" in console.export_text()


def test_a_key_per_client_is_not_merged() -> None:
    options = BenchOptions(timeout_s=5, api_keys={"alice": "sk-a", "bob": "sk-b"})
    identity = _bench(options, clients=KEYS)["identity"]
    assert identity == {"auth_mode": "api-key", "merged": [], "note": None}


def test_an_open_router_charges_the_header_names() -> None:
    identity = _bench(BenchOptions(timeout_s=5, token="anything"))["identity"]
    assert identity == {"auth_mode": "open", "merged": [], "note": None}


def test_client_key_option_gives_each_client_its_key(capsys: Any) -> None:
    """``bench --client-key NAME=KEY``: per-client keys from the command line; a malformed
    one, or a name the workload lacks, is a usage error before anything is sent."""
    from fairserve.commands.app import run as cli
    from fairserve.commands.bench import parse_client_keys
    from fairserve.commands.errors import ExitCode

    assert parse_client_keys(["alice=sk-a", "bob=sk=b"], ["alice", "bob"]) == {
        "alice": "sk-a",
        "bob": "sk=b",
    }
    base = ["bench", "--url", "http://127.0.0.1:9", "--workload", "vtc-constant"]
    for bad in ("client1", "client1=", "=sk", "nobody=sk"):
        assert cli([*base, "--client-key", bad]) == ExitCode.USAGE
        assert "--client-key" in capsys.readouterr().err
