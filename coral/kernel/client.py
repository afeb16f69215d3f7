"""The bus client: a DEALER (directed traffic, requests) and a SUB (events) connected to a kernel.

``async with BusClient("tui", endpoints, subscribe=["kernel."]) as bus:`` connects, says ``Hello`` and
returns once the kernel's ``Ready`` came back and the SUB path is proven live (a sync round trip), so that
nothing sent or published after that is missed. Then::

    await bus.send("allocator", msg)            # directed
    await bus.publish(msg)                      # event, topic = the message's tag
    reply = await bus.request("allocator", msg, timeout=5.0)
    await bus.subscribe("mkt.")                 # returns once the subscription is live
    async for env in bus: ...                   # Envelope(kind, source, tag, msg, corr)
    await bus.reply(env, answer)                # answer a request

Received frames that do not decode are reported on the bus as ``ErrorEvent`` and skipped. The inbox is
bounded (``inbox_size``): when it is full the client stops reading its sockets, their queues fill to the
high-water mark, and the kernel drops (and reports) what it cannot deliver. Heartbeats go out every
``Ready.heartbeat_interval`` real seconds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Self

import anyio
import anyio.abc
import anyio.lowlevel
import attrs
import zmq
import zmq.asyncio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from coral.kernel.broker import Broker
from coral.kernel.codec import DEFAULT_CODEC, Codec
from coral.kernel.events import ErrorEvent, Goodbye, Heartbeat, Hello, Ready, SyncMark, SyncRequest
from coral.kernel.keys import ClientKeys
from coral.kernel.wire import (
    KERNEL,
    KERNEL_B,
    KIND_REPLY,
    KIND_REQUEST,
    PUBLISH_B,
    REPLY_MARK,
    REQUEST_MARK,
    SYNC_TOPIC,
    BusError,
    Endpoints,
    Envelope,
    Malformed,
    check_hwm,
    check_name,
    check_positive,
    pack_corr,
    parse_direct,
    parse_published,
    readable,
    recv_nowait,
    send_nowait,
    set_common_options,
)

_DRAIN_BATCH = 256
_YIELD_EVERY = 32


class RequestError(BusError):
    """The kernel could not deliver a request (for example, the destination does not exist)."""


class RequestTimeout(BusError, TimeoutError):
    """No reply came back within the timeout."""


@attrs.define
class ClientStats:
    """Counters since the client connected."""

    sent: int = 0
    received: int = 0
    discarded: int = 0
    errors: int = 0


class _Pending:
    __slots__ = ("envelope", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.envelope: Envelope | None = None


class _Sync:
    __slots__ = ("direct", "event", "published")

    def __init__(self) -> None:
        self.direct = False
        self.published = False
        self.event = anyio.Event()

    def check(self) -> None:
        if self.direct and self.published:
            self.event.set()


class BusClient:
    """A named connection to a kernel; use as an async context manager."""

    def __init__(
        self,
        name: str,
        endpoints: Endpoints,
        *,
        subscribe: Iterable[str] = (),
        inbox_size: int = 1024,
        hwm: int = 10_000,
        handshake_timeout: float = 10.0,
        codec: Codec = DEFAULT_CODEC,
        context: zmq.asyncio.Context | None = None,
        curve: ClientKeys | None = None,
    ) -> None:
        self.name = check_name(name)
        if not isinstance(endpoints, Endpoints):
            raise BusError(f"endpoints: expected Endpoints, got {type(endpoints).__name__}")
        self.endpoints = endpoints
        tcp = any(a.startswith("tcp://") for a in (endpoints.router, endpoints.pub))
        self.curve = curve if tcp else None
        """CURVE keys for a tcp:// kernel (inproc:// and ipc:// need none); None: plaintext."""
        self._topics = [_check_prefix(p) for p in subscribe]
        if not isinstance(inbox_size, int) or inbox_size < 1:
            raise BusError(f"inbox_size: expected an int >= 1, got {inbox_size!r}")
        self.inbox_size = inbox_size
        self.hwm = check_hwm(hwm)
        self.handshake_timeout = check_positive(handshake_timeout, "handshake_timeout")
        self.codec = codec
        self.stats = ClientStats()
        self.on_arrival: Callable[[], None] | None = None
        """Called whenever a message lands in the inbox (the mesh tracks its actors' idleness by it)."""
        self.ready: Ready | None = None
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._name_b = name.encode()
        self._sync_prefix = SYNC_TOPIC + self._name_b + b"."
        self._fresh_prefix = SYNC_TOPIC + self._name_b + b"!"
        self._inbox_recv: MemoryObjectReceiveStream[Envelope] | LocalInbox | None = None
        self._accepting = True
        self._feeds: list[MemoryObjectSendStream[Envelope] | LocalInbox] = []
        self._pending: dict[int, _Pending] = {}
        self._syncs: dict[int, _Sync] = {}
        self._ids = itertools.count(1)
        self._unyielded = 0
        self._send_waiting = 0
        self._dealer_shadow: zmq.Socket[Any]
        self._dest_cache: dict[str, bytes] = {}
        self._ready_event = anyio.Event()
        self._goodbye_event = anyio.Event()
        self._stack: contextlib.AsyncExitStack | None = None
        self._closed = False
        self._dealer: zmq.asyncio.Socket
        self._sub: zmq.asyncio.Socket

    # -- lifecycle ----------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._stack is not None or self._closed:
            raise BusError(f"client {self.name!r}: already opened")
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            await self._connect(stack)
        except BaseException:
            self._closed = True
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def _connect(self, stack: contextlib.AsyncExitStack) -> None:
        """Open the sockets and the inbox, and shake hands; what ``stack`` holds is undone on close."""
        dealer = self._ctx.socket(zmq.DEALER)
        stack.callback(dealer.close, 0)
        set_common_options(dealer, self.hwm)
        dealer.setsockopt(zmq.ROUTING_ID, self._name_b)
        sub = self._ctx.socket(zmq.SUB)
        stack.callback(sub.close, 0)
        set_common_options(sub, self.hwm)
        for topic in self._topics:
            sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        # this client's sync marks, subscribed before connecting: a subscription made at each sync
        # reached the publisher after the mark it was for (a lost mark and a retry per sync)
        sub.setsockopt(zmq.SUBSCRIBE, self._sync_prefix)
        if self.curve is not None:
            self.curve.apply(dealer)
            self.curve.apply(sub)
        try:
            dealer.connect(self.endpoints.router)
            sub.connect(self.endpoints.pub)
        except zmq.ZMQError as exc:
            raise BusError(f"client {self.name!r}: cannot connect to {self.endpoints}: {exc}") from exc
        self._dealer, self._sub = dealer, sub
        self._dealer_shadow = zmq.Socket.shadow(dealer.underlying)
        send, recv = anyio.create_memory_object_stream[Envelope](self.inbox_size)
        self._inbox_recv = recv
        stack.callback(recv.close)
        with send:
            feeds = [send.clone(), send.clone()]
        self._feeds = list(feeds)
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        tg.start_soon(self._direct_loop, feeds[0])
        tg.start_soon(self._published_loop, feeds[1])
        await self._handshake()
        tg.start_soon(self._heartbeat_loop)

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Say goodbye (waiting briefly for the kernel's acknowledgement) and close the sockets."""
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            with anyio.move_on_after(1.0):
                await self._send_frames(KERNEL_B, Goodbye())
                await self._goodbye_event.wait()
        except (zmq.ZMQError, BusError):
            pass
        finally:
            self._closed = True
            self.stop_receiving()
            for slot in self._pending.values():  # wake waiting requests: they fail as closed
                slot.event.set()
            for state in self._syncs.values():  # and waiting syncs: they fail as closed
                state.event.set()
            await stack.aclose()

    async def _handshake(self) -> None:
        retry = 0.05
        with anyio.move_on_after(self.handshake_timeout) as scope:
            while self.ready is None:
                await self._send_frames(KERNEL_B, Hello(self.name))
                with anyio.move_on_after(retry):
                    await self._ready_event.wait()
                retry = min(retry * 2, 1.0)
        if scope.cancelled_caught:
            hint = (
                f" (with CURVE key {self.curve.name!r}: the kernel refuses unknown or revoked keys)"
                if self.curve is not None
                else " (a kernel with keys refuses plaintext clients: give --keys)"
                if self.endpoints.router.startswith("tcp://")
                else ""
            )
            raise BusError(
                f"client {self.name!r}: no Ready from the kernel at {self.endpoints.router} "
                f"within {self.handshake_timeout}s{hint}"
            )
        await self.sync(timeout=self.handshake_timeout)

    async def _heartbeat_loop(self) -> None:
        assert self.ready is not None
        for seq in itertools.count():
            await anyio.sleep(self.ready.heartbeat_interval)
            with contextlib.suppress(zmq.ZMQError, BusError):
                await self._send_frames(KERNEL_B, Heartbeat(seq))

    def stop_receiving(self) -> None:
        """Stop putting new messages in the inbox; the inbox iterator ends once it is drained.

        Replies to requests and sync marks are still handled.
        """
        self._accepting = False
        for feed in self._feeds:
            feed.close()

    # -- sending ------------------------------------------------------------------------------------

    def _dest(self, dest: str) -> bytes:
        b = self._dest_cache.get(dest)
        if b is None:
            b = KERNEL_B if dest == KERNEL else check_name(dest).encode()
            self._dest_cache[dest] = b
        return b

    async def _send_frames(self, dest: bytes, msg: object, corr: bytes | None = None) -> None:
        if self._closed:
            raise BusError(f"client {self.name!r}: closed")
        tag, body = self.codec.encode(msg)
        frames = (dest, tag, body) if corr is None else (dest, tag, body, corr)
        sent = False
        if not self._send_waiting:  # never overtake a send that waits for room
            try:
                send_nowait(self._dealer_shadow, frames)
                sent = True
            except zmq.Again:
                pass
            else:
                if readable(self._dealer_shadow):
                    self._dealer.get(zmq.EVENTS)  # the send may have taken pyzmq's wake-up: re-arm it
        if not sent:
            self._send_waiting += 1
            try:
                await self._dealer.send_multipart(frames)
            finally:
                self._send_waiting -= 1
        self.stats.sent += 1
        self._unyielded += 1
        if self._unyielded >= _YIELD_EVERY:  # a tight send loop must let the kernel and receivers run
            self._unyielded = 0
            await anyio.lowlevel.checkpoint()

    async def send(self, dest: str, msg: object) -> None:
        """Send ``msg`` to the peer named ``dest`` (or to ``kernel``)."""
        await self._send_frames(self._dest(dest), msg)

    async def publish(self, msg: object) -> None:
        """Publish ``msg`` to every subscriber of a prefix of its tag."""
        await self._send_frames(PUBLISH_B, msg)

    async def request(self, dest: str, msg: object, *, timeout: float = 10.0) -> Any:
        """Send a request to ``dest`` and return the message of its reply (real-time ``timeout``)."""
        check_positive(timeout, "timeout")
        cid = next(self._ids)
        slot = self._pending[cid] = _Pending()
        try:
            await self._send_frames(self._dest(dest), msg, pack_corr(REQUEST_MARK, cid))
            with anyio.move_on_after(timeout):
                await slot.event.wait()
        finally:
            del self._pending[cid]
        env = slot.envelope
        if env is None and self._closed:
            raise BusError(f"request {type(msg).__name__} to {dest!r}: the client closed before the reply came")
        if env is None:
            raise RequestTimeout(f"request {type(msg).__name__} to {dest!r}: no reply within {timeout}s")
        if env.source == KERNEL and isinstance(env.msg, ErrorEvent):
            raise RequestError(f"request {type(msg).__name__} to {dest!r}: {env.msg.reason}")
        return env.msg

    async def reply(self, env: Envelope, msg: object) -> None:
        """Answer the request ``env`` with ``msg``."""
        if env.kind != KIND_REQUEST:
            raise BusError(f"reply: envelope {env.tag!r} from {env.source!r} is a {env.kind}, not a request")
        await self._send_frames(self._dest(env.source), msg, pack_corr(REPLY_MARK, env.corr))

    # -- subscriptions and sync ---------------------------------------------------------------------

    async def subscribe(self, prefix: str) -> None:
        """Receive published messages whose tag starts with ``prefix``; returns once that is live."""
        self._set_sub(zmq.SUBSCRIBE, _check_prefix(prefix).encode())
        self._topics.append(prefix)
        await self.sync(fresh=True)

    async def unsubscribe(self, prefix: str) -> None:
        """Undo one ``subscribe(prefix)``."""
        if prefix not in self._topics:
            raise BusError(f"unsubscribe: {prefix!r} is not subscribed")
        self._set_sub(zmq.UNSUBSCRIBE, prefix.encode())
        self._topics.remove(prefix)
        await self.sync(fresh=True)

    def _set_sub(self, option: int, topic: bytes) -> None:
        self._sub.setsockopt(option, topic)
        self._sub.get(zmq.EVENTS)  # let pyzmq re-check readiness in case the option call consumed a wake-up

    @property
    def closed(self) -> bool:
        """Whether the client has been closed (or failed to open)."""
        return self._closed

    @property
    def subscriptions(self) -> tuple[str, ...]:
        return tuple(self._topics)

    async def sync(self, timeout: float = 10.0, *, fresh: bool = False) -> None:
        """Barrier with the kernel, on both paths.

        On return, the kernel has handled everything this client sent before the call, and this client
        has received (into its inbox) everything the kernel routed or published to it before that.
        ``fresh`` also proves that every subscription change made before the call is live at the
        kernel: its mark is published on a topic of its own that only a subscription made after them
        covers (subscriptions reach the kernel in order).
        """
        token = next(self._ids)
        state = self._syncs[token] = _Sync()
        topic = self._fresh_prefix + str(token).encode()
        if fresh:
            self._set_sub(zmq.SUBSCRIBE, topic)
        retry = 0.005
        try:
            with anyio.move_on_after(timeout):
                while not state.event.is_set():
                    await self._send_frames(KERNEL_B, SyncRequest(token, fresh))
                    with anyio.move_on_after(retry):
                        await state.event.wait()
                    retry = min(retry * 2, 0.5)
        finally:
            del self._syncs[token]
            if fresh and not self._closed:
                self._set_sub(zmq.UNSUBSCRIBE, topic)
        if self._closed:
            raise BusError(f"client {self.name!r}: closed during a sync")
        if not state.event.is_set():
            raise BusError(f"client {self.name!r}: sync with the kernel timed out after {timeout}s")

    # -- receiving ----------------------------------------------------------------------------------

    @property
    def _inbox(self) -> MemoryObjectReceiveStream[Envelope] | LocalInbox:
        if self._inbox_recv is None:
            raise BusError(f"client {self.name!r}: not connected (use 'async with BusClient(...)')")
        return self._inbox_recv

    async def receive(self) -> Envelope:
        """The next message; raises anyio.EndOfStream once receiving stopped and the inbox is drained."""
        return await self._inbox.receive()

    def receive_nowait(self) -> Envelope:
        """The next message if one is queued; raises anyio.WouldBlock otherwise."""
        return self._inbox.receive_nowait()

    def __aiter__(self) -> AsyncIterator[Envelope]:
        return _Inbox(self._inbox)

    @property
    def backlog(self) -> int:
        """Messages waiting in the inbox (including a reader blocked on a full inbox)."""
        inbox = self._inbox_recv
        if inbox is None:
            return 0
        if isinstance(inbox, LocalInbox):
            return len(inbox)
        st = inbox.statistics()
        return st.current_buffer_used + st.tasks_waiting_send

    async def _deliver(self, feed: MemoryObjectSendStream[Envelope], env: Envelope) -> None:
        if not self._accepting:
            self.stats.discarded += 1
            return
        try:
            try:
                feed.send_nowait(env)
            except anyio.WouldBlock:
                await feed.send(env)
        except anyio.ClosedResourceError:  # receiving stopped while this one waited for room
            self.stats.discarded += 1
            return
        self.stats.received += 1
        if self.on_arrival is not None:
            self.on_arrival()

    async def _report(self, bad: Malformed) -> None:
        self.stats.errors += 1
        with contextlib.suppress(zmq.ZMQError, BusError):
            await self._send_frames(PUBLISH_B, ErrorEvent(self.name, bad.tag, bad.reason))

    def on_direct(self, frames: list[bytes]) -> Envelope | Malformed | None:
        """Classify one directed frame list: control replies are consumed (None), the rest returned."""
        parsed = parse_direct(frames, self.codec)
        if isinstance(parsed, Malformed):
            return parsed
        if parsed.kind == KIND_REPLY:
            slot = self._pending.get(parsed.corr)
            if slot is not None and slot.envelope is None:
                slot.envelope = parsed
                slot.event.set()
            return None
        if parsed.source == KERNEL:
            msg = parsed.msg
            if isinstance(msg, Ready):
                if self.ready is None and msg.name == self.name:
                    self.ready = msg
                    self._ready_event.set()
                return None
            if isinstance(msg, SyncMark):
                state = self._syncs.get(msg.token)
                if state is not None:
                    state.direct = True
                    state.check()
                return None
            if isinstance(msg, Goodbye):
                self._goodbye_event.set()
                return None
        return parsed

    def on_published(self, frames: list[bytes]) -> Envelope | Malformed | None:
        """Classify one published frame list: sync marks are consumed (None), the rest returned."""
        if frames and frames[0][:1] == b"\x00" and frames[0].startswith(SYNC_TOPIC):
            for prefix in (self._sync_prefix, self._fresh_prefix):
                if not frames[0].startswith(prefix):
                    continue
                try:
                    token = int(frames[0][len(prefix) :])
                except ValueError:
                    return None
                state = self._syncs.get(token)
                if state is not None:
                    state.published = True
                    state.check()
            return None
        return parse_published(frames, self.codec)

    async def _direct_loop(self, feed: MemoryObjectSendStream[Envelope]) -> None:
        await self._read_loop(self._dealer, self.on_direct, feed)

    async def _published_loop(self, feed: MemoryObjectSendStream[Envelope]) -> None:
        await self._read_loop(self._sub, self.on_published, feed)

    async def _read_loop(
        self,
        sock: zmq.asyncio.Socket,
        classify: Callable[[list[bytes]], Envelope | Malformed | None],
        feed: MemoryObjectSendStream[Envelope],
    ) -> None:
        # Await one message, then take what else is already queued without awaiting (much cheaper).
        # Only this task receives on ``sock``, so reading through the shadow socket is safe: the next
        # awaited recv re-checks ZMQ_EVENTS before it waits on the file descriptor.
        shadow: zmq.Socket[Any] = zmq.Socket.shadow(sock.underlying)
        with feed:
            while True:
                await self._take(classify(await sock.recv_multipart()), feed)
                for _ in range(_DRAIN_BATCH):
                    try:
                        frames = recv_nowait(shadow)
                    except zmq.Again:
                        break
                    await self._take(classify(frames), feed)
                else:
                    await anyio.lowlevel.checkpoint()

    async def _take(self, item: Envelope | Malformed | None, feed: MemoryObjectSendStream[Envelope]) -> None:
        if isinstance(item, Envelope):
            await self._deliver(feed, item)
        elif item is not None:
            await self._report(item)


class _Inbox:
    """Iterates the inbox, yielding to the event loop every ``_YIELD_EVERY`` messages, not on every one."""

    __slots__ = ("_n", "_recv")

    def __init__(self, recv: MemoryObjectReceiveStream[Envelope] | LocalInbox) -> None:
        self._recv = recv
        self._n = 0

    def __aiter__(self) -> _Inbox:
        return self

    async def __anext__(self) -> Envelope:
        self._n += 1
        if self._n < _YIELD_EVERY:
            try:
                return self._recv.receive_nowait()
            except anyio.WouldBlock:
                pass
            except anyio.EndOfStream:
                raise StopAsyncIteration from None
        self._n = 0
        try:
            return await self._recv.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


class LocalInbox:
    """The inbox of a ``LocalBusClient``: a bounded queue with one reader, filled by the broker's calls.

    What it needs of a memory object stream, for less: ``send_nowait`` (``anyio.WouldBlock`` when full,
    ``anyio.ClosedResourceError`` once closed), ``close`` (no more sends; the reader drains what is queued,
    then gets ``anyio.EndOfStream``), ``receive_nowait`` and ``receive``. A ``receive`` that must wait
    waits on a bare asyncio future on asyncio (an ``anyio.Event`` elsewhere), without the stream's
    checkpoint before it and its per-wait event and receiver objects; one with a message queued yields
    first, as the stream's does.
    """

    __slots__ = ("_buffer", "_closed", "_event", "_size", "_waiter")

    def __init__(self, size: int) -> None:
        self._size = size
        self._buffer: collections.deque[Envelope] = collections.deque()
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._event: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self._buffer)

    def send_nowait(self, item: Envelope) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if len(self._buffer) >= self._size:
            raise anyio.WouldBlock
        self._buffer.append(item)
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        elif self._event is not None:
            self._event.set()
            self._event = None

    def receive_nowait(self) -> Envelope:
        if self._buffer:
            return self._buffer.popleft()
        if self._closed:
            raise anyio.EndOfStream
        raise anyio.WouldBlock

    async def receive(self) -> Envelope:
        if self._buffer or self._closed:
            await anyio.lowlevel.checkpoint()
        while not self._buffer and not self._closed:
            try:
                loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                waiter = self._waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    if self._waiter is waiter:
                        self._waiter = None
            else:
                event = self._event = anyio.Event()
                await event.wait()
        return self.receive_nowait()


