"""Request traces (JSON lines): record what clients sent, replay it as a workload.

A trace never holds text or token ids, only what scheduling depends on. The first line may
be a header, ``{"fairserve_trace": 1, "block_tokens": 32, "name": ..., "duration_s": ...,
"seed": ...}`` (all but the version optional); every other line is one request::

    {"client": "alice", "app": "alice/p3", "app_type": "multi-turn", "arrival_s": 12.5,
     "prompt_tokens": 1234, "prefix_hashes": ["9f1c...", ...], "output_tokens": 87,
     "max_output_tokens": 512}

``app``, ``app_type`` and ``max_output_tokens`` are optional (null or absent).

``prefix_hashes`` are chained hashes of the prompt's full blocks of ``block_tokens``
tokens: hash i covers blocks 0..i, so two prompts share the first i+1 hashes exactly when
they share the first (i+1)·block_tokens tokens. Replay rebuilds each block's token ids
from its hash alone, so equal hash sequences give equal token prefixes and the prefix
cache behaves as it did; the partial last block is replayed as fresh tokens.

Replay is open loop: the requests of one ``app`` become one program whose calls are
released at their recorded arrival times (a trace does not know which call waited for
which). Outputs are not recorded, so a later prompt that contained an earlier answer
re-computes those tokens on replay.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from fairserve.core.errors import ConfigError
from fairserve.core.types import TOKEN_BYTES
from fairserve.workloads.model import Call, ClientInfo, Program
from fairserve.workloads.spec import VOCAB_SIZE
from fairserve.workloads.tokens import random_key

TRACE_VERSION = 1
DEFAULT_BLOCK_TOKENS = 32
_HASH_BYTES = 8


def prefix_hashes(prompt_key: bytes, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> list[str]:
    """Chained hashes (hex) of the prompt's full blocks."""
    block_bytes = block_tokens * TOKEN_BYTES
    hashes: list[str] = []
    previous = b""
    for start in range(0, len(prompt_key) - block_bytes + 1, block_bytes):
        block = prompt_key[start : start + block_bytes]
        previous = hashlib.blake2b(previous + block, digest_size=_HASH_BYTES).digest()
        hashes.append(previous.hex())
    return hashes


def open_for_recording(path: str | Path) -> tuple[TextIO, Path | None]:
    """Open ``path`` for a new trace, keeping what a previous recording left there: a
    non-empty file is first renamed beside it (``NAME.1``, ``NAME.2``, ... the first free
    one), since a router restarted with the same ``--record`` must not erase the traffic it
    recorded before. Returns the stream and where the old trace went (None: nothing kept)."""
    target = Path(path)
    kept: Path | None = None
    if target.is_file() and target.stat().st_size > 0:
        n = 1
        while target.with_name(f"{target.name}.{n}").exists():
            n += 1
        kept = target.rename(target.with_name(f"{target.name}.{n}"))
    return target.open("w", encoding="utf-8"), kept


