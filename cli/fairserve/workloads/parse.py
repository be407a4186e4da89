"""The workload file (TOML): parsing and validation.

Top level: ``name`` (default: the file's stem), ``description`` (optional), ``duration_s``,
``seed`` (default 0) and one ``[[clients]]`` table per client stream::

    name = "demo"
    duration_s = 300
    seed = 7

    [[clients]]
    name = "alice"            # letters, digits, "_", "-", "."
    weight = 1                # fair-share weight (default 1)
    count = 1                 # n > 1: clients alice1 .. alicen, each with these settings
    program = "single"        # single | multi-turn | long-qa | tree-of-thought | judge
    arrival = "poisson"       # poisson | gamma | uniform | on-off | ramp
    rate_per_s = 2.0          # programs started per second (for on-off: while on)
    start_s = 0               # active window [start_s, stop_s); stop_s defaults to
    stop_s = 300              #   the workload's duration
    input_tokens = 512        # a number, or a distribution table:
    output_tokens = { dist = "lognormal", mean = 128, cv = 0.5, min = 8, max = 1024 }
    shared_prefix_tokens = { dist = "uniform", min = 100, max = 200 }
    max_output_tokens = 1024  # what the client asks for (default: the true output length)

Lengths: a number (constant) or ``{ dist = "constant", value = N }``,
``{ dist = "uniform", min = A, max = B }`` (integers, both included) or
``{ dist = "lognormal", mean = M, cv = C, min = A, max = B }`` (``cv`` = standard
deviation / mean; ``min``/``max`` optional clamps). Token lengths are whole numbers.

Prompts: ``shared_prefix_tokens`` is the client's own prefix (a system prompt), the same
token ids in every program of that client (a shorter draw is a prefix of a longer one);
``input_tokens`` is the fresh part after it (question, user turn, article).

Arrivals: ``poisson``; ``gamma`` with ``cv`` (gap coefficient of variation; the DLPM
paper's traces); ``uniform`` (evenly spaced, VTC's deterministic traces); ``on-off`` with
``on_s`` and ``off_s`` (starts on; ``rate_per_s`` is the rate while on); ``ramp`` with
``rate_end_per_s`` (the rate moves linearly from ``rate_per_s`` to ``rate_end_per_s`` over
the client's window as written in the file, and stays at ``rate_end_per_s`` if a run is
longer). on-off and ramp take ``spacing = "poisson" | "gamma" | "uniform"`` (default
poisson) for how arrivals are spaced.

Programs and their parameters:

- ``single``: one call, prompt = shared prefix + input.
- ``long-qa``: long-context QA; ``documents`` (default 1) documents per client, each of
  ``shared_prefix_tokens`` (drawn once per document); a program asks one question
  (``input_tokens``) about one of them.
- ``multi-turn``: ``turns`` (a length) calls, each after the previous one plus
  ``think_time_s``; prompt of turn k+1 = prompt k + output k + a new user turn.
- ``tree-of-thought``: ``depth`` levels of ``branches`` children per node
  (branches + branches² + ... calls); a child starts when its parent finishes and extends
  the parent's prompt and output with ``step_tokens`` new tokens (default 16); the first
  level extends the question.
- ``judge``: branch-solve-merge: one branch call, ``dimensions`` solve calls after it
  (branch prompt + branch output + ``step_tokens``), one merge call after all of them
  (branch prompt + branch output + every solve's output + ``step_tokens``).
- ``think_time_s`` (a number or distribution, seconds, default 0) delays every call that
  waits for another (multi-turn, tree-of-thought, judge).

Shared prefixes across clients: a top-level ``[[prefixes]]`` table names a token sequence
(``name = "sys"``, ``tokens = 2000``); a client with ``shared_prefix = "sys"`` starts every
prompt with it, before its own ``shared_prefix_tokens`` (teams sharing one system prompt hit
each other's cache). Its tokens are seeded by the workload seed and the prefix's name.

Phases and distribution shift: several ``[[clients]]`` entries may use the same ``name``.
They are one client (same weight, shared prefix, program numbering) with several streams,
usually in consecutive windows (``start_s``/``stop_s``) with different arrivals or rates,
as in VTC's distribution-shift experiment. Overlapping windows are allowed too (a client
mixing program kinds).

Unknown keys, and keys that the chosen program or arrival does not use, are errors, so a
typo never falls back to a default silently. Values beyond sanity limits (``spec.MAX_*``:
a million tokens, a thousand turns, trees of ten thousand calls) are errors too.

Seeds: each stream of random numbers is seeded by the workload ``seed``, the client's name
and the entry's index among entries of that name, so adding, removing or reordering other
clients never changes a client's traffic.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from fairserve.core.errors import ConfigError
from fairserve.workloads.arrivals import ARRIVALS, SPACINGS, ArrivalSpec
from fairserve.workloads.dists import Constant, Dist
from fairserve.workloads.fields import Table
from fairserve.workloads.spec import (
    MAX_CLIENT_COUNT,
    MAX_DEPTH,
    MAX_FAN_OUT,
    MAX_TOKENS,
    MAX_TREE_CALLS,
    MAX_TURNS,
    PROGRAMS,
    ClientSpec,
    PrefixSpec,
    WorkloadSpec,
)

TOP_KEYS = ("name", "description", "duration_s", "seed", "clients", "prefixes")
COMMON_KEYS = (
    "name", "count", "weight", "program", "arrival", "rate_per_s", "start_s", "stop_s",
    "input_tokens", "output_tokens", "shared_prefix_tokens", "max_output_tokens",
    "shared_prefix",
)  # fmt: skip
PROGRAM_KEYS: dict[str, tuple[str, ...]] = {
    "single": (),
    "long-qa": ("documents",),
    "multi-turn": ("turns", "think_time_s"),
    "tree-of-thought": ("branches", "depth", "step_tokens", "think_time_s"),
    "judge": ("dimensions", "step_tokens", "think_time_s"),
}
ARRIVAL_KEYS: dict[str, tuple[str, ...]] = {
    "poisson": (),
    "gamma": ("cv",),
    "uniform": (),
    "on-off": ("on_s", "off_s", "spacing", "cv"),
    "ramp": ("rate_end_per_s", "spacing", "cv"),
}
_ALL_KEYS = frozenset(COMMON_KEYS).union(*PROGRAM_KEYS.values(), *ARRIVAL_KEYS.values())
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def load_spec(path: str | Path) -> WorkloadSpec:
    """Read and validate a workload file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read workload file: {exc.strerror or exc}") from None
    return loads_spec(text, str(path))


