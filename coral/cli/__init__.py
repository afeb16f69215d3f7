"""The ``coral`` command line: the composition root that wires the packages together."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from coral.cli import common
from coral.errors import CoralError

VERB_MODULES = (
    "catalog_cmd",
    "templates_cmd",
    "plan_cmd",
    "bench_cmd",
    "simulate_cmd",
    "up_cmd",
    "replay_cmd",
    "tui_cmd",
    "profile_cmd",
    "keys_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The full ``coral`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="coral",
        description="Serve many LLMs on a mixed, multi-region GPU fleet at the lowest cost that meets every SLO.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parent = common.parent_parser()
    for name in VERB_MODULES:
        importlib.import_module(f"coral.cli.{name}").add(sub, parent)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``coral`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc: int = args.func(args)
    except CoralError as e:
        print(f"coral: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("coral: interrupted", file=sys.stderr)
        return 130
    return rc


if __name__ == "__main__":
    sys.exit(main())
