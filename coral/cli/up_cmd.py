"""``coral up``: run the whole mesh (kernel and actors) on a scenario, with a live status.

With no arguments it runs the bundled ``default`` scenario on the simulated cloud and simulated stage
workers, 60 times faster than real time (a one-hour scenario in about a minute, when the machine keeps
up; the status shows any lag). It builds missing templates first. The run is bulk-synchronous on a
virtual clock paced against the wall clock, so ``--record`` gives a journal that ``coral replay``
reproduces exactly. It ends at the end of the scenario (plus a drain for requests in flight), after
``--for`` of wall time, or on Ctrl-C / SIGTERM.

Other programs attach through ``--bind`` (the kernel's ROUTER at the given port, its PUB at the next):
send control commands (``coral.messages.control``) to the ``operator`` gateway, which applies them at the
next quiet point of the run and replies with the ``CommandResult``. The terminal UI attaches the same way
(``run_up(..., on_start=...)`` is where ``coral up --tui`` will start it).

``--gateway HOST:PORT`` serves the OpenAI-compatible HTTP gateway (``coral.gateway``) in the same process:
clients ask for a deployment by name as ``model``. ``--metrics HOST:PORT`` serves the mesh's Prometheus
metrics (``coral.metrics``). Both are off unless given; API keys, the safe-by-default checks and TLS
(``--metrics-public``, ``--tls-cert``, ``--tls-key``) are ``coral.cli.apikeys_cmd``'s.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import socket
import sys
import time
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import attrs
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from coral.cli import apikeys_cmd
from coral.cli.common import catalog_files, catalog_from, perf_from
from coral.errors import CoralError
from coral.gateway import Gateway, MeshLink, parse_address, serving
from coral.gateway.server import bind
from coral.kernel import Endpoints, Mesh, ServerKeys
from coral.messages.mesh import CloudSetup, Host, MeshTiming
from coral.scenario import Scenario, load_scenario
from coral.store import TemplateStore, default_store_path

DEFAULT_SPEED = 60.0
DEFAULT_BIND = "tcp://127.0.0.1:7450"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h)?\s*$")
_UNIT = {None: 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0}


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser("up", parents=[parent], help="run the mesh (kernel and actors) on a scenario, with live status")
    p.add_argument("--scenario", default="default", help="scenario NAME (bundled) or FILE (default: default)")
    p.add_argument(
        "--speed",
        default=str(DEFAULT_SPEED),
        help=f"scenario seconds per wall second, or 'max' for as fast as possible (default: {DEFAULT_SPEED:g})",
    )
    p.add_argument(
        "--for", dest="for_", default=None, metavar="DURATION", help="stop after this wall time (90s, 5m, 1h)"
    )
    p.add_argument("--record", type=Path, default=None, metavar="JOURNAL", help="record every message to a new journal")
    p.add_argument(
        "--bind",
        default=DEFAULT_BIND,
        help=f"kernel address: tcp://HOST:PORT, ipc://PATH or inproc (default: {DEFAULT_BIND})",
    )
    p.add_argument(
        "--keys",
        type=Path,
        default=None,
        metavar="DIR",
        help="CurveZMQ key directory (`coral keys init`): encrypt and authenticate the tcp bus "
        "(default: $CORAL_KEYS; required to bind a non-loopback address)",
    )
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="JOURNAL",
        help="restart a crashed run from its --record journal (and JOURNAL.cloud.json), appending to it",
    )
    p.add_argument(
        "--unknown-nodes",
        default="release",
        choices=("adopt", "release"),
        help="with --resume: nodes the provider runs that the journal does not know (default: release)",
    )
    p.add_argument("--store", type=Path, default=None, help="template store (default: the user data dir)")
    p.add_argument(
        "--hosts",
        type=Path,
        default=None,
        metavar="FILE",
        help="run on these machines instead of the simulated cloud: TOML with [[host]] name, region, node",
    )
    p.add_argument("--policy", default="coral", choices=("coral", "homo", "pd-homo"))
    p.add_argument(
        "--backend",
        default="sim",
        choices=("sim", "vllm"),
        help="stage-worker engine: the simulator's timing model, or real vLLM servers on this machine "
        "(real time; only templates vLLM can run as they are)",
    )
    p.add_argument(
        "--vllm-only", action="store_true", help="plan only with templates vLLM can run as they are (implied by vllm)"
    )
    p.add_argument(
        "--weights",
        action="append",
        default=[],
        metavar="MODEL=DIR",
        help="weights of a catalog model for --backend vllm (default: the catalog's Hugging Face id; the tiny "
        "model is built locally)",
    )
    p.add_argument("--vllm-device", default="auto", choices=("auto", "cpu", "gpu"), help="(default: the vLLM build's)")
    p.add_argument(
        "--vllm-dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="weights and activations of the vLLM servers (default: vLLM's choice; float32 on a CPU reproduces "
        "transformers' greedy tokens exactly)",
    )
    p.add_argument(
        "--vllm-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="vLLM server logs, caches, KV-transfer files and built models (default: ./.coral-vllm)",
    )
    p.add_argument(
        "--warmup",
        default=None,
        metavar="DURATION",
        help="time before the scenario starts in which the first fleet loads (default: 10s)",
    )
    p.add_argument(
        "--drain",
        default=None,
        metavar="DURATION",
        help="time after the scenario ends for requests in flight (default: 60s)",
    )
    p.add_argument(
        "--queue-timeout",
        default=None,
        metavar="DURATION",
        help="how long a request waits for a serving instance (default: 60s; 180s with --backend vllm, whose "
        "servers take a minute or more to start)",
    )
    p.add_argument(
        "--until-idle",
        action="store_true",
        help="end as soon as the scenario's traffic is over and no request is open, instead of after --drain",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the arrivals and faults (default: 0)")
    p.add_argument(
        "--no-deadline",
        action="store_true",
        help="solve every plan to completion instead of under the scenario's deadline (reproducible anywhere)",
    )
    p.add_argument(
        "--columns",
        default="all",
        choices=("all", "generated"),
        help="allocation MIP over all template columns (exact) or generated ones (faster, LP bound only)",
    )
    p.add_argument("--no-build", action="store_true", help="fail instead of building missing templates")
    p.add_argument("--no-status", action="store_true", help="no live status, only the summary at the end")
    p.add_argument("--tui", action="store_true", help="watch and steer the mesh in the terminal UI (quit it to stop)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--gateway",
        default=None,
        metavar="HOST:PORT",
        help="serve the OpenAI-compatible gateway here (model = deployment name; default: off)",
    )
    p.add_argument(
        "--gateway-active",
        type=int,
        default=256,
        metavar="N",
        help="requests the gateway serves at once (default: 256)",
    )
    p.add_argument(
        "--gateway-queue",
        type=int,
        default=1024,
        metavar="N",
        help="requests that may wait for a slot; more are shed with 429 (default: 1024)",
    )
    p.add_argument("--metrics", default=None, metavar="HOST:PORT", help="serve Prometheus metrics here (default: off)")
    apikeys_cmd.add_up_options(p)
    p.set_defaults(func=run_up)


def parse_duration(text: str, what: str = "--for") -> float:
    """Seconds in ``90``, ``90s``, ``5m``, ``1.5h``, ``500ms``."""
    m = _DURATION.match(text)
    if m is None:
        raise CoralError(f"{what}: expected a duration like 90s, 5m or 1h, got {text!r}")
    v = float(m.group(1)) * _UNIT[m.group(2)]
    if not v > 0:
        raise CoralError(f"{what}: must be positive, got {text!r}")
    return v


def parse_speed(text: str) -> float | None:
    """Scenario seconds per wall second; None for 'max'."""
    if text.strip().lower() == "max":
        return None
    try:
        v = float(text)
    except ValueError:
        raise CoralError(f"--speed: expected a number or 'max', got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise CoralError(f"--speed: must be a positive number, got {text!r}")
    return v


def parse_bind(text: str) -> Endpoints | None:
    """The kernel's endpoints for ``--bind`` (None: in-process only)."""
    t = text.strip()
    if t == "inproc":
        return None
    m = re.match(r"^tcp://([^:/]+):(\d+)$", t)
    if m:
        host, port = m.group(1), int(m.group(2))
        if port == 0:
            return Endpoints(f"tcp://{host}:0", f"tcp://{host}:0")
        if not 0 < port < 65535:
            raise CoralError(f"--bind: port must be in 1..65534 (or 0 for any), got {port}")
        return Endpoints(f"tcp://{host}:{port}", f"tcp://{host}:{port + 1}")
    if t.startswith("ipc://") and len(t) > len("ipc://"):
        return Endpoints(f"{t}.router", f"{t}.pub")
    raise CoralError(f"--bind: expected tcp://HOST:PORT, ipc://PATH or inproc, got {text!r}")


