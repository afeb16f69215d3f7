"""The kernel's broker: a ROUTER socket for directed traffic and a PUB socket for events.

Every client (an actor, the TUI, a remote stage worker) connects a DEALER, whose routing id is its name, to
the ROUTER, and a SUB to the PUB. All traffic goes through the broker, which journals it:

- a directed message ``[dest, tag, body(, corr)]`` from client ``src`` leaves the ROUTER for ``dest`` as
  ``[src, tag, body(, corr)]``;
- a message to dest ``*`` is published as ``[tag, src, body]`` (the tag is the topic);
- a message to dest ``kernel`` is for the broker (``Hello``, ``Heartbeat``, ``SyncRequest``, ``Goodbye``,
  ``ShutdownRequested``).

Directed sends never block the broker: a destination whose queue is at its high-water mark, or that does
not exist, loses the message and the broker publishes an ``ErrorEvent`` (for a full queue, at most one a
second per destination, with the count; a request to a missing peer also gets the ``ErrorEvent`` back as
its reply). Frames that are not a valid envelope become an ``ErrorEvent``; the broker never decodes
message bodies, receivers do. A peer silent for ``peer_timeout`` seconds (real time) is dropped and
reported as ``PeerLost``.

Refusals (a CURVE kernel): ZAP refuses an unknown or revoked key, naming the peer's address (its host:
the port changes with each retry). libzmq reports a failed handshake (a plaintext client never reaches
ZAP) with a code but not the peer, and the fd of the connection is closed (or already reused) by the
time the event arrives, so its address is ``UNNAMED_PEER``, which says so. Each is an ``AuthRefused``
with a readable reason; repeats from one peer (host, mechanism, key) are merged: the first is published
at once, later ones at most once per ``REFUSAL_REPORT_S`` with their count.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.lowlevel
import attrs
import zmq
import zmq.asyncio
from zmq.utils import z85

from coral.kernel.clock import Clock, RealClock
from coral.kernel.codec import DEFAULT_CODEC, Codec, DecodeError
from coral.kernel.events import (
    PROTOCOL,
    AuthRefused,
    ErrorEvent,
    Goodbye,
    Hello,
    PeerJoined,
    PeerLeft,
    PeerLost,
    Ready,
    ShutdownRequested,
    SyncMark,
    SyncRequest,
)
from coral.kernel.journal import Journal
from coral.kernel.keys import ServerKeys
from coral.kernel.wire import (
    KERNEL,
    KERNEL_B,
    KIND_PUBLISH,
    KIND_REQUEST,
    KIND_SEND,
    PUBLISH_B,
    REPLY_MARK,
    SYNC_TOPIC,
    BusError,
    Endpoints,
    check_hwm,
    check_positive,
    pack_corr,
    recv_nowait,
    send_nowait,
    set_common_options,
    text,
    unpack_corr,
    valid_tag,
)


class LocalPeer(Protocol):
    """A client in the broker's own process (``coral.kernel.client.LocalBusClient``): the broker hands it
    frames by a call instead of a socket. ``push_*`` return False when its inbox is full (a drop)."""

    topics: list[bytes]

    def push_direct(self, frames: list[bytes]) -> bool: ...

    def push_published(self, frames: list[bytes]) -> bool: ...


_DRAIN_BATCH = 256
_DROP_REPORT_S = 1.0
_TAG_CACHE_MAX = 4096
_ids = itertools.count()

_HELLO = b"kernel.hello"
_HEARTBEAT = b"kernel.heartbeat"
_SYNC = b"kernel.sync"
_GOODBYE = b"kernel.goodbye"
_SHUTDOWN = b"kernel.shutdown"


def inproc_endpoints() -> Endpoints:
    """A fresh pair of inproc addresses, unique in this process."""
    n = next(_ids)
    return Endpoints(f"inproc://coral-{os.getpid()}-{n}-router", f"inproc://coral-{os.getpid()}-{n}-pub")


ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_HANDSHAKE_FAILED = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL) | int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
UNNAMED_PEER = "unnamed peer (libzmq gives no address for a failed handshake)"
"""The address of a refusal that libzmq reports without its peer (a plaintext client of a CURVE kernel)."""
REFUSAL_REPORT_S = 10.0
"""Repeated refusals of one peer are reported at most once in this many seconds (real time), merged."""
_PROTOCOL_ERRORS = {
    int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH): "mechanism mismatch: not a CURVE client (plaintext)",
    int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC): "cryptographic error: the client has the wrong server key",
    int(zmq.PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE): "CURVE key exchange failed",
    int(zmq.PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND): "unexpected handshake command (not a ZMTP client?)",
    int(zmq.PROTOCOL_ERROR_ZMTP_INVALID_SEQUENCE): "invalid handshake sequence",
    int(zmq.PROTOCOL_ERROR_ZMTP_UNSPECIFIED): "unspecified ZMTP protocol error",
}


def handshake_reason(code: int) -> str:
    """A readable reason for a libzmq handshake failure code."""
    known = _PROTOCOL_ERRORS.get(code)
    if known is not None:
        return f"security handshake failed: {known}"
    if code & 0xFF000000 == 0x11000000:
        return f"security handshake failed: malformed or unexpected ZMTP command (code {code:#x})"
    if code & 0xFF000000 == 0x20000000:
        return f"security handshake failed: the authenticator answered badly (code {code:#x})"
    return f"security handshake failed (code {code:#x})"


def peer_host(address: str) -> str:
    """``tcp://HOST`` of a ZAP address or ``host:port`` (the port changes with every retry)."""
    if not address or address in ("?", UNNAMED_PEER):
        return UNNAMED_PEER
    host = address.removeprefix("tcp://")
    if host.startswith("[") and "]" in host:
        host = host[: host.index("]") + 1]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return f"tcp://{host}"