class TraceWriter:
    """Writes a trace to an open text stream, one request per ``write``."""

    def __init__(
        self,
        out: TextIO,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        *,
        name: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        if block_tokens < 1:
            raise ConfigError(f"block_tokens: expected an integer >= 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self._out = out
        header: dict[str, object] = {"fairserve_trace": TRACE_VERSION, "block_tokens": block_tokens}
        if name is not None:
            header["name"] = name
        if duration_s is not None:
            header["duration_s"] = duration_s
        out.write(json.dumps(header) + "\n")

    def write(
        self,
        client: str,
        app: str | None,
        arrival_s: float,
        prompt_key: bytes,
        output_tokens: int,
        max_output_tokens: int | None = None,
        app_type: str | None = None,
    ) -> None:
        record: dict[str, object] = {
            "client": client,
            "app": app,
            "app_type": app_type,
            "arrival_s": round(arrival_s, 6),
            "prompt_tokens": len(prompt_key) // TOKEN_BYTES,
            "prefix_hashes": prefix_hashes(prompt_key, self.block_tokens),
            "output_tokens": output_tokens,
        }
        if max_output_tokens is not None:
            record["max_output_tokens"] = max_output_tokens
        self._out.write(json.dumps(record, separators=(",", ":")) + "\n")


@dataclass(frozen=True, slots=True)
class TraceRecord:
    client: str
    app: str
    app_type: str
    arrival_s: float
    prompt_tokens: int
    hashes: tuple[int, ...]
    output_tokens: int
    max_output_tokens: int


def block_tokens_key(hashes: tuple[int, ...], block_tokens: int) -> bytes:
    """The token ids of the blocks with these hashes (splitmix64 of hash and position)."""
    if not hashes:
        return b""
    mixed = (
        np.array(hashes, dtype=np.uint64)[:, None]
        + (np.arange(1, block_tokens + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))[None, :]
    )
    mixed ^= mixed >> np.uint64(30)
    mixed *= np.uint64(0xBF58476D1CE4E5B9)
    mixed ^= mixed >> np.uint64(27)
    mixed *= np.uint64(0x94D049BB133111EB)
    mixed ^= mixed >> np.uint64(31)
    return (mixed % np.uint64(VOCAB_SIZE)).astype("<u4").tobytes()


class TraceWorkload:
    """A recorded trace as a ``Workload``; ``seed`` only drives the partial-block tokens."""

    def __init__(
        self,
        records: list[TraceRecord],
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        *,
        name: str = "trace",
        duration_s: float | None = None,
        seed: int = 0,
    ) -> None:
        self.records = sorted(records, key=lambda r: r.arrival_s)
        self.block_tokens = block_tokens
        self._name = name
        last_s = self.records[-1].arrival_s if self.records else 0.0
        self._duration_s = duration_s if duration_s is not None else last_s + 1.0
        self._seed = seed
        names = dict.fromkeys(r.client for r in self.records)
        self._clients = tuple(ClientInfo(name) for name in names)
        owners: dict[str, set[str]] = {}
        for record in self.records:
            owners.setdefault(record.app, set()).add(record.client)
        self._shared_apps = {app for app, clients in owners.items() if len(clients) > 1}

    @property
    def name(self) -> str:
        return self._name

    @property
    def description(self) -> str:
        return f"replay of a recorded trace ({len(self.records)} requests)"

    @property
    def duration_s(self) -> float:
        return self._duration_s

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def clients(self) -> tuple[ClientInfo, ...]:
        return self._clients

    def programs(
        self, seed: int | None = None, duration_s: float | None = None
    ) -> Iterator[Program]:
        horizon_s = self._duration_s if duration_s is None else duration_s
        rng = np.random.default_rng(self._seed if seed is None else seed)
        groups: dict[tuple[str, str], list[TraceRecord]] = {}
        for record in self.records:
            if record.arrival_s < horizon_s:
                groups.setdefault((record.client, record.app), []).append(record)
        for records in groups.values():  # first appearance = start order
            yield self._program(records, rng)

    def _program(self, records: list[TraceRecord], rng: np.random.Generator) -> Program:
        first = records[0]
        app = f"{first.client}:{first.app}" if first.app in self._shared_apps else first.app
        calls = []
        for k, record in enumerate(records):
            shared = block_tokens_key(record.hashes, self.block_tokens)
            tail = record.prompt_tokens - len(record.hashes) * self.block_tokens
            calls.append(
                Call(
                    f"{app}/c{k}",
                    shared + random_key(rng, tail),
                    record.output_tokens,
                    record.max_output_tokens,
                    delay_s=record.arrival_s - first.arrival_s,
                )
            )
        return Program(app, first.client, first.app_type, first.arrival_s, tuple(calls))


def load_trace(path: str | Path) -> TraceWorkload:
    """Read a trace file (errors name the file, the line and the field)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read trace: {exc.strerror or exc}") from None
    header: Mapping[str, object] = {}
    records: list[TraceRecord] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: invalid JSON: {exc.msg}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {data!r}")
        if "fairserve_trace" in data:
            header = _check_header(data, where)
            continue
        block = _int(header, "block_tokens", where, DEFAULT_BLOCK_TOKENS)
        records.append(_record(data, where, block, len(records)))
    return TraceWorkload(
        records,
        _int(header, "block_tokens", str(path), DEFAULT_BLOCK_TOKENS),
        name=str(header.get("name", path.stem)),
        duration_s=_duration(header, str(path)),
        seed=_int(header, "seed", str(path), 0, minimum=0),
    )


def _check_header(data: Mapping[str, object], where: str) -> Mapping[str, object]:
    if data["fairserve_trace"] != TRACE_VERSION:
        raise ConfigError(
            f"{where}: fairserve_trace: expected version {TRACE_VERSION}, "
            f"got {data['fairserve_trace']!r}"
        )
    _int(data, "block_tokens", where, DEFAULT_BLOCK_TOKENS)
    _duration(data, where)
    return data


def _duration(data: Mapping[str, object], where: str) -> float | None:
    value = data.get("duration_s")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{where}: duration_s: expected a positive number, got {value!r}")
    return float(value)


def _int(
    data: Mapping[str, object], key: str, where: str, default: int | None, minimum: int = 1
) -> int:
    value = data.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: {key}: missing (expected an integer >= {minimum})")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: {key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _record(data: Mapping[str, object], where: str, block: int, index: int) -> TraceRecord:
    client = data.get("client")
    if not isinstance(client, str) or not client:
        raise ConfigError(f"{where}: client: expected a non-empty string, got {client!r}")
    app = data.get("app")
    if app is None:
        app = f"{client}/r{index}"
    if not isinstance(app, str):
        raise ConfigError(f"{where}: app: expected a string or null, got {app!r}")
    arrival = data.get("arrival_s")
    if isinstance(arrival, bool) or not isinstance(arrival, int | float):
        raise ConfigError(f"{where}: arrival_s: expected a number >= 0, got {arrival!r}")
    if not math.isfinite(arrival) or arrival < 0:
        raise ConfigError(f"{where}: arrival_s: expected a number >= 0, got {arrival!r}")
    prompt = _int(data, "prompt_tokens", where, None)
    output = _int(data, "output_tokens", where, None)
    asked = _int(data, "max_output_tokens", where, output, minimum=output)
    app_type = data.get("app_type") or "trace"
    if not isinstance(app_type, str):
        raise ConfigError(f"{where}: app_type: expected a string or null, got {app_type!r}")
    hashes = _hashes(data, where, prompt, block)
    return TraceRecord(client, app, app_type, float(arrival), prompt, hashes, output, asked)


def _hashes(data: Mapping[str, object], where: str, prompt: int, block: int) -> tuple[int, ...]:
    raw = data.get("prefix_hashes", [])
    expected = f"a list of at most {prompt // block} hex strings"
    if not isinstance(raw, list) or len(raw) > prompt // block:
        raise ConfigError(f"{where}: prefix_hashes: expected {expected}, got {raw!r}")
    try:
        return tuple(int(h, 16) & 0xFFFF_FFFF_FFFF_FFFF for h in raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: prefix_hashes: expected {expected}") from None
