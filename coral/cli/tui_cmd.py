"""``coral tui``: the terminal UI, attached to a running ``coral up`` or replaying a recorded journal."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from coral.cli import up_setup
from coral.errors import CoralError
from coral.kernel.address import default_endpoints, parse_connect


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser("tui", parents=[parent], help="watch and steer a running mesh in a terminal UI")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--connect",
        metavar="ADDR",
        default=None,
        help="the kernel of a running `coral up`: what it took as --bind (tcp://HOST:PORT or ipc://PATH) "
        "or ROUTER,PUB (default: coral up's default, tcp://127.0.0.1:7450)",
    )
    src.add_argument("--replay", type=Path, default=None, metavar="JOURNAL", help="play a recorded journal instead")
    p.add_argument(
        "--speed",
        default="1",
        help="replay speed: kernel seconds per wall second, or 'max' (default: 1)",
    )
    p.add_argument(
        "--store", type=Path, default=None, help="template store for the stage bars (default: the user data dir)"
    )
    p.add_argument(
        "--keys",
        type=Path,
        default=None,
        metavar="DIR",
        help="CurveZMQ key directory for a tcp:// kernel with keys (default: $CORAL_KEYS; none: plaintext)",
    )
    p.add_argument("--key-name", default="tui", help="this client's key in DIR/clients (default: tui)")
    p.set_defaults(func=run_tui_cmd)


def parse_speed(text: str) -> float:
    """``--speed``: a positive number, or ``max`` (as fast as possible: infinite)."""
    v = up_setup.parse_speed("max" if text.strip().lower() == "inf" else text)
    return math.inf if v is None else v


def run_tui_cmd(args: argparse.Namespace) -> int:
    from tui.app import run_tui

    speed = parse_speed(args.speed)
    if args.replay is None and args.speed != "1":
        raise CoralError("--speed: only with --replay")
    if args.replay is not None and not args.replay.is_file():
        raise CoralError(f"--replay: {args.replay}: no such journal file")
    endpoints = parse_connect(args.connect) if args.connect is not None else None
    curve = None
    if args.replay is None:
        from coral.cli.keys_cmd import client_keys_for

        curve = client_keys_for(endpoints or default_endpoints(), args.keys, args.key_name)
    return run_tui(
        endpoints, replay=args.replay, speed=speed, store=args.store, catalog_files=args.catalog, curve=curve
    )