@attrs.define
class _Refusals:
    """Merges repeated refusals of one peer (see the module docstring)."""

    period: float = REFUSAL_REPORT_S
    # (address, mechanism, key) -> [reason, count since the last report, first unreported at, reported at]
    seen: dict[tuple[str, str, str], list[Any]] = attrs.field(factory=dict)

    def add(self, now: float, address: str, mechanism: str, key: str, reason: str) -> AuthRefused | None:
        k = (address, mechanism, key)
        rec = self.seen.get(k)
        if rec is None or now - rec[3] >= self.period:
            n = 1 + (rec[1] if rec is not None else 0)
            first = rec[2] if rec is not None and rec[1] else now
            self.seen[k] = [reason, 0, now, now]
            return AuthRefused(address, mechanism, key, reason, n, round(now - first, 3))
        if rec[1] == 0:
            rec[2] = now
        rec[0], rec[1] = reason, rec[1] + 1
        return None

    def due(self, now: float) -> list[AuthRefused]:
        """Merged reports of peers whose repeats waited a whole period."""
        out = []
        for (address, mechanism, key), rec in sorted(self.seen.items()):
            if rec[1] and now - rec[3] >= self.period:
                out.append(AuthRefused(address, mechanism, key, rec[0], rec[1], round(now - rec[2], 3)))
                rec[1], rec[3] = 0, now
        return out


def private_ipc_dir(address: str) -> None:
    """For an ``ipc://PATH`` address: create PATH's folder with mode 0700, or refuse one others can enter."""
    folder = Path(address[len("ipc://") :]).parent
    if not folder.exists():
        folder.mkdir(mode=0o700, parents=True)
        os.chmod(folder, 0o700)
        return
    mode = folder.stat().st_mode & 0o777
    if mode & 0o077:
        raise BusError(
            f"cannot bind {address}: its folder {folder} is open to other users (mode {mode:04o}); "
            "put the socket in a private folder (mode 0700), e.g. ipc:///tmp/coral-$USER/bus"
        )


def _bind(sock: zmq.Socket[Any], address: str) -> str:
    if address.startswith("tcp://") and address.endswith(":0"):
        address = address[:-2] + ":*"
    if address.startswith("ipc://"):
        private_ipc_dir(address)
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        raise BusError(f"cannot bind {address}: {exc}") from exc
    endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
    return endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)


@attrs.define
class BrokerStats:
    """Counters since the broker started."""

    routed: int = 0
    published: int = 0
    dropped: int = 0
    errors: int = 0


@attrs.define
class Peer:
    """A client that completed the handshake; ``last_seen`` is in real (monotonic) seconds."""

    name: str
    last_seen: float


