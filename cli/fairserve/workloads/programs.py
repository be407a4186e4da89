"""Program generators: turn one client stream's settings into ``Program``s of ``Call``s.

Each program draws its lengths with one vectorised numpy call per quantity (none for
constants) and takes its fresh token ids as slices of a per-stream pool, then builds
prompts by concatenating bytes: per-call Python work is what limits how fast the simulator
can replay an hour of tree-of-thought traffic. Dependent calls extend their parent's
prompt *and output* (``output_key``), which is what lets an engine that caches prompt +
output on finish serve them from its prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable

from fairserve.workloads.dists import Constant, Dist, draw_floats, draw_ints
from fairserve.workloads.model import Call, Program
from fairserve.workloads.spec import ClientSpec
from fairserve.workloads.tokens import (
    DOCUMENTS,
    PROGRAMS,
    PrefixSource,
    TokenPool,
    random_key,
    stream_rng,
)


class ProgramBuilder:
    """Builds the programs of one client stream; deterministic in (seed, client, entry)."""

    def __init__(
        self, spec: ClientSpec, seed: int, prefix: PrefixSource, common: bytes = b""
    ) -> None:
        """``common``: the named ``[[prefixes]]`` entry the client's prompts start with."""
        self.spec = spec
        self._common = common
        self._seed = seed
        self._rng = stream_rng(seed, spec.name, PROGRAMS, spec.occurrence)
        self._tokens = TokenPool(self._rng)
        self._prefix = prefix
        self._documents: dict[int, bytes] = {}
        builders: dict[str, Callable[[str], tuple[Call, ...]]] = {
            "single": self._single,
            "long-qa": self._long_qa,
            "multi-turn": self._multi_turn,
            "tree-of-thought": self._tree,
            "judge": self._judge,
        }
        self._build = builders[spec.program]

    def build(self, app: str, start_s: float) -> Program:
        return Program(app, self.spec.name, self.spec.program, start_s, self._build(app))

    # -- shared pieces ---------------------------------------------------------------

    def _ints(self, dist: Dist, n: int, floor: int = 1) -> list[int]:
        if isinstance(dist, Constant):
            return [max(floor, round(dist.value))] * n
        ints: list[int] = draw_ints(dist, self._rng, n, floor).tolist()
        return ints

    def _int(self, dist: Dist, floor: int = 1) -> int:
        if isinstance(dist, Constant):
            return max(floor, round(dist.value))
        return self._ints(dist, 1, floor)[0]

    def _max_outputs(self, outputs: list[int]) -> list[int]:
        """What each call asks for: the configured maximum, never below the true output."""
        if self.spec.max_output_tokens is None:
            return outputs
        asked = self._ints(self.spec.max_output_tokens, len(outputs))
        return [max(a, o) for a, o in zip(asked, outputs, strict=True)]

    def _think(self, n: int) -> list[float]:
        think = self.spec.think_time_s
        if isinstance(think, Constant):
            return [max(0.0, think.value)] * n
        delays: list[float] = draw_floats(think, self._rng, n).tolist()
        return delays

    def _shared_prefix(self) -> bytes:
        return self._common + self._prefix.prefix(self._int(self.spec.shared_prefix_tokens, 0))

    def _document(self) -> bytes:
        """One of the client's documents (each drawn once, from its own stream)."""
        count = self.spec.documents
        index = int(self._rng.integers(count)) if count > 1 else 0
        document = self._documents.get(index)
        if document is None:
            rng = stream_rng(self._seed, self.spec.name, DOCUMENTS, index)
            length = int(draw_ints(self.spec.shared_prefix_tokens, rng, 1, 0)[0])
            document = self._documents[index] = random_key(rng, length)
        return document

    def _one_call(self, app: str, prefix: bytes) -> tuple[Call, ...]:
        spec = self.spec
        question = self._tokens.take(self._int(spec.input_tokens))
        outputs = [self._int(spec.output_tokens)]
        max_out = self._max_outputs(outputs)[0]
        return (Call(f"{app}/c0", prefix + question, outputs[0], max_out),)

    # -- program kinds ---------------------------------------------------------------

    def _single(self, app: str) -> tuple[Call, ...]:
        return self._one_call(app, self._shared_prefix())

    def _long_qa(self, app: str) -> tuple[Call, ...]:
        return self._one_call(app, self._common + self._document())

    def _multi_turn(self, app: str) -> tuple[Call, ...]:
        """Turn k+1's prompt = turn k's prompt + turn k's output + a new user turn."""
        spec = self.spec
        turns = self._int(spec.turns)
        prompt = self._shared_prefix()
        inputs = self._ints(spec.input_tokens, turns)
        outputs = self._ints(spec.output_tokens, turns)
        max_outs = self._max_outputs(outputs)
        think = self._think(turns)
        take = self._tokens.take
        calls: list[Call] = []
        for k in range(turns):
            prompt += take(inputs[k])
            output_key = take(outputs[k]) if k < turns - 1 else b""
            after = (calls[-1].id,) if calls else ()
            delay_s = think[k] if calls else 0.0
            calls.append(
                Call(f"{app}/c{k}", prompt, outputs[k], max_outs[k], after, delay_s, output_key)
            )
            prompt += output_key
        return tuple(calls)

    def _tree(self, app: str) -> tuple[Call, ...]:
        """Breadth-first tree: call j's parent is call j // branches - 1 (-1: the question)."""
        spec = self.spec
        branches = spec.branches
        n_calls = sum(branches**level for level in range(1, spec.depth + 1))
        first_leaf = n_calls - branches**spec.depth
        root = self._shared_prefix() + self._tokens.take(self._int(spec.input_tokens))
        steps = self._ints(spec.step_tokens, n_calls, 0)
        outputs = self._ints(spec.output_tokens, n_calls)
        max_outs = self._max_outputs(outputs)
        think = self._think(n_calls)
        take = self._tokens.take
        ids = [f"{app}/c{j}" for j in range(n_calls)]
        contexts: list[bytes] = []  # prompt + output of each inner call
        calls: list[Call] = []
        for j in range(n_calls):
            parent = j // branches - 1
            prompt = (contexts[parent] if parent >= 0 else root) + take(steps[j])
            if j < first_leaf:
                output_key = take(outputs[j])
                contexts.append(prompt + output_key)
            else:
                output_key = b""
            after = (ids[parent],) if parent >= 0 else ()
            delay_s = think[j] if parent >= 0 else 0.0
            calls.append(Call(ids[j], prompt, outputs[j], max_outs[j], after, delay_s, output_key))
        return tuple(calls)

    def _judge(self, app: str) -> tuple[Call, ...]:
        """Branch, then ``dimensions`` solves on branch prompt + output, then one merge."""
        spec = self.spec
        dims = spec.dimensions
        n_calls = dims + 2
        steps = self._ints(spec.step_tokens, n_calls, 0)
        outputs = self._ints(spec.output_tokens, n_calls)
        max_outs = self._max_outputs(outputs)
        think = self._think(n_calls)
        take = self._tokens.take
        branch_prompt = self._shared_prefix() + take(self._int(spec.input_tokens))
        branch_out = take(outputs[0])
        branch = Call(f"{app}/c0", branch_prompt, outputs[0], max_outs[0], output_key=branch_out)
        context = branch_prompt + branch_out
        solves = []
        for k in range(1, dims + 1):
            prompt = context + take(steps[k])
            solves.append(
                Call(f"{app}/c{k}", prompt, outputs[k], max_outs[k], (branch.id,), think[k],
                     take(outputs[k]))
            )  # fmt: skip
        merge_prompt = context + b"".join(s.output_key for s in solves) + take(steps[-1])
        merge = Call(
            f"{app}/c{n_calls - 1}", merge_prompt, outputs[-1], max_outs[-1],
            tuple(s.id for s in solves), think[-1],
        )  # fmt: skip
        return (branch, *solves, merge)
