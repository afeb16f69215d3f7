"""Broker and bus client: handshake on every transport, routing, pub/sub filtering, errors and liveness."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import msgspec
import pytest
import zmq
import zmq.asyncio

from coral.kernel import (
    Broker,
    BusClient,
    BusError,
    Endpoints,
    ErrorEvent,
    PeerJoined,
    PeerLeft,
    PeerLost,
    RequestError,
    RequestTimeout,
    encode,
    inproc_endpoints,
)
from coral.kernel.events import Hello

from .msgs import AEvent, BEvent, Ping, Pong, drain, next_match, next_of


@pytest.fixture(params=["inproc", "ipc", "tcp"])
def endpoints(request: pytest.FixtureRequest, tmp_path: Path) -> Endpoints:
    if request.param == "inproc":
        return inproc_endpoints()
    if request.param == "ipc":
        return Endpoints(f"ipc://{tmp_path}/router", f"ipc://{tmp_path}/pub")
    return Endpoints("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")


class Raw:
    """A bare DEALER that speaks (or garbles) the protocol by hand."""

    def __init__(self, router: str, identity: bytes) -> None:
        self.sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTING_ID, identity)
        self.sock.connect(router)

    async def send(self, *frames: bytes) -> None:
        await self.sock.send_multipart(list(frames))

    def close(self) -> None:
        self.sock.close(0)


async def test_handshake_and_directed_send(endpoints: Endpoints) -> None:
    async with Broker(endpoints) as broker:
        ep = broker.endpoints
        if endpoints.router.startswith("tcp"):
            assert not ep.router.endswith(":0") and ep.router != ep.pub
        async with BusClient("watcher", ep, subscribe=["kernel.peer."]) as watcher:
            assert watcher.ready is not None and watcher.ready.name == "watcher"
            async with BusClient("alice", ep) as alice:
                assert alice.ready is not None
                await next_match(watcher, PeerJoined, name="alice")
                assert set(broker.peers) == {"watcher", "alice"}
                await alice.send("watcher", Ping(1))
                env = await next_of(watcher, Ping)
                assert (env.kind, env.source, env.tag, env.msg) == ("send", "alice", "test.kernel.ping", Ping(1))
            assert (await next_of(watcher, PeerLeft)).msg.name == "alice"
            assert set(broker.peers) == {"watcher"}


async def test_pub_sub_filters_by_topic_prefix() -> None:
    async with Broker() as broker:
        ep = broker.endpoints
        async with (
            BusClient("a-only", ep, subscribe=["test.kernel.a."]) as a_only,
            BusClient("everything", ep, subscribe=["test.kernel."]) as everything,
            BusClient("deaf", ep) as deaf,
            BusClient("pub", ep) as pub,
        ):
            for i in range(3):
                await pub.publish(AEvent(i))
                await pub.publish(BEvent(i))
            await pub.sync()  # the kernel has published all six
            for c in (a_only, everything, deaf):
                await c.sync()  # ... and each subscriber has received what it will ever get
            assert [e.msg for e in drain(a_only)] == [AEvent(0), AEvent(1), AEvent(2)]
            got = drain(everything)
            assert [e.msg for e in got] == [AEvent(0), BEvent(0), AEvent(1), BEvent(1), AEvent(2), BEvent(2)]
            assert all(e.kind == "publish" and e.source == "pub" for e in got)
            assert drain(deaf) == []
            await deaf.subscribe("test.kernel.b.")  # live on return: the next publish arrives
            await pub.publish(BEvent(9))
            assert (await next_of(deaf, BEvent)).msg == BEvent(9)
            await deaf.unsubscribe("test.kernel.b.")
            await pub.publish(BEvent(10))
            await pub.sync()
            await deaf.sync()
            assert drain(deaf) == []


async def test_request_reply_and_failures() -> None:
    async with Broker() as broker, anyio.create_task_group() as tg:
        ep = broker.endpoints
        async with BusClient("server", ep) as server, BusClient("client", ep) as client:

            async def serve() -> None:
                async for env in server:
                    if env.kind == "request" and env.msg.n >= 0:
                        await server.reply(env, Pong(env.msg.n * 2))

            tg.start_soon(serve)
            assert await client.request("server", Ping(21)) == Pong(42)
            results = []

            async def ask(n: int) -> None:
                results.append(await client.request("server", Ping(n)))

            async with anyio.create_task_group() as inner:
                for n in range(20):
                    inner.start_soon(ask, n)
            assert sorted(r.n for r in results) == [2 * n for n in range(20)]
            with pytest.raises(RequestError, match="unknown destination 'nobody'"):
                await client.request("nobody", Ping(1))
            with pytest.raises(RequestTimeout, match="no reply within"):
                await client.request("server", Ping(-1), timeout=0.05)
            async with BusClient("oneshot", ep) as oneshot:
                await oneshot.send("client", Ping(5))
                plain = await next_of(client, Ping)
                with pytest.raises(BusError, match="not a request"):
                    await client.reply(plain, Pong(0))
            tg.cancel_scope.cancel()


async def test_garbage_frames_become_error_events_and_bus_keeps_working() -> None:
    async with Broker() as broker:
        ep = broker.endpoints
        async with BusClient("watch", ep, subscribe=["kernel.error"]) as watch, BusClient("alice", ep) as alice:
            raw = Raw(ep.router, b"vandal")
            try:
                ping_tag, ping_body = encode(Ping(1))
                bad_body = msgspec.msgpack.encode({"n": "seven"})
                cases = [
                    ([b"one"], "expected 3 or 4 frames, got 1"),
                    ([b"alice", b"\xff\xfe", ping_body], "bad tag frame"),
                    ([b"alice", ping_tag, ping_body, b"zz"], "malformed correlation"),
                    ([b"nobody", ping_tag, ping_body], "unknown destination 'nobody'"),
                    ([b"kernel", ping_tag, ping_body], "does not handle"),
                    ([b"kernel", b"kernel.hello", b"\xc1"], "malformed"),
                ]
                for frames, expected in cases:
                    await raw.send(*frames)
                    env = await next_of(watch, ErrorEvent)
                    assert env.source == "kernel" and expected in env.msg.reason, (frames, env.msg)
                    # the sender of a lost message is named (the TUI leaves out its own)
                    assert env.msg.origin == ("vandal" if expected.startswith("unknown destination") else "")
                # A valid envelope with a bad body reaches alice, who reports it and carries on.
                await raw.send(b"alice", ping_tag, bad_body)
                env = await next_of(watch, ErrorEvent)
                err = env.msg
                assert (env.source, err.source, err.tag) == ("alice", "alice", "test.kernel.ping")
                assert "$.n" in err.reason and "Expected `int`, got `str`" in err.reason
                await raw.send(b"alice", b"test.kernel.nosuch", ping_body)
                assert "unknown tag" in (await next_of(watch, ErrorEvent)).msg.reason
                await raw.send(b"alice", ping_tag, ping_body)
                env = await next_of(alice, Ping)
                assert env.source == "vandal" and env.msg == Ping(1)
                assert alice.stats.errors == 2 and broker.stats.errors >= len(cases)
            finally:
                raw.close()


async def test_silent_peer_is_reported_lost() -> None:
    # 1.5 s, not 0.5: a busy 2-core machine can stall the heartbeating client's loop for half a second
    async with Broker(heartbeat_interval=0.05, peer_timeout=1.5) as broker:
        ep = broker.endpoints
        async with BusClient("watch", ep, subscribe=["kernel.peer."]) as watch:
            raw = Raw(ep.router, b"ghost")
            try:
                tag, body = encode(Hello("ghost"))
                await raw.send(b"kernel", tag, body)
                await next_match(watch, PeerJoined, name="ghost")
                lost = await next_of(watch, PeerLost)
                assert lost.msg.name == "ghost" and lost.msg.silent_s >= 1.5  # reported only past the timeout
                assert "ghost" not in broker.peers and "watch" in broker.peers  # the heartbeating one stays
            finally:
                raw.close()


async def test_destination_over_high_water_mark_drops_with_error() -> None:
    async with Broker(hwm=4) as broker:
        ep = broker.endpoints
        async with (
            BusClient("watch", ep, subscribe=["kernel.error"]) as watch,
            BusClient("slow", ep, inbox_size=1, hwm=4) as slow,
            BusClient("fast", ep, hwm=4) as fast,
        ):
            for i in range(2000):
                await fast.send("slow", Ping(i))
            await fast.sync()
            assert broker.stats.dropped > 0
            env = await next_of(watch, ErrorEvent)
            assert "destination over high-water mark" in env.msg.reason and "fast -> slow" in env.msg.reason
            assert (await slow.receive()).msg == Ping(0)
            # Drops are reported once, then summed up at most once a second: no storm of error events.
            assert broker.stats.errors * 10 < broker.stats.dropped


async def test_traffic_after_shutdown_is_dropped_not_raised() -> None:
    """A late publisher (a solve that ends after the mesh closed) meets a closed broker: counted, no error."""
    broker = Broker()
    async with broker:
        assert broker.serving
        broker.publish(Ping(0))
    assert not broker.serving
    before = broker.stats.dropped
    broker.publish(Ping(1))
    assert broker.send("anyone", Ping(2)) is False
    broker.local_frames([b"late", b"", b"x", b""])
    assert broker.stats.dropped == before + 3


async def test_bad_options_are_rejected() -> None:
    with pytest.raises(BusError, match="hwm"):
        Broker(hwm=0)
    with pytest.raises(BusError, match="peer_timeout"):
        Broker(heartbeat_interval=2.0, peer_timeout=1.0)
    with pytest.raises(BusError, match="router"):
        Endpoints("http://x", "tcp://127.0.0.1:1")
    with pytest.raises(BusError, match="reserved"):
        BusClient("kernel", inproc_endpoints())
    with pytest.raises(BusError, match="name"):
        BusClient("-bad name", inproc_endpoints())
    with pytest.raises(BusError, match="inbox_size"):
        BusClient("x", inproc_endpoints(), inbox_size=0)
    with pytest.raises(BusError, match="cannot bind"):
        async with Broker(Endpoints("tcp://256.1.1.1:0", "tcp://127.0.0.1:0")):
            pass


async def test_handshake_times_out_without_a_kernel() -> None:
    with pytest.raises(BusError, match="no Ready"):
        async with BusClient("lonely", inproc_endpoints(), handshake_timeout=0.1):
            pass


WORKER = """
import sys, anyio, attrs
from coral.kernel import BusClient, Endpoints, message

@message("test.kernel.ping")
@attrs.frozen
class Ping:
    n: int

@message("test.kernel.pong")
@attrs.frozen
class Pong:
    n: int

async def main() -> None:
    async with BusClient("worker", Endpoints(sys.argv[1], sys.argv[2])) as bus:
        async for env in bus:
            if env.msg.n < 0:
                return
            await bus.reply(env, Pong(env.msg.n * 10))

anyio.run(main)
"""


async def test_remote_worker_process_over_tcp() -> None:
    """A stage worker in another process connects over tcp, with its own copy of the message types."""
    async with Broker(Endpoints("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")) as broker:
        ep = broker.endpoints
        async with BusClient("watch", ep, subscribe=["kernel.peer."]) as watch, BusClient("boss", ep) as boss:
            cwd = Path(__file__).resolve().parents[2]
            async with await anyio.open_process([sys.executable, "-c", WORKER, ep.router, ep.pub], cwd=cwd) as proc:
                await next_match(watch, PeerJoined, timeout=30, name="worker")
                assert await boss.request("worker", Ping(4), timeout=30) == Pong(40)
                await boss.send("worker", Ping(-1))
                assert (await next_of(watch, PeerLeft, timeout=30)).msg.name == "worker"
                assert await proc.wait() == 0
