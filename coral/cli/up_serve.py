"""What ``coral up`` serves over HTTP next to the kernel, for operators and their tools: the
OpenAI-compatible gateway (``--gateway``) and the Prometheus metrics (``--metrics``)."""

from __future__ import annotations

import argparse
import socket
from typing import Any

import anyio
import anyio.abc
import attrs
from rich.console import Console

from coral.cli import apikeys_cmd
from coral.gateway import Gateway, MeshLink, serving
from coral.gateway.server import bind
from coral.kernel import Mesh
from coral.scenario import Scenario


@attrs.frozen
class Serve:
    """What ``coral up`` serves over HTTP besides the kernel: the gateway and the metrics (bound sockets)."""

    gateway: socket.socket | None = None
    metrics: socket.socket | None = None
    max_active: int = 256
    max_queue: int = 1024
    access: apikeys_cmd.Access | None = None


async def start_serving(
    serve: Serve,
    mesh: Mesh,
    scenario: Scenario,
    seed: int,
    tg: anyio.abc.TaskGroup,
    links: list[MeshLink],
    console: Console,
) -> None:
    """Attach the gateway and the metrics to ``mesh`` and serve them in ``tg`` (until it is cancelled)."""
    from coral.metrics import TOPICS, GatewayCollector, MeshMetrics

    gw: Gateway | None = None
    if serve.gateway is not None:
        gw = Gateway(
            {d.name: max(1, round(d.shape.mean_out)) for d in scenario.deployments},
            seed=seed,
            max_active=serve.max_active,
            max_queue=serve.max_queue,
            auth=serve.access.auth if serve.access is not None else None,
        )
        link = await MeshLink.open(gw, mesh)
        links.append(link)
        tg.start_soon(link.run)
        tg.start_soon(_serve_forever, gw, serve.gateway, "gateway", console, serve.access)
    if serve.metrics is not None:
        metrics = MeshMetrics({d.name: d.model for d in scenario.deployments})
        if gw is not None:
            metrics.registry.register(GatewayCollector(gw))
        app = serve.access.metrics_app(metrics.registry, metrics.asgi()) if serve.access else metrics.asgi()
        bus = await mesh.client("metrics", subscribe=TOPICS, inbox_size=1 << 16)

        async def feed() -> None:
            async for env in bus:
                metrics.update(env)

        tg.start_soon(feed)
        tg.start_soon(_serve_forever, app, serve.metrics, "metrics", console, serve.access)


async def _serve_forever(
    app: Any, sock: socket.socket, what: str, console: Console, access: apikeys_cmd.Access | None = None
) -> None:
    try:
        async with serving(app, sock, what=f"--{what}", tls=access.tls if access is not None else None) as url:
            console.print(f"coral up: {what} at {url}")
            await anyio.sleep_forever()
    finally:
        if isinstance(app, Gateway):
            with anyio.CancelScope(shield=True):
                await app.aclose()


def serve_from_args(
    args: argparse.Namespace,
    gw_addr: tuple[str, int] | None,
    metrics_addr: tuple[str, int] | None,
    access: apikeys_cmd.Access | None = None,
) -> Serve:
    """Bind the gateway's and the metrics' sockets (before the mesh starts: a taken port fails early)."""
    return Serve(
        bind(*gw_addr, "--gateway") if gw_addr is not None else None,
        bind(*metrics_addr, "--metrics") if metrics_addr is not None else None,
        args.gateway_active,
        args.gateway_queue,
        access,
    )
