"""The scripted model server itself, through the real `openai` client and plain HTTP."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.agent.fake_model import UNSCRIPTED_STATUS, FakeModelServer, Turn

pytestmark = pytest.mark.fast


def client(server: FakeModelServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=0, timeout=5)


async def test_answers_in_order_and_records_requests(fake_model: FakeModelServer):
    fake_model.script(["first", "second"])
    async with client(fake_model) as model:
        for expected in ("first", "second"):
            completion = await model.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hello"}]
            )
            assert completion.choices[0].message.content == expected
    assert [r.texts("user") for r in fake_model.requests] == [["hello"], ["hello"]]
    assert fake_model.pending == 0


async def test_a_responder_answers_by_content_once_the_script_is_used(
    fake_model: FakeModelServer,
):
    fake_model.script(["scripted"])
    fake_model.respond_with(lambda request: request.texts("user")[-1].upper())
    async with client(fake_model) as model:
        answers = [
            (
                await model.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": word}]
                )
            )
            .choices[0]
            .message.content
            for word in ("one", "two", "three")
        ]
    assert answers == ["scripted", "TWO", "THREE"]


async def test_lists_models(fake_model: FakeModelServer):
    async with client(fake_model) as model:
        page = await model.models.list()
    assert [m.id for m in page.data] == ["fake-model"]


async def test_an_unscripted_request_fails_loudly(fake_model: FakeModelServer):
    async with client(fake_model) as model:
        with pytest.raises(
            openai.APIStatusError, match="no turn scripted for request #1"
        ) as caught:
            await model.chat.completions.create(model="m", messages=[])
    assert caught.value.status_code == UNSCRIPTED_STATUS


async def test_scripted_errors_carry_status_and_headers(fake_model: FakeModelServer):
    fake_model.script([Turn.error(429, "slow down", **{"retry-after": "7"})])
    async with client(fake_model) as model:
        with pytest.raises(openai.RateLimitError, match="slow down") as caught:
            await model.chat.completions.create(model="m", messages=[])
    assert caught.value.response.headers["retry-after"] == "7"


async def test_streaming_is_refused(fake_model: FakeModelServer):
    fake_model.script(["never sent"])
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{fake_model.url}/chat/completions",
            json={"model": "m", "messages": [], "stream": True},
        )
    assert response.status_code == 400


async def test_reset_cuts_a_hang_short_and_forgets(fake_model: FakeModelServer):
    fake_model.script([Turn.hang(30.0, "late"), "unused"])
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=10) as http:
        request = asyncio.create_task(
            http.post(f"{fake_model.url}/chat/completions", json={"model": "m", "messages": []})
        )
        await asyncio.to_thread(fake_model.wait_for_requests, 1)
        fake_model.reset()
        response = await request
    assert response.json()["choices"][0]["message"]["content"] == "late"
    assert time.monotonic() - started < 5
    assert fake_model.requests == [] and fake_model.pending == 0


def test_start_and_stop_are_idempotent():
    server = FakeModelServer(models=["a", "b"])
    with pytest.raises(RuntimeError, match="start"):
        _ = server.url
    server.start()
    server.start()
    assert httpx.get(f"{server.url}/models").json()["data"][1]["id"] == "b"
    server.stop()
    server.stop()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.url}/models", timeout=1)