def _check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise BusError(f"subscribe: expected a str prefix, got {type(prefix).__name__}")
    if prefix.startswith("\x00"):
        raise BusError("subscribe: prefixes starting with NUL are reserved for the kernel")
    return prefix


class LocalBusClient(BusClient):
    """A bus client in the broker's own process: the same protocol as ``BusClient`` (handshake, routing,
    journal, requests, subscriptions), carried by calls instead of sockets.

    A send is handled by the broker before ``send`` returns, and what the broker routes to this client
    is in its inbox when the broker's call returns, so ``sync`` has nothing to wait for. The inbox holds
    ``inbox_size + hwm`` messages (the inbox and the socket queue of a ``BusClient``); beyond that the
    broker drops and reports, as it does at a socket's high-water mark.
    """

    def __init__(
        self,
        name: str,
        broker: Broker,
        *,
        subscribe: Iterable[str] = (),
        inbox_size: int = 1024,
        hwm: int = 10_000,
        codec: Codec = DEFAULT_CODEC,
    ) -> None:
        super().__init__(name, broker.endpoints, subscribe=subscribe, inbox_size=inbox_size, hwm=hwm, codec=codec)
        self._broker = broker
        self.topics: list[bytes] = [t.encode() for t in self._topics]
        self._feed: LocalInbox | None = None

    async def _connect(self, stack: contextlib.AsyncExitStack) -> None:
        inbox = LocalInbox(self.inbox_size + self.hwm)
        self._inbox_recv = inbox  # a reader still draining it after the close gets EndOfStream, not an error
        self._feed = inbox
        self._feeds = [inbox]
        stack.callback(inbox.close)
        self._broker.attach(self._name_b, self)
        stack.callback(self._broker.detach, self._name_b)
        await self._handshake()

    async def _send_frames(self, dest: bytes, msg: object, corr: bytes | None = None) -> None:
        if self._closed:
            raise BusError(f"client {self.name!r}: closed")
        tag, body = self.codec.encode(msg)
        frames = [self._name_b, dest, tag, body] if corr is None else [self._name_b, dest, tag, body, corr]
        self._broker.local_frames(frames)
        self.stats.sent += 1
        self._unyielded += 1
        if self._unyielded >= _YIELD_EVERY:  # a tight send loop must let the receivers run
            self._unyielded = 0
            await anyio.lowlevel.checkpoint()

    def _set_sub(self, option: int, topic: bytes) -> None:
        if option == zmq.SUBSCRIBE:
            self.topics.append(topic)
        elif topic in self.topics:
            self.topics.remove(topic)

    async def sync(self, timeout: float = 10.0, *, fresh: bool = False) -> None:
        """Nothing is ever in flight between this client and the kernel: a checkpoint."""
        if self._closed:
            raise BusError(f"client {self.name!r}: closed")
        await anyio.lowlevel.checkpoint()

    def push_direct(self, frames: list[bytes]) -> bool:
        """The broker routes a directed message (``[source, tag, body(, corr)]``) here; False: inbox full."""
        return self._push(self.on_direct(frames))

    def push_published(self, frames: list[bytes]) -> bool:
        """The broker publishes ``[topic, source, body]`` to this subscriber; False: inbox full."""
        return self._push(self.on_published(frames))

    def _push(self, item: Envelope | Malformed | None) -> bool:
        if isinstance(item, Malformed):
            self.stats.errors += 1
            self._broker.publish(ErrorEvent(self.name, item.tag, item.reason), self.name)
            return True
        if item is None:
            return True
        if not self._accepting or self._feed is None:
            self.stats.discarded += 1
            return True
        try:
            self._feed.send_nowait(item)
        except anyio.WouldBlock:
            return False
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.stats.discarded += 1
            return True
        self.stats.received += 1
        if self.on_arrival is not None:
            self.on_arrival()
        return True
