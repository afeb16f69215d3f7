"""``coral replay JOURNAL``: re-run a recorded mesh run from its external inputs and check its decisions.

The journal's setup record rebuilds the mesh (scenario, templates, timing, seed); the recorded market
quotes, arrivals, faults and operator commands are delivered at their recorded times on a virtual clock;
each plan is re-solved with the solver effort it recorded. Every published decision (plans, fleet
actions and updates, demand and market updates, routing reports, command results) must match the
journal. A journal without its end record (a crash, a copy cut short) or without the run's
``mesh.end`` is incomplete: its decisions are checked up to its last record, and the outcome says so.
A torn tail is one warning line; a corrupt record is one error line naming its byte offset.
Exit status 0 when all match, 1 with a readable diff when not, 2 when the journal cannot be replayed
(not a mesh journal, another catalog, corrupt), 3 when all match but the journal is incomplete.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from coral.errors import CoralError
from coral.kernel import TornTailWarning, read_journal
from coral.kernel.journal import journal_info


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser("replay", parents=[parent], help="replay a recorded mesh run and check its decisions")
    p.add_argument("journal", type=Path, metavar="JOURNAL", help="a journal written by `coral up --record`")
    p.add_argument("--out", type=Path, default=None, metavar="FILE", help="also keep the replay's own journal")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=run_replay)


def run_replay(args: argparse.Namespace) -> int:
    from actors.replay import replay_journal

    if not args.journal.is_file():
        raise CoralError(f"{args.journal}: no such journal file")
    if args.out is not None and args.out.exists():
        raise CoralError(f"--out: {args.out} exists; give a new file")
    info = journal_info(args.journal)
    if info.torn is not None:
        print(f"coral replay: warning: {info.torn}", file=sys.stderr)
    ended = any(r.tag == "mesh.end" for r in _records(args.journal))
    incomplete = info.incomplete_reason() if not info.complete else "" if ended else "no mesh.end record"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)  # said once above
        report = anyio.run(lambda: replay_journal(args.journal, out=args.out), backend="asyncio")
    if args.json:
        out = {
            "journal": str(args.journal),
            "ok": report.ok,
            "complete": not incomplete,
            "incomplete": incomplete,
            "end_s": report.end,
            "inputs": report.inputs,
            "decisions": report.counts,
            "diffs": list(report.diffs),
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        con = Console()
        total = sum(report.counts.values())
        if report.ok:
            kinds = ", ".join(f"{n} {t}" for t, n in sorted(report.counts.items()))
            con.print(
                f"[green]replay matches[/]: {total} decisions ({kinds}) from {report.inputs} inputs, "
                f"up to t={report.end:g} s"
            )
        else:
            con.print(f"[red]replay differs[/] from {args.journal} ({total} decisions recorded):")
            for d in report.diffs:
                con.print(f"  {d}", markup=False, highlight=False)
        if incomplete:
            con.print(
                f"[yellow]journal incomplete[/]: {incomplete}; checked only up to its last record",
                highlight=False,
            )
    return 1 if not report.ok else 3 if incomplete else 0


def _records(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)
        yield from read_journal(path)
