"""Benchmark the test tiers: the wall time and the CPU time of ``just test-fast`` (or ``just test``).

The targets (issue 26): the fast tier under 3 minutes and the full suite under 8 on a quiet 2-core machine.
The machine's load changes the wall time a lot, so the run prints the load average before and after, and
two CPU times, each a lower bound of what the run used: the rusage of every process waited for (xdist
workers, solver children, CLI runs), and the CPU of every descendant read from ``/proc`` every half
second. The second sees what the first cannot: a vLLM server's engine core and workers, killed with the
server's process group and never waited for (a server start is about 40 s of CPU, half of it there); it
misses processes that live less than half a second. On a quiet machine with ``c`` cores the wall time is
at least the larger over ``c``.

    python bench/test_tiers.py [--full] [--json] [-- PYTEST_ARGS...]
    python bench/test_tiers.py --files FILE... [--json] [-- PYTEST_ARGS...]

``--files`` runs only the given test files or node ids, in one process (``python -m pytest -q -n 0``):
the before/after figure of a change to a few test modules, vLLM servers included, without the whole suite.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


TICK_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stats() -> dict[int, tuple[int, int, float]]:
    """pid -> (parent pid, start time in ticks, user + system CPU seconds) of every process in /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # after the command: state, ppid, ..., utime (11), stime (12), ..., starttime (19)
        out[int(d)] = (int(rest[1]), int(rest[19]), (int(rest[11]) + int(rest[12])) / TICK_S)
    return out


KINDS = (
    (b"vllm.model_executor.models.registry", "vLLM model registry child"),
    (b"coral.vllm.serve", "vLLM API server (coral.vllm.serve)"),
    (b"VLLM::EngineCore", "vLLM engine core"),
    (b"VLLM::Worker", "vLLM worker (pipeline rank)"),
    (b"VLLM", "vLLM, other"),
    (b"multiprocessing.spawn", "spawned child (multiprocessing: solver process, pool worker)"),
    (b"exec(eval(sys.stdin", "pytest-xdist worker (execnet)"),
    (b"\0worker\0", "coral worker"),
    (b"coral.cli", "coral CLI run"),
    (b"pytest", "pytest"),
)
"""How ``bench/test_tiers.py`` names a process, by the first marker in its command line (vLLM renames its
processes, e.g. ``VLLM::EngineCore``). The coral runs that tests start come before ``pytest``: their
arguments name pytest's temporary folders (``/tmp/pytest-of-USER/...``)."""

PROVISIONAL = frozenset({"other", "spawned child (multiprocessing: solver process, pool worker)"})
"""Kinds read again at every sample: vLLM renames its engine core and workers some seconds after they
start; until then they look like any spawned child."""


def process_kind(pid: int) -> str:
    """The kind of process ``pid`` (``KINDS``) from its command line now."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read(4096)
    except OSError:
        return "other"
    return next((name for mark, name in KINDS if mark in cmd), "other")


class TreeCpu:
    """The CPU time of ``root`` and every descendant, sampled from /proc (Linux) every ``every_s`` seconds
    until ``stop()``: each process's last reading, keyed by (pid, start time) so reused pids count apart."""

    def __init__(self, root: int, every_s: float = 0.5) -> None:
        self.root, self.every_s = root, every_s
        self.seen: dict[tuple[int, int], float] = {}
        self.kinds: dict[tuple[int, int], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.available = os.path.isdir("/proc")
        if self.available:
            self._thread.start()

    def _sample(self) -> None:
        stats = _stats()
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in stats.items():
            kids.setdefault(ppid, []).append(pid)
        todo = [self.root] if self.root in stats else []  # the root too: pytest itself with --files
        while todo:
            pid = todo.pop()
            _, start, cpu = stats[pid]
            self.seen[(pid, start)] = cpu
            if self.kinds.get((pid, start), "other") in PROVISIONAL:
                self.kinds[(pid, start)] = process_kind(pid)
            todo += kids.get(pid, [])

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def by_kind(self) -> dict[str, tuple[int, float]]:
        """kind -> (processes, CPU seconds), dearest first."""
        out: dict[str, tuple[int, float]] = {}
        for key, cpu in self.seen.items():
            n, c = out.get(self.kinds.get(key, "other"), (0, 0.0))
            out[self.kinds.get(key, "other")] = (n + 1, c + cpu)
        return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))

    def stop(self) -> float:
        """Stop sampling; the CPU seconds of every descendant seen."""
        self._stop.set()
        if self.available:
            self._thread.join()
        return sum(self.seen.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="run `just test` (everything) instead of `just test-fast`")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    ap.add_argument(
        "--files", nargs="+", metavar="FILE", help="run only these test files or node ids, without xdist (-n 0)"
    )
    ap.add_argument("pytest_args", nargs="*", help="further pytest arguments (after --)")
    args = ap.parse_args(argv)
    if args.files and args.full:
        ap.error("--files: not with --full")
    if args.files:
        missing = [f for f in args.files if not (ROOT / f.split("::")[0]).exists()]
        if missing:
            ap.error(f"--files: {missing[0]}: no such file")
        recipe = " ".join(args.files)
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *args.files]
        cmd += args.pytest_args
    else:
        recipe = "test" if args.full else "test-fast"
        cmd = ["just", recipe, "-q", "-p", "no:cacheprovider", *args.pytest_args]
    load0 = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sys.stderr)
    tree = TreeCpu(proc.pid)
    rc = proc.wait()
    tree_cpu = tree.stop()
    wall = time.monotonic() - t0
    load1 = os.getloadavg()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime
    fig = {
        "recipe": recipe,
        "exit": rc,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cpu_tree_s": round(tree_cpu, 1) if tree.available else None,
        "processes_seen": len(tree.seen),
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in load1],
    }
    fig["by_kind"] = {k: {"processes": n, "cpu_s": round(c, 1)} for k, (n, c) in tree.by_kind().items()}
    if args.json:
        print(json.dumps(fig))
    else:
        print(
            f"{'pytest -n 0 ' if args.files else 'just '}{recipe}: exit {rc}, {wall:.0f} s wall, {cpu:.0f} s CPU "
            "(user + sys of pytest and the children "
            f"it waited for), {tree_cpu:.0f} s CPU sampled over {len(tree.seen)} processes, on {os.cpu_count()} "
            f"cores; load {load0[0]:.2f} before, {load1[0]:.2f} after"
        )
        for kind, (n, c) in tree.by_kind().items():
            print(f"  {c:8.1f} s CPU  {n:4d} x {kind}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
