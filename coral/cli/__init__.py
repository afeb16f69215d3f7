"""The ``coral`` command line: the composition root that wires the packages together.

Every failure ends in one line on stderr and a non-zero exit: a bad argument (2), a ``CoralError`` (2),
an ``OSError`` naming its file (1), also when an async task group wraps them; a closed stdout
(``coral ... | head``) ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from coral import __version__
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
    "worker_cmd",
)

EXIT_PIPE = 141
"""The status of a command whose reader went away (128 + SIGPIPE), as a shell pipeline reports it."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the usage is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The full ``coral`` argument parser."""
    parser = Parser(
        prog="coral",
        description="Serve many LLMs on a mixed, multi-region GPU fleet at the lowest cost that meets every SLO.",
    )
    parser.add_argument("--version", action="version", version=f"coral {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in VERB_MODULES:
        importlib.import_module(f"coral.cli.{name}").add(sub, common.parent_parser())
    return parser


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in action.choices.values():
                out += _parsers(p)
    return out


def join_dashed_values(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``--for -5s`` as ``--for=-5s``: argparse takes a value that starts with a dash for an option and
    reports "expected one argument"; joined, the value reaches the option's own check, which names it."""
    takes_value: set[str] = set()
    known: set[str] = set()
    for p in _parsers(parser):
        for action in p._actions:
            known.update(action.option_strings)
            if action.option_strings and action.nargs is None and not isinstance(action, argparse._VersionAction):
                takes_value.update(s for s in action.option_strings if s.startswith("--") and action.const is None)
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a in takes_value and nxt is not None and nxt.startswith("-") and nxt.split("=")[0] not in known:
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def describe(exc: BaseException) -> str | None:
    """The one line for a user-facing failure (None: a bug, which keeps its traceback)."""
    if isinstance(exc, CoralError):
        return str(exc)
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        if exc.filename is not None:
            return f"{exc.filename}: {what}"
        return what
    return None


def _close_stdout() -> None:
    """After the reader of stdout went away: point stdout at /dev/null so the exit's flush is quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``coral`` console script."""
    parser = build_parser()
    args = parser.parse_args(join_dashed_values(parser, sys.argv[1:] if argv is None else list(argv)))
    try:
        rc: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        _close_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt:
        print("coral: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        leaves = [x for x in _leaves(e) if not isinstance(x, BrokenPipeError)]
        if not leaves:
            _close_stdout()
            return EXIT_PIPE
        lines = [describe(x) for x in leaves]
        if any(line is None for line in lines):
            raise
        print(f"coral: error: {lines[0]}", file=sys.stderr)
        return 2 if isinstance(leaves[0], CoralError) else 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
