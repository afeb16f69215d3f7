"""``coral worker``: run the stage worker of this GPU host (``actors.hostworker``) against a kernel.

Checks everything before it connects, each refusal one line naming the option: the node type must be in
the catalog and ``--gpus`` must be its GPU count; ``--kernel`` must be a tcp address; an engine address
or a kernel that other machines can reach needs keys (``--keys DIR`` or ``$CORAL_KEYS``, holding
``server.key``, ``clients/NAME.key_secret`` and ``engine.secret``), so nothing listens beyond loopback
without them.

The local workers that ``coral up --backend vllm`` starts on its own machine (``coral.cli.up_workers``) get
two more inputs in their environment: without keys, the run's engine secret (``CORAL_ENGINE_SECRET``, hex),
so that their servers still require API keys; and ``CORAL_WORKER_PARENT``, the pid of that ``coral up``:
when it is gone the worker stops its servers and exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

import anyio

from coral.cli.apikeys_cmd import is_loopback
from coral.cli.common import catalog_from, stop_on_signals
from coral.cli.keys_cmd import is_loopback as tcp_is_loopback
from coral.cli.up_setup import parse_duration
from coral.cli.up_workers import PARENT_ENV, SECRET_ENV
from coral.errors import CoralError
from coral.kernel.address import parse_connect
from coral.kernel.keys import client_keys, engine_secret, keys_dir
from coral.vllm.fleet import parse_weights


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser("worker", parents=[parent], help="run this GPU host's stage worker (vLLM servers) for a kernel")
    p.add_argument("--kernel", required=True, metavar="tcp://HOST:PORT", help="the kernel's address (coral up --bind)")
    p.add_argument("--name", required=True, help="this host's name (as in coral up's --hosts file)")
    p.add_argument("--region", required=True, help="the catalog region the host is in")
    p.add_argument("--node", required=True, help="the catalog node type of this host")
    p.add_argument("--gpus", type=int, required=True, help="GPUs of this host (must be the node type's count)")
    p.add_argument(
        "--engine-host",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address the vLLM servers listen on, which the kernel's host reaches (default: 127.0.0.1)",
    )
    p.add_argument(
        "--keys",
        type=Path,
        default=None,
        metavar="DIR",
        help="key directory (default: $CORAL_KEYS)",
    )
    p.add_argument("--key-name", default=None, metavar="NAME", help="client key name (default: --name)")
    p.add_argument(
        "--weights", action="append", default=[], metavar="MODEL=DIR", help="where a model's weights are on this host"
    )
    p.add_argument("--work-dir", type=Path, default=Path(".coral-worker"), metavar="DIR", help="server logs and caches")
    p.add_argument(
        "--grace", default="60s", metavar="DURATION", help="keep serving this long without a kernel (default: 60s)"
    )
    p.add_argument(
        "--connect-timeout", default="10s", metavar="DURATION", help="wait this long for the kernel (default: 10s)"
    )
    p.set_defaults(func=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    """``coral worker``: check the host, connect, serve until SIGTERM/SIGINT."""
    from actors.hosts import worker_problem
    from actors.hostworker import HostWorker, WorkerConfig

    cat = catalog_from(args)
    bad = worker_problem(cat, args.node, args.gpus, args.region)
    if bad is not None:
        flag = "--gpus" if bad.startswith("gpus") else "--region" if bad.startswith("region") else "--node"
        raise CoralError(f"{flag}: {bad.removeprefix('gpus: ')}")
    endpoints = parse_connect(args.kernel, "--kernel")
    if not endpoints.router.startswith("tcp://"):
        raise CoralError(f"--kernel: a worker connects over tcp://HOST:PORT, got {args.kernel!r}")
    d = keys_dir(args.keys)
    if d is None:
        for what, off in (("--engine-host", not is_loopback(args.engine_host)),
                          ("--kernel", not tcp_is_loopback(endpoints.router))):  # fmt: skip
            if off:
                raise CoralError(
                    f"{what}: {args.engine_host if what == '--engine-host' else endpoints.router} is reachable from "
                    "other machines, and nothing may listen or talk there without keys; give --keys DIR (or set "
                    "CORAL_KEYS) with server.key, clients/NAME.key_secret and engine.secret from the kernel's host"
                )
    curve = client_keys(d, args.key_name or args.name) if d is not None else None
    given = os.environ.pop(SECRET_ENV, "")  # not passed on to the servers' environment
    try:
        secret = engine_secret(d) if d is not None else bytes.fromhex(given)
    except ValueError:
        raise CoralError(f"${SECRET_ENV}: not an engine secret (expected hex digits)") from None
    parent = os.environ.pop(PARENT_ENV, "")
    if parent and not parent.isdigit():
        raise CoralError(f"${PARENT_ENV}: expected a process id, got {parent!r}")
    cfg = WorkerConfig(
        args.name,
        args.region,
        args.node,
        args.gpus,
        args.engine_host,
        endpoints,
        curve,
        secret,
        args.work_dir.resolve(),
        parse_weights(args.weights, cat),
        grace_s=parse_duration(args.grace, "--grace"),
        connect_timeout_s=parse_duration(args.connect_timeout, "--connect-timeout"),
    )
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="coral worker %(asctime)s %(message)s")
    worker = HostWorker(cfg)

    async def main() -> None:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def orphaned() -> None:  # a local worker ends with the coral up that started it
                while os.getppid() == int(parent):
                    await anyio.sleep(1.0)
                logging.getLogger("coral.worker").warning("coral up (pid %s) is gone: stopping", parent)
                stop.set()

            tg.start_soon(stop_on_signals, stop)
            if parent:
                tg.start_soon(orphaned)
            await worker.run(stop)
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")
    return 0
