"""Two tenants on one Batch API, and a hostile client, over real HTTP on loopback, on
SQLite and on PostgreSQL.

The app puts a ``Principal`` on each request from its bearer key, as the router's
identity middleware does; what each tenant can see and do is asserted through the API
alone: another tenant's objects are 404 (never 403) and absent from lists. Then the
limits a hostile client meets: the line cap while streaming, nesting depth per line, a
filename with CR/LF, ``expires_after``, and a body dribbled too slowly (408).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sageserve.batch import BatchStore
from sageserve.batch.api import PRINCIPAL, BatchApi
from sageserve.batch.limits import MAX_DEPTH
from sageserve.dispatch.identity import ANONYMOUS
from tests.batch.conftest import ME, MODEL, THEM, deadline_of, jsonl, known_models, line
from tests.batch.test_api_http import error_of, form

KEYS = {"key-a": ME, "key-b": THEM}
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}
MAX_LINES = 5
BODY_TIMEOUT_S = 0.5

Scenario = Callable[[aiohttp.ClientSession, str, BatchStore], Awaitable[None]]


@web.middleware
async def identify(request: web.Request, handler: Any) -> web.StreamResponse:
    """The caller named by its bearer key (anonymous without one)."""
    key = request.headers.get("Authorization", "").removeprefix("Bearer ")
    request[PRINCIPAL] = KEYS.get(key, ANONYMOUS)
    response: web.StreamResponse = await handler(request)
    return response


def serve(store_url: str, scenario: Scenario) -> None:
    """A BatchApi behind ``identify`` on ``store_url`` at a loopback port."""

    async def main() -> None:
        store = BatchStore.open(store_url, max_requests=MAX_LINES)
        api = BatchApi(
            store,
            known_models,
            deadlines=deadline_of,
            max_upload_bytes=1024 * 1024,
            body_timeout_s=BODY_TIMEOUT_S,
        )
        app = web.Application(middlewares=[identify])
        api.add_routes(app)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            async with aiohttp.ClientSession() as client:
                await scenario(client, f"http://127.0.0.1:{runner.addresses[0][1]}", store)
        finally:
            await runner.cleanup()
            store.close()

    asyncio.run(main())


async def upload(
    client: aiohttp.ClientSession, url: str, content: bytes, headers: dict[str, str]
) -> dict[str, Any]:
    async with client.post(f"{url}/v1/files", data=form(content), headers=headers) as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


async def create(
    client: aiohttp.ClientSession, url: str, file_id: str, headers: dict[str, str], **extra: Any
) -> aiohttp.ClientResponse:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", **extra}
    return await client.post(f"{url}/v1/batches", json=body, headers=headers)


async def run_and_close(store: BatchStore) -> None:
    """The release worker's part: answer every queued request, close the batches."""
    for claimed in await asyncio.to_thread(store.claim, MODEL, 100, "router", 60):
        await asyncio.to_thread(store.complete, claimed.id, "router", 200, {"ok": 1})
    await asyncio.to_thread(store.finalize)


def test_another_tenant_finds_none_of_my_files_batches_or_results(store_url: str) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        mine = await upload(client, url, jsonl([line("a"), line("b")]), A)
        async with await create(client, url, mine["id"], A) as r:
            assert r.status == 200, await r.text()
            done_id = (await r.json())["id"]
        await run_and_close(store)
        async with await create(client, url, mine["id"], A) as r:
            running_id = (await r.json())["id"]  # still in progress
        async with client.get(f"{url}/v1/batches/{done_id}", headers=A) as r:
            done = await r.json()
        output_id = done["output_file_id"]
        assert done["status"] == "completed" and output_id

        for caller in (B, {}):  # another tenant, and an anonymous caller
            for path in (
                f"/v1/files/{mine['id']}",
                f"/v1/files/{mine['id']}/content",
                f"/v1/files/{output_id}",
                f"/v1/files/{output_id}/content",
                f"/v1/batches/{done_id}",
                f"/v1/batches/{running_id}",
            ):
                async with client.get(f"{url}{path}", headers=caller) as r:
                    assert r.status == 404, (path, caller)
                    assert (await error_of(r))["code"] == "not_found"
            async with client.post(f"{url}/v1/batches/{running_id}/cancel", headers=caller) as r:
                assert r.status == 404
            async with client.delete(f"{url}/v1/files/{output_id}", headers=caller) as r:
                assert r.status == 404
            async with await create(client, url, mine["id"], caller) as r:
                assert r.status == 400
                error = await error_of(r)
            assert error["param"] == "input_file_id" and "no such file" in error["message"]
            for listing in ("/v1/files", "/v1/files?purpose=batch_output", "/v1/batches"):
                async with client.get(f"{url}{listing}", headers=caller) as r:
                    assert (await r.json())["data"] == [], listing
            async with client.get(f"{url}/v1/batches?after={done_id}", headers=caller) as r:
                assert r.status == 400 and (await error_of(r))["param"] == "after"

        # the owner still has everything, untouched by the others' attempts
        async with client.get(f"{url}/v1/files", headers=A) as r:
            listed = {f["id"] for f in (await r.json())["data"]}
        assert listed == {mine["id"], output_id}
        async with client.get(f"{url}/v1/batches", headers=A) as r:
            assert {b["id"] for b in (await r.json())["data"]} == {done_id, running_id}
        async with client.get(f"{url}/v1/batches/{running_id}", headers=A) as r:
            assert (await r.json())["status"] == "in_progress"
        # B's own work is B's: same names, separate objects
        theirs = await upload(client, url, jsonl([line("a")]), B)
        async with client.get(f"{url}/v1/files", headers=B) as r:
            assert [f["id"] for f in (await r.json())["data"]] == [theirs["id"]]

    serve(store_url, scenario)


