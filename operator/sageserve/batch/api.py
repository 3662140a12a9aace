"""The OpenAI Batch API's HTTP handlers: ``/v1/files`` and ``/v1/batches`` over the store.

Why here and not in ``router/app.py``: the handlers need only the store, the router's
view of which model is served for batch work and in which tier, and an upload limit; the
router adds them to its application with ``BatchApi(...).add_routes(app)``. Objects and
errors are shaped as OpenAI's (``{"error": {"message", "type", "param", "code"}}``), so
the OpenAI SDKs and tools built for the Batch API work unchanged.

Every object belongs to the caller's tenant (``_principal``): another tenant's file or
batch is 404, as one that never existed, and absent from lists.

An upload is read chunk by chunk, its bytes and request lines counted as they arrive: it is
refused with 413 as soon as it passes ``max_upload_bytes``, or 400 at the first line past
the per-batch cap (50,000 requests), before the rest is read or anything is parsed or
stored. A body (upload or JSON) that does not arrive within ``body_timeout_s`` is 408 and
the connection is closed, so a client dribbling bytes holds no handler. Store calls are
blocking database transactions and run in ``asyncio.to_thread``; ``models`` and
``deadlines`` are called from that worker thread while a batch is created.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from sqlalchemy.exc import SQLAlchemyError

from sageserve.batch.jsonl import ENDPOINTS
from sageserve.batch.limits import BadJson, LineCounter, content_disposition, load_json
from sageserve.batch.objects import BatchObject, Conflict, FileObject, InvalidInput, NotFound
from sageserve.batch.retention import expires_after_object, parse_expires_after
from sageserve.batch.store import DEFAULT_WINDOW, BatchStore, TierDeadlines
from sageserve.dispatch.identity import ANONYMOUS, Principal

#: (served model name, caller) -> the batch tier the caller's lines of it run in; None
#: when the model is not served to this caller for batch work
BatchTierFor = Callable[[str, Principal], str | None]
#: An upload's bytes claimed against the router's in-flight byte budget
#: (``--max-inflight-bytes``): the function that gives them back, or None when they would
#: pass it (429: a burst of large uploads costs at most the budget, not the burst).
ClaimBytes = Callable[[int], Callable[[], None] | None]
#: Seconds a client is asked to wait after a 429 for in-flight bytes.
BUSY_RETRY_AFTER_S = 5
#: where the router's identity middleware leaves the caller on a request
PRINCIPAL = web.RequestKey("sageserve.principal", Principal)

log = logging.getLogger("sageserve.batch")

#: The default upload limit: large enough for OpenAI's 50,000 requests of a few KB each
#: at most; a router replica holds one upload in memory while reading it.
DEFAULT_MAX_UPLOAD_BYTES = 100 * 1024 * 1024
#: Multipart framing (boundaries, part headers, the purpose field) on top of the file.
MULTIPART_SLACK = 64 * 1024
MAX_FILE_LIST = 10_000
MAX_BATCH_LIST = 100
MAX_METADATA_PAIRS = 16
#: The router's default for a body to arrive (``RouterConfig.body_timeout_seconds``).
DEFAULT_BODY_TIMEOUT_S = 30.0
#: The multipart fields of OpenAI's ``expires_after`` on an upload.
EXPIRES_ANCHOR, EXPIRES_SECONDS = "expires_after[anchor]", "expires_after[seconds]"
T = TypeVar("T")


def openai_error(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An error shaped as the OpenAI API shapes them."""
    type_ = "server_error" if status >= 500 else "invalid_request_error"
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


