"""Trace record/replay: prefixes survive as hashes; replay rebuilds equal token prefixes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.errors import ConfigError
from fairserve.core.types import key_to_tokens, tokens_to_key
from fairserve.workloads import Workload
from fairserve.workloads.spec import VOCAB_SIZE
from fairserve.workloads.trace import TraceWriter, block_tokens_key, load_trace, prefix_hashes

from .helpers import client, workload


def common_tokens(a: bytes, b: bytes) -> int:
    n = 0
    for x, y in zip(key_to_tokens(a), key_to_tokens(b), strict=False):
        if x != y:
            break
        n += 1
    return n


@given(
    shared=st.lists(st.integers(0, 99), max_size=80),
    a=st.lists(st.integers(100, 199), max_size=40),
    b=st.lists(st.integers(200, 299), max_size=40),
)
def test_hashes_agree_exactly_on_shared_full_blocks(
    shared: list[int], a: list[int], b: list[int]
) -> None:
    ha, hb = (
        prefix_hashes(tokens_to_key(shared + a), 8),
        prefix_hashes(tokens_to_key(shared + b), 8),
    )
    common = sum(1 for x, y in zip(ha, hb, strict=False) if x == y)
    assert common == min(len(shared) // 8, len(ha), len(hb))
    assert ha[:common] == hb[:common]
    assert len(ha) == (len(shared) + len(a)) // 8


def test_block_tokens_are_a_function_of_the_hash() -> None:
    key = block_tokens_key((1, 2, 3), 16)
    assert key == block_tokens_key((1, 2, 3), 16)
    assert key[: 32 * 4] == block_tokens_key((1, 2), 16)
    assert key != block_tokens_key((1, 2, 4), 16)
    tokens = key_to_tokens(key)
    assert len(tokens) == 48 and max(tokens) < VOCAB_SIZE and len(set(tokens)) > 40


def record_workload(path: Path, block_tokens: int = 32) -> list[tuple[str, bytes, float, int]]:
    """Write the first call of each program of a small workload as a trace."""
    w = workload(
        client("a", shared_prefix_tokens=100, input_tokens=50),
        client("b", shared_prefix_tokens=100, input_tokens=50),
    )
    sent = []
    with path.open("w") as out:
        writer = TraceWriter(out, block_tokens, name="recorded", duration_s=60.0)
        for p in w.programs():
            call = p.calls[0]
            writer.write(p.client, p.app, p.start_s, call.prompt_key, call.output_tokens, 64)
            sent.append((p.client, call.prompt_key, p.start_s, call.output_tokens))
    return sent


def test_replay_rebuilds_lengths_times_and_shared_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    sent = record_workload(path)
    w: Workload = load_trace(path)
    assert (w.name, w.duration_s) == ("recorded", 60.0)
    assert [c.name for c in w.clients] == ["a", "b"]
    replayed = list(w.programs())
    assert len(replayed) == len(sent)
    for program, (name, prompt, start_s, output) in zip(replayed, sent, strict=True):
        (call,) = program.calls
        assert program.client == name
        assert program.start_s == pytest.approx(start_s, abs=1e-6)
        assert call.input_tokens == len(prompt) // 4
        assert (call.output_tokens, call.max_output_tokens) == (output, 64)
    same = [p.calls[0].prompt_key for p in replayed if p.client == "a"]
    other = [p.calls[0].prompt_key for p in replayed if p.client == "b"]
    assert common_tokens(same[0], same[1]) == 96  # 3 full blocks of the 100 shared tokens
    assert common_tokens(same[0], other[0]) == 0
    assert list(w.programs()) == replayed
    assert list(w.programs(seed=5)) != replayed  # only the partial-block tails change
    assert all(p.start_s < 10 for p in w.programs(duration_s=10.0))


def test_requests_of_one_app_replay_as_one_open_loop_program(tmp_path: Path) -> None:
    path = tmp_path / "apps.jsonl"
    lines = [
        {"client": "x", "app": "chat1", "app_type": "multi-turn", "arrival_s": 1.0,
         "prompt_tokens": 10, "output_tokens": 5},
        {"client": "y", "app": None, "arrival_s": 1.5, "prompt_tokens": 3, "output_tokens": 1},
        {"client": "x", "app": "chat1", "arrival_s": 4.0, "prompt_tokens": 30,
         "output_tokens": 7},
        {"client": "y", "app": "chat1", "arrival_s": 5.0, "prompt_tokens": 3, "output_tokens": 1},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    w = load_trace(path)
    programs = list(w.programs())
    assert [p.app for p in programs] == ["x:chat1", "y/r1", "y:chat1"]
    chat = programs[0]
    assert chat.app_type == "multi-turn" and programs[1].app_type == "trace"
    assert [c.delay_s for c in chat.calls] == [0.0, 3.0]
    assert [c.id for c in chat.calls] == ["x:chat1/c0", "x:chat1/c1"]
    assert w.duration_s == 6.0


BASE_RECORD = {"client": "c", "arrival_s": 1, "prompt_tokens": 3, "output_tokens": 1}


def record_line(**fields: object) -> str:
    """A trace line: the base record with ``fields`` replaced (``...`` deletes one)."""
    data = {**BASE_RECORD, **fields}
    return json.dumps({k: v for k, v in data.items() if v is not ...})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "t.jsonl:2: invalid JSON"),
        ("[1, 2]", "t.jsonl:2: expected a JSON object"),
        (record_line(client=...), "t.jsonl:2: client: expected a non-empty string"),
        (record_line(app=3), "t.jsonl:2: app: expected a string or null, got 3"),
        (record_line(app_type=3), "t.jsonl:2: app_type: expected a string or null"),
        (record_line(arrival_s=-1), "t.jsonl:2: arrival_s: expected a number >= 0, got -1"),
        (record_line(prompt_tokens=...), "t.jsonl:2: prompt_tokens: missing"),
        (record_line(output_tokens=0), "t.jsonl:2: output_tokens: expected an integer >= 1"),
        (
            record_line(output_tokens=4, max_output_tokens=2),
            "t.jsonl:2: max_output_tokens: expected an integer >= 4, got 2",
        ),
        (
            record_line(prompt_tokens=40, prefix_hashes=["zz"]),
            "t.jsonl:2: prefix_hashes: expected a list of at most 1 hex strings",
        ),
        (
            record_line(prefix_hashes=["00"]),
            "t.jsonl:2: prefix_hashes: expected a list of at most 0 hex strings",
        ),
        ('{"fairserve_trace": 2}', "t.jsonl:2: fairserve_trace: expected version 1, got 2"),
        (
            '{"fairserve_trace": 1, "block_tokens": 0}',
            "t.jsonl:2: block_tokens: expected an integer >= 1",
        ),
    ],
)
def test_malformed_trace_lines_name_file_line_and_field(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(f"{record_line()}\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load_trace(path)
    assert str(info.value).startswith(f"{tmp_path}/{message}"), str(info.value)


def test_writer_header_and_missing_file(tmp_path: Path) -> None:
    out = io.StringIO()
    TraceWriter(out, 16)
    assert json.loads(out.getvalue()) == {"fairserve_trace": 1, "block_tokens": 16}
    with pytest.raises(ConfigError, match="block_tokens"):
        TraceWriter(out, 0)
    with pytest.raises(ConfigError, match="cannot read trace"):
        load_trace(tmp_path / "missing.jsonl")