def test_deleting_the_input_of_a_running_batch_says_why_and_waits(store_url: str) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        file = await upload(client, url, jsonl([line("a")]), A)
        async with await create(client, url, file["id"], A) as r:
            batch = await r.json()
        async with client.delete(f"{url}/v1/files/{file['id']}", headers=A) as r:
            assert r.status == 409
            error = await error_of(r)
        assert error["code"] == "file_in_use"
        assert batch["id"] in error["message"] and "cancel" in error["message"]
        async with client.post(f"{url}/v1/batches/{batch['id']}/cancel", headers=A) as r:
            assert (await r.json())["status"] == "cancelled"
        async with client.delete(f"{url}/v1/files/{file['id']}", headers=A) as r:
            assert r.status == 200 and (await r.json())["deleted"] is True
        async with client.get(f"{url}/v1/files/{file['id']}/content", headers=A) as r:
            assert r.status == 404

    serve(store_url, scenario)


def test_an_upload_past_the_line_cap_is_refused_while_it_streams(store_url: str) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        over = jsonl([line(f"r{i}") for i in range(MAX_LINES + 1)])
        async with client.post(f"{url}/v1/files", data=form(over), headers=A) as r:
            assert r.status == 400
            error = await error_of(r)
        assert error["param"] == "file" and error["code"] == "too_many_requests"
        assert str(MAX_LINES) in error["message"] and "split" in error["message"]
        flood = b"{}\n" * 20_000  # far more lines than bytes matter for
        async with client.post(f"{url}/v1/files", data=form(flood), headers=A) as r:
            assert r.status == 400 and (await error_of(r))["code"] == "too_many_requests"
        blanks = jsonl([line(f"r{i}") + "\n\n  " for i in range(MAX_LINES)])
        async with client.post(f"{url}/v1/files", data=form(blanks), headers=A) as r:
            assert r.status == 200  # blank lines are not requests
        async with client.get(f"{url}/v1/files", headers=A) as r:
            assert len((await r.json())["data"]) == 1  # nothing of the refused ones

    serve(store_url, scenario)


def test_a_line_nested_too_deep_is_that_lines_error_and_the_others_run(
    store_url: str,
) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        deep = "[" * 100_000 + "]" * 100_000
        nested = json.dumps({"custom_id": "deep", "method": "POST", "url": "x", "body": 1})
        lines = [line("ok"), nested.replace("1}", deep + "}"), line("also-ok")]
        file = await upload(client, url, jsonl(lines), A)
        async with await create(client, url, file["id"], A) as r:
            assert r.status == 200, await r.text()
            batch = await r.json()
        assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 1}
        await run_and_close(store)
        async with client.get(f"{url}/v1/batches/{batch['id']}", headers=A) as r:
            done = await r.json()
        assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
        async with client.get(f"{url}/v1/files/{done['error_file_id']}/content", headers=A) as r:
            [error] = [json.loads(x) for x in (await r.text()).splitlines()]
        assert error["error"]["code"] == "invalid_json_line"
        assert "line 2" in error["error"]["message"]
        assert str(MAX_DEPTH) in error["error"]["message"]
        body = '{"input_file_id": ' + "[" * 100_000 + "]" * 100_000 + "}"
        async with client.post(f"{url}/v1/batches", data=body, headers=A) as r:
            assert r.status == 400 and str(MAX_DEPTH) in (await error_of(r))["message"]

    serve(store_url, scenario)


