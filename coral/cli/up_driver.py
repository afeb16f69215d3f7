"""``coral up``'s driver: runs the mesh with the live status, the TUI, the HTTP endpoints, the signals and
the wall-time limit around it, and returns the summary."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.live import Live

from coral.cli.common import stop_on_signals
from coral.cli.resumed import resume_summary
from coral.cli.tui_process import exit_text, run_tui_process
from coral.cli.up_serve import Serve, start_serving
from coral.cli.up_status import render_status, summarize
from coral.errors import CoralError
from coral.gateway import MeshLink
from coral.kernel import Endpoints, Mesh, ServerKeys


async def run_up_async(
    setup: Any,
    scenario: Any,
    catalog: Any,
    perf: Any,
    *,
    journal: Path | None,
    endpoints: Endpoints | None,
    speed: float | None,
    wall_limit: float | None,
    console: Console,
    live: bool,
    on_start: Callable[[Mesh, Any], Awaitable[None]] | None = None,
    tui_store: Path | None = None,
    curve: ServerKeys | None = None,
    resume: Any = None,
    unknown_nodes: str = "release",
    serve: Serve | None = None,
    engine_factory: Callable[[str], Any] | None = None,
    until_idle: bool = False,
    host_table: Any = None,
) -> dict[str, Any]:
    """Run the mesh until the scenario ends, ``wall_limit`` passes or SIGINT/SIGTERM; return the summary.

    With ``tui_store`` the terminal UI runs in a process of its own attached to the mesh over the bus
    (``coral.cli.tui_process``; it reads no store): quitting it stops the mesh, the mesh stopping ends it, and
    a UI that fails stops the mesh and raises CoralError. ``serve`` adds the HTTP gateway and the metrics endpoint.
    ``host_table``: the engines run on the hosts whose ``coral worker`` registered (``actors.hosts``).
    The start-up heap is kept out of the garbage collector's scans for the run (``run_mesh``'s ``freeze_heap``).
    """
    # Start-up cost: the actors load in about 3 s, and every ``coral`` command imports this module.
    from actors.compose import RunState, run_mesh
    from actors.recovery import provider_state_path

    stop = anyio.Event()
    state = RunState()
    t0 = time.monotonic()
    info: dict[str, Any] = {"endpoints": None}
    links: list[MeshLink] = []

    async def started(mesh: Mesh, cm: Any) -> None:
        info["endpoints"] = mesh.endpoints
        if not live:
            console.print(f"coral up: {setup.scenario_name}, kernel at {mesh.endpoints.router} / {mesh.endpoints.pub}")
        if on_start is not None:
            await on_start(mesh, cm)
        if serve is not None:
            await start_serving(serve, mesh, scenario, setup.seed, tg, links, console)
        if tui_store is not None:
            tg.start_soon(tui, mesh)

    def stepped(now: float) -> None:
        for link in links:
            link.step(now)
        while len(state.refused) > info.setdefault("refused_shown", 0):
            r = state.refused[info["refused_shown"]]
            info["refused_shown"] += 1
            if not live:
                console.print(f"coral up: refused {r.count} connection(s) from {r.address}: {r.reason}", markup=False)

    async def tui(mesh: Mesh) -> None:
        rc = await run_tui_process(mesh.endpoints, mesh.local_keys)
        if rc != 0:
            info["tui_failed"] = rc
        stop.set()

    async with anyio.create_task_group() as tg:

        async def limit() -> None:
            assert wall_limit is not None
            await anyio.sleep(wall_limit)
            stop.set()

        async def show() -> None:
            with Live(console=console, refresh_per_second=4, transient=False) as view:
                while True:
                    view.update(
                        render_status(setup, state, time.monotonic() - t0, speed, info["endpoints"], console.width)
                    )
                    await anyio.sleep(0.25)

        async def idle() -> None:
            while True:
                await anyio.sleep(0.5)
                st = state.stats
                if (
                    st is not None
                    and st.at >= setup.duration_s
                    and all(d.in_flight + d.queued == 0 for d in st.deployments)
                ):
                    stop.set()
                    return

        tg.start_soon(stop_on_signals, stop)
        if wall_limit is not None:
            tg.start_soon(limit)
        if until_idle:
            tg.start_soon(idle)
        if live:
            tg.start_soon(show)
        result = await run_mesh(
            setup,
            scenario,
            catalog,
            perf,
            journal=journal,
            endpoints=endpoints,
            pace=speed,
            stop=stop,
            gateway=True,
            state=state,
            on_start=started,
            curve=curve,
            provider_state=provider_state_path(journal) if journal is not None else None,
            resume=resume,
            unknown_nodes=unknown_nodes,
            on_step=stepped,
            engine_factory=engine_factory,
            host_table=host_table,
            freeze_heap=True,
        )
        tg.cancel_scope.cancel()
    if "tui_failed" in info:
        raise CoralError(f"--tui: the terminal UI {exit_text(info['tui_failed'])}; the mesh was stopped")
    out = summarize(setup, result.state, result.end, result.reason, result.wall_s, journal)
    if result.resumed is not None:
        out["resumed"] = resume_summary(result.resumed, resume)
    return out
