"""Fuzz: random frames fed to the receive paths of the broker and the client never raise."""

from __future__ import annotations

import random

import msgspec
import pytest
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coral.kernel import Broker, BusClient, Envelope
from coral.kernel.wire import Malformed, pack_corr

from .msgs import Ping, Pong, next_of

TAGS = [b"test.kernel.ping", b"test.kernel.plan", b"kernel.hello", b"kernel.sync", b"kernel.shutdown", b"kernel.ready"]
NAMES = [b"kernel", b"*", b"fuzzed", b"peer", b"", b"\x00sync.fuzzed.1"]
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
frame = st.one_of(
    st.binary(max_size=24),
    st.sampled_from(TAGS + NAMES),
    st.builds(pack_corr, st.sampled_from([b"q", b"r", b"x"]), st.integers(0, 2**64 - 1)),
    msgpack_values.map(msgspec.msgpack.encode),
    st.builds(lambda n: msgspec.msgpack.encode({"n": n}), st.integers(-(2**63), 2**64 - 1) | st.text(max_size=3)),
)
frames_st = st.lists(frame, min_size=0, max_size=6)


@pytest.mark.slow
async def test_random_frames_never_raise_out_of_receive_paths() -> None:
    async with Broker() as broker:
        ep = broker.endpoints
        async with BusClient("fuzzed", ep) as client, BusClient("peer", ep) as peer:
            broker_errors: list[BaseException] = []

            @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
            @given(frames_st)
            def check(frames: list[bytes]) -> None:
                for result in (client.on_direct(frames), client.on_published(frames)):
                    assert result is None or isinstance(result, (Envelope, Malformed))
                try:
                    broker.handle_frames([b"fuzzer", *frames])
                except Exception as exc:  # recorded, not raised, so that hypothesis shrinks nothing silently
                    broker_errors.append(exc)

            check()
            assert broker_errors == []
            # The frames the broker routed reached real clients, which decoded or reported each one;
            # the bus still works afterwards.
            await client.sync()
            await peer.sync()
            await client.send("peer", Ping(1))
            assert (await next_of(peer, Ping)).msg == Ping(1)


async def test_random_frames_over_the_socket_keep_the_mesh_running() -> None:
    rng = random.Random(1234)
    async with Broker() as broker:
        ep = broker.endpoints
        async with BusClient("peer", ep) as peer, BusClient("other", ep) as other:
            raw = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            raw.setsockopt(zmq.LINGER, 0)
            raw.connect(broker.endpoints.router)
            try:
                pool = TAGS + NAMES + [b"peer", b"other", b""]
                for _ in range(500):
                    frames = [
                        rng.choice(pool) if rng.random() < 0.6 else rng.randbytes(rng.randrange(0, 20))
                        for _ in range(rng.randrange(0, 6))
                    ]
                    await raw.send_multipart(frames or [b""])
                await other.send("peer", Pong(2))
                assert (await next_of(peer, Pong)).msg == Pong(2)
                assert broker.stats.errors > 0
            finally:
                raw.close(0)
