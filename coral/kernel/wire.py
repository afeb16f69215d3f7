"""Frame layouts shared by the broker and the client, and the parsers that turn raw frames into envelopes.

The parsers are total: for any list of byte strings they return a result or an error reason, never raise.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import attrs
import zmq
from zmq.backend import Socket as _RawSocket

from coral.errors import CoralError
from coral.kernel.codec import Codec, DecodeError, tag_text
from coral.kernel.registry import MAX_TAG_LEN, TAG_RE

KERNEL = "kernel"
"""The destination name of the kernel itself (handshake, heartbeats, sync, shutdown requests)."""
KERNEL_B = KERNEL.encode()
PUBLISH_B = b"*"
"""The destination frame that asks the kernel to publish a message on its PUB socket."""
SYNC_TOPIC = b"\x00sync."
"""Prefix of the private topics on which the kernel publishes sync marks (never a tag: tags are ASCII)."""

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@/+-]*$")
MAX_NAME_LEN = 64

_CORR = struct.Struct(">cQ")
REQUEST_MARK = b"q"
REPLY_MARK = b"r"

KIND_SEND = "send"
KIND_REQUEST = "request"
KIND_REPLY = "reply"
KIND_PUBLISH = "publish"


class BusError(CoralError):
    """A bad name, endpoint or option given to the bus, or a bus operation that cannot be done."""


def check_name(name: str) -> str:
    """Return ``name`` if it is a valid peer name; raise BusError naming the reason otherwise."""
    if not isinstance(name, str):
        raise BusError(f"name: expected str, got {type(name).__name__}")
    if name == KERNEL:
        raise BusError(f"name: {KERNEL!r} is reserved for the kernel")
    if len(name) > MAX_NAME_LEN or not NAME_RE.match(name):
        raise BusError(
            f"name {name!r}: expected 1-{MAX_NAME_LEN} characters of letters, digits and _.:@/+- "
            "(not starting with punctuation)"
        )
    return name


def check_hwm(hwm: int) -> int:
    """Return ``hwm`` if it is a bounded high-water mark (an int >= 1)."""
    if not isinstance(hwm, int) or isinstance(hwm, bool) or hwm < 1:
        raise BusError(f"hwm: expected an int >= 1 (0 would mean unbounded), got {hwm!r}")
    return hwm


def check_positive(value: float, name: str) -> float:
    """Return ``value`` if it is a number > 0."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise BusError(f"{name}: expected a number > 0, got {value!r}")
    return float(value)


def valid_tag(tag: bytes) -> bool:
    """Whether ``tag`` is a syntactically valid wire tag."""
    if len(tag) > MAX_TAG_LEN:
        return False
    try:
        return TAG_RE.match(tag.decode("ascii")) is not None
    except UnicodeDecodeError:
        return False


def pack_corr(mark: bytes, corr: int) -> bytes:
    """The correlation frame of a request (``q``) or reply (``r``) with id ``corr``."""
    return _CORR.pack(mark, corr)


def unpack_corr(frame: bytes) -> tuple[str, int] | None:
    """(kind, id) of a correlation frame (``request`` or ``reply``); None if it is malformed."""
    if len(frame) != _CORR.size:
        return None
    mark, corr = _CORR.unpack(frame)
    if mark == REQUEST_MARK:
        return KIND_REQUEST, corr
    if mark == REPLY_MARK:
        return KIND_REPLY, corr
    return None


def text(b: bytes) -> str:
    """A printable form of a name or tag frame."""
    return tag_text(b)


@attrs.frozen
class Endpoints:
    """The two addresses of a kernel: its ROUTER (directed traffic) and its PUB (events)."""

    router: str
    pub: str

    def __attrs_post_init__(self) -> None:
        for field, value in (("router", self.router), ("pub", self.pub)):
            if not isinstance(value, str) or not value.startswith(("inproc://", "ipc://", "tcp://")):
                raise BusError(f"{field}: expected an inproc://, ipc:// or tcp:// address, got {value!r}")


@attrs.frozen
class Envelope:
    """A received message with its routing facts.

    ``kind`` is ``send`` or ``request`` for directed messages and ``publish`` for events; ``corr`` is the
    request id a reply must carry (0 otherwise).
    """

    kind: str
    source: str
    tag: str
    msg: Any
    corr: int = 0


@attrs.frozen
class Malformed:
    """A frame list that is not a valid message; ``tag`` is the tag frame's text when there was one."""

    tag: str
    reason: str


def parse_direct(frames: list[bytes], codec: Codec) -> Envelope | Malformed:
    """Parse what a DEALER receives from the kernel: [source, tag, body] or [source, tag, body, corr]."""
    n = len(frames)
    if n == 3:
        kind, corr = KIND_SEND, 0
    elif n == 4:
        kc = unpack_corr(frames[3])
        if kc is None:
            return Malformed(text(frames[1]), f"malformed correlation frame {frames[3][:16]!r} from {text(frames[0])}")
        kind, corr = kc
    else:
        return Malformed("", f"malformed directed message: expected 3 or 4 frames, got {n}")
    source, tag, body = frames[0], frames[1], frames[2]
    try:
        msg = codec.decode(tag, body)
    except DecodeError as exc:
        return Malformed(exc.tag, f"from {text(source)}: {exc}")
    return Envelope(kind, text(source), tag.decode(), msg, corr)


def parse_published(frames: list[bytes], codec: Codec) -> Envelope | Malformed:
    """Parse what a SUB receives from the kernel: [topic, source, body], where the topic is the tag."""
    if len(frames) != 3:
        return Malformed("", f"malformed published message: expected 3 frames, got {len(frames)}")
    tag, source, body = frames
    try:
        msg = codec.decode(tag, body)
    except DecodeError as exc:
        return Malformed(exc.tag, f"from {text(source)}: {exc}")
    return Envelope(KIND_PUBLISH, text(source), tag.decode(), msg)


_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE) | _NOBLOCK
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_raw_send = _RawSocket.send
_raw_recv = _RawSocket.recv
_raw_get = _RawSocket.get


def send_nowait(sock: zmq.Socket[Any], frames: tuple[bytes, ...] | list[bytes]) -> None:
    """Send a multipart message without blocking (raises zmq.Again at the high-water mark).

    Calls the Cython socket methods directly: pyzmq's ``send_multipart`` spends most of its time
    combining ``IntFlag`` enums. A multipart message is atomic: if its first frame is accepted, so is the
    rest.
    """
    last = len(frames) - 1
    for i in range(last):
        _raw_send(sock, frames[i], _MORE_NOBLOCK)
    _raw_send(sock, frames[last], _NOBLOCK)


def recv_nowait(sock: zmq.Socket[Any]) -> list[bytes]:
    """Receive one multipart message without blocking (raises zmq.Again when none is queued)."""
    frame = _raw_recv(sock, _NOBLOCK, False)  # a Frame knows whether more parts follow: no getsockopt
    parts = [frame.bytes]
    while frame.more:
        frame = _raw_recv(sock, _NOBLOCK, False)
        parts.append(frame.bytes)
    return parts


def readable(sock: zmq.Socket[Any]) -> bool:
    """Whether a message is queued (this also lets libzmq process its pending commands)."""
    events: int = _raw_get(sock, _EVENTS)  # type: ignore[assignment]
    return bool(events & _POLLIN)


def set_common_options(sock: zmq.Socket[Any], hwm: int) -> None:
    """Bounded queues both ways and no linger on close."""
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, 0)
