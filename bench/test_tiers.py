"""Benchmark the test tiers: the wall time and the CPU time of ``just test-fast`` (or ``just test``).

The targets (issue 26): the fast tier under 3 minutes and the full suite under 8 on a quiet 2-core machine.
The machine's load changes the wall time a lot, so the run prints the load average before and after, and
the CPU time of pytest and every process it waited for (xdist workers, vLLM servers, solver children):
on a quiet machine with ``c`` cores the wall time is at least that CPU time over ``c``.

    python bench/test_tiers.py [--full] [--json] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="run `just test` (everything) instead of `just test-fast`")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    ap.add_argument("pytest_args", nargs="*", help="further pytest arguments (after --)")
    args = ap.parse_args(argv)
    recipe = "test" if args.full else "test-fast"
    cmd = ["just", recipe, "-q", "-p", "no:cacheprovider", *args.pytest_args]
    load0 = os.getloadavg()
    t0 = time.monotonic()
    rc = subprocess.run(cmd, cwd=ROOT, stdout=sys.stderr).returncode
    wall = time.monotonic() - t0
    load1 = os.getloadavg()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime
    fig = {
        "recipe": recipe,
        "exit": rc,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in load1],
    }
    if args.json:
        print(json.dumps(fig))
    else:
        print(
            f"just {recipe}: exit {rc}, {wall:.0f} s wall, {cpu:.0f} s CPU (user + sys of pytest and its children) "
            f"on {os.cpu_count()} cores; load {load0[0]:.2f} before, {load1[0]:.2f} after"
        )
    return rc


if __name__ == "__main__":
    sys.exit(main())
