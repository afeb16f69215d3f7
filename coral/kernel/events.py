"""The kernel's own messages: handshake, liveness and sync control, and the events it publishes.

Control messages (``Hello``, ``Ready``, ``Heartbeat``, ``Goodbye``, ``SyncRequest``, ``SyncMark``) travel
between a client and the kernel and are never journaled. Events are published on the PUB socket under the
``kernel.`` topic; subscribe to ``kernel.actor.`` for supervision and ``kernel.peer.`` for membership.
A client sends ``ShutdownRequested`` to the kernel to ask the mesh to stop; the kernel publishes it when
shutdown begins.
"""

from __future__ import annotations

import attrs

from coral.kernel.registry import message

PROTOCOL = 1
"""The wire protocol version a client announces in ``Hello``."""


@message("kernel.hello")
@attrs.frozen
class Hello:
    """Client -> kernel: the first message of a connection."""

    name: str
    protocol: int = PROTOCOL


@message("kernel.ready")
@attrs.frozen
class Ready:
    """Kernel -> client: the handshake answer; the client is usable once it has this."""

    name: str
    protocol: int
    heartbeat_interval: float
    peer_timeout: float
    time: float


@message("kernel.heartbeat")
@attrs.frozen
class Heartbeat:
    """Client -> kernel: I am alive."""

    seq: int


@message("kernel.goodbye")
@attrs.frozen
class Goodbye:
    """Client -> kernel: I am leaving cleanly."""

    reason: str = ""


@message("kernel.sync")
@attrs.frozen
class SyncRequest:
    """Client -> kernel: answer with a SyncMark on both the directed and the published path. The mark is
    published on ``SYNC_TOPIC + client + "." + token``, or ``"!"`` in place of the dot when ``fresh``
    (a topic the client's standing subscription to its marks does not cover)."""

    token: int
    fresh: bool = False


@message("kernel.sync_mark")
@attrs.frozen
class SyncMark:
    """Kernel -> client: everything the kernel routed to the client before this mark has been sent."""

    token: int


@message("kernel.error")
@attrs.frozen
class ErrorEvent:
    """A frame that could not be routed or decoded; ``source`` is who noticed, ``tag`` the frame's tag,
    ``origin`` the peer that sent the frame where the kernel knows it (a lost message's sender), else ""."""

    source: str
    tag: str
    reason: str
    origin: str = ""


@message("kernel.auth.refused")
@attrs.frozen
class AuthRefused:
    """The kernel refused a connection: an unknown or revoked CURVE key (``key``, z85), or a client that
    failed the security handshake (a plaintext client of a CURVE kernel: ``mechanism`` is what failed).
    ``address`` is the peer's (``tcp://HOST``; ``?`` when libzmq did not tell). Repeats from one peer
    are merged: ``count`` refusals since the previous report of this peer, the first ``first_s`` seconds
    (monotonic, real time) before this report."""

    address: str
    mechanism: str
    key: str
    reason: str
    count: int = 1
    first_s: float = 0.0


@message("kernel.peer.joined")
@attrs.frozen
class PeerJoined:
    """A client completed its handshake."""

    name: str


@message("kernel.peer.left")
@attrs.frozen
class PeerLeft:
    """A client said goodbye."""

    name: str
    reason: str = ""


@message("kernel.peer.lost")
@attrs.frozen
class PeerLost:
    """A client sent nothing (not even a heartbeat) for longer than the peer timeout."""

    name: str
    silent_s: float


@message("kernel.actor.crashed")
@attrs.frozen
class ActorCrashed:
    """An actor raised; ``count`` is its crashes within the restart window, this one included."""

    actor: str
    error: str
    count: int


@message("kernel.actor.restarted")
@attrs.frozen
class ActorRestarted:
    """The supervisor restarted a crashed actor."""

    actor: str
    error: str
    count: int


@message("kernel.actor.gave_up")
@attrs.frozen
class ActorGaveUp:
    """The actor crashed more often than its restart budget allows; it stays stopped."""

    actor: str
    error: str
    count: int


@message("kernel.shutdown")
@attrs.frozen
class ShutdownRequested:
    """Ask the mesh to shut down (client -> kernel), or announce that it is shutting down (published)."""

    source: str
    reason: str = ""
