"""The gateway over real HTTP against real upstream servers: routing, passthrough (SSE included), errors,
retry-once on a dead instance, shedding, and the arrival counts it hands to the router."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import anyio
import anyio.abc
import pytest

from coral.gateway import Gateway, GatewayError, serving
from coral.gateway.app import Mailbox, Receive, Scope, Send
from coral.gateway.upstream import PlaceholderServer
from coral.messages import FleetUpdate, InstanceInfo, Outcome, ProxiedArrivals
from tests.gateway.helpers import sse

LOCAL = ("127.0.0.1", 0)


def inst(
    iid: str,
    dep: str,
    endpoint: str,
    state: str = "serving",
    weight: float = 1.0,
    mode: str = "aggregated",
    region: str = "r1",
) -> InstanceInfo:
    return InstanceInfo(iid, dep, "t1", region, mode, state, ("a",), ("n" + iid,), "w", weight, 1e9, 0.0, endpoint)


def fleet(seq: int, *instances: InstanceInfo) -> FleetUpdate:
    return FleetUpdate(seq, float(seq), instances)


async def post(s: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with s.post(url, data=data, headers={"content-type": "application/json"}) as r:
        return r.status, dict(r.headers), await r.read()


async def test_proxy_routes_streams_and_reports_errors() -> None:
    a, b = PlaceholderServer("a"), PlaceholderServer("b")
    gw = Gateway({"chat": 16, "idle": 16}, seed=3)
    async with serving(a, LOCAL) as ua, serving(b, LOCAL) as ub, serving(gw, LOCAL) as url:
        gw.on_fleet(fleet(1, inst("i1", "chat", ua), inst("i2", "chat", ub), inst("i3", "idle", ua, "loading")))
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                assert r.status == 200
            async with s.get(url + "/v1/models") as r:
                models = {m["id"]: m["ready"] for m in (await r.json())["data"]}
            assert models == {"chat": True, "idle": False}

            served = set()
            for _ in range(12):
                st, hd, body = await post(
                    s, url + "/v1/completions", {"model": "chat", "prompt": "hi", "max_tokens": 3}
                )
                assert st == 200, body
                doc = json.loads(body)
                assert doc["usage"]["completion_tokens"] == 3 and len(doc["choices"][0]["text"].split()) == 3
                served.add(doc["served_by"])
            assert served == {"a", "b"}  # both weights are used

            req = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
            st, hd, body = await post(s, url + "/v1/chat/completions", req)
            assert st == 200 and hd["Content-Type"].startswith("text/event-stream")
            events = sse(body)
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert len("".join(c["choices"][0]["delta"]["content"] for c in chunks).split()) == 4

            st, hd, body = await post(s, url + "/v1/completions", {"model": "nope", "prompt": "x"})
            assert st == 404 and json.loads(body)["error"]["type"] == "not_found_error"
            assert "nope" in json.loads(body)["error"]["message"]

            st, hd, body = await post(s, url + "/v1/completions", {"model": "idle", "prompt": "x"})
            assert st == 503 and hd["Retry-After"] == "2"
            assert json.loads(body)["error"]["type"] == "service_unavailable"

            bad: list[tuple[str, Any, str]] = [
                ("/v1/completions", b"{not json", "JSON"),
                ("/v1/completions", [1, 2], "object"),
                ("/v1/completions", {"prompt": "x"}, "model"),
                ("/v1/completions", {"model": "chat"}, "prompt"),
                ("/v1/completions", {"model": "chat", "prompt": [{"a": 1}]}, "prompt"),
                ("/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 0}, "max_tokens"),
                ("/v1/completions", {"model": "chat", "prompt": "x", "stream": "yes"}, "stream"),
                ("/v1/completions", {"model": "chat", "prompt": "x", "n": 2}, "n"),
                ("/v1/chat/completions", {"model": "chat", "messages": []}, "messages"),
                ("/v1/chat/completions", {"model": "chat", "messages": [{"content": "x"}]}, "role"),
            ]
            before = a.served + b.served
            for path, body_in, needle in bad:
                st, hd, body = await post(s, url + path, body_in)
                err = json.loads(body)["error"]
                assert st == 400 and err["type"] == "invalid_request_error", (body_in, body)
                assert needle in err["message"], (needle, err)
            assert a.served + b.served == before  # nothing bad reached an instance

            async with s.get(url + "/v1/completions") as r:
                assert r.status == 405
            async with s.get(url + "/v2/nothing") as r:
                assert r.status == 404

    inputs = gw.take_inputs(5.0)
    assert inputs == [ProxiedArrivals(5.0, {"chat": 13})]
    assert gw.take_inputs(6.0) == []
    await gw.aclose()


async def test_retry_once_on_a_dead_instance() -> None:
    b = PlaceholderServer("b")
    gw = Gateway({"chat": 16}, seed=1)
    async with serving(b, LOCAL) as ub, serving(gw, LOCAL) as url:
        async with serving(PlaceholderServer("a"), LOCAL) as ua:
            gw.on_fleet(fleet(1, inst("i1", "chat", ua), inst("i2", "chat", ub)))
        # instance i1's server is gone: connections to it are refused
        async with aiohttp.ClientSession() as s:
            for _ in range(10):
                st, _hd, body = await post(
                    s, url + "/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 2}
                )
                assert st == 200 and json.loads(body)["served_by"] == "b"
            assert gw.retried >= 1
            assert b.served == 10
            gw.on_fleet(fleet(2, inst("i1", "chat", ua)))
            st, _hd, body = await post(s, url + "/v1/completions", {"model": "chat", "prompt": "x"})
            assert st == 502 and "i1" in json.loads(body)["error"]["message"]
    await gw.aclose()


class Held:
    """An upstream that answers only once ``release`` is set."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.inner = PlaceholderServer("held")
        self.arrived = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.arrived += 1
            await self.release.wait()
        await self.inner(scope, receive, send)


