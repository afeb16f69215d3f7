"""Recovery benchmark: the fault cases of the reliability issue, each with what was lost and how long the
mesh took to come back.

Cases (scenario ``mesh-steady``, templates built into a temporary store):

- ``kill-9``: ``coral up --record --speed 25`` in a subprocess, SIGKILL once the journal reaches kernel time
  40 s, then ``coral up --resume`` (``--speed max``);
- ``torn-tail``: the same, killed at 60 s, the journal truncated at a seeded random byte of its second half,
  then ``--resume --unknown-nodes adopt``;
- ``node-gone``: killed at 40 s, the provider state edited so that a journal node is dead and an unknown
  node runs, then ``--resume --unknown-nodes release``;
- ``hang``: a stage worker wedges at 30 s (connected, silent) in an in-process run.

Lost: pre-crash requests that ended neither completed nor failed (expected 0), nodes rented twice and
instances started twice (expected 0). Recovery, in kernel seconds: from the resume (or the fault) to the
first instance serving again; wall seconds: from starting ``coral up --resume`` to its journal's
``mesh.resumed`` record (the kernel back up, state rebuilt and reconciled). Timings depend on the machine's
load.

Run ``python bench/recovery.py [--json]`` (``just bench recovery``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import coral.messages  # noqa: E402,F401 - registers the message tags
from actors.recovery import fleet_state, provider_state_path  # noqa: E402
from coral.kernel import JournalRecord, TornTailWarning, read_journal  # noqa: E402

RUNNER = "import sys; from coral.cli import main; sys.exit(main(sys.argv[1:]))"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def records(path: Path) -> list[JournalRecord]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)
        try:
            return list(read_journal(path))
        except Exception:
            return []


def crash(store: Path, journal: Path, at: float) -> None:
    cmd = [sys.executable, "-c", RUNNER, "up", "--scenario", "mesh-steady", "--store", str(store), "--no-build",
           "--no-deadline", "--bind", "tcp://127.0.0.1:0", "--no-status", "--speed", "25",
           "--record", str(journal)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT)
    try:
        while max((r.time for r in records(journal)), default=-1e9) < at:
            if proc.poll() is not None:
                raise SystemExit("coral up ended before the crash")
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()


def resume(store: Path, journal: Path, *extra: str) -> tuple[dict[str, Any], float, str]:
    cmd = [sys.executable, "-c", RUNNER, "up", "--resume", str(journal), "--store", str(store), "--no-build",
           "--speed", "max", "--bind", "inproc", "--json", *extra]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    back = None
    n0 = len(records(journal))
    while proc.poll() is None:
        if back is None and any(r.tag == "mesh.resumed" for r in records(journal)[n0:]):
            back = time.perf_counter() - t0
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"resume failed:\n{err[-2000:]}")
    if back is None:
        back = time.perf_counter() - t0
    return json.loads(out), back, err


def losses(journal: Path, summary: dict[str, Any]) -> dict[str, Any]:
    recs = records(journal)
    k = next(i for i, r in enumerate(recs) if r.tag == "mesh.resumed")
    resumed = recs[k].decode()
    ledger = fleet_state(recs[:k]).ledger
    starts = Counter(r.decode().instance for r in recs if r.tag == "fleet.action" and r.decode().action == "start")
    owner: dict[str, str] = {}
    double = 0
    for r in recs:
        if r.tag == "fleet.update":
            for i in r.decode().instances:
                for nid in i.node_ids:
                    double += owner.setdefault(nid, i.id) != i.id
    dep = summary["deployments"]["chat-8b"]
    serving = [r.time for r in recs[k:] if r.tag == "fleet.action" and r.decode().action == "serving"]
    return {
        "pre_crash_arrived": len(ledger.arrived),
        "resubmitted": resumed.resubmitted,
        "requests_lost": len(ledger.open) - resumed.resubmitted + dep["open"],
        "failed_after": dep["failed_by"],
        "instances_started_twice": sum(n > 1 for n in starts.values()),
        "nodes_rented_twice": double,
        "adopted": list(resumed.adopted),
        "released": list(resumed.released),
        "lost_nodes": list(resumed.lost),
        "recover_kernel_s": round(serving[0] - resumed.at, 1) if serving else None,
    }


def case_kill(store: Path, tmp: Path) -> dict[str, Any]:
    j = tmp / "kill.journal"
    crash(store, j, 40.0)
    summary, wall, _ = resume(store, j)
    return {"case": "kill-9 mid-run, --resume", "wall_back_s": round(wall, 2), **losses(j, summary)}


def case_torn(store: Path, tmp: Path) -> dict[str, Any]:
    j = tmp / "torn.journal"
    crash(store, j, 60.0)
    size = j.stat().st_size
    cut = random.Random(7).randrange(size // 2, size - 1)
    with open(j, "r+b") as f:
        f.truncate(cut)
    summary, wall, err = resume(store, j, "--unknown-nodes", "adopt")
    warned = next((line for line in err.splitlines() if "torn tail" in line), "")
    return {"case": "torn journal tail, --resume", "wall_back_s": round(wall, 2), "warning": warned,
            **losses(j, summary)}  # fmt: skip


def case_gone(store: Path, tmp: Path) -> dict[str, Any]:
    j = tmp / "gone.journal"
    crash(store, j, 40.0)
    known = fleet_state(records(j))
    path = provider_state_path(j)
    state = json.loads(path.read_text())
    gone = known.instances[0].node_ids[0]
    for n in state["nodes"]:
        if n["id"] == gone:
            n["state"] = "dead"
    state["next"] += 1
    state["nodes"].append({"id": f"n{state['next']}", "region": known.instances[0].region, "node": "g6.xlarge",
                           "ready_at": 0.0, "state": "running", "tags": {}})  # fmt: skip
    path.write_text(json.dumps(state))
    summary, wall, _ = resume(store, j, "--unknown-nodes", "release")
    return {"case": "node gone + unknown node, --resume", "wall_back_s": round(wall, 2), **losses(j, summary)}


def case_hang(store: Path, tmp: Path) -> dict[str, Any]:
    import anyio
    import attrs

    from actors.compose import CoralMesh, RunOptions, library_for, make_setup, run_mesh
    from actors.feed import FAULT_SOURCE, Input, ListFeed, MergedFeed
    from coral.catalog import load_catalog
    from coral.messages import SUPERVISOR, CloudSetup, FaultInjected
    from coral.perf import PerfModel
    from coral.scenario import load_scenario
    from coral.store import TemplateStore

    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario("mesh-steady", cat)
    with TemplateStore(store, readonly=True) as st:
        lib = library_for(st, sc)
    opts = attrs.evolve(RunOptions(seed=7, deterministic=True), cloud=CloudSetup(provision_s=5.0, startup_s=5.0))
    setup = make_setup(sc, cat, perf, lib, opts)
    j = tmp / "hang.journal"
    fault = Input(30.0, FAULT_SOURCE, SUPERVISOR, FaultInjected(30.0, "hang", "aws-us-east-1", "g5.xlarge", 1))
    feed = MergedFeed(CoralMesh(setup, sc, cat, perf).feed(), ListFeed([fault]))
    res = anyio.run(lambda: run_mesh(setup, sc, cat, perf, journal=j, feed=feed), backend="asyncio")
    recs = records(j)
    lost = [r.decode() for r in recs if r.tag == "fleet.node_lost"]
    serving = [r.time for r in recs if r.tag == "fleet.action" and r.decode().action == "serving" and r.time > 30]
    d = res.state.stats.deployments[0] if res.state.stats else None
    return {
        "case": "stage worker hangs (connected, silent)",
        "detected_after_s": round(lost[0].at - 30.0, 1) if lost else None,
        "recover_kernel_s": round(serving[0] - 30.0, 1) if serving else None,
        "requests_lost": (d.in_flight + d.queued) if d else None,
        "retried": d.retries if d else None,
        "failed_after": dict(d.failed_by) if d else None,
        "heartbeat_timeout_s": setup.timing.heartbeat_timeout_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from coral.catalog import load_catalog
    from coral.perf import PerfModel
    from tests.mesh.helpers import build_store

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cat = load_catalog()
        store = build_store(tmp / "templates.sqlite", PerfModel(cat), cat)
        rows = [case_kill(store, tmp), case_torn(store, tmp), case_gone(store, tmp), case_hang(store, tmp)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(r.pop("case") + ": " + ", ".join(f"{k} {v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
