"""Serving an ASGI application (the gateway, the metrics) with uvicorn inside the caller's event loop."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import uvicorn

from coral.errors import CoralError
from coral.kernel.address import parse_host_port

parse_address = parse_host_port
"""``HOST:PORT`` or ``PORT`` of ``--gateway`` and ``--metrics`` (``coral.kernel.address``)."""


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the caller owns the process's signals (coral up stops on SIGINT/SIGTERM itself)


def bind(host: str, port: int, what: str) -> socket.socket:
    """A listening TCP socket on ``host:port``; a CoralError naming ``what`` when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # the proto makes asyncio set TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise CoralError(f"{what}: cannot listen on {host}:{port} ({e.strerror or e})") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def serving(
    app: Any, where: tuple[str, int] | socket.socket, *, what: str = "server", tls: tuple[str, str] | None = None
) -> AsyncIterator[str]:
    """Serve ``app`` on ``(host, port)`` or a bound socket (``bind``) while the block runs; yields the base
    URL (``http://host:port``, ``https`` with ``tls``: the certificate and key files). The socket is closed
    at the end."""
    sock = where if isinstance(where, socket.socket) else bind(*where, what)
    host, bound = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        http="httptools",
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=2,
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )
    server = _Server(config)
    shown = f"[{host}]" if ":" in host else host
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started and not server.should_exit:
            await anyio.sleep(0.005)
        try:
            yield f"{'https' if tls else 'http'}://{shown}:{bound}"
        finally:
            server.should_exit = True
    sock.close()