async def test_overload_is_shed_with_429() -> None:
    up = Held()
    gw = Gateway({"chat": 16}, max_active=1, max_queue=1)
    async with serving(up, LOCAL) as uu, serving(gw, LOCAL) as url:
        gw.on_fleet(fleet(1, inst("i1", "chat", uu)))
        body = {"model": "chat", "prompt": "x", "max_tokens": 1}
        results: list[int] = []
        async with aiohttp.ClientSession() as s, anyio.create_task_group() as tg:

            async def one() -> None:
                results.append((await post(s, url + "/v1/completions", body))[0])

            tg.start_soon(one)
            tg.start_soon(one)
            with anyio.fail_after(10):
                while up.arrived < 1 or gw.waiting < 1:
                    await anyio.sleep(0.01)
            st, hd, raw = await post(s, url + "/v1/completions", body)
            assert st == 429 and hd["Retry-After"] == "1"
            assert json.loads(raw)["error"]["type"] == "rate_limit_error"
            up.release.set()
        assert results == [200, 200] and gw.shed == 1
    await gw.aclose()


@pytest.mark.parametrize(
    ("kwargs", "needle"), [({"max_active": 0}, "max_active"), ({"max_queue": -1}, "max_queue"),
                           ({"retry_after_s": 0}, "retry_after_s")]
)  # fmt: skip
def test_bad_parameters_are_named(kwargs: dict[str, int], needle: str) -> None:
    with pytest.raises(GatewayError, match=needle):
        Gateway({"chat": 16}, **kwargs)


class Slow:
    """An upstream that streams a chunk every 20 ms (up to 500) and notes when its client goes away."""

    def __init__(self) -> None:
        self.chunks = 0
        self.gone = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(500):
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
            self.chunks += 1
            with anyio.move_on_after(0.02):
                if (await receive())["type"] == "http.disconnect":
                    self.gone.set()
                    return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def test_a_stream_ends_upstream_when_its_client_goes_away() -> None:
    up = Slow()
    gw = Gateway({"chat": 16}, max_active=4)
    async with serving(up, LOCAL) as uu, serving(gw, LOCAL) as url:
        gw.on_fleet(fleet(1, inst("i1", "chat", uu)))
        async with aiohttp.ClientSession() as s:
            body = {"model": "chat", "prompt": "x", "stream": True}
            r = await s.post(url + "/v1/completions", json=body)
            assert r.status == 200
            assert (await r.content.readany()).startswith(b"data: ")
            r.close()  # the client hangs up mid-stream
        with anyio.fail_after(10):
            await up.gone.wait()
            while gw.slots.value < 4:
                await anyio.sleep(0.01)
        assert up.chunks < 500
    await gw.aclose()


async def test_an_instance_that_dies_mid_response_gives_502() -> None:
    async def half(conn: anyio.abc.SocketStream) -> None:
        async with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await conn.receive()
            await conn.send(
                b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"partial'
            )

    gw = Gateway({"chat": 16})
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg, serving(gw, LOCAL) as url:
        tg.start_soon(listener.serve, half)
        gw.on_fleet(fleet(1, inst("i1", "chat", f"http://127.0.0.1:{port}")))
        async with aiohttp.ClientSession() as s:
            st, _hd, body = await post(s, url + "/v1/completions", {"model": "chat", "prompt": "x"})
        assert st == 502 and "mid-response" in json.loads(body)["error"]["message"]
        tg.cancel_scope.cancel()
    await gw.aclose()


