"""Workloads: file format, program generators, built-in scenarios.

``resolve_workload("vtc-constant")``, ``resolve_workload("mine.toml")`` or
``resolve_workload("recorded.jsonl")`` gives a ``Workload``; ``workload.programs()`` yields
its programs lazily in start order. The file format is described in
``fairserve.workloads.parse``, the trace format in ``fairserve.workloads.trace``.
"""

from fairserve.workloads.catalog import (
    builtin_names,
    builtin_text,
    list_builtin,
    load_builtin,
    resolve_workload,
)
from fairserve.workloads.model import Call, ClientInfo, Program, Workload
from fairserve.workloads.synthetic import (
    SyntheticWorkload,
    load_workload,
    loads_workload,
    parse_workload,
)
from fairserve.workloads.trace import TraceWorkload, TraceWriter, load_trace

__all__ = [
    "Call",
    "ClientInfo",
    "Program",
    "SyntheticWorkload",
    "TraceWorkload",
    "TraceWriter",
    "Workload",
    "builtin_names",
    "builtin_text",
    "list_builtin",
    "load_builtin",
    "load_trace",
    "load_workload",
    "loads_workload",
    "parse_workload",
    "resolve_workload",
]
