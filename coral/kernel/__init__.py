"""Coral's actor microkernel: typed attrs messages between anyio actors, over ZeroMQ, through one kernel.

Messages
    ``attrs.frozen`` classes registered under a short dotted tag (``@message("mkt.update")``). A message
    travels as two frames: the tag (ASCII) and its msgpack body (msgspec). Receivers decode with one cached
    ``msgspec.msgpack.Decoder(cls)`` per tag; a frame that fails to decode becomes a ``DecodeError`` (tag
    and field path), which the receiver publishes as an ``ErrorEvent`` and skips.

Sockets
    The kernel binds a ROUTER and a PUB (inproc://, ipc:// or tcp://; ``tcp://127.0.0.1:0`` picks a free
    port). A client (``BusClient``) connects a DEALER, whose routing id is its name, to the ROUTER, and a
    SUB to the PUB. High-water marks are bounded on every socket, linger is 0. Frames:

    ========================  ================================================
    client DEALER -> kernel   ``[dest, tag, body]`` or ``[dest, tag, body, corr]``
    kernel ROUTER -> client   ``[source, tag, body]`` or ``[source, tag, body, corr]``
    kernel PUB -> client SUB  ``[topic, source, body]`` (the topic is the tag)
    ========================  ================================================

    ``dest`` is a peer name, ``*`` (publish) or ``kernel``. ``corr``, present only on a request and its
    reply, is ``q`` (request) or ``r`` (reply) followed by a big-endian u64 request id. Subscribers filter
    by tag prefix: ``kernel.actor.`` gets all supervision events. Topics starting with NUL are the
    kernel's private sync marks. The kernel never blocks on a receiver: a directed message to a missing
    peer, or to one whose queue is at its high-water mark, is dropped and reported as an ``ErrorEvent``,
    so bulk senders should bound what they have in flight (requests, or a window).

Handshake and liveness
    A client sends ``Hello`` and is usable once the kernel's ``Ready`` came back and a sync round trip
    proved its SUB path live. It sends a ``Heartbeat`` every ``heartbeat_interval`` real seconds; a
    client silent for ``peer_timeout`` is reported as ``PeerLost``. ``client.sync()`` is a barrier on both
    paths, and ``subscribe()`` returns only once the subscription is live.

Security
    On tcp:// endpoints a kernel given ``ServerKeys`` speaks CurveZMQ (encrypted, authenticated): its ZAP
    handler allows the client keys of its key directory and publishes an ``AuthRefused`` event
    (``kernel.auth.refused``) for each unknown or revoked key and each client that fails the security
    handshake (a plaintext one). Clients pass ``ClientKeys``. inproc:// and ipc:// need no keys; an ipc
    socket's folder must be private (0700). See ``coral.kernel.keys``.

Journal
    The kernel appends every routed and published message (not its handshake, heartbeat and sync control
    traffic) to an append-only file: a 12-byte header ``b"CORALJNL" + u32 version``, then records of
    ``u32 length | u32 crc32 | msgpack [seq, time, kind, source, dest, tag, body, corr]`` (little-endian).
    A torn tail is truncated on open with a warning; a bad record raises an error naming its offset. See
    ``coral.kernel.journal``.

Time and actors
    Decisions read time only from the kernel ``Clock`` (real, scaled or virtual). ``Mesh`` owns the
    broker, clock, journal and supervisor, spawns ``Actor`` subclasses, restarts crashed ones within a
    ``RestartPolicy`` budget, and under a ``VirtualClock`` can ``quiesce()`` (every actor idle, nothing in
    flight) before the next external input or clock step; ``inject(msg, at=t)`` does quiesce, step and
    deliver in one call.
"""

from coral.kernel.actor import (
    Actor,
    ActorContext,
    ActorError,
    ActorHandle,
    ActorState,
    Alarm,
    RestartPolicy,
    SpawnError,
    Supervisor,
)
from coral.kernel.broker import Broker, inproc_endpoints
from coral.kernel.client import BusClient, RequestError, RequestTimeout
from coral.kernel.clock import Clock, ClockError, RealClock, ScaledClock, VirtualClock
from coral.kernel.codec import Codec, DecodeError, EncodeError, decode, encode
from coral.kernel.events import (
    ActorCrashed,
    ActorGaveUp,
    ActorRestarted,
    AuthRefused,
    ErrorEvent,
    Heartbeat,
    PeerJoined,
    PeerLeft,
    PeerLost,
    Ready,
    ShutdownRequested,
)
from coral.kernel.journal import (
    Fsync,
    Journal,
    JournalCorruptError,
    JournalError,
    JournalRecord,
    TornTailWarning,
    read_journal,
)
from coral.kernel.keys import ClientKeys, KeysError, ServerKeys, client_keys, server_keys
from coral.kernel.mesh import Mesh, MeshError, MeshState
from coral.kernel.registry import REGISTRY, Registry, RegistryError, message
from coral.kernel.wire import KERNEL, BusError, Endpoints, Envelope

__all__ = [
    "KERNEL",
    "REGISTRY",
    "Actor",
    "ActorContext",
    "ActorCrashed",
    "ActorError",
    "ActorGaveUp",
    "ActorHandle",
    "ActorRestarted",
    "ActorState",
    "Alarm",
    "AuthRefused",
    "Broker",
    "BusClient",
    "BusError",
    "ClientKeys",
    "Clock",
    "ClockError",
    "Codec",
    "DecodeError",
    "EncodeError",
    "Endpoints",
    "Envelope",
    "ErrorEvent",
    "Fsync",
    "Heartbeat",
    "Journal",
    "JournalCorruptError",
    "JournalError",
    "JournalRecord",
    "KeysError",
    "Mesh",
    "MeshError",
    "MeshState",
    "PeerJoined",
    "PeerLeft",
    "PeerLost",
    "Ready",
    "RealClock",
    "Registry",
    "RegistryError",
    "RequestError",
    "RequestTimeout",
    "RestartPolicy",
    "ScaledClock",
    "ServerKeys",
    "ShutdownRequested",
    "SpawnError",
    "Supervisor",
    "TornTailWarning",
    "VirtualClock",
    "client_keys",
    "decode",
    "encode",
    "inproc_endpoints",
    "message",
    "read_journal",
    "server_keys",
]
