"""A minimal OpenAI-compatible server that answers at once with placeholder text (an ASGI application).

It stands for an engine's own HTTP server where none runs: the direct baseline of ``just bench gateway``
and the upstream of the gateway's tests. Completions and chat completions (streamed or not) get
``max_tokens`` placeholder words (16 when not given); every response names the server (``served_by``,
and the ``x-served-by`` header) so that a test can tell which instance answered.
"""

from __future__ import annotations

import itertools

from coral.gateway import openai
from coral.gateway.app import Receive, Scope, Send, read_body, respond, send_chunk


class PlaceholderServer:
    """The server (see the module docstring); ``name`` identifies it in its responses."""

    def __init__(self, name: str = "upstream") -> None:
        self.name = name
        self.served = 0
        self.seen: list[tuple[str, int | None, bool]] = []
        """(path, max_tokens, stream) of each request served."""
        self.ids = itertools.count(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        extra = [(b"x-served-by", self.name.encode())]
        if path == "/health":
            await respond(send, 200, b"{}", extra)
            return
        if path not in ("/v1/completions", "/v1/chat/completions"):
            await respond(send, 404, openai.error_body(f"no route {path}", "not_found_error", 404), extra)
            return
        body = await read_body(receive)
        try:
            req = openai.parse("chat" if path.endswith("chat/completions") else "completions", body)
        except openai.BadRequest as e:
            await respond(send, 400, openai.error_body(str(e), "invalid_request_error", 400, e.param), extra)
            return
        self.served += 1
        self.seen.append((path, req.max_tokens, req.stream))
        rid = next(self.ids)
        out = req.max_tokens or 16
        if not req.stream:
            data = openai.completion(req, rid, out, 0, "length")
            await respond(send, 200, data[:-1] + b',"served_by":"' + self.name.encode() + b'"}', extra)
            return
        headers = [(b"content-type", b"text/event-stream"), *extra]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for k in range(out):
            await send_chunk(send, openai.chunk(req, rid, 0, openai.words(rid, k, k + 1), first=k == 0, finish=None))
        await send_chunk(send, openai.chunk(req, rid, 0, "", first=False, finish="length"))
        await send({"type": "http.response.body", "body": openai.DONE, "more_body": False})
