"""``coral up --resume JOURNAL``: open a crashed run's journal and run the mesh on from where it stopped.

The resumed run takes its scenario, seed, timing, templates and catalog from the journal's ``mesh.setup``
(``--scenario``, ``--seed``, ``--policy``, ``--hosts`` and friends are ignored), restores the fleet from
the journal and the provider's state file (``JOURNAL.cloud.json``), reconciles the two, and appends to
the same journal (see ``actors.recovery``). What the summary says about it is ``coral.cli.resumed``'s.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import anyio
import attrs
from rich.console import Console

from actors.recovery import Recovery, check_provider, load_recovery, provider_state_path
from actors.setup import world_of
from coral.cli.up_driver import run_up_async
from coral.cli.up_status import print_summary
from coral.cli.up_workers import is_local
from coral.errors import CoralError
from coral.kernel import Endpoints, ServerKeys
from coral.store import default_store_path


def open_resume(args: argparse.Namespace) -> Recovery:
    """Check the flags, truncate a torn tail (printing the warning) and rebuild the crashed run's state."""
    if args.record is not None:
        raise CoralError("--record: not with --resume (the resumed run appends to the journal it resumes)")
    state = provider_state_path(args.resume)
    if args.resume.is_file() and not state.is_file():
        raise CoralError(
            f"--resume: {state}: no provider state next to the journal (only runs recorded with --record "
            "by this version keep one)"
        )
    rec = load_recovery(args.resume)
    if rec.torn is not None:
        print(f"coral up: warning: {rec.torn}", file=sys.stderr)
    if not rec.complete:
        f = rec.fleet
        print(
            f"coral up: --resume: {args.resume} is incomplete (no end record after record {f.last_seq}, "
            f"t={f.last_time:g} s): resuming a run that did not stop cleanly",
            file=sys.stderr,
        )
    check = check_provider(rec.fleet, state)
    print(f"coral up: --resume: {check.describe(args.unknown_nodes)}", file=sys.stderr)
    return attrs.evolve(rec, provider=check)


def run_resumed(
    args: argparse.Namespace,
    endpoints: Endpoints | None,
    speed: float | None,
    wall_limit: float | None,
    curve: ServerKeys | None,
    serve: Callable[[], Any] | None = None,
    vllm: Callable[[Any, Any], Any] | None = None,
    access: Any = None,
) -> int:
    """``coral up --resume``: rebuild the crashed run and run it on, appending to its journal.

    ``vllm`` (``--backend vllm``) makes the engine factory from the scenario and catalog: only a run on
    ``--hosts`` machines can go on, adopting the servers their ``coral worker`` kept running.
    """
    rec = open_resume(args)
    setup = rec.setup
    sc, cat, perf = world_of(setup)
    fleet = None
    if vllm is not None:
        if setup.cloud.kind != "hosts" or is_local(setup.cloud.hosts):
            raise CoralError(
                "--resume: a crashed run on the vllm backend without --hosts cannot be resumed (its local workers "
                "and their servers stopped with the crashed process)"
            )
        fleet = vllm(sc, cat)
        if access is not None:
            access.use_engines(fleet.backend.engine_secret)
    console = Console(stderr=args.json, quiet=args.tui)
    summary = anyio.run(
        functools.partial(
            run_up_async,
            setup,
            sc,
            cat,
            perf,
            journal=args.resume,
            endpoints=endpoints,
            speed=speed,
            wall_limit=wall_limit,
            console=console,
            live=not (args.no_status or args.json or args.tui),
            tui_store=(args.store or default_store_path()) if args.tui else None,
            curve=curve,
            serve=serve() if serve is not None else None,
            resume=rec,
            unknown_nodes=args.unknown_nodes,
            engine_factory=fleet,
            host_table=getattr(fleet, "table", None),
        ),
        backend="asyncio",
    )
    if fleet is not None:
        fleet.close()
    console.quiet = False
    if args.json:
        json.dump(summary, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_summary(summary, console)
    return 0