async def test_a_pooled_connection_closed_by_the_instance_is_replaced_without_a_retry() -> None:
    conns = 0
    doc = b'{"served_by":"raw"}'

    async def once(conn: anyio.abc.SocketStream) -> None:
        """Answer the first request of a connection; close it on the second (an idle close racing it)."""
        nonlocal conns
        conns += 1
        async with conn:
            for n in range(2):
                data = b""
                while b"\r\n\r\n" not in data:
                    data += await conn.receive()
                if n == 1:
                    return
                head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(doc)
                await conn.send(head + doc)

    gw = Gateway({"chat": 16})
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg, serving(gw, LOCAL) as url:
        tg.start_soon(listener.serve, once)
        gw.on_fleet(fleet(1, inst("i1", "chat", f"http://127.0.0.1:{port}")))
        async with aiohttp.ClientSession() as s:
            for _ in range(3):
                st, _hd, body = await post(s, url + "/v1/completions", {"model": "chat", "prompt": "x"})
                assert st == 200 and body == doc
        assert gw.retried == 0 and conns == 3  # each second request found its connection closing
        tg.cancel_scope.cancel()
    await gw.aclose()


async def test_retry_once_when_an_instance_drops_the_connection() -> None:
    async def drop(conn: anyio.abc.SocketStream) -> None:
        async with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await conn.receive()  # read the request, then hang up without a byte

    b = PlaceholderServer("b")
    gw = Gateway({"chat": 16}, seed=5)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg, serving(b, LOCAL) as ub, serving(gw, LOCAL) as url:
        tg.start_soon(listener.serve, drop)
        gw.on_fleet(fleet(1, inst("i1", "chat", f"http://127.0.0.1:{port}"), inst("i2", "chat", ub)))
        async with aiohttp.ClientSession() as s:
            for _ in range(8):
                st, _hd, body = await post(s, url + "/v1/completions", {"model": "chat", "prompt": "x"})
                assert st == 200 and json.loads(body)["served_by"] == "b"
        assert gw.retried >= 1 and b.served == 8
        tg.cancel_scope.cancel()
    await gw.aclose()


async def test_disaggregated_two_step_protocol() -> None:
    """A prefill instance gets the request with max_tokens 1 (not streamed); then a decode instance of the
    same region gets the whole request and its response (streamed or not) is the client's."""
    pre, d1, d2, far = (PlaceholderServer(n) for n in ("pre", "d1", "d2", "far"))
    gw = Gateway({"pd": 16, "lonely": 16}, seed=5)
    async with (
        serving(pre, LOCAL) as up,
        serving(d1, LOCAL) as u1,
        serving(d2, LOCAL) as u2,
        serving(far, LOCAL) as uf,
        serving(gw, LOCAL) as url,
    ):
        gw.on_fleet(
            fleet(
                1,
                inst("p1", "pd", up, mode="prefill"),
                inst("d1", "pd", u1, mode="decode"),
                inst("d2", "pd", u2, mode="decode"),
                inst("d3", "pd", uf, mode="decode", region="r2"),
                inst("p2", "lonely", up, mode="prefill", region="r3"),
            )
        )
        async with aiohttp.ClientSession() as s:
            served = set()
            for _ in range(8):
                st, _, body = await post(s, url + "/v1/completions", {"model": "pd", "prompt": "hi", "max_tokens": 5})
                assert st == 200, body
                doc = json.loads(body)
                assert doc["usage"]["completion_tokens"] == 5
                served.add(doc["served_by"])
            assert served == {"d1", "d2"} and far.served == 0  # decode in the prefill's region only
            assert pre.seen == [("/v1/completions", 1, False)] * 8
            assert {m for _, m, _ in d1.seen + d2.seen} == {5}
            req = {"model": "pd", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
            st, hd, body = await post(s, url + "/v1/chat/completions", req)
            assert st == 200 and hd["Content-Type"].startswith("text/event-stream") and sse(body)[-1] == "[DONE]"
            assert pre.seen[-1] == ("/v1/chat/completions", 1, False)
            st, hd, body = await post(s, url + "/v1/completions", {"model": "lonely", "prompt": "x"})
            assert st == 503 and "decode" in json.loads(body)["error"]["message"] and hd["Retry-After"]
            assert gw.prefilled == 9


async def test_a_mailbox_hands_over_what_came_together_and_ends_when_closed() -> None:
    """A simulated request's outcomes: the ones that came before a take are taken together (one write); a
    take waits for the next; a closed mailbox gives what is left, then nothing."""
    box = Mailbox()
    box.put(Outcome(1, "progress", 1.0, tokens=1))
    box.put(Outcome(1, "progress", 1.0, tokens=2))
    assert [o.tokens for o in await box.take()] == [1, 2]
    got: list[list[Outcome]] = []
    async with anyio.create_task_group() as tg:

        async def taker() -> None:
            got.append(await box.take())

        tg.start_soon(taker)
        await anyio.sleep(0.01)
        assert got == []  # it waits
        box.put(Outcome(1, "done", 2.0, tokens=3))
    assert [o.kind for o in got[0]] == ["done"]
    box.put(Outcome(1, "progress", 3.0, tokens=4))
    box.close()
    assert [o.tokens for o in await box.take()] == [4]
    assert await box.take() == []
