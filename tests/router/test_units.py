"""Pure pieces: the clients file, the config checks, identity, the SSE relay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairserve.core.errors import ConfigError
from fairserve.core.openai_api import ApiError
from fairserve.router.accounting import Accounting, Usage
from fairserve.router.config import ClientEntry, RouterConfig, load_clients
from fairserve.router.identity import identify
from fairserve.router.relay import SseRelay, complete_body


def test_clients_file_maps_keys_to_names_and_weights(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[[clients]]\nname = "a"\napi_keys = ["k1", "k2"]\nweight = 3\n'
        '[[clients]]\nname = "b"\napi_key = "k3"\n'
    )
    keys, weights = load_clients(path)
    assert keys == {
        "k1": ClientEntry("a", 3.0),
        "k2": ClientEntry("a", 3.0),
        "k3": ClientEntry("b"),
    }
    assert weights == {"a": 3.0, "b": 1.0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("clients = 3", "clients: expected a list of tables"),
        ('[[clients]]\napi_key = "k"', "clients[0].name: expected a non-empty string"),
        ('[[clients]]\nname = "a"', "clients[0]: expected an api_key"),
        ('[[clients]]\nname = "a"\napi_key = "k"\nweight = "x"', "clients[0].weight"),
        ('[[clients]]\nname = "a"\napi_key = "k"\ncolor = 1', "unknown field 'color'"),
        ('[[clients]]\nname="a"\napi_key="k"\n[[clients]]\nname="b"\napi_key="k"', "already used"),
        ("[[clients", "not valid TOML"),
    ],
)
def test_clients_file_errors_name_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "clients.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"clients\.toml") as info:
        load_clients(path)
    assert message in str(info.value)


def test_missing_clients_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_clients(tmp_path / "none.toml")


def test_config_checks() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        RouterConfig(worker_urls=())
    with pytest.raises(ConfigError, match="twice"):
        RouterConfig(worker_urls=("http://a:1", "http://a:1"))
    with pytest.raises(ConfigError, match="no path"):
        RouterConfig(worker_urls=("http://a:1/v1",))
    with pytest.raises(ConfigError, match="--queue-cap"):
        RouterConfig(worker_urls=("http://a:1",), queue_cap=0)
    with pytest.raises(ConfigError, match="--max-outstanding-per-worker"):
        RouterConfig(worker_urls=("http://a:1",), max_outstanding_per_worker=0)
    with pytest.raises(ConfigError, match="--metrics-max-clients"):
        RouterConfig(worker_urls=("http://a:1",), metrics_max_clients=-1)


def test_identity_precedence() -> None:
    keys = {"k": ClientEntry("alice")}
    both = {"Authorization": "Bearer k", "X-Fairserve-Client": "bob"}
    assert identify(both, {"user": "carol"}, keys) == "alice"
    assert identify({"X-Fairserve-Client": "bob"}, {"user": "carol"}, keys, True) == "bob"
    assert identify({}, {"user": "carol"}, keys, True) == "carol"
    assert identify({}, {}, keys, True) == "anonymous"
    assert identify({"Authorization": "Bearer EMPTY"}, {}, {}) == "anonymous"  # no file
    with pytest.raises(ApiError) as info:
        identify({"Authorization": "Bearer bad"}, {}, keys)
    assert info.value.status == 401
    with pytest.raises(ApiError, match="user: expected a string"):
        identify({}, {"user": 5}, {})


def _events(data: bytes) -> list[str]:
    return [e for e in data.decode().split("\n\n") if e]


def test_relay_strips_requested_usage_chunk_and_splits_events_anywhere() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
    stream = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()
    relay = SseRelay("chat", want_usage=False, prompt_tokens=5)
    out = b"".join(relay.feed(stream[i : i + 7]) for i in range(0, len(stream), 7))
    out += relay.close()
    assert _events(out) == [f"data: {json.dumps(chunk)}", "data: [DONE]"]
    assert relay.usage() == Usage(5, 0, 1) and relay.state.first_token


def test_relay_synthesises_usage_when_upstream_has_none() -> None:
    chunk = {"choices": [{"index": 0, "text": "a"}]}
    relay = SseRelay("completions", want_usage=True, prompt_tokens=9)
    out = relay.feed(f"data: {json.dumps(chunk)}\r\n\r\ndata: [DONE]\r\n\r\n".encode())
    out += relay.close()
    events = _events(out)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["usage"]["prompt_tokens"] == 9


def test_complete_body_fills_usage() -> None:
    body = json.dumps({"choices": [{"message": {"content": "one two three"}}]}).encode()
    data, usage = complete_body(body, "chat", 4)
    assert usage == Usage(4, 0, 4)  # 13 bytes: 4 estimated tokens (core/prefix_key)
    assert json.loads(data)["usage"]["completion_tokens"] == 4


def test_jain_index_over_the_active_window() -> None:
    acc = Accounting({"b": 2.0})
    acc.sample(0.0)
    for client in ("a", "b"):
        acc.arrived(client, 0.0, 1.0)
    acc.sample(1.0)
    acc.finished("a", "w", 0.0, Usage(10, 0, 0), 0.1, None, 2.0)
    acc.finished("b", "w", 0.0, Usage(20, 0, 0), 0.1, None, 2.0)
    for client in ("a", "b"):
        acc.arrived(client, 0.0, 3.0)
    jain, window = acc.jain_index(3.0)
    assert jain == pytest.approx(1.0)  # b got twice the service with twice the weight
    assert window == (1.0, 3.0)
