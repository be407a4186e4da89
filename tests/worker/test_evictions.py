"""The eviction log: sequence numbers, paging, bounds and stale readers."""

from __future__ import annotations

from fairserve.core.prefix_key import text_key
from fairserve.core.radix import RadixTree
from fairserve.core.tokenizer import token_key, tokenize
from fairserve.core.types import key_len, tokens_to_key
from fairserve.worker.evictions import EvictionLog, TextPrompts
from tests.worker.helpers import get_json, make_config, post_json, run, serving, tiny_profile


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


def test_evicted_text_prompts_reach_the_router_in_its_own_key_space() -> None:
    """The router keys text prompts by their text blocks (``core.prefix_key``), not by the
    worker's tokens: the simulated worker publishes an evicted prefix of a text prompt in
    those units, so the router's global tree (here one like it) forgets exactly that
    prompt. A 256-token pool and distinct ~60-token prompts: the oldest ones go."""

    async def body() -> None:
        config = make_config(profile=tiny_profile(kv_capacity_tokens=256))
        prompts = [" ".join(f"w{i}x{j}" for j in range(60)) for i in range(8)]
        tree = RadixTree()  # the router's global tree, for this one worker
        async with serving(config) as (_, session):
            for prompt in prompts:
                tree.insert(text_key(prompt), "w")
                request = {"prompt": prompt, "max_tokens": 2}
                assert (await post_json(session, "/v1/completions", request))[0] == 200
            _, page = await get_json(session, "/fairserve/worker/evictions?since=0")
        assert page["events"], "nothing was evicted"
        removed = sum(tree.remove_owner(tokens_to_key(e["tokens"]), "w") for e in page["events"])
        assert removed > 0
        assert tree.match_owners(text_key(prompts[0])).owners == frozenset()  # forgotten
        assert tree.match_owners(text_key(prompts[-1])).owners == {"w"}  # still cached
        assert tree.match_owners(text_key(prompts[-1])).tokens == key_len(text_key(prompts[-1]))

    run(body())


def test_text_prompts_translate_what_they_begin_and_pass_the_rest_through() -> None:
    first = "The shared document. Then the first question?"
    second = "The shared document. And another one."
    prompts = TextPrompts()
    for text in (first, second):
        prompts.add(token_key(text), text)
    # A whole prompt: its text key, as the router has it.
    assert prompts.router_key(token_key(first)) == text_key(first)
    # The two prompts' shared tokens: the shared text (20 bytes, 5 units).
    shared = tokens_to_key(tokenize("The shared document."))
    assert token_key(second).startswith(shared)
    assert prompts.router_key(shared) == text_key("The shared document.")
    # A prefix that ends inside a unit keeps that unit, never a shorter prefix: "The"
    # (3 bytes) is the unit "The ", not nothing (which would name every prompt).
    assert prompts.router_key(token_key(first)[:4]) == b"The "
    shared_and_a_word = tokens_to_key(tokenize("The shared document. Then"))
    assert prompts.router_key(shared_and_a_word) == text_key(first)[:28]  # 25 bytes
    # Token ids nobody sent as text, and a flush: unchanged.
    ids = tokens_to_key([7, 8, 9])
    assert prompts.router_key(ids) == ids
    assert prompts.router_key(b"") == b""


def test_text_prompts_forget_the_oldest_past_their_bound() -> None:
    texts = [f"prompt number {i} with some words" for i in range(4)]
    tokens = key_len(token_key(texts[0]))
    prompts = TextPrompts(max_tokens=2 * tokens)
    for text in texts:
        prompts.add(token_key(text), text)
    assert prompts.router_key(token_key(texts[0])) == token_key(texts[0])  # forgotten
    assert prompts.router_key(token_key(texts[3])) == text_key(texts[3])


def test_an_evicted_node_ending_in_a_short_word_spares_the_document_above_it() -> None:
    """The worker evicts leaves first: two tails after "... a", then the node "... a"
    itself, while a third prompt still caches the document. The router must forget the
    first two and keep the third (a key cut back to a whole unit would name the document)."""
    document = "A shared document of some length here"  # 37 bytes
    tails = (document + " a b c", document + " a x y", document + " q r s")
    prompts = TextPrompts()
    tree = RadixTree()  # the router's tree for this worker
    for text in tails:
        prompts.add(token_key(text), text)
        tree.insert(text_key(text), "w")
    node = tokens_to_key(tokenize(document + " a"))  # 39 bytes, in the 10th unit
    for evicted in (token_key(tails[0]), token_key(tails[1]), node):
        tree.remove_owner(prompts.router_key(evicted), "w")
    assert tree.match_owners(text_key(tails[2])).owners == {"w"}
    assert tree.match_owners(text_key(tails[2])).tokens == key_len(text_key(tails[2]))
    for text in tails[:2]:
        assert tree.match_owners(text_key(text)).tokens < key_len(text_key(text))
