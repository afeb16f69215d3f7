"""``coral up``: run the whole mesh (kernel and actors) on a scenario, with a live status.

With no arguments it runs the bundled ``default`` scenario on the simulated cloud and simulated stage
workers, 60 times faster than real time (a one-hour scenario in about a minute, when the machine keeps
up; the status shows any lag). It builds missing templates first. The run is bulk-synchronous on a
virtual clock paced against the wall clock, so ``--record`` gives a journal that ``coral replay``
reproduces exactly. It ends at the end of the scenario (plus a drain for requests in flight), after
``--for`` of wall time, or on Ctrl-C / SIGTERM.

The verb is split by concern: ``up_setup`` (durations, hosts, the mesh set-up), ``up_serve`` (the HTTP
gateway and metrics), ``up_driver`` (the run itself) and ``up_status`` (live status and summary);
``coral.kernel.address`` parses ``--bind``.

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
import functools
import json
import sys
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from coral.cli import apikeys_cmd
from coral.cli.common import add_policy, catalog_from, check_output, open_store, perf_from, store_path
from coral.cli.tui_process import check_endpoints
from coral.cli.up_driver import run_up_async
from coral.cli.up_serve import Serve, serve_from_args, start_serving
from coral.cli.up_setup import DEFAULT_SPEED, mesh_setup, parse_duration, parse_speed, vllm_fleet
from coral.cli.up_status import print_summary, summarize
from coral.cli.up_workers import LocalWorkers, local_hosts
from coral.errors import CoralError
from coral.gateway import parse_address
from coral.gateway.server import bind
from coral.kernel.address import DEFAULT_BIND, check_free, parse_bind
from coral.kernel.keys import keys_dir
from coral.scenario import load_scenario

__all__ = ["DEFAULT_BIND", "DEFAULT_SPEED", "Serve", "add", "run_up", "run_up_async", "start_serving", "summarize"]


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
    add_policy(p)
    p.add_argument(
        "--backend",
        default="sim",
        choices=("sim", "vllm"),
        help="stage-worker engine: the simulator's timing model, or real vLLM servers (real time; only templates "
        "vLLM can run as they are), run by the --hosts machines' `coral worker`s or, without --hosts, by local "
        "workers that coral up starts itself",
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


def run_up(args: argparse.Namespace) -> int:
    """``coral up``: check every argument, build the set-up, run the mesh and print the summary."""
    from actors.compose import library_for

    if args.tui and args.json:
        raise CoralError("--tui and --json do not go together: the UI owns the terminal")
    speed = parse_speed(args.speed)
    wall_limit = parse_duration(args.for_) if args.for_ is not None else None
    endpoints = parse_bind(args.bind)
    if args.tui:
        check_endpoints(endpoints)
    from coral.cli.keys_cmd import default_keys_dir, kernel_keys

    curve = kernel_keys(endpoints, args.keys)
    if args.seed < 0:
        raise CoralError(f"--seed: must be >= 0, got {args.seed}")
    if args.resume is None and args.record is not None:
        if args.record.is_file() and args.record.stat().st_size > 0:
            raise CoralError(f"--record: {args.record} exists; give a new file (a journal holds one run)")
        check_output(args.record, "--record")
    vllm = args.backend == "vllm"
    if vllm:
        if args.speed != str(DEFAULT_SPEED) and speed != 1.0:
            raise CoralError(f"--speed: the vllm backend runs in real time (1), got {args.speed!r}")
        speed = 1.0
        if args.hosts is None and args.resume is None and (endpoints is None or endpoints.router[:6] != "tcp://"):
            raise CoralError(
                f"--bind: the vllm backend's local workers connect to the kernel over tcp, got {args.bind!r}; "
                "bind tcp://127.0.0.1:PORT (the default)"
            )
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
    check_free(endpoints)
    for addr, flag in ((gw_addr, "--gateway"), (metrics_addr, "--metrics")):
        if addr is not None and addr[1] != 0:
            bind(*addr, flag).close()  # a taken port fails now, not after the templates are built
    access = apikeys_cmd.up_access(args, gw_addr, metrics_addr, args.keys or default_keys_dir())
    if args.resume is not None:
        from coral.cli.resume import run_resumed  # start-up cost: it loads the actors (about 3 s)

        return run_resumed(
            args,
            endpoints,
            speed,
            wall_limit,
            curve,
            lambda: serve_from_args(args, gw_addr, metrics_addr, access),
            (lambda sc, cat: vllm_fleet(args, sc, cat, local=False)) if vllm else None,
            access,
        )
    cat = catalog_from(args)
    perf = perf_from(args, cat)
    sc = load_scenario(args.scenario, cat)
    path = store_path(args)
    with open_store(args, readonly=args.no_build, scenario=args.scenario) as store:
        if not args.no_build:
            from coral.cli.plan_cmd import ensure_templates

            ensure_templates(sc, cat, perf, store, args, quiet=args.json)
        library = library_for(store, sc, perf.version, vllm_only=vllm or args.vllm_only)
    local = vllm and args.hosts is None
    hosts = local_hosts(sc, cat) if local else None
    setup = mesh_setup(args, sc, cat, perf, library, warmup=warmup, drain=drain, queue=queue, hosts=hosts)
    fleet = vllm_fleet(args, sc, cat, local=local) if vllm else None
    workers = None
    on_start = None
    if fleet is not None:
        access.use_engines(fleet.backend.engine_secret)
    if local and fleet is not None and hosts is not None:
        workers = LocalWorkers(
            hosts, setup.catalog_files, Path(fleet.backend.work_dir), keys_dir(args.keys), fleet.backend.engine_secret,
            {h.node: cat.nodes[h.node].gpu_count for h in hosts},
        )  # fmt: skip
        workers.check_keys()

        async def on_start(mesh: Any, _cm: Any) -> None:
            assert workers is not None and mesh.endpoints is not None
            workers.start(mesh.endpoints)

    console = Console(stderr=args.json, quiet=args.tui)
    serve = serve_from_args(args, gw_addr, metrics_addr, access)
    try:
        summary = anyio.run(
            functools.partial(
                run_up_async,
                setup,
                sc,
                cat,
                perf,
                journal=args.record,
                endpoints=endpoints,
                speed=speed,
                wall_limit=wall_limit,
                console=console,
                live=not (args.no_status or args.json or args.tui),
                tui_store=path if args.tui else None,
                curve=curve,
                serve=serve,
                engine_factory=fleet,
                until_idle=args.until_idle,
                host_table=getattr(fleet, "table", None),
                on_start=on_start,
            ),
            backend="asyncio",
        )
    finally:
        if fleet is not None:
            fleet.close()
        if workers is not None:
            workers.stop()
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
        print_summary(summary, console)
    return 0