class Broker:
    """The ROUTER + PUB hub; use as ``async with Broker(...) as broker``."""

    def __init__(
        self,
        endpoints: Endpoints | None = None,
        *,
        clock: Clock | None = None,
        journal: Journal | None = None,
        hwm: int = 10_000,
        heartbeat_interval: float = 1.0,
        peer_timeout: float = 10.0,
        codec: Codec = DEFAULT_CODEC,
        context: zmq.asyncio.Context | None = None,
        on_shutdown_request: Callable[[ShutdownRequested], None] | None = None,
        curve: ServerKeys | None = None,
    ) -> None:
        self.requested = endpoints if endpoints is not None else inproc_endpoints()
        tcp = any(a.startswith("tcp://") for a in (self.requested.router, self.requested.pub))
        self.curve = curve if tcp else None
        """CURVE keys when any endpoint is tcp:// (inproc:// and ipc:// need none); None: plaintext."""
        self.clock: Clock = clock if clock is not None else RealClock()
        self.journal = journal
        self.hwm = check_hwm(hwm)
        self.heartbeat_interval = check_positive(heartbeat_interval, "heartbeat_interval")
        self.peer_timeout = check_positive(peer_timeout, "peer_timeout")
        if self.peer_timeout <= self.heartbeat_interval:
            raise BusError(
                f"peer_timeout: must exceed heartbeat_interval ({self.heartbeat_interval}), got {peer_timeout}"
            )
        self.codec = codec
        self.on_shutdown_request = on_shutdown_request
        self._peers: dict[bytes, Peer] = {}
        self._local: dict[bytes, LocalPeer] = {}
        self._router_sent = False
        self.stats = BrokerStats()
        # A CURVE broker runs its ZAP handler in its own context (one handler per context).
        self._own_ctx = context is None and self.curve is not None
        if context is not None:
            self._ctx = context
        else:
            self._ctx = zmq.asyncio.Context() if self._own_ctx else zmq.asyncio.Context.instance()
        self.refused = 0
        self._refusals = _Refusals()
        self._endpoints: Endpoints | None = None
        self._valid_tags: set[bytes] = set()
        self._drops: dict[bytes, list[Any]] = {}
        self._stack: contextlib.AsyncExitStack | None = None
        self._router: zmq.asyncio.Socket
        self._router_sync: zmq.Socket[Any]
        self._pub: zmq.Socket[Any]

    @property
    def peers(self) -> dict[str, Peer]:
        """The connected clients that completed the handshake, by name."""
        return {p.name: p for p in self._peers.values()}

    @property
    def endpoints(self) -> Endpoints:
        """The bound addresses (a tcp port 0 or ``*`` resolved to the real port)."""
        if self._endpoints is None:
            raise BusError("broker: not started (use 'async with Broker(...)')")
        return self._endpoints

    async def __aenter__(self) -> Broker:
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            if self._own_ctx:
                stack.callback(self._ctx.destroy, 0)
            zap: zmq.asyncio.Socket | None = None
            if self.curve is not None:
                zap = self._ctx.socket(zmq.REP)
                stack.callback(zap.close, 0)
                zap.setsockopt(zmq.LINGER, 0)
                try:
                    zap.bind(ZAP_ENDPOINT)
                except zmq.ZMQError as exc:
                    raise BusError(f"cannot start the CURVE authenticator (one per zmq context): {exc}") from exc
            router = self._ctx.socket(zmq.ROUTER)
            stack.callback(router.close, 0)
            set_common_options(router, self.hwm)
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            pub_async = self._ctx.socket(zmq.PUB)
            stack.callback(pub_async.close, 0)
            set_common_options(pub_async, self.hwm)
            monitors = []
            if self.curve is not None:
                for sock in (router, pub_async):
                    self.curve.apply(sock)
                    sock.setsockopt(zmq.ZAP_DOMAIN, b"coral")
                    mon = sock.get_monitor_socket(_HANDSHAKE_FAILED)
                    stack.callback(mon.close, 0)
                    stack.callback(sock.disable_monitor)
                    monitors.append(mon)
            router_ep = _bind(router, self.requested.router)
            pub_ep = _bind(pub_async, self.requested.pub)
            self._router = router
            self._router_sync = zmq.Socket.shadow(router.underlying)
            self._pub = zmq.Socket.shadow(pub_async.underlying)
            self._endpoints = Endpoints(router_ep, pub_ep)
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            tg.start_soon(self._route_loop)
            tg.start_soon(self._liveness_loop)
            if zap is not None:
                tg.start_soon(self._zap_loop, zap)
            for mon in monitors:
                tg.start_soon(self._monitor_loop, mon)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
        if self.journal is not None:
            self.journal.flush()

    # -- kernel-originated traffic -------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """True between start and the beginning of shutdown; outside it, traffic is dropped and counted."""
        return self._stack is not None

    def publish(self, msg: object, source: str = KERNEL) -> None:
        """Publish (and journal) a message on behalf of ``source``; dropped once the broker is closing."""
        if not self.serving:
            self.stats.dropped += 1
            return
        tag, body = self.codec.encode(msg)
        self._publish(tag, source.encode(), tag, body)

    def send(self, dest: str, msg: object, source: str = KERNEL) -> bool:
        """Send (and journal) a directed message on behalf of ``source``; False if it was not delivered."""
        if not self.serving:
            self.stats.dropped += 1
            return False
        tag, body = self.codec.encode(msg)
        ok = self._route(source.encode(), dest.encode(), tag, body, None)
        # A send on the shadow socket may swallow the ROUTER's read notification: let pyzmq re-check it.
        self._router.get(zmq.EVENTS)
        return ok

    def attach(self, ident: bytes, peer: LocalPeer) -> None:
        """Connect an in-process client: it is a peer like any other, reached without a socket."""
        if ident in self._local:
            raise BusError(f"client {text(ident)!r}: a local client of that name is already attached")
        self._local[ident] = peer

    def detach(self, ident: bytes) -> None:
        """Disconnect an in-process client (after its Goodbye)."""
        self._local.pop(ident, None)

    def local_frames(self, frames: list[bytes]) -> None:
        """Handle frames an in-process client sent (identity first), at once; dropped once closing."""
        if not self.serving:
            self.stats.dropped += 1
            return
        self._router_sent = False
        self._on_frames(frames)
        if self._router_sent:  # a send on the shadow socket may swallow the ROUTER's read notification
            self._router.get(zmq.EVENTS)

    # -- the loops -----------------------------------------------------------------------------------

    async def _route_loop(self) -> None:
        router, rsync = self._router, self._router_sync
        while True:
            frames = await router.recv_multipart()
            self._on_frames(frames)
            for _ in range(_DRAIN_BATCH):
                try:
                    frames = recv_nowait(rsync)
                except zmq.Again:
                    if self.journal is not None:
                        self.journal.flush()
                    break
                self._on_frames(frames)
            else:
                await anyio.lowlevel.checkpoint()

    async def _liveness_loop(self) -> None:
        period = min(self.heartbeat_interval, self.peer_timeout / 4, _DROP_REPORT_S)
        while True:
            await anyio.sleep(period)
            now = anyio.current_time()
            late = [(i, p) for i, p in self._peers.items() if now - p.last_seen > self.peer_timeout]
            for ident, peer in [(i, p) for i, p in late if i not in self._local]:
                del self._peers[ident]
                self.publish(PeerLost(peer.name, round(now - peer.last_seen, 3)))
            self._report_drops(now)
            for report in self._refusals.due(time.monotonic()):  # as _refuse: also called outside the loop
                self.publish(report)

    async def _zap_loop(self, zap: zmq.asyncio.Socket) -> None:
        """The ZAP handler (RFC 27): allow the CURVE keys of ``curve.allowed()``; report each refusal."""
        assert self.curve is not None
        while True:
            req = await zap.recv_multipart()
            try:
                reply = self._zap_answer(req)
            except Exception as exc:  # never leave libzmq waiting, never crash the kernel
                self._error("", f"authenticator failed: {type(exc).__name__}: {exc}")
                reply = [b"1.0", req[1] if len(req) > 1 else b"", b"500", b"internal error", b"", b""]
            await zap.send_multipart(reply)

    def _zap_answer(self, req: list[bytes]) -> list[bytes]:
        assert self.curve is not None
        if len(req) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, rid, _domain, address, _identity, mechanism = req[:6]
        creds = req[6:]
        addr = address.decode(errors="replace")
        mech = mechanism.decode(errors="replace")
        if version != b"1.0":
            return [b"1.0", rid, b"500", b"unsupported ZAP version", b"", b""]
        if mechanism != b"CURVE" or len(creds) != 1 or len(creds[0]) != 32:
            reason = f"mechanism {mech}: only CURVE clients are allowed"
            self._refuse(addr, mech, "", reason)
            return [b"1.0", rid, b"400", reason.encode(), b"", b""]
        key = z85.encode(creds[0])
        try:
            allowed = self.curve.allowed()
        except OSError as exc:
            allowed = {}
            self._error("", f"cannot read the allowed client keys: {exc}")
        name = allowed.get(key)
        if name is None:
            reason = "unknown or revoked client key"
            self._refuse(addr, mech, key.decode(), reason)
            return [b"1.0", rid, b"400", reason.encode(), b"", b""]
        return [b"1.0", rid, b"200", b"OK", name.encode(), b""]

    async def _monitor_loop(self, mon: zmq.asyncio.Socket) -> None:
        """Report failed security handshakes (a plaintext client of a CURVE kernel) as AuthRefused, from
        ``UNNAMED_PEER`` (see the module docstring)."""
        from zmq.utils.monitor import parse_monitor_message

        while True:
            frames = await mon.recv_multipart()
            try:
                ev = parse_monitor_message(frames)
            except Exception:
                continue
            event, value = int(ev.get("event", 0)), int(ev.get("value", 0))
            if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                mech = "NULL" if value == int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) else "CURVE"
                self._refuse(UNNAMED_PEER, mech, "", handshake_reason(value))
            else:
                name = errno.errorcode.get(value, str(value))
                self._refuse(UNNAMED_PEER, "?", "", f"security handshake failed ({name}): not a CURVE client?")

    def _refuse(self, address: str, mechanism: str, key: str, reason: str) -> None:
        self.refused += 1
        report = self._refusals.add(time.monotonic(), peer_host(address), mechanism, key, reason)
        if report is not None:
            self.publish(report)

    # -- frame handling (never raises) ---------------------------------------------------------------

    def _on_frames(self, frames: list[bytes]) -> None:
        try:
            self._dispatch(frames)
        except Exception as exc:  # a bug in _dispatch must not take the kernel down; report it
            self._error("", f"broker failed on a frame: {type(exc).__name__}: {exc}")

    def handle_frames(self, frames: list[bytes]) -> None:
        """Route, publish or answer one frame list as if read from the ROUTER (identity first).

        Total: any malformed input becomes a published ErrorEvent, never an exception.
        """
        self._dispatch(frames)
        self._router.get(zmq.EVENTS)  # called from outside the route loop: re-arm pyzmq's wake-up

    def _dispatch(self, frames: list[bytes]) -> None:
        n = len(frames)
        if n != 4 and n != 5:
            sender = text(frames[0]) if frames else "?"
            self._error("", f"malformed envelope from {sender}: expected 3 or 4 frames, got {n - 1}")
            return
        ident, dest, tag, body = frames[0], frames[1], frames[2], frames[3]
        corr = frames[4] if n == 5 else None
        peer = self._peers.get(ident)
        if peer is not None:
            peer.last_seen = anyio.current_time()
        if tag not in self._valid_tags:
            if not valid_tag(tag):
                self._error(text(tag), f"bad tag frame from {text(ident)}")
                return
            if len(self._valid_tags) < _TAG_CACHE_MAX:
                self._valid_tags.add(tag)
        if dest == PUBLISH_B:
            self._publish(tag, ident, tag, body)
        elif dest == KERNEL_B:
            self._to_kernel(ident, tag, body, corr)
        else:
            self._route(ident, dest, tag, body, corr)

    def _route(self, source: bytes, dest: bytes, tag: bytes, body: bytes, corr: bytes | None) -> bool:
        if corr is None:
            kind, cid = KIND_SEND, 0
            out = [dest, source, tag, body]
        else:
            kc = unpack_corr(corr)
            if kc is None:
                self._error(text(tag), f"malformed correlation frame from {text(source)}")
                return False
            kind, cid = kc
            out = [dest, source, tag, body, corr]
        try:
            local = self._local.get(dest)
            if local is None:
                self._router_sent = True
                send_nowait(self._router_sync, out)
            elif not local.push_direct(out[1:]):
                raise zmq.Again
        except zmq.Again:
            self.stats.dropped += 1
            pending = self._drops.get(dest)
            if pending is None:  # first drop since the last report: say so now, count the rest
                self._drops[dest] = [0, anyio.current_time(), text(source), text(tag)]
                reason = f"dropped {text(source)} -> {text(dest)}: destination over high-water mark"
                self._error(text(tag), reason, text(source))
            else:
                pending[0] += 1
            return False
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self.stats.dropped += 1
            reason = f"unknown destination {text(dest)!r} (from {text(source)})"
            event = ErrorEvent(KERNEL, text(tag), reason, text(source))
            self.stats.errors += 1
            self.publish(event)
            if kind == KIND_REQUEST and source != KERNEL_B:
                self._reply(source, pack_corr(REPLY_MARK, cid), event)
            return False
        self.stats.routed += 1
        if self.journal is not None:
            self.journal.append(self.clock.now(), kind, text(source), text(dest), tag.decode(), body, cid)
        return True

    def _report_drops(self, now: float) -> None:
        for dest, (count, since, source, tag) in list(self._drops.items()):
            if now - since < _DROP_REPORT_S:
                continue
            del self._drops[dest]
            if count:
                self._error(
                    tag,
                    f"dropped {count} more messages to {text(dest)} (last from {source}) in {now - since:.1f}s: "
                    "destination over high-water mark",
                )

    def _publish(self, topic: bytes, source: bytes, tag: bytes, body: bytes) -> None:
        with contextlib.suppress(zmq.Again):  # PUB drops at its high-water mark; it never blocks
            send_nowait(self._pub, (topic, source, body))
        for peer in self._local.values():
            for prefix in peer.topics:
                if topic.startswith(prefix):
                    peer.push_published([topic, source, body])  # a full inbox drops, as PUB does
                    break
        self.stats.published += 1
        if self.journal is not None and not topic.startswith(SYNC_TOPIC):
            self.journal.append(self.clock.now(), KIND_PUBLISH, text(source), topic.decode(), tag.decode(), body)

    def _error(self, tag: str, reason: str, origin: str = "") -> None:
        self.stats.errors += 1
        self.publish(ErrorEvent(KERNEL, tag, reason, origin))

    def _reply(self, ident: bytes, corr: bytes | None, msg: object) -> None:
        tag, body = self.codec.encode(msg)
        out = [ident, KERNEL_B, tag, body] if corr is None else [ident, KERNEL_B, tag, body, corr]
        local = self._local.get(ident)
        if local is not None:
            local.push_direct(out[1:])
            return
        self._router_sent = True
        with contextlib.suppress(zmq.ZMQError):
            send_nowait(self._router_sync, out)

    def _join(self, ident: bytes) -> str:
        peer = self._peers.get(ident)
        if peer is None:
            peer = self._peers[ident] = Peer(text(ident), anyio.current_time())
            self.publish(PeerJoined(peer.name))
        return peer.name

    def _to_kernel(self, ident: bytes, tag: bytes, body: bytes, corr: bytes | None) -> None:
        if tag == _HEARTBEAT:
            self._join(ident)
            return
        try:
            msg = self.codec.decode(tag, body)
        except DecodeError as exc:
            self._error(exc.tag, f"from {text(ident)}: {exc}")
            return
        if tag == _SYNC and isinstance(msg, SyncRequest):
            mark = SyncMark(msg.token)
            self._reply(ident, None, mark)
            mtag, mbody = self.codec.encode(mark)
            sep = b"!" if msg.fresh else b"."
            self._publish(SYNC_TOPIC + ident + sep + str(msg.token).encode(), KERNEL_B, mtag, mbody)
        elif tag == _HELLO and isinstance(msg, Hello):
            if msg.protocol != PROTOCOL:
                self._error(text(tag), f"{text(ident)} speaks protocol {msg.protocol}, kernel {PROTOCOL}")
                return
            name = self._join(ident)
            self._reply(
                ident, None, Ready(name, PROTOCOL, self.heartbeat_interval, self.peer_timeout, self.clock.now())
            )
        elif tag == _GOODBYE and isinstance(msg, Goodbye):
            peer = self._peers.pop(ident, None)
            if peer is not None:
                self.publish(PeerLeft(peer.name, msg.reason))
            self._reply(ident, None, msg)
        elif tag == _SHUTDOWN and isinstance(msg, ShutdownRequested):
            if self.journal is not None:
                self.journal.append(self.clock.now(), KIND_SEND, text(ident), KERNEL, tag.decode(), body)
            if self.on_shutdown_request is not None:
                self.on_shutdown_request(msg)
        else:
            reason = f"the kernel does not handle {text(tag)!r}"
            self._error(text(tag), f"{reason} (from {text(ident)})")
            kc = unpack_corr(corr) if corr is not None else None
            if kc is not None and kc[0] == KIND_REQUEST:
                self._reply(ident, pack_corr(REPLY_MARK, kc[1]), ErrorEvent(KERNEL, text(tag), reason))
