"""The eviction log: sequence numbers, paging, bounds and stale readers."""

from __future__ import annotations

from fairserve.core.types import tokens_to_key
from fairserve.worker.evictions import EvictionLog


def keys(*lengths: int) -> list[bytes]:
    return [tokens_to_key(range(n)) for n in lengths]


def test_reads_from_a_sequence_number_and_says_where_to_go_on() -> None:
    log = EvictionLog()
    log.extend(keys(2, 3))
    page = log.read(0)
    assert page == {
        "next": 2,
        "events": [{"seq": 0, "tokens": [0, 1]}, {"seq": 1, "tokens": [0, 1, 2]}],
        "dropped": False,
    }
    assert log.read(2) == {"next": 2, "events": [], "dropped": False}
    log.extend([b""])
    assert log.read(2)["events"] == [{"seq": 2, "tokens": []}]


def test_pages_are_limited() -> None:
    log = EvictionLog()
    log.extend(keys(1, 1, 1, 1, 1))
    page = log.read(1, limit=2)
    assert [e["seq"] for e in page["events"]] == [1, 2]
    assert page["next"] == 3


def test_old_events_drop_by_count_and_by_tokens_and_readers_are_told() -> None:
    log = EvictionLog(max_events=3, max_tokens=10)
    log.extend(keys(1, 1, 1, 1))
    assert log.first_seq == 1
    page = log.read(0)
    assert page["dropped"] is True
    assert [e["seq"] for e in page["events"]] == [1, 2, 3]
    log.extend(keys(9))  # 9 + 1 + 1 > 10 tokens: two more go
    assert log.first_seq == 3
    assert log.read(3)["dropped"] is False


def test_a_reader_from_an_earlier_process_starts_over() -> None:
    log = EvictionLog()
    log.extend(keys(1))
    page = log.read(50)
    assert page["dropped"] is True
    assert page["next"] == 1
    assert [e["seq"] for e in page["events"]] == [0]
