"""Addresses on the command line, parsed in one place: a kernel's (``coral up --bind``, ``coral tui
--connect``) and an HTTP listener's (``--gateway``, ``--metrics``).

A kernel address is ``tcp://HOST:PORT`` (the ROUTER at PORT, the PUB at PORT+1), ``ipc://PATH``
(``PATH.router`` and ``PATH.pub``), ``inproc`` (in-process only: no address), or, to connect,
``ROUTER,PUB`` spelled out. An HTTP address is ``HOST:PORT`` or ``PORT`` (host 127.0.0.1). HOST may be
a bracketed IPv6 address. Every error is a ``CoralError`` (a ``BusError`` for ``--connect``) that names
the flag.
"""

from __future__ import annotations

import re
import socket

from coral.errors import CoralError
from coral.kernel.wire import BusError, Endpoints

DEFAULT_BIND = "tcp://127.0.0.1:7450"
"""``coral up``'s kernel address, where ``coral tui`` looks when given none."""

_HOST_PORT = re.compile(r"^\s*(?:([^:\s\[\]/]+|\[[0-9a-fA-F:.]+\]):)?(\d+)\s*$")


def _split(text: str) -> tuple[str | None, int] | None:
    m = _HOST_PORT.match(text)
    return None if m is None else ((m.group(1) or "").strip("[]") or None, int(m.group(2)))


def parse_host_port(text: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``PORT`` (host 127.0.0.1) for ``flag``; port 0 picks a free one."""
    split = _split(text)
    if split is None:
        raise CoralError(f"{flag}: expected HOST:PORT or PORT, got {text!r}")
    host, port = split[0] or "127.0.0.1", split[1]
    if not 0 <= port <= 65535:
        raise CoralError(f"{flag}: port must be in 0..65535, got {port}")
    return host, port


def parse_bind(text: str, flag: str = "--bind") -> Endpoints | None:
    """The kernel's endpoints for ``--bind`` (None: in-process only). Port 0 picks free ports."""
    t = text.strip()
    if t == "inproc":
        return None
    split = _split(t[len("tcp://") :]) if t.startswith("tcp://") else None
    if split is not None and split[0] is not None:
        host, port = split[0], split[1]
        shown = f"[{host}]" if ":" in host else host
        if port == 0:
            return Endpoints(f"tcp://{shown}:0", f"tcp://{shown}:0")
        if not 0 < port < 65535:
            raise CoralError(f"{flag}: port must be in 1..65534 (or 0 for any), got {port}")
        return Endpoints(f"tcp://{shown}:{port}", f"tcp://{shown}:{port + 1}")
    if t.startswith("ipc://") and len(t) > len("ipc://"):
        return Endpoints(f"{t}.router", f"{t}.pub")
    raise CoralError(f"{flag}: expected tcp://HOST:PORT, ipc://PATH or inproc, got {text!r}")


def parse_connect(text: str, flag: str = "--connect") -> Endpoints:
    """The endpoints of a running kernel: what its ``--bind`` took (not inproc, not port 0), or
    ``ROUTER,PUB``; a ``BusError`` naming ``flag`` otherwise."""
    text = text.strip()
    if "," in text:
        router, pub = (p.strip() for p in text.split(",", 1))
        try:
            return Endpoints(router, pub)
        except BusError as exc:
            raise BusError(f"{flag}: {exc}") from None
    expected = f"{flag}: expected tcp://HOST:PORT (port 1..65534), ipc://PATH or ROUTER,PUB, got {text!r}"
    try:
        eps = parse_bind(text, flag)
    except CoralError:
        raise BusError(expected) from None
    if eps is None or eps.router.endswith(":0"):
        raise BusError(expected)
    return eps


def default_endpoints() -> Endpoints:
    """The endpoints of ``coral up``'s default ``--bind``."""
    eps = parse_bind(DEFAULT_BIND)
    assert eps is not None
    return eps


def check_free(endpoints: Endpoints | None, flag: str = "--bind") -> None:
    """Refuse, before a run starts, tcp ports that another process listens on (a second ``coral up``)."""
    if endpoints is None:
        return
    for address in dict.fromkeys((endpoints.router, endpoints.pub)):
        if not address.startswith("tcp://"):
            continue
        split = _split(address[len("tcp://") :])
        if split is None or split[0] is None or split[1] == 0:
            continue
        host, port = split[0], split[1]
        if host == "*":
            host = "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds: TIME_WAIT is no clash
            try:
                probe.bind((host, port))
            except socket.gaierror:
                continue  # an unknown host name: the kernel's own bind reports it
            except OSError as e:
                raise CoralError(
                    f"{flag}: cannot bind {address} ({e.strerror or e}; is another `coral up` running?); "
                    f"give another address, e.g. --bind tcp://{host}:{port + 10}, or --bind inproc"
                ) from None
