"""Programs: call DAGs are well formed and dependent prompts extend parent prompt + output."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.types import TOKEN_BYTES, key_to_tokens
from fairserve.workloads import Program
from fairserve.workloads.spec import VOCAB_SIZE

from .helpers import client, take, workload

LENGTH = {"dist": "uniform", "min": 1, "max": 40}


def check_program(program: Program) -> None:
    """The invariants every host relies on."""
    seen: dict[str, int] = {}
    assert program.app.startswith(f"{program.client}/p")
    for k, call in enumerate(program.calls):
        assert call.id == f"{program.app}/c{k}"
        assert all(parent in seen for parent in call.after), "after refers to an earlier call"
        assert call.output_tokens >= 1
        assert call.max_output_tokens >= call.output_tokens
        assert call.delay_s >= 0
        assert len(call.prompt_key) % TOKEN_BYTES == 0 and call.input_tokens >= 1
        assert not call.output_key or len(call.output_key) == 4 * call.output_tokens
        seen[call.id] = k
    assert not program.calls[0].after


def by_id(program: Program) -> dict[str, Any]:
    return {call.id: call for call in program.calls}


def test_single_prompt_is_the_clients_prefix_plus_a_fresh_suffix() -> None:
    w = workload(client("a", shared_prefix_tokens=50), client("b", shared_prefix_tokens=50))
    programs = take(w, 40)
    prefixes: dict[str, set[bytes]] = {p.client: set() for p in programs}
    for p in programs:
        check_program(p)
        (call,) = p.calls
        assert call.input_tokens == 150
        assert call.output_key == b""
        prefixes[p.client].add(call.prompt_key[: 50 * TOKEN_BYTES])
    assert all(len(keys) == 1 for keys in prefixes.values())
    assert prefixes["a"] != prefixes["b"]
    suffixes = [p.calls[0].prompt_key[200:] for p in programs]
    assert len(set(suffixes)) == len(suffixes)


def test_variable_shared_prefixes_are_prefixes_of_each_other() -> None:
    w = workload(client(shared_prefix_tokens={"dist": "uniform", "min": 0, "max": 3000}))
    programs = take(w, 30)
    longest = max((p.calls[0] for p in programs), key=lambda c: c.input_tokens)
    for p in programs:
        shared = p.calls[0].input_tokens - 100
        assert p.calls[0].prompt_key[: shared * 4] == longest.prompt_key[: shared * 4]


def test_token_ids_are_in_the_vocabulary() -> None:
    w = workload(client(program="judge", dimensions=3, shared_prefix_tokens=20))
    for p in take(w, 10):
        for call in p.calls:
            ids = key_to_tokens(call.prompt_key + call.output_key)
            assert min(ids) >= 0 and max(ids) < VOCAB_SIZE


def test_long_qa_programs_pick_among_the_clients_documents() -> None:
    w = workload(client(program="long-qa", documents=3, shared_prefix_tokens=500, input_tokens=20))
    programs = take(w, 60)
    documents = {p.calls[0].prompt_key[: 500 * 4] for p in programs}
    assert len(documents) == 3
    for p in programs:
        check_program(p)
        assert p.app_type == "long-qa" and p.calls[0].input_tokens == 520


def test_multi_turn_prompts_extend_previous_prompt_and_output() -> None:
    w = workload(
        client(program="multi-turn", turns=4, think_time_s=2.5, shared_prefix_tokens=10,
               input_tokens=LENGTH, output_tokens=LENGTH)
    )  # fmt: skip
    for p in take(w, 20):
        check_program(p)
        assert len(p.calls) == 4
        for prev, call in zip(p.calls, p.calls[1:], strict=False):
            assert call.after == (prev.id,)
            assert call.delay_s == 2.5
            assert call.prompt_key.startswith(prev.prompt_key + prev.output_key)
            assert call.input_tokens > prev.input_tokens + prev.output_tokens
        assert p.calls[-1].output_key == b""


def test_tree_of_thought_children_extend_parent_prompt_and_output() -> None:
    w = workload(
        client(program="tree-of-thought", branches=3, depth=3, step_tokens=5,
               input_tokens=LENGTH, output_tokens=LENGTH, shared_prefix_tokens=7)
    )  # fmt: skip
    for p in take(w, 10):
        check_program(p)
        calls = by_id(p)
        assert len(p.calls) == 3 + 9 + 27
        roots = [c for c in p.calls if not c.after]
        assert len(roots) == 3
        assert len({c.prompt_key[: -5 * 4] for c in roots}) == 1  # same question, new step
        children: dict[str, int] = {}
        for call in p.calls:
            if call.after:
                (parent_id,) = call.after
                parent = calls[parent_id]
                children[parent_id] = children.get(parent_id, 0) + 1
                assert call.prompt_key.startswith(parent.prompt_key + parent.output_key)
                assert call.input_tokens == parent.input_tokens + parent.output_tokens + 5
        assert set(children.values()) == {3} and len(children) == 3 + 9
        leaves = [c for c in p.calls if c.id not in children]
        assert len(leaves) == 27 and all(c.output_key == b"" for c in leaves)


def test_judge_is_branch_solve_merge() -> None:
    w = workload(client(program="judge", dimensions=4, step_tokens=3, think_time_s=0.5))
    for p in take(w, 10):
        check_program(p)
        branch, *solves, merge = p.calls
        assert len(solves) == 4 and not branch.after
        context = branch.prompt_key + branch.output_key
        for solve in solves:
            assert solve.after == (branch.id,) and solve.delay_s == 0.5
            assert solve.prompt_key.startswith(context)
            assert solve.input_tokens == len(context) // 4 + 3
        assert merge.after == tuple(s.id for s in solves)
        outputs = b"".join(s.output_key for s in solves)
        assert merge.prompt_key.startswith(context + outputs)
        assert merge.output_key == b""


def test_max_output_tokens_is_what_the_client_asks_never_below_the_output() -> None:
    w = workload(client(output_tokens=LENGTH, max_output_tokens=20))
    calls = [p.calls[0] for p in take(w, 100)]
    assert {c.max_output_tokens for c in calls if c.output_tokens <= 20} == {20}
    assert all(c.max_output_tokens == c.output_tokens for c in calls if c.output_tokens > 20)
    exact = workload(client(output_tokens=LENGTH))
    assert all(p.calls[0].max_output_tokens == p.calls[0].output_tokens for p in take(exact, 50))


PROGRAM_FIELDS = st.sampled_from(
    [
        {"program": "single"},
        {"program": "long-qa", "documents": 2},
        {"program": "multi-turn", "turns": {"dist": "uniform", "min": 1, "max": 5}},
        {"program": "tree-of-thought", "branches": 2, "depth": 3, "step_tokens": 0},
        {"program": "judge", "dimensions": 3},
    ]
)


@given(
    fields=PROGRAM_FIELDS,
    prefix=st.integers(0, 200),
    seed=st.integers(0, 2**31),
)
def test_every_program_kind_yields_valid_dags(
    fields: dict[str, Any], prefix: int, seed: int
) -> None:
    if fields["program"] == "long-qa":
        prefix = max(prefix, 1)
    w = workload(
        client("x", shared_prefix_tokens=prefix, input_tokens=LENGTH, output_tokens=LENGTH,
               **fields),
        seed=seed,
        duration_s=5.0,
    )  # fmt: skip
    apps = set()
    for p in w.programs():
        check_program(p)
        assert p.app_type == fields["program"]
        apps.add(p.app)
    assert len(apps) == len(list(w.programs()))
