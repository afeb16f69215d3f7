"""The gateway's ASGI application (see ``coral.gateway`` for the behaviour)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import anyio
import anyio.abc

from coral.errors import CoralError
from coral.gateway import openai
from coral.gateway.auth import ApiKey, Auth, Refused
from coral.gateway.client import Client, Response, UpstreamError
from coral.gateway.openai import ApiRequest, BadRequest
from coral.gateway.table import RouteTable
from coral.messages.fleet import FleetUpdate, InstanceInfo
from coral.messages.requests import ArrivalBatch, Outcome, ProxiedArrivals, RequestResults, RequestSpec

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

GATEWAY_ID_BASE = 1 << 48
"""Request ids of the gateway start here (the input feed's count up from 1)."""
MAX_BODY = 16 << 20
DEFAULT_OUT = 16
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_PASSED_HEADERS = frozenset((b"content-type", b"content-length", b"content-encoding", b"cache-control"))
_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


class GatewayError(CoralError):
    """A gateway set up with an impossible value; the message names the parameter."""


class Mailbox:
    """The outcomes of one simulated request as the mesh hands them over (a deque and a future to wait on:
    cheaper per streamed token than a memory object stream, asyncio only)."""

    __slots__ = ("closed", "items", "waiter")

    def __init__(self) -> None:
        self.items: deque[Outcome] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False

    def put(self, o: Outcome) -> None:
        self.items.append(o)
        self._wake()

    def close(self) -> None:
        """No more outcomes: ``take`` returns what is left, then nothing."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def take(self) -> list[Outcome]:
        """Every outcome that came since the last call (waiting for one); [] once closed and empty."""
        while not self.items:
            if self.closed:
                return []
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        out = list(self.items)
        self.items.clear()
        return out


class _Reply(Exception):
    """An error response to send: status, OpenAI error type, message and extra headers."""

    def __init__(self, status: int, kind: str, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.headers = headers or []
        self.param: str | None = None


class Gateway:
    """An OpenAI-compatible HTTP front for the fleet (an ASGI application).

    ``deployments`` maps each deployment name (the ``model`` clients ask for) to its default output
    length in tokens (used when a simulated request gives no ``max_tokens``). At most ``max_active``
    requests are served at once; up to ``max_queue`` more wait for a slot; beyond that a request is shed
    with 429 and ``Retry-After``. ``retry_after_s`` is the ``Retry-After`` of a 503 (no live instance).
    """

    def __init__(
        self,
        deployments: Mapping[str, int],
        *,
        seed: int = 0,
        max_active: int = 256,
        max_queue: int = 1024,
        retry_after_s: int = 2,
        connect_timeout_s: float = 5.0,
        auth: Auth | None = None,
    ) -> None:
        if max_active < 1:
            raise GatewayError(f"max_active: must be at least 1, got {max_active}")
        if max_queue < 0:
            raise GatewayError(f"max_queue: must not be negative, got {max_queue}")
        if retry_after_s < 1:
            raise GatewayError(f"retry_after_s: must be at least 1, got {retry_after_s}")
        self.default_out = dict(deployments)
        self.table = RouteTable(deployments, seed=seed)
        self.max_active = max_active
        self.max_queue = max_queue
        self.retry_after = str(retry_after_s).encode()
        self.slots = anyio.Semaphore(max_active)
        self.waiting = 0
        self.next_id = GATEWAY_ID_BASE
        self.client = Client(connect_timeout_s)
        self.linked = False
        self.pending: list[tuple[int, str, int, int, bool]] = []
        self.proxied: dict[str, int] = {}
        self.waiters: dict[int, Mailbox] = {}
        self.shed = 0
        self.retried = 0
        self.prefilled = 0
        self.responses: dict[tuple[str, int], int] = {}
        self.auth = auth
        self.on_pending: Callable[[], None] | None = None
        """Called when a simulated request starts waiting for ``take_inputs`` (``MeshLink``: the doorbell)."""

    # -- the bus side -------------------------------------------------------------------------------

    def on_fleet(self, msg: FleetUpdate) -> None:
        """Take a fleet update into the routing table."""
        self.table.update(msg)

    def on_results(self, msg: RequestResults) -> None:
        """Hand the mesh's progress and outcomes to the requests waiting for them."""
        for o in msg.outcomes:
            box = self.waiters.get(o.id)
            if box is not None:
                box.put(o)

    def take_inputs(self, now: float) -> list[object]:
        """The messages for the router at a quiet point at kernel time ``now``: the simulated requests
        that arrived since the last call (arriving at ``now``) and the counts of the proxied ones."""
        out: list[object] = []
        if self.pending:
            specs = tuple(RequestSpec(rid, dep, now, prompt, n) for rid, dep, prompt, n, _ in self.pending)
            ends_only = tuple(rid for rid, *_, stream in self.pending if not stream)
            self.pending = []
            out.append(ArrivalBatch(now, now, specs, reply=True, ends_only=ends_only))
        if self.proxied:
            out.append(ProxiedArrivals(now, dict(sorted(self.proxied.items()))))
            self.proxied = {}
        return out

    def unlink(self) -> None:
        """The mesh is gone: fail every simulated request still waiting."""
        self.linked = False
        for box in self.waiters.values():
            box.close()
        self.waiters.clear()
        self.pending.clear()

    async def aclose(self) -> None:
        """Close the upstream connections."""
        self.client.close()

    # -- the HTTP side ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in _PATHS:
            send = self._counted(send, path)
        try:
            key = self.auth.check(scope["headers"]) if self.auth is not None and path.startswith("/v1/") else None
            if path == "/health":
                await respond(send, 200, b'{"status":"ok"}')
            elif path == "/v1/models":
                await respond(send, 200, self.models(key))
            elif path in _PATHS:
                if method != "POST":
                    raise _Reply(405, "invalid_request_error", f"{path}: use POST")
                await self.generate(_PATHS[path], path, await read_body(receive), send, receive, key)
            else:
                raise _Reply(404, "not_found_error", f"no route {method} {path}")
        except _Reply as r:
            await respond(send, r.status, openai.error_body(str(r), r.kind, r.status, r.param), r.headers)
        except Refused as r:
            await r.send(send)

    def _counted(self, send: Send, path: str) -> Send:
        """``send`` that counts the response's status per path (``responses``)."""

        async def counted(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                key = (path, msg["status"])
                self.responses[key] = self.responses.get(key, 0) + 1
            await send(msg)

        return counted

    def models(self, key: ApiKey | None = None) -> bytes:
        data = [
            {"id": d, "object": "model", "created": 0, "owned_by": "coral", "ready": bool(self.table.instances(d))}
            for d in sorted(self.table.known)
            if key is None or key.models is None or d in key.models
        ]
        return openai.encode_json({"object": "list", "data": data})

    async def generate(
        self, kind: str, path: str, body: bytes, send: Send, receive: Receive, key: ApiKey | None = None
    ) -> None:
        """Serve one completion request: check it, admit it, route it. A stream ends when its client goes
        away (a proxied one closes its upstream connection, which makes vLLM abort the request)."""
        try:
            req = openai.parse(kind, body)
        except BadRequest as e:
            r = _Reply(400, "invalid_request_error", str(e))
            r.param = e.param
            raise r from None
        if key is not None and self.auth is not None:
            self.auth.admit(key, req.model)
        if req.model not in self.table.known:
            raise _Reply(404, "not_found_error", f"model {req.model!r} does not exist (see /v1/models)")
        rid = self.next_id
        self.next_id += 1
        inst = self.table.choose(req.model, rid)
        if inst is None or (not inst.endpoint and not self.linked):
            raise _Reply(
                503,
                "service_unavailable",
                f"model {req.model!r} has no live instance now; retry later",
                [(b"retry-after", self.retry_after)],
            )
        try:
            self.slots.acquire_nowait()
        except anyio.WouldBlock:
            if self.waiting >= self.max_queue:
                self.shed += 1
                raise _Reply(
                    429,
                    "rate_limit_error",
                    f"the gateway is at capacity ({self.max_active} active, {self.max_queue} waiting)",
                    [(b"retry-after", b"1")],
                ) from None
            self.waiting += 1
            try:
                await self.slots.acquire()
            finally:
                self.waiting -= 1
        try:
            if inst.endpoint:
                self.proxied[req.model] = self.proxied.get(req.model, 0) + 1
                serve = self.proxy(req, rid, inst, path, body, send)
            else:
                serve = self.simulate(req, rid, send)
            if not req.stream or not inst.endpoint:  # a simulated stream's client may leave: it ends at done
                await serve
                return
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
                await serve
                tg.cancel_scope.cancel()
        finally:
            self.slots.release()

    # -- proxied to an engine's own HTTP server -----------------------------------------------------

    async def proxy(self, req: ApiRequest, rid: int, inst: InstanceInfo, path: str, body: bytes, send: Send) -> None:
        """Pass the request to ``inst``'s endpoint and its response back as it comes (once retried on
        another instance when the first fails before its first byte).

        A prefill instance runs the disaggregated two-step protocol: the request with ``max_tokens`` 1
        (not streamed) goes to it, which computes the prompt's KV cache and hands it to the KV-transfer
        connector; then the whole request goes to a decode instance of the same region, which loads that
        cache instead of recomputing the prompt, and its response is the client's."""
        prefill = None
        if inst.mode == "prefill":
            prefill = inst
            inst = await self._prefill(req, rid, inst, path, body)
        try:
            resp = await self._post(inst, path, body)
        except UpstreamError as e:
            if prefill is not None:  # another decode instance of the region (the KV cache is shared there)
                other = next(
                    (d for k in range(1, 4) if (d := self.table.decode_for(prefill, rid, k)) and d.id != inst.id),
                    None,
                )
            else:
                other = self.table.choose(req.model, rid, 1, avoid=inst.id)
            if not e.before_first_byte or other is None or not other.endpoint:
                raise _Reply(502, "upstream_error", f"instance {inst.id} failed: {e}") from None
            self.retried += 1
            try:
                resp = await self._post(other, path, body)
            except UpstreamError as e2:
                raise _Reply(502, "upstream_error", f"instances {inst.id} and {other.id} failed: {e2}") from None
        try:
            headers = [(k, v) for k, v in resp.headers if k in _PASSED_HEADERS]
            if any(k == b"content-length" for k, _ in headers):  # a whole response: pass it in one piece
                try:
                    data = await resp.read()
                except UpstreamError as e:
                    raise _Reply(502, "upstream_error", f"instance failed mid-response: {e}") from None
                await send({"type": "http.response.start", "status": resp.status, "headers": headers})
                await send({"type": "http.response.body", "body": data, "more_body": False})
                return
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            try:
                async for data in resp.chunks():
                    await send({"type": "http.response.body", "body": data, "more_body": True})
            except UpstreamError:
                pass  # the instance died mid-response: end what was sent (nothing can be retried now)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            resp.release()

    async def _post(self, inst: InstanceInfo, path: str, body: bytes) -> Response:
        """POST to ``inst``'s engine, with its engine key when it has one (``coral.gateway.auth``)."""
        extra = self.auth.engine_header(inst.id) if self.auth is not None else b""
        return await self.client.post(inst.endpoint, path, body, extra)

    async def _prefill(self, req: ApiRequest, rid: int, inst: InstanceInfo, path: str, body: bytes) -> InstanceInfo:
        """Step one of the disaggregated protocol on ``inst``; returns the decode instance for step two."""
        doc = json.loads(body)
        doc["max_tokens"] = 1
        doc.pop("max_completion_tokens", None)
        doc["stream"] = False
        doc.pop("stream_options", None)
        first = json.dumps(doc).encode()
        tried = [inst]
        while True:
            try:
                resp = await self._post(tried[-1], path, first)
                try:
                    data = await resp.read()
                finally:
                    resp.release()
                if resp.status != 200:
                    raise _Reply(resp.status, "upstream_error", f"prefill on {tried[-1].id}: {data[:300]!r}")
                break
            except UpstreamError as e:
                other = self.table.choose(req.model, rid, len(tried), avoid=tried[-1].id)
                if not e.before_first_byte or len(tried) > 1 or other is None or not other.endpoint:
                    raise _Reply(502, "upstream_error", f"prefill instance {tried[-1].id} failed: {e}") from None
                self.retried += 1
                tried.append(other)
        decode = self.table.decode_for(tried[-1], rid)
        if decode is None:
            raise _Reply(
                503,
                "service_unavailable",
                f"model {req.model!r} has no live decode instance in {tried[-1].region} now; retry later",
                [(b"retry-after", self.retry_after)],
            )
        self.prefilled += 1
        return decode

    # -- simulated in the mesh ----------------------------------------------------------------------

    async def simulate(self, req: ApiRequest, rid: int, send: Send) -> None:
        """Hand the request to the mesh's router and answer with placeholder text at the simulated times:
        all at completion, or (streamed) each token batch as the simulated instance generates it."""
        out = req.max_tokens or self.default_out.get(req.model, DEFAULT_OUT)
        box = self.waiters[rid] = Mailbox()
        self.pending.append((rid, req.model, req.prompt_tokens, out, req.stream))
        if self.on_pending is not None:
            self.on_pending()
        finish = "length" if req.max_tokens is not None else "stop"
        created = int(time.time())
        events = openai.TokenEvents(req, rid, created) if req.stream else None
        sent = -1  # tokens streamed; -1: headers not sent yet
        o: Outcome | None = None
        try:
            while True:
                got = await box.take()  # all that came since the last: one write for them
                if not got:
                    break
                o = got[-1]  # the latest progress, or the end (nothing follows a request's end)
                if o.kind == "failed":
                    break
                if events is None:
                    if o.kind == "done":
                        await respond(send, 200, openai.completion(req, rid, out, created, finish))
                        return
                    continue
                upto = out if o.kind == "done" else min(o.tokens, out)
                if sent < 0:
                    await send({"type": "http.response.start", "status": 200, "headers": _SSE})
                    sent = 0
                parts = []
                if upto > sent:
                    text = openai.words(rid, sent, upto)
                    first = sent == 0
                    parts.append(openai.chunk(req, rid, created, text, first=True, finish=None) if first
                                 else events.event(text))  # fmt: skip
                    sent = upto
                if o.kind == "done":
                    parts.append(openai.chunk(req, rid, created, "", first=False, finish=finish))
                    if req.include_usage:
                        parts.append(openai.usage_chunk(req, rid, created, out))
                    parts.append(openai.DONE)
                    await send({"type": "http.response.body", "body": b"".join(parts), "more_body": False})
                    return
                if parts:
                    await send_chunk(send, parts[0])
        finally:
            self.waiters.pop(rid, None)
        reason = o.reason if o is not None and o.kind == "failed" else "the mesh stopped"
        message = f"request failed in the fleet ({reason})"
        if sent < 0 and reason == "too_long":
            raise _Reply(
                400, "invalid_request_error", f"{message}: prompt and max_tokens exceed the instance's KV cache"
            )
        if sent < 0:
            raise _Reply(503, "service_unavailable", message, [(b"retry-after", self.retry_after)])
        await send(
            {"type": "http.response.body", "body": openai.error_event(message, "server_error"), "more_body": False}
        )


async def read_body(receive: Receive) -> bytes:
    """The request body (at most ``MAX_BODY`` bytes)."""
    parts = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _Reply(400, "invalid_request_error", "body: the client went away")
        data = msg.get("body", b"")
        size += len(data)
        if size > MAX_BODY:
            raise _Reply(413, "invalid_request_error", f"body: larger than {MAX_BODY} bytes")
        parts.append(data)
        if not msg.get("more_body", False):
            return b"".join(parts)


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A whole JSON response."""
    hs = [*_JSON, (b"content-length", str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_chunk(send: Send, data: bytes) -> None:
    """One part of a streamed response."""
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
