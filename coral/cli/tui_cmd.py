"""``coral tui``: the terminal UI, attached to a running ``coral up`` or replaying a recorded journal."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from coral.errors import CoralError


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
    """``--speed``: a positive number, or ``max`` (as fast as possible)."""
    t = text.strip().lower()
    if t in ("max", "inf"):
        return math.inf
    try:
        v = float(t)
    except ValueError:
        raise CoralError(f"--speed: expected a positive number or 'max', got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise CoralError(f"--speed: must be a positive number or 'max', got {text!r}")
    return v


def run_tui_cmd(args: argparse.Namespace) -> int:
    from tui.app import run_tui
    from tui.bus import parse_address

    speed = parse_speed(args.speed)
    if args.replay is None and args.speed != "1":
        raise CoralError("--speed: only with --replay")
    if args.replay is not None and not args.replay.is_file():
        raise CoralError(f"--replay: {args.replay}: no such journal file")
    endpoints = parse_address(args.connect) if args.connect is not None else None
    curve = None
    if args.replay is None:
        from coral.cli.keys_cmd import client_keys_for
        from tui.bus import default_endpoints

        curve = client_keys_for(endpoints or default_endpoints(), args.keys, args.key_name)
    return run_tui(
        endpoints, replay=args.replay, speed=speed, store=args.store, catalog_files=args.catalog, curve=curve
    )