class _Refused(Exception):
    """An error response to send instead of the object."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


class BatchApi:
    """``/v1/files`` and ``/v1/batches`` on one ``BatchStore``.

    ``models`` maps a served model name to its batch tier (None: not served for batch
    work); ``deadlines`` maps a tier to its deadline in seconds (None: the completion
    window alone); uploads over ``max_upload_bytes`` get 413; a body that takes longer
    than ``body_timeout_s`` to arrive gets 408.
    """

    def __init__(
        self,
        store: BatchStore,
        models: BatchTierFor,
        *,
        deadlines: TierDeadlines = lambda _: None,
        max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        accepted: Callable[[BatchObject, Principal], Awaitable[None]] | None = None,
        claim_bytes: ClaimBytes | None = None,
    ) -> None:
        self.store = store
        self.models = models
        self.deadlines = deadlines
        self.max_upload_bytes = max_upload_bytes
        self.body_timeout_s = body_timeout_s
        #: told of every batch accepted into the queue (the router counts its load: β)
        self.accepted = accepted
        #: an upload's bytes held against the router's in-flight budget while it is read
        #: and stored (None: uploads are bounded one by one only)
        self.claim_bytes = claim_bytes

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/files", self.upload_file)
        app.router.add_get("/v1/files", self.list_files)
        app.router.add_get("/v1/files/{file_id}", self.get_file)
        app.router.add_get("/v1/files/{file_id}/content", self.file_content)
        app.router.add_delete("/v1/files/{file_id}", self.delete_file)
        app.router.add_post("/v1/batches", self.create_batch)
        app.router.add_get("/v1/batches", self.list_batches)
        app.router.add_get("/v1/batches/{batch_id}", self.get_batch)
        app.router.add_post("/v1/batches/{batch_id}/cancel", self.cancel_batch)

    # ---- files ---------------------------------------------------------------------

    async def upload_file(self, request: web.Request) -> web.Response:
        caller = _principal(request)
        most = self.max_upload_bytes + MULTIPART_SLACK
        declared = request.content_length
        if declared is not None and declared > most:
            return self._too_large()  # 413 before 429: waiting would not help it
        release = None
        if self.claim_bytes is not None:
            release = self.claim_bytes(most if declared is None else declared)
            if release is None:
                return self._busy()
        try:
            upload = await self._in_time(self._read_upload(request))
            obj = await self._call(
                self.store.create_file,
                caller,
                upload.content,
                upload.filename,
                upload.purpose,
                upload.expires_after_s,
            )
        except _Refused as refused:
            return refused.response
        finally:
            if release is not None:
                release()
        return web.json_response(obj.to_openai())

    async def list_files(self, request: web.Request) -> web.Response:
        try:
            limit = _limit(request, MAX_FILE_LIST, MAX_FILE_LIST)
            purpose = request.query.get("purpose")
            found, more = await self._call(
                self.store.list_files,
                _principal(request),
                purpose,
                limit,
                request.query.get("after"),
            )
        except _Refused as refused:
            return refused.response
        return web.json_response(_page(found, more))

    async def get_file(self, request: web.Request) -> web.Response:
        try:
            obj = await self._call(
                self.store.get_file, _principal(request), request.match_info["file_id"]
            )
        except _Refused as refused:
            return refused.response
        return web.json_response(obj.to_openai())

    async def file_content(self, request: web.Request) -> web.Response:
        file_id, caller = request.match_info["file_id"], _principal(request)
        try:
            obj = await self._call(self.store.get_file, caller, file_id)
            content = await self._call(self.store.file_content, caller, file_id)
        except _Refused as refused:
            return refused.response
        return web.Response(
            body=content,
            headers={
                "Content-Type": "application/octet-stream",
                "Content-Disposition": content_disposition(obj.filename),
            },
        )

    async def delete_file(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        try:
            await self._call(self.store.delete_file, _principal(request), file_id)
        except _Refused as refused:
            return refused.response
        return web.json_response({"id": file_id, "object": "file", "deleted": True})

    # ---- batches -------------------------------------------------------------------

    async def create_batch(self, request: web.Request) -> web.Response:
        caller = _principal(request)
        try:
            body = await self._in_time(_json_object(request))
            input_file_id = _string(body, "input_file_id", "the id of an uploaded file")
            endpoint = _string(body, "endpoint", " or ".join(ENDPOINTS))
            if endpoint not in ENDPOINTS:
                raise _Refused(
                    openai_error(
                        400,
                        f"endpoint {endpoint!r} is not supported: use {' or '.join(ENDPOINTS)}",
                        "endpoint",
                    )
                )
            window = body.get("completion_window", DEFAULT_WINDOW)
            if not isinstance(window, str):
                raise _Refused(
                    openai_error(
                        400,
                        f"completion_window must be a string such as {DEFAULT_WINDOW!r}",
                        "completion_window",
                    )
                )
            metadata = _metadata(body.get("metadata"))
            keep = _invalid_as_400(
                expires_after_object, body.get("output_expires_after"), "output_expires_after"
            )
            batch = await self._call(
                self.store.create_batch,
                caller,
                input_file_id,
                endpoint,
                window,
                metadata,
                lambda name: self.models(name, caller),
                self.deadlines,
                keep,
            )
        except _Refused as refused:
            return refused.response
        if self.accepted is not None:
            await self.accepted(batch, caller)
        return web.json_response(batch.to_openai())

    async def list_batches(self, request: web.Request) -> web.Response:
        try:
            limit = _limit(request, 20, MAX_BATCH_LIST)
            found, more = await self._call(
                self.store.list_batches, _principal(request), limit, request.query.get("after")
            )
        except _Refused as refused:
            return refused.response
        return web.json_response(_page(found, more))

    async def get_batch(self, request: web.Request) -> web.Response:
        try:
            batch = await self._call(
                self.store.get_batch, _principal(request), request.match_info["batch_id"]
            )
        except _Refused as refused:
            return refused.response
        return web.json_response(batch.to_openai())

    async def cancel_batch(self, request: web.Request) -> web.Response:
        try:
            batch = await self._call(
                self.store.cancel, _principal(request), request.match_info["batch_id"]
            )
        except _Refused as refused:
            return refused.response
        return web.json_response(batch.to_openai())

    # ---- helpers -------------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store call in a worker thread; its errors become OpenAI error responses."""
        try:
            return await asyncio.to_thread(fn, *args)
        except NotFound as exc:
            # a missing object named in the body or query is a bad request, in the path 404
            status = 400 if exc.param else 404
            raise _Refused(
                openai_error(
                    status,
                    f"no such {exc.kind}: {exc.object_id!r}; list them with GET /v1/{exc.kind}s",
                    exc.param,
                    "not_found",
                )
            ) from None
        except InvalidInput as exc:
            raise _Refused(openai_error(400, str(exc), exc.param, exc.code)) from None
        except Conflict as exc:
            raise _Refused(openai_error(409, str(exc), None, exc.code)) from None
        except SQLAlchemyError as exc:
            log.warning("batch queue database error: %s", exc)
            raise _Refused(
                openai_error(
                    503,
                    "the batch queue's database is unavailable; retry later",
                    headers={"Retry-After": "5"},
                )
            ) from None

    async def _in_time(self, reading: Awaitable[T]) -> T:
        """``reading`` (of the request's body), or 408 with the connection closed when the
        body does not arrive within ``body_timeout_s``."""
        try:
            return await asyncio.wait_for(reading, self.body_timeout_s)
        except TimeoutError:
            response = openai_error(
                408,
                f"the request body did not arrive within {self.body_timeout_s:g} s: send it "
                "at once, or split a large file into several uploads",
                code="body_timeout",
            )
            response.force_close()
            raise _Refused(response) from None

    async def _read_upload(self, request: web.Request) -> _Upload:
        """The fields of a multipart upload, refused past the byte or line limit."""
        if not request.content_type.startswith("multipart/"):
            raise _Refused(
                openai_error(
                    400,
                    "upload a file as multipart/form-data with the fields purpose=batch and "
                    "file=@requests.jsonl",
                    "file",
                )
            )
        if (request.content_length or 0) > self.max_upload_bytes + MULTIPART_SLACK:
            raise _Refused(self._too_large())
        try:
            return await self._read_parts(request)
        except (ValueError, HttpProcessingError) as exc:
            # no boundary, a body without it, a part header with a control character or
            # not UTF-8: aiohttp's reader refuses them, the client gets told
            raise _Refused(
                openai_error(
                    400,
                    f"the upload is not a readable multipart/form-data body ({exc}); send the "
                    "fields purpose=batch and file=@requests.jsonl",
                    "file",
                )
            ) from None

    async def _read_parts(self, request: web.Request) -> _Upload:
        fields: dict[str, str] = {}
        filename = ""
        content: bytes | None = None
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise _Refused(openai_error(400, "nested multipart bodies are not supported"))
            if part.name == "file":
                filename = part.filename or filename
                content = await self._read_file_part(part)
            elif part.name in ("purpose", EXPIRES_ANCHOR, EXPIRES_SECONDS):
                fields[part.name] = (await _read_limited(part, 256) or b"").decode(errors="replace")
            else:
                await part.release()
        if content is None:
            raise _Refused(openai_error(400, "file: required, the JSONL file of requests", "file"))
        purpose = fields.get("purpose")
        if purpose != "batch":
            raise _Refused(
                openai_error(
                    400,
                    f"purpose {purpose!r} is not supported here: send purpose=batch",
                    "purpose",
                )
            )
        keep = None
        if EXPIRES_ANCHOR in fields or EXPIRES_SECONDS in fields:
            keep = _invalid_as_400(
                parse_expires_after,
                fields.get(EXPIRES_ANCHOR),
                fields.get(EXPIRES_SECONDS),
                "expires_after",
                True,
            )
        return _Upload(purpose, filename, content, keep)

    async def _read_file_part(self, part: BodyPartReader) -> bytes:
        """The file's bytes, its size and request lines counted chunk by chunk: refused as
        soon as either passes its limit, so a hostile file costs at most one chunk past
        the limit, and is never parsed."""
        most = self.store.max_requests
        chunks: list[bytes] = []
        size = 0
        lines = LineCounter()
        while chunk := await part.read_chunk(64 * 1024):
            size += len(chunk)
            if size > self.max_upload_bytes:
                raise _Refused(self._too_large())
            if lines.feed(chunk) > most:
                raise _Refused(
                    openai_error(
                        400,
                        f"file has more than {most} request lines, the limit of one batch: "
                        "split the requests into several files and batches",
                        "file",
                        "too_many_requests",
                    )
                )
            chunks.append(chunk)
        return b"".join(chunks)

    def _busy(self) -> web.Response:
        """429 for an upload the router has no room for now (its body is not read)."""
        response = openai_error(
            429,
            "the router has as many bytes of requests in flight as it may hold "
            "(--max-inflight-bytes); retry this upload shortly",
            code="max_inflight_bytes",
            headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
        )
        response.force_close()
        return response

    def _too_large(self) -> web.Response:
        return openai_error(
            413,
            f"file is larger than {self.max_upload_bytes} bytes, the router's upload limit: "
            "split the requests into several files and batches",
            "file",
            "file_too_large",
        )


