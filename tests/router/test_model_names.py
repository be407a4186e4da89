"""Model names as SGLang treats them: a router fronting one model serves any name (SGLang's
own examples send ``"model": "default"``); with several models the name picks one, and an
unknown name is a 404 that lists the names served."""

from __future__ import annotations

from contextlib import AsyncExitStack

from fairserve.worker.server import WorkerServer
from tests.router.helpers import chat, post, routed, sim_router
from tests.worker.helpers import make_config, run


def test_one_model_accepts_any_name() -> None:
    # Before: "default" was refused with 404 although the router serves one model.
    async def body() -> None:
        async with sim_router() as (_, session, _):
            for name in ("default", "gpt-9", "fairserve-sim"):
                status, answer, _ = await post(session, "/v1/chat/completions", chat(model=name))
                assert status == 200, (name, answer)
            status, _, _ = await post(session, "/v1/completions", {"prompt": "a", "model": "x"})
            assert status == 200

    run(body())


def test_several_models_refuse_an_unknown_name() -> None:
    async def body() -> None:
        async with AsyncExitStack() as stack:
            urls = []
            for name in ("model-a", "model-b"):
                server = WorkerServer(make_config(model_name=name, speed=200.0), "127.0.0.1", 0)
                urls.append(await server.start())
                stack.push_async_callback(server.stop)
            _, session = await stack.enter_async_context(routed(urls))
            status, error, _ = await post(session, "/v1/chat/completions", chat(model="default"))
            assert status == 404 and error["error"]["code"] == 404
            message = error["error"]["message"]
            assert "'default'" in message and "model-a" in message and "model-b" in message
            status, _, _ = await post(session, "/v1/chat/completions", chat(model="model-b"))
            assert status == 200

    run(body())


def test_strict_model_names_refuse_an_unknown_name_with_one_model() -> None:
    async def body() -> None:
        async with sim_router(strict_model_names=True) as (_, session, _):
            status, error, _ = await post(session, "/v1/chat/completions", chat(model="default"))
            assert status == 404 and "fairserve-sim" in error["error"]["message"]
            status, _, _ = await post(session, "/v1/chat/completions", chat(model="fairserve-sim"))
            assert status == 200

    run(body())
