"""The one admin rule (``fairserve.api.auth``): who may write, and what the others hear."""

from __future__ import annotations

import pytest

from fairserve.api.auth import bearer_token, is_loopback_host, require_admin
from fairserve.core.openai_api import ApiError, error_body

HINT = "start the worker with --admin-token"


def refusal(headers: dict[str, str], token: str | None, open_when_unset: bool) -> int | None:
    """The status a write is refused with, or None when it may go ahead."""
    try:
        require_admin(headers, token, open_when_unset=open_when_unset, enable_hint=HINT)
    except ApiError as exc:
        return exc.status
    return None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, 401),
        ({"Authorization": ""}, 401),
        ({"Authorization": "s3cret"}, 401),  # no scheme
        ({"Authorization": "Basic s3cret"}, 401),
        ({"Authorization": "Bearer "}, 401),
        ({"Authorization": "Bearer wrong"}, 403),
        ({"Authorization": "Bearer s3cret2"}, 403),
        ({"Authorization": "Bearer s3cret"}, None),
        ({"Authorization": "bearer   s3cret  "}, None),
    ],
)
def test_with_a_token_writes_need_it(headers: dict[str, str], expected: int | None) -> None:
    for open_when_unset in (True, False):  # a configured token applies on any address
        assert refusal(headers, "s3cret", open_when_unset) == expected


def test_without_a_token_only_a_loopback_listener_accepts_writes() -> None:
    assert refusal({}, None, open_when_unset=True) is None
    assert refusal({"Authorization": "Bearer anything"}, None, open_when_unset=True) is None
    with pytest.raises(ApiError) as caught:
        require_admin({}, None, open_when_unset=False, enable_hint=HINT)
    assert caught.value.status == 403
    assert caught.value.message == f"writes are disabled: {HINT}"


def test_refusals_have_the_openai_error_shape() -> None:
    for headers, kind in (({}, "authentication_error"), (
        {"Authorization": "Bearer x"}, "permission_error"
    )):  # fmt: skip
        with pytest.raises(ApiError) as caught:
            require_admin(headers, "s3cret", open_when_unset=False, enable_hint=HINT)
        assert error_body(caught.value)["error"]["type"] == kind


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.org", False),
        ("", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_bearer_token() -> None:
    assert bearer_token({"Authorization": "Bearer abc"}) == "abc"
    assert bearer_token({"Authorization": "Token abc"}) is None
    assert bearer_token({}) is None