def loads_spec(text: str, source: str) -> WorkloadSpec:
    """Parse workload TOML text; ``source`` names it in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    return parse_spec(data, source)


def parse_spec(data: Mapping[str, object], source: str) -> WorkloadSpec:
    """Validate a decoded workload file (a TOML document as a dict)."""
    top = Table(data, "", source)
    top.check_keys(TOP_KEYS)
    duration_s = top.number("duration_s")
    prefixes = _parse_prefixes(top)
    entries = data.get("clients")
    if not isinstance(entries, list) or not entries:
        top.fail("clients", "a non-empty array of [[clients]] tables", entries)
    clients: list[tuple[Table, ClientSpec]] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            top.fail(f"clients[{index}]", "a table", entry)
        table = Table(entry, f"clients[{index}]", source)
        specs = _parse_client(table, duration_s)
        _check_prefix_name(table, specs[0].shared_prefix, prefixes)
        clients.extend((table, spec) for spec in specs)
    return WorkloadSpec(
        name=top.string("name", Path(source).stem),
        description=_description(top),
        duration_s=duration_s,
        clients=_number_occurrences(clients),
        seed=top.integer("seed", 0, minimum=0),
        source=source,
        prefixes=prefixes,
    )


def _parse_prefixes(top: Table) -> tuple[PrefixSpec, ...]:
    """The ``[[prefixes]]`` array: unique names, each a length in tokens."""
    entries = top.data.get("prefixes", [])
    if not isinstance(entries, list):
        top.fail("prefixes", "an array of [[prefixes]] tables", entries)
    out: dict[str, PrefixSpec] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            top.fail(f"prefixes[{index}]", "a table", entry)
        table = Table(entry, f"prefixes[{index}]", top.source)
        table.check_keys(("name", "tokens"))
        name = table.string("name")
        if not _NAME.fullmatch(name):
            table.fail("name", "letters, digits, '_', '-' or '.' (starting alphanumeric)", name)
        if name in out:
            table.error("name", f"prefix {name!r} is defined twice")
        out[name] = PrefixSpec(name, table.integer("tokens", maximum=MAX_TOKENS))
    return tuple(out.values())


def _check_prefix_name(table: Table, name: str | None, prefixes: tuple[PrefixSpec, ...]) -> None:
    if name is None or any(p.name == name for p in prefixes):
        return
    known = ", ".join(p.name for p in prefixes) or "none defined"
    table.error("shared_prefix", f"unknown prefix {name!r}; [[prefixes]]: {known}")


def _description(top: Table) -> str:
    value = top.data.get("description", "")
    if not isinstance(value, str):
        top.fail("description", "a string", value)
    return value


def _parse_client(table: Table, duration_s: float) -> list[ClientSpec]:
    table.check_keys(_ALL_KEYS)
    name = table.string("name")
    if not _NAME.fullmatch(name):
        table.fail("name", "letters, digits, '_', '-' or '.' (starting alphanumeric)", name)
    program = table.choice("program", PROGRAMS, "single")
    arrival_kind = table.choice("arrival", ARRIVALS, "poisson")
    _check_applicable(table, program, arrival_kind)
    start_s = table.number("start_s", 0.0, strict=False)
    if start_s >= duration_s:
        table.fail("start_s", f"a time before duration_s ({duration_s:g})", table.data["start_s"])
    stop_s = None
    if "stop_s" in table.data:
        stop_s = table.number("stop_s")
        if stop_s <= start_s:
            table.fail("stop_s", f"a time after start_s ({start_s:g})", table.data["stop_s"])
    window_s = (stop_s if stop_s is not None else duration_s) - start_s
    spec = ClientSpec(
        name=name,
        program=program,
        arrival=_parse_arrival(table, arrival_kind, window_s),
        input_tokens=_tokens(table, "input_tokens", None, floor=1),
        output_tokens=_tokens(table, "output_tokens", None, floor=1),
        weight=table.number("weight", 1.0),
        shared_prefix_tokens=_tokens(
            table, "shared_prefix_tokens", None if program == "long-qa" else Constant(0), floor=0
        ),
        max_output_tokens=_optional_length(table, "max_output_tokens"),
        start_s=start_s,
        stop_s=stop_s,
        shared_prefix=table.string("shared_prefix") if "shared_prefix" in table.data else None,
    )
    spec = _parse_program(table, spec)
    count = table.integer("count", 1, maximum=MAX_CLIENT_COUNT)
    if count == 1:
        return [spec]
    return [replace(spec, name=f"{name}{i}") for i in range(1, count + 1)]


def _check_applicable(table: Table, program: str, arrival: str) -> None:
    """Keys valid somewhere but not for this program or arrival are errors too."""
    for key in table.data:
        if key in COMMON_KEYS:
            continue
        if any(key in keys for keys in PROGRAM_KEYS.values()):
            if key not in PROGRAM_KEYS[program]:
                users = [p for p, keys in PROGRAM_KEYS.items() if key in keys]
                table.error(key, f"not used by program {program!r} (only by {', '.join(users)})")
        elif key not in ARRIVAL_KEYS[arrival]:
            users = [a for a, keys in ARRIVAL_KEYS.items() if key in keys]
            table.error(key, f"not used by arrival {arrival!r} (only by {', '.join(users)})")


def _parse_arrival(table: Table, kind: str, window_s: float) -> ArrivalSpec:
    spacing = kind if kind in SPACINGS else table.choice("spacing", SPACINGS, "poisson")
    cv = 1.0
    if spacing == "gamma":
        cv = table.number("cv")
    elif "cv" in table.data:
        table.error("cv", f"only used with gamma spacing, not {spacing!r}")
    spec = ArrivalSpec(kind=kind, spacing=spacing, cv=cv, ramp_s=window_s)
    if kind == "ramp":
        rate = table.number("rate_per_s", minimum=0.0, strict=False)
        end = table.number("rate_end_per_s", minimum=0.0, strict=False)
        if rate == 0 and end == 0:
            table.fail("rate_end_per_s", "a positive rate at one end of the ramp", end)
        return replace(spec, rate_per_s=rate, rate_end_per_s=end)
    spec = replace(spec, rate_per_s=table.number("rate_per_s"))
    if kind == "on-off":
        return replace(spec, on_s=table.number("on_s"), off_s=table.number("off_s", strict=False))
    return spec


def _tokens(table: Table, key: str, default: Dist | None, *, floor: int) -> Dist:
    return table.dist(key, default, floor=floor, integer=True, ceiling=MAX_TOKENS)


def _optional_length(table: Table, key: str) -> Dist | None:
    if key not in table.data:
        return None
    return _tokens(table, key, None, floor=1)


def _parse_program(table: Table, spec: ClientSpec) -> ClientSpec:
    """Fill in the parameters of the client's program kind (the others keep defaults)."""
    keys = PROGRAM_KEYS[spec.program]
    if "think_time_s" in keys:
        think = table.dist("think_time_s", Constant(0.0), floor=0, integer=False)
        spec = replace(spec, think_time_s=think)
    if "step_tokens" in keys:
        spec = replace(spec, step_tokens=_tokens(table, "step_tokens", Constant(16), floor=0))
    if spec.program == "multi-turn":
        turns = table.dist("turns", None, floor=1, integer=True, ceiling=MAX_TURNS)
        return replace(spec, turns=turns)
    if spec.program == "tree-of-thought":
        branches = table.integer("branches", maximum=MAX_FAN_OUT)
        depth = table.integer("depth", maximum=MAX_DEPTH)
        _check_tree_size(table, branches, depth)
        return replace(spec, branches=branches, depth=depth)
    if spec.program == "judge":
        return replace(spec, dimensions=table.integer("dimensions", maximum=MAX_FAN_OUT))
    if spec.program == "long-qa":
        return replace(spec, documents=table.integer("documents", 1, maximum=MAX_FAN_OUT))
    return spec


def _check_tree_size(table: Table, branches: int, depth: int) -> None:
    calls = sum(branches**level for level in range(1, depth + 1))
    if calls > MAX_TREE_CALLS:
        table.fail(
            "depth", f"a tree of at most {MAX_TREE_CALLS} calls (this one has {calls})", depth
        )


def _number_occurrences(clients: list[tuple[Table, ClientSpec]]) -> tuple[ClientSpec, ...]:
    """Entries sharing a name are one client: number them and check their weights agree."""
    seen: dict[str, tuple[Table, ClientSpec]] = {}
    counts: dict[str, int] = {}
    out: list[ClientSpec] = []
    for table, spec in clients:
        first_table, first = seen.setdefault(spec.name, (table, spec))
        if first.weight != spec.weight:
            table.error(
                "weight",
                f"client {spec.name!r} already has weight {first.weight:g} "
                f"({first_table.path}); entries of one client must use the same weight",
            )
        occurrence = counts.get(spec.name, 0)
        counts[spec.name] = occurrence + 1
        out.append(replace(spec, occurrence=occurrence))
    return tuple(out)