def raw_upload(filename_star: str, content: bytes) -> tuple[bytes, str]:
    """A multipart body whose file part names itself with RFC 5987's ``filename*`` (the
    way a client gets CR/LF past the part's header line)."""
    boundary = "sageserveboundary"
    body = (
        (
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f"--{boundary}\r\n"
            f"Content-Disposition: form-data; name=\"file\"; filename*=UTF-8''{filename_star}\r\n"
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


def test_a_filename_with_cr_lf_still_downloads(store_url: str) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        for star, stored in (
            ("evil%0D%0ASet-Cookie%3A%20x%3D1%22.jsonl", "evilSet-Cookie: x=1.jsonl"),
            ("r%C3%A9sum%C3%A9%00.jsonl", "résumé.jsonl"),
        ):
            body, content_type = raw_upload(star, b'{"x": 1}\n')
            headers = {**A, "Content-Type": content_type}
            async with client.post(f"{url}/v1/files", data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                file = await r.json()
            assert file["filename"] == stored
            async with client.get(f"{url}/v1/files/{file['id']}/content", headers=A) as r:
                assert r.status == 200 and await r.read() == b'{"x": 1}\n'
                disposition = r.headers["Content-Disposition"]
                assert "Set-Cookie" not in r.headers
            assert "\r" not in disposition and "\n" not in disposition
            assert disposition.startswith("attachment; filename=")

    serve(store_url, scenario)


def test_expires_after_sets_when_files_and_results_go(store_url: str) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        data = form(jsonl([line("a")]))
        data.add_field("expires_after[anchor]", "created_at")
        data.add_field("expires_after[seconds]", "3600")
        async with client.post(f"{url}/v1/files", data=data, headers=A) as r:
            file = await r.json()
        assert file["expires_at"] == file["created_at"] + 3600
        default = await upload(client, url, jsonl([line("b")]), A)
        assert default["expires_at"] == default["created_at"] + 30 * 86400

        bad = form(b"{}\n")
        bad.add_field("expires_after[anchor]", "created_at")
        bad.add_field("expires_after[seconds]", "60")
        async with client.post(f"{url}/v1/files", data=bad, headers=A) as r:
            assert r.status == 400
            error = await error_of(r)
        assert error["param"] == "expires_after[seconds]" and "3600" in error["message"]
        wrong = {"anchor": "created_at", "seconds": 31 * 86400}
        async with await create(client, url, file["id"], A, output_expires_after=wrong) as r:
            assert r.status == 400
            assert (await error_of(r))["param"] == "output_expires_after.seconds"

        keep = {"anchor": "created_at", "seconds": 7200}
        async with await create(client, url, file["id"], A, output_expires_after=keep) as r:
            assert r.status == 200
            batch = await r.json()
        await run_and_close(store)
        async with client.get(f"{url}/v1/batches/{batch['id']}", headers=A) as r:
            done = await r.json()
        async with client.get(f"{url}/v1/files/{done['output_file_id']}", headers=A) as r:
            output = await r.json()
        assert output["expires_at"] == output["created_at"] + 7200

    serve(store_url, scenario)


async def dribble(url: str, head: str, first_bytes: bytes) -> tuple[bytes, bytes]:
    """Send a request's head and the start of its body, then nothing more; returns the
    response and what the connection gives after it (b"" once closed)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode() + first_bytes)
    await writer.drain()
    response = await reader.readuntil(b"\r\n\r\n")
    length = int(
        next(h for h in response.split(b"\r\n") if h.lower().startswith(b"content-length")).split(
            b":"
        )[1]
    )
    body = await reader.readexactly(length)
    after = await reader.read()
    writer.close()
    return response + body, after


@pytest.mark.slow
def test_a_body_dribbled_too_slowly_is_408_and_the_connection_closed(store_url: str) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        json_head = (
            "POST /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        body, content_type = raw_upload("in.jsonl", jsonl([line("a")]))
        upload_head = (
            "POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body) + 100}\r\n\r\n"
        )
        for head, start in ((json_head, b'{"input_file_id": '), (upload_head, body)):
            response, after = await dribble(url, head, start)
            assert response.startswith(b"HTTP/1.1 408"), response
            assert b"body_timeout" in response
            assert after == b""  # closed: the slow client holds nothing
        async with client.get(f"{url}/v1/files", headers=A) as r:
            assert (await r.json())["data"] == []

    serve(store_url, scenario)


def test_uploads_claim_the_routers_in_flight_bytes_and_wait_their_turn(store_url: str) -> None:
    """An upload holds its declared bytes against the router's budget while it is read and
    stored: past the budget 429 with Retry-After, nothing stored; a body declared over the
    upload limit is still 413 (waiting would not help it)."""
    budget = {"limit": 64 * 1024, "used": 0}

    def claim(size: int) -> Callable[[], None] | None:
        if budget["used"] + size > budget["limit"]:
            return None
        budget["used"] += size

        def release() -> None:
            budget["used"] -= size

        return release

    async def main() -> None:
        store = BatchStore.open(store_url)
        api = BatchApi(store, known_models, max_upload_bytes=1024 * 1024, claim_bytes=claim)
        app = web.Application(middlewares=[identify])
        api.add_routes(app)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as client:
                await upload(client, url, jsonl([line("a")]), A)
                assert budget["used"] == 0  # given back once stored
                budget["used"] = budget["limit"]  # other bodies hold the budget
                async with client.post(f"{url}/v1/files", data=form(b"{}\n"), headers=A) as r:
                    assert r.status == 429 and int(r.headers["Retry-After"]) > 0
                    assert (await error_of(r))["code"] == "max_inflight_bytes"
                body, content_type = raw_upload("big.jsonl", b"x" * (2 * 1024 * 1024))
                headers = {**A, "Content-Type": content_type}
                async with client.post(f"{url}/v1/files", data=body, headers=headers) as r:
                    assert r.status == 413
                budget["used"] = 0
                async with client.get(f"{url}/v1/files", headers=A) as r:
                    assert len((await r.json())["data"]) == 1  # the refused one left nothing
        finally:
            await runner.cleanup()
            store.close()

    asyncio.run(main())