class _Upload(NamedTuple):
    purpose: str
    filename: str
    content: bytes
    #: ``expires_after`` in seconds (None: the default retention)
    expires_after_s: float | None


def _invalid_as_400(parse: Callable[..., T], *args: Any) -> T:
    """A pure parser's ``InvalidInput`` as the 400 naming its field."""
    try:
        return parse(*args)
    except InvalidInput as exc:
        raise _Refused(openai_error(400, str(exc), exc.param, exc.code)) from None


def _principal(request: web.Request) -> Principal:
    found = request.get(PRINCIPAL)
    return found if isinstance(found, Principal) else ANONYMOUS


async def _read_limited(part: BodyPartReader, limit: int) -> bytes | None:
    """The part's bytes, or None as soon as it passes ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await part.read_chunk(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = load_json(await request.read())
    except BadJson as exc:
        raise _Refused(
            openai_error(400, f"the body is not JSON a request can be read from: {exc}")
        ) from None
    if not isinstance(body, dict):
        raise _Refused(openai_error(400, "the body must be a JSON object"))
    return body


def _string(body: dict[str, Any], field: str, what: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value:
        raise _Refused(openai_error(400, f"{field}: required, {what}", field))
    return value


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    ok = (
        isinstance(value, dict)
        and len(value) <= MAX_METADATA_PAIRS
        and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in value.items()
        )
    )
    if not ok:
        raise _Refused(
            openai_error(
                400,
                f"metadata must be an object of at most {MAX_METADATA_PAIRS} string pairs, "
                "keys up to 64 and values up to 512 characters",
                "metadata",
            )
        )
    return dict(value)


def _limit(request: web.Request, default: int, most: int) -> int:
    raw = request.query.get("limit")
    try:
        limit = default if raw is None else int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise _Refused(
            openai_error(400, f"limit must be an integer from 1 to {most}, got {raw!r}", "limit")
        )
    return limit


def _page(found: list[FileObject] | list[BatchObject], more: bool) -> dict[str, Any]:
    data = [obj.to_openai() for obj in found]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


__all__ = ["DEFAULT_MAX_UPLOAD_BYTES", "BatchApi", "ClaimBytes", "openai_error"]