def load_hosts(path: Path, scenario: Scenario) -> tuple[Host, ...]:
    """The machines of a ``--hosts`` file: ``[[host]]`` tables with ``name``, ``region`` and ``node``."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CoralError(f"--hosts: {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise CoralError(f"--hosts: {path}: TOML syntax error: {e}") from None
    rows = data.get("host")
    if not isinstance(rows, list) or not rows:
        raise CoralError(f"--hosts: {path}: needs at least one [[host]] table")
    hosts = []
    for i, row in enumerate(rows):
        where = f"--hosts: {path}: [[host]] #{i + 1}"
        extra = sorted(set(row) - {"name", "region", "node"})
        if extra:
            raise CoralError(f"{where}: unknown key {extra[0]!r} (allowed: name, region, node)")
        for key in ("name", "region", "node"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise CoralError(f"{where}: key {key!r} must be a non-empty string")
        if row["region"] not in scenario.regions:
            raise CoralError(
                f"{where}: region {row['region']!r} is not among the scenario's ({', '.join(scenario.regions)})"
            )
        if row["node"] not in scenario.node_types:
            raise CoralError(f"{where}: node type {row['node']!r} is not among the scenario's node types")
        hosts.append(Host(row["name"], row["region"], row["node"]))
    try:
        CloudSetup(kind="hosts", hosts=tuple(hosts)).check()
    except CoralError as e:
        raise CoralError(f"--hosts: {path}: {e}") from None
    return tuple(hosts)


def run_up(args: argparse.Namespace) -> int:
    from actors.compose import RunOptions, library_for, make_setup

    if args.tui and args.json:
        raise CoralError("--tui and --json do not go together: the UI owns the terminal")
    speed = parse_speed(args.speed)
    wall_limit = parse_duration(args.for_) if args.for_ is not None else None
    endpoints = parse_bind(args.bind)
    from coral.cli.keys_cmd import default_keys_dir, kernel_keys

    curve = kernel_keys(endpoints, args.keys)
    if args.seed < 0:
        raise CoralError(f"--seed: must be >= 0, got {args.seed}")
    if args.resume is None and args.record is not None and args.record.exists() and args.record.stat().st_size > 0:
        raise CoralError(f"--record: {args.record} exists; give a new file (a journal holds one run)")
    vllm = args.backend == "vllm"
    if vllm:
        if args.speed != str(DEFAULT_SPEED) and speed != 1.0:
            raise CoralError(f"--speed: the vllm backend runs in real time (1), got {args.speed!r}")
        speed = 1.0
    warmup = parse_duration(args.warmup, "--warmup") if args.warmup is not None else None
    drain = parse_duration(args.drain, "--drain") if args.drain is not None else None
    queue = parse_duration(args.queue_timeout, "--queue-timeout") if args.queue_timeout is not None else None
    if queue is None and vllm:
        queue = 180.0
    gw_addr = parse_address(args.gateway, "--gateway") if args.gateway is not None else None
    metrics_addr = parse_address(args.metrics, "--metrics") if args.metrics is not None else None
    if args.gateway_active < 1:
        raise CoralError(f"--gateway-active: must be at least 1, got {args.gateway_active}")
    if args.gateway_queue < 0:
        raise CoralError(f"--gateway-queue: must not be negative, got {args.gateway_queue}")
    access = apikeys_cmd.up_access(args, gw_addr, metrics_addr, args.keys or default_keys_dir())
    if args.resume is not None:
        if vllm:
            raise CoralError("--resume: a crashed run on the vllm backend cannot be resumed (its servers died with it)")
        from coral.cli.resume import run_resumed

        return run_resumed(
            args, endpoints, speed, wall_limit, curve, lambda: _serve(args, gw_addr, metrics_addr, access)
        )
    cat = catalog_from(args)
    perf = perf_from(args, cat)
    sc = load_scenario(args.scenario, cat)
    path = args.store or default_store_path()
    with TemplateStore(path, readonly=args.no_build) as store:
        if not args.no_build:
            from coral.cli.plan_cmd import ensure_templates

            ensure_templates(sc, cat, perf, store, args, quiet=args.json)
        library = library_for(store, sc, perf.version, vllm_only=vllm or args.vllm_only)
    cloud = CloudSetup() if args.hosts is None else CloudSetup(kind="hosts", hosts=load_hosts(args.hosts, sc))
    if vllm and args.hosts is None:
        cloud = attrs.evolve(cloud, provision_s=0.0)  # the nodes are this machine: nothing to provision
    timing = MeshTiming()
    if warmup is not None:
        timing = attrs.evolve(timing, warmup_s=float(math.ceil(warmup)))
    if drain is not None:
        timing = attrs.evolve(timing, drain_s=drain)
    if queue is not None:
        timing = attrs.evolve(timing, queue_timeout_s=queue)
    options = RunOptions(
        seed=args.seed,
        policy=args.policy,
        deterministic=args.no_deadline,
        columns=args.columns,
        cloud=cloud,
        timing=timing,
    )
    setup = make_setup(sc, cat, perf, library, options, catalog_files=catalog_files(args), profile_files=args.profiles)
    fleet = _vllm_fleet(args, sc, cat) if vllm else None
    if fleet is not None:
        access.use_engines(fleet.backend.engine_secret)
    console = Console(stderr=args.json, quiet=args.tui)
    serve = _serve(args, gw_addr, metrics_addr, access)
    try:
        summary = anyio.run(
            _run,
            setup,
            sc,
            cat,
            perf,
            args.record,
            endpoints,
            speed,
            wall_limit,
            console,
            not (args.no_status or args.json or args.tui),
            path if args.tui else None,
            curve,
            serve,
            None,
            "release",
            fleet,
            args.until_idle,
            backend="asyncio",
        )
    finally:
        if fleet is not None:
            fleet.close()
    if fleet is not None:
        summary["backend"] = {
            "name": "vllm",
            "device": fleet.backend.device,
            "servers_started": fleet.servers_started(),
            "faults": fleet.faults(),
        }
    console.quiet = False
    if args.json:
        json.dump(summary, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        _print_summary(summary, console)
    return 0


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
) -> dict[str, Any]:
    """Run the mesh until the scenario ends, ``wall_limit`` passes or SIGINT/SIGTERM; return the summary.

    With ``tui_store`` the terminal UI attaches to the mesh in this process (reading templates from that
    store), and quitting it stops the mesh. ``serve`` adds the HTTP gateway and the metrics endpoint.
    """
    from actors.compose import RunState, run_mesh
    from actors.recovery import provider_state_path
    from coral.cli.resume import resume_summary

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

    async def tui(mesh: Mesh) -> None:
        from tui.app import run_tui_async

        await run_tui_async(mesh.endpoints, store=tui_store, curve=mesh.local_keys)
        stop.set()

    async with anyio.create_task_group() as tg:

        async def signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as sigs:
                async for _ in sigs:
                    stop.set()
                    return

        async def limit() -> None:
            assert wall_limit is not None
            await anyio.sleep(wall_limit)
            stop.set()

        async def show() -> None:
            with Live(console=console, refresh_per_second=4, transient=False) as view:
                while True:
                    view.update(render_status(setup, state, time.monotonic() - t0, speed, info["endpoints"]))
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

        tg.start_soon(signals)
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
        )
        tg.cancel_scope.cancel()
    out = summarize(setup, result.state, result.end, result.reason, result.wall_s, journal)
    if result.resumed is not None:
        out["resumed"] = resume_summary(result.resumed, resume)
    return out


def _serve(
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


async def _run(
    setup: Any,
    sc: Any,
    cat: Any,
    perf: Any,
    journal: Path | None,
    endpoints: Endpoints | None,
    speed: float | None,
    wall_limit: float | None,
    console: Console,
    live: bool,
    tui_store: Path | None,
    curve: ServerKeys | None = None,
    serve: Serve | None = None,
    resume: Any = None,
    unknown_nodes: str = "release",
    engine_factory: Callable[[str], Any] | None = None,
    until_idle: bool = False,
) -> dict[str, Any]:
    return await run_up_async(
        setup,
        sc,
        cat,
        perf,
        journal=journal,
        endpoints=endpoints,
        speed=speed,
        wall_limit=wall_limit,
        console=console,
        live=live,
        tui_store=tui_store,
        curve=curve,
        resume=resume,
        unknown_nodes=unknown_nodes,
        serve=serve,
        engine_factory=engine_factory,
        until_idle=until_idle,
    )


def _vllm_fleet(args: argparse.Namespace, sc: Scenario, cat: Any) -> Any:
    """The engine factory of ``--backend vllm``: real vLLM servers on this machine."""
    from coral.engines.vllm import VllmBackend
    from coral.vllm.fleet import VllmFleet, detect_device, parse_weights, resolve_weights

    device = detect_device(args.vllm_device)
    work = (args.vllm_dir or Path.cwd() / ".coral-vllm").resolve()
    weights = resolve_weights([d.model for d in sc.deployments], cat, parse_weights(args.weights, cat), work)
    max_len = min((cat.models[d.model].max_context or 4096) for d in sc.deployments)
    backend = VllmBackend(
        models=weights,
        device=device,
        dtype=args.vllm_dtype,
        enforce_eager=device == "cpu",  # compiled CPU start-up takes minutes; eager output is the same
        max_model_len=min(max_len, 4096) if device == "cpu" else None,
        work_dir=str(work),
        seed=args.seed,
    )
    return VllmFleet(backend)


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


def summarize(setup: Any, st: Any, end: float, reason: str, wall_s: float, journal: Path | None) -> dict[str, Any]:
    """The end-of-run summary (what ``--json`` prints)."""
    deps = {}
    if st.stats is not None:
        for d in st.stats.deployments:
            deps[d.deployment] = {
                "arrivals": d.arrivals,
                "completed": d.completed,
                "failed": d.failed,
                "failed_by": d.failed_by,
                "retries": d.retries,
                "open": d.in_flight + d.queued,
                "slo_attainment": d.attainment,
                "ttft_p50_s": d.ttft_p50,
                "tpot_p50_s": d.tpot_p50,
            }
    fleet = st.fleet
    return {
        "scenario": setup.scenario_name,
        "end_s": end,
        "reason": reason,
        "wall_s": round(wall_s, 3),
        "plans": st.plans,
        "cost_per_hour": fleet.cost_per_hour if fleet is not None else 0.0,
        "spent_usd": fleet.spent_usd if fleet is not None else 0.0,
        "instances": len(fleet.instances) if fleet is not None else 0,
        "actor_crashes": st.crashes,
        "bus_errors": st.errors,
        "deployments": deps,
        "journal": str(journal) if journal is not None else None,
    }


def _print_summary(s: dict[str, Any], con: Console) -> None:
    con.print(
        f"coral up: {s['scenario']} stopped at t={s['end_s']:.0f} s ({s['reason']}) after {s['wall_s']:.1f} s; "
        f"{s['plans']} plans, ${s['spent_usd']:.2f} spent" + (f"; journal {s['journal']}" if s["journal"] else "")
    )
    if "resumed" in s:
        from coral.cli.resume import describe

        con.print(describe(s["resumed"]))


def render_status(setup: Any, st: Any, wall: float, speed: float | None, endpoints: Endpoints | None) -> Group:
    """The live status: clock, cost, plan, demand vs capacity with SLO attainment, instances per region."""
    end = setup.duration_s
    lag = ""
    if speed is not None and wall > 0:
        behind = wall * speed - (st.now + setup.timing.warmup_s)
        if behind > 5 * setup.timing.tick_s:
            lag = f"  [yellow]{behind:,.0f} s behind[/]"
    fleet = st.fleet
    rate, spent = (fleet.cost_per_hour, fleet.spent_usd) if fleet is not None else (0.0, 0.0)
    head = (
        f"[bold]{setup.scenario_name}[/]  t={st.now:,.0f}/{end:,.0f} s  "
        f"speed {'max' if speed is None else f'{speed:g}x'}  wall {wall:,.0f} s{lag}  "
        f"cost [bold]${rate:,.2f}/h[/] (spent ${spent:,.2f})"
    )
    lines: list[Any] = [Text.from_markup(head)]
    if endpoints is not None:
        lines.append(
            Text(f"kernel {endpoints.router}  events {endpoints.pub}  control: send to 'operator'", style="dim")
        )
    if st.plan is not None:
        p = st.plan.plan
        diff = " ".join(
            f"{'+' if c.delta > 0 else ''}{c.delta} {c.deployment}/{c.template_id[:6]}@{c.region}" for c in st.plan.diff
        )
        lines.append(
            Text(
                f"plan #{p.seq} at t={p.at:,.0f} ({p.trigger}): ${p.cost_per_hour:,.2f}/h, {p.status}, "
                f"solve {p.solve_s * 1e3:,.0f} ms; diff {diff or 'none'}"
            )
        )
    t = Table(title="deployments", title_justify="left")
    for c in (
        "deployment",
        "demand req/s",
        "capacity req/s",
        "serving",
        "done",
        "failed",
        "open",
        "SLO met",
        "TTFT p50",
        "TPOT p50",
    ):
        t.add_column(c, justify="left" if c == "deployment" else "right")
    cap: dict[str, float] = {}
    serving: dict[str, int] = {}
    if fleet is not None:
        for i in fleet.instances:
            if i.state in ("serving", "retiring") and i.mode != "decode":
                cap[i.deployment] = cap.get(i.deployment, 0.0) + i.weight
                serving[i.deployment] = serving.get(i.deployment, 0) + 1
    traffic = {d.deployment: d for d in st.stats.deployments} if st.stats is not None else {}
    demand = st.demand.demand if st.demand is not None else {}
    for name in [d for d in traffic] or list(demand):
        d = traffic.get(name)
        row = [name, f"{demand.get(name, 0.0):,.2f}", f"{cap.get(name, 0.0):,.2f}", str(serving.get(name, 0))]
        if d is not None:
            att = d.attainment
            color = "green" if att >= 0.9 else "yellow" if att >= 0.5 else "red"
            row += [
                f"{d.completed:,}", f"{d.failed:,}", f"{d.in_flight + d.queued:,}", f"[{color}]{att:.0%}[/]",
                f"{d.ttft_p50:.2f} s", f"{d.tpot_p50 * 1e3:.0f} ms",
            ]  # fmt: skip
        else:
            row += ["-"] * 6
        t.add_row(*row)
    lines.append(t)
    if fleet is not None:
        r = Table(title="instances per region", title_justify="left")
        for c in ("region", "provisioning", "loading", "serving", "retiring", "draining", "nodes"):
            r.add_column(c, justify="left" if c == "region" else "right")
        per: dict[str, dict[str, int]] = {}
        for i in fleet.instances:
            row_d = per.setdefault(i.region, {})
            row_d[i.state] = row_d.get(i.state, 0) + 1
            row_d["nodes"] = row_d.get("nodes", 0) + len(i.node_ids)
        for region in sorted(per):
            v = per[region]
            r.add_row(
                region,
                *(str(v.get(k, 0)) for k in ("provisioning", "loading", "serving", "retiring", "draining", "nodes")),
            )
        lines.append(r)
    return Group(*lines)
