"""The Batch API over real HTTP on loopback, as an OpenAI client uses it: upload a JSONL
file, create a batch, follow it, download its results; and each bad input, answered with
an OpenAI-shaped error naming the field."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from sageserve.batch import BatchStore
from sageserve.batch.api import BatchApi
from sageserve.dispatch.identity import ANONYMOUS
from tests.batch.conftest import MODEL, deadline_of, jsonl, known_models, line, read_jsonl

LIMIT = 4096

Scenario = Callable[[aiohttp.ClientSession, str, BatchStore], Awaitable[None]]


def run(tmp_path: Path, scenario: Scenario) -> None:
    """Serve a BatchApi on a SQLite store at a loopback port and run ``scenario``."""

    async def main() -> None:
        store = BatchStore.open(f"sqlite:///{tmp_path}/queue.db")
        api = BatchApi(store, known_models, deadlines=deadline_of, max_upload_bytes=LIMIT)
        app = web.Application()
        api.add_routes(app)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as client:
                await scenario(client, f"http://127.0.0.1:{port}", store)
        finally:
            await runner.cleanup()
            store.close()

    asyncio.run(main())


def form(content: bytes, purpose: str | None = "batch", name: str = "in.jsonl") -> aiohttp.FormData:
    data = aiohttp.FormData()
    if purpose is not None:
        data.add_field("purpose", purpose)
    data.add_field("file", content, filename=name, content_type="application/jsonl")
    return data


async def upload(client: aiohttp.ClientSession, url: str, lines: list[str]) -> dict[str, Any]:
    async with client.post(f"{url}/v1/files", data=form(jsonl(lines))) as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


async def error_of(response: aiohttp.ClientResponse) -> dict[str, Any]:
    body = await response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    return error


def test_upload_create_follow_and_download(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        file = await upload(client, url, [line("a"), "{broken", line("b")])
        assert file["object"] == "file" and file["purpose"] == "batch"
        assert file["filename"] == "in.jsonl" and file["id"].startswith("file-")
        async with client.get(f"{url}/v1/files/{file['id']}") as r:
            assert (await r.json())["bytes"] == file["bytes"]
        async with client.get(f"{url}/v1/files/{file['id']}/content") as r:
            assert await r.read() == jsonl([line("a"), "{broken", line("b")])

        request = {
            "input_file_id": file["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"job": "nightly"},
        }
        async with client.post(f"{url}/v1/batches", json=request) as r:
            assert r.status == 200, await r.text()
            batch = await r.json()
        assert batch["object"] == "batch" and batch["status"] == "in_progress"
        assert batch["expires_at"] == batch["created_at"] + 86400
        assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 1}
        assert batch["metadata"] == {"job": "nightly"} and batch["errors"] is None

        # the release worker's part, as the router runs it
        for claimed in await asyncio.to_thread(store.claim, MODEL, 10, "router", 60):
            await asyncio.to_thread(store.complete, claimed.id, "router", 200, {"ok": 1})
        await asyncio.to_thread(store.finalize)

        async with client.get(f"{url}/v1/batches/{batch['id']}") as r:
            done = await r.json()
        assert done["status"] == "completed" and done["completed_at"] is not None
        assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
        async with client.get(f"{url}/v1/files/{done['output_file_id']}/content") as r:
            assert r.status == 200
            output = read_jsonl(await r.read())
        assert [o["custom_id"] for o in output] == ["a", "b"]
        async with client.get(f"{url}/v1/files/{done['error_file_id']}/content") as r:
            [error] = read_jsonl(await r.read())
        assert error["error"]["code"] == "invalid_json_line"
        assert error["error"]["message"].startswith("line 2 ")

        async with client.get(f"{url}/v1/batches") as r:
            listed = await r.json()
        assert listed["object"] == "list" and [b["id"] for b in listed["data"]] == [batch["id"]]
        assert listed["has_more"] is False and listed["first_id"] == batch["id"]
        async with client.get(f"{url}/v1/files", params={"purpose": "batch_output"}) as r:
            outputs = {f["id"] for f in (await r.json())["data"]}
        assert outputs == {done["output_file_id"], done["error_file_id"]}
        async with client.delete(f"{url}/v1/files/{file['id']}") as r:
            assert await r.json() == {"id": file["id"], "object": "file", "deleted": True}
        async with client.get(f"{url}/v1/files/{file['id']}") as r:
            assert r.status == 404
            assert (await error_of(r))["code"] == "not_found"

    run(tmp_path, scenario)


def test_an_upload_over_the_limit_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        just_over = b"x" * (LIMIT + 1)  # found while reading the part
        async with client.post(f"{url}/v1/files", data=form(just_over)) as r:
            assert r.status == 413
            error = await error_of(r)
        assert error["param"] == "file" and error["code"] == "file_too_large"
        assert str(LIMIT) in error["message"] and "split" in error["message"]
        far_over = b"x" * (LIMIT + 128 * 1024)  # refused on its Content-Length
        async with client.post(f"{url}/v1/files", data=form(far_over)) as r:
            assert r.status == 413
        async with client.post(f"{url}/v1/files", data=form(b"y" * LIMIT)) as r:
            assert r.status == 200  # exactly the limit is fine
        files, _ = await asyncio.to_thread(store.list_files, ANONYMOUS)
        assert [f.bytes for f in files] == [LIMIT]

    run(tmp_path, scenario)


def test_bad_uploads_name_the_field(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        async with client.post(f"{url}/v1/files", data=form(b"{}", purpose="fine-tune")) as r:
            assert r.status == 400
            error = await error_of(r)
        assert error["param"] == "purpose" and "purpose=batch" in error["message"]
        async with client.post(f"{url}/v1/files", data=form(b"{}", purpose=None)) as r:
            assert (await error_of(r))["param"] == "purpose"
        only_purpose = aiohttp.FormData({"purpose": "batch"})
        only_purpose.add_field("other", b"z", filename="z")
        async with client.post(f"{url}/v1/files", data=only_purpose) as r:
            assert r.status == 400 and (await error_of(r))["param"] == "file"
        async with client.post(f"{url}/v1/files", json={"file": "x"}) as r:
            assert r.status == 400 and "multipart/form-data" in (await error_of(r))["message"]
        assert (await asyncio.to_thread(store.list_files, ANONYMOUS))[0] == []

    run(tmp_path, scenario)


def test_bad_batch_requests_name_the_field_and_the_fix(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        file = await upload(client, url, [line("a")])
        good = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions"}
        cases: list[tuple[Any, int, str | None, str]] = [
            ({**good, "input_file_id": None}, 400, "input_file_id", "required"),
            ({**good, "input_file_id": "file-nope"}, 400, "input_file_id", "file-nope"),
            ({**good, "endpoint": "/v1/embeddings"}, 400, "endpoint", "/v1/completions"),
            ({**good, "completion_window": "1y"}, 400, "completion_window", "'24h'"),
            ({**good, "completion_window": 24}, 400, "completion_window", "string"),
            ({**good, "metadata": {str(i): "v" for i in range(17)}}, 400, "metadata", "16"),
            ([good], 400, None, "JSON object"),
        ]
        for body, status, param, words in cases:
            async with client.post(f"{url}/v1/batches", json=body) as r:
                assert r.status == status, (body, await r.text())
                error = await error_of(r)
            assert error["param"] == param and words in error["message"], (body, error)
            assert error["type"] == "invalid_request_error"
        async with client.post(f"{url}/v1/batches", data=b"{nope") as r:
            assert r.status == 400 and "not JSON" in (await error_of(r))["message"]
        async with client.get(f"{url}/v1/batches/batch_nope") as r:
            assert r.status == 404 and "batch_nope" in (await error_of(r))["message"]
        async with client.post(f"{url}/v1/batches/batch_nope/cancel") as r:
            assert r.status == 404
        for query in ({"limit": "0"}, {"limit": "many"}, {"limit": "101"}):
            async with client.get(f"{url}/v1/batches", params=query) as r:
                assert r.status == 400 and (await error_of(r))["param"] == "limit"
        async with client.get(f"{url}/v1/batches", params={"after": "batch_nope"}) as r:
            assert r.status == 400 and (await error_of(r))["param"] == "after"
        # the default window is 24 h when none is given
        async with client.post(f"{url}/v1/batches", json=good) as r:
            assert r.status == 200 and (await r.json())["completion_window"] == "24h"

    run(tmp_path, scenario)


def test_cancel_and_page_through_batches(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        file = await upload(client, url, [line("a"), line("b")])
        ids = []
        for _ in range(3):
            body = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions"}
            async with client.post(f"{url}/v1/batches", json=body) as r:
                ids.append((await r.json())["id"])
        async with client.post(f"{url}/v1/batches/{ids[0]}/cancel") as r:
            cancelled = await r.json()
        assert cancelled["status"] == "cancelled" and cancelled["cancelled_at"] is not None
        async with client.get(f"{url}/v1/files/{cancelled['error_file_id']}/content") as r:
            errors = read_jsonl(await r.read())
        assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}

        seen: list[str] = []
        after: str | None = None
        while True:
            params = {"limit": "2", **({"after": after} if after else {})}
            async with client.get(f"{url}/v1/batches", params=params) as r:
                page = await r.json()
            seen += [b["id"] for b in page["data"]]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert sorted(seen) == sorted(ids) and len(seen) == 3

        for claimed in await asyncio.to_thread(store.claim, MODEL, 10, "router", 60):
            await asyncio.to_thread(store.complete, claimed.id, "router", 200, {})
        await asyncio.to_thread(store.finalize)
        async with client.post(f"{url}/v1/batches/{ids[1]}/cancel") as r:
            assert r.status == 409
            assert "completed" in (await error_of(r))["message"]

    run(tmp_path, scenario)


def test_a_database_that_fails_is_a_503_to_retry(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str, store: BatchStore) -> None:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE files")
        async with client.get(f"{url}/v1/files") as r:
            assert r.status == 503 and r.headers["Retry-After"]
            assert (await error_of(r))["type"] == "server_error"

    run(tmp_path, scenario)
