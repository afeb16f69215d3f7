"""Gateway benchmark: the latency the gateway and the mesh add to the simulated engine's own time.

Two processes: ``coral up``'s mesh with its HTTP gateway (the ``mesh-steady`` scenario without its own
traffic, paced at ``--speed``, recording a journal), and this client (aiohttp, streamed completions).
``--policy pd-homo`` plans the deployment as a prefill/decode pair: the first token then comes from the
prefill instance and the rest from the decode instance, after the KV handoff.

1. Singles: ``--singles`` streamed requests one at a time on the idle mesh (``--tokens`` each).
2. Burst: ``--burst`` requests, at most ``--concurrency`` in flight.

For each request the simulated fleet's own times come from the journal: its entry into the mesh (the
gateway's ``req.arrivals``, at the paced time of its arrival), the time of each token (the router's
``req.result`` progress and completion, which carry the engine's times), and its dispatch (the router's
``req.dispatch``: the router's wait for a free instance before it, a queue that the simulated fleet
models in front of its engines, is reported apart). The client times each request from its send. The
added latency of token k is (client time of token k after the send) - (simulated time of token k after
the entry) / speed: what is not the simulated fleet's (HTTP, the gateway, the delivery into the mesh, the
driver's pacing, falling behind the wall clock). Reported per phase: p50 / p99 of the added time to the
first token (TTFT) and per token (every token after the first), the simulated TTFT and the router's wait.
Targets: added p50 <= 20 ms, p99 <= 100 ms; the burst's client TTFT p50 at most the simulated TTFT p50
+ 20 ms. Also reported: the mesh process's CPU per token streamed in the burst (its CPU from the burst's
first send to its last token, over the burst's tokens: the HTTP side and the mesh's own work for them).

The machine is shared: the load average is printed with the figures. Run
``python bench/gateway.py [--json] [--speed 1] [--policy coral] [--singles 30] [--burst 2000] [--concurrency 64]
[--no-deadline]`` (plans are solved under the scenario's deadline, as ``coral up`` solves them, unless
``--no-deadline``). With ``CORAL_BENCH_PROFILE=FILE`` in the environment the mesh process is profiled
(cProfile, in CPU time: on a loaded machine wall time mostly measures waiting for a core) into FILE.
(``just bench gateway``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from solvers.planning import POLICIES  # noqa: E402

SCENARIO = "mesh-steady"
MODEL = "chat-8b"
PROMPT = "Tell me about coral reefs and the fish that live around them."


def serve(store: str, journal: str, speed: float, policy: str, no_deadline: bool) -> None:
    """Child process: run the mesh with its gateway until SIGINT/SIGTERM; print the gateway's URL."""
    import anyio
    import attrs
    from rich.console import Console

    from actors.compose import CoralMesh, run_mesh
    from coral.catalog import load_catalog
    from coral.cli.common import stop_on_signals
    from coral.cli.up_serve import Serve, start_serving
    from coral.gateway import MeshLink
    from coral.gateway.server import bind
    from coral.kernel import Mesh
    from coral.messages import ArrivalBatch
    from coral.perf import PerfModel
    from tests.mesh.helpers import RECORD_OPTIONS, World

    catalog = load_catalog()
    perf = PerfModel(catalog)
    world = World(catalog, perf, Path(store))
    sc = attrs.evolve(world.scenario(SCENARIO), duration_s=3600)
    setup = world.setup(SCENARIO, attrs.evolve(RECORD_OPTIONS, policy=policy, deterministic=no_deadline), sc)
    sock = bind("127.0.0.1", 0, "gateway")
    inner = CoralMesh(setup, sc, catalog, perf).feed()

    class NoTraffic:
        def next_at(self) -> float | None:
            return inner.next_at()

        def take(self, t: float) -> list[Any]:
            return [i for i in inner.take(t) if not isinstance(i.msg, ArrivalBatch)]

    steps: list[tuple[float, float, float]] = []  # (wall, simulated, process CPU) of each step of the driver

    async def main() -> None:
        stop = anyio.Event()
        links: list[MeshLink] = []
        async with anyio.create_task_group() as tg:

            async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
                await start_serving(Serve(sock), mesh, sc, setup.seed, tg, links, Console(quiet=True))
                print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)

            def on_step(now: float) -> None:
                steps.append((time.monotonic(), now, time.process_time()))
                for link in links:
                    link.step(now)

            tg.start_soon(stop_on_signals, stop)
            await run_mesh(
                setup, sc, catalog, perf, feed=NoTraffic(), pace=speed, stop=stop, on_start=on_start,
                on_step=on_step, journal=journal, gateway=True,
            )  # fmt: skip
            tg.cancel_scope.cancel()

    prof = os.environ.get("CORAL_BENCH_PROFILE")  # a cProfile of the mesh process, for finding its costs
    if prof:
        import cProfile

        with cProfile.Profile(time.process_time) as pr:
            anyio.run(main, backend="asyncio")
        pr.dump_stats(prof)
    else:
        anyio.run(main, backend="asyncio")
    Path(journal + ".steps").write_text(json.dumps(steps))


async def one(s: Any, url: str, tokens: int) -> dict[str, Any]:
    """One streamed completion: its id, send time and (wall time, tokens so far) of each chunk."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": tokens, "stream": True}
    t0 = time.perf_counter()
    marks: list[tuple[float, int]] = []
    rid = -1
    got = 0
    async with s.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            return {"status": r.status, "t0": t0, "marks": [], "rid": -1}
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            doc = json.loads(line[6:])
            rid = int(doc["id"].split("-")[1])
            n = len(doc["choices"][0]["text"].split()) if doc["choices"] else 0
            if n:
                got += n
                marks.append((time.perf_counter(), got))
    return {"status": 200, "t0": t0, "marks": marks, "rid": rid}


async def client(url: str, singles: int, burst: int, concurrency: int, tokens: int) -> dict[str, list[Any]]:
    import aiohttp
    import anyio

    out: dict[str, list[Any]] = {"singles": [], "burst": []}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        while True:  # until the deployment has a serving instance
            async with s.get(url + "/v1/models") as r:
                if any(m["id"] == MODEL and m["ready"] for m in (await r.json())["data"]):
                    break
            await anyio.sleep(0.1)
        await one(s, url, 1)  # warm the connection
        for _ in range(singles):
            out["singles"].append(await one(s, url, tokens))
            await anyio.sleep(0.2)
        left = burst

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                out["burst"].append(await one(s, url, tokens))

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
    return out


def engine_times(journal: Path) -> tuple[dict[int, float], dict[int, float], dict[int, list[float]]]:
    """Per gateway request: its entry into the mesh, its dispatch, and the engine time of each token."""
    from coral.gateway import GATEWAY_ID_BASE
    from coral.kernel import read_journal
    from coral.messages import ArrivalBatch, Dispatch, RequestResults

    entered: dict[int, float] = {}
    admitted: dict[int, float] = {}
    marks: dict[int, list[tuple[float, int]]] = {}
    first: dict[int, float] = {}
    for r in read_journal(journal):
        if r.tag == "req.arrivals" and r.source == "gateway":
            batch = r.decode()
            assert isinstance(batch, ArrivalBatch)
            for spec in batch.requests:
                entered.setdefault(spec.id, spec.t)
        elif r.tag == "req.dispatch":
            msg = r.decode()
            assert isinstance(msg, Dispatch)
            for item in msg.items:
                if item.id >= GATEWAY_ID_BASE and item.gen == 0:
                    admitted.setdefault(item.id, item.avail)
        elif r.tag == "req.result":
            msg = r.decode()
            assert isinstance(msg, RequestResults)
            for o in msg.outcomes:
                if o.kind in ("progress", "done"):
                    marks.setdefault(o.id, []).append((o.t, o.tokens))
                    if o.t_first >= 0:
                        first.setdefault(o.id, o.t_first)
    times: dict[int, list[float]] = {}
    for rid, ms in marks.items():
        ts: list[float] = []
        for t, k in ms:
            while len(ts) < k:
                ts.append(first[rid] if not ts and rid in first else t)
        times[rid] = ts
    return entered, admitted, times


def stalls(journal: Path, speed: float, reqs: list[dict[str, Any]], burst_n: int = 0) -> dict[str, Any]:
    """Where the clock fell behind the wall clock, from the driver's steps (``serve`` writes them): each
    step that took more than 20 ms of wall time beyond its simulated time (a stall: the mesh was busy
    while the clock stood), with the simulated events at that instant, and how much of the slowest
    requests' added time the stalls in their lifetime explain; and the mesh process's CPU per token
    streamed in the burst (the last ``burst_n`` requests): its CPU from the burst's first send to its
    last token over the tokens streamed."""
    from coral.kernel import read_journal

    steps = json.loads(Path(str(journal) + ".steps").read_text())
    events: dict[float, set[str]] = {}
    for r in read_journal(journal):
        if r.tag in ("plan.new", "dem.update", "mkt.update", "fleet.update", "req.counts"):
            events.setdefault(r.time, set()).add(r.tag)
    found = []
    for (w0, v0, _), (w1, v1, _) in itertools.pairwise(steps):
        extra = (w1 - w0) - (v1 - v0) / speed
        if extra > 0.02:
            near = sorted({tag for t, tags in events.items() if v0 <= t <= v1 for tag in tags})
            found.append({"wall": w1, "at": v0, "to": v1, "extra_ms": extra * 1e3, "events": near})
    slow = []
    for q in reqs:
        if q["status"] == 200 and q["marks"]:
            end = q["marks"][0][0]
            inside = [x for x in found if q["t0"] <= x["wall"] <= end + 0.001]
            slow.append(((end - q["t0"]) * 1e3, sum(x["extra_ms"] for x in inside), [x["events"] for x in inside]))
    slow.sort(key=lambda x: -x[0])
    burst = [q for q in reqs[-burst_n:] if q["status"] == 200 and q["marks"]] if burst_n else []
    cpu_ms_per_token = float("nan")
    if burst:
        t0, t1 = min(q["t0"] for q in burst), max(q["marks"][-1][0] for q in burst)
        inside = [c for w, _, c in steps if t0 <= w <= t1]
        tokens = sum(q["marks"][-1][1] for q in burst)
        if len(inside) > 1 and tokens:
            cpu_ms_per_token = (inside[-1] - inside[0]) * 1e3 / tokens
    total = sum(x["extra_ms"] for x in found)
    at_plans = sum(x["extra_ms"] for x in found if "plan.new" in x["events"])
    worst = sorted(found, key=lambda x: -x["extra_ms"])[:5]
    return {
        "stalls": len(found),
        "stalled_ms": total,
        "stalled_at_plans_ms": at_plans,
        "worst": worst,
        "slowest_requests": slow[:5],
        "burst_cpu_ms_per_token": cpu_ms_per_token,
    }


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def summarize(
    reqs: list[dict[str, Any]],
    entered: dict[int, float],
    admitted: dict[int, float],
    times: dict[int, list[float]],
    speed: float,
) -> dict[str, float]:
    ttft_added, tok_added, sim_ttft, client_ttft, waited = [], [], [], [], []
    failed = 0
    for q in reqs:
        rid = q["rid"]
        if q["status"] != 200 or rid not in entered or rid not in times or not q["marks"]:
            failed += 1
            continue
        e, ts = entered[rid], times[rid]
        prev = 0
        for wall, k in q["marks"]:
            for j in range(prev, min(k, len(ts))):
                added = (wall - q["t0"]) - (ts[j] - e) / speed
                (ttft_added if j == 0 else tok_added).append(added * 1e3)
            prev = k
        sim_ttft.append((ts[0] - e) / speed * 1e3)
        client_ttft.append((q["marks"][0][0] - q["t0"]) * 1e3)
        waited.append((admitted.get(rid, e) - e) / speed * 1e3)
    return {
        "requests": len(reqs),
        "failed_or_unmatched": failed,
        "simulated_ttft_p50_ms": pct(sim_ttft, 0.5),
        "router_wait_p50_ms": pct(waited, 0.5),
        "router_wait_p99_ms": pct(waited, 0.99),
        "client_ttft_p50_ms": pct(client_ttft, 0.5),
        "client_ttft_p99_ms": pct(client_ttft, 0.99),
        "added_ttft_p50_ms": pct(ttft_added, 0.5),
        "added_ttft_p99_ms": pct(ttft_added, 0.99),
        "added_token_p50_ms": pct(tok_added, 0.5),
        "added_token_p99_ms": pct(tok_added, 0.99),
        "tokens": len(tok_added),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", type=float, default=1.0, help="the mesh's pace (coral up --speed)")
    ap.add_argument("--singles", type=int, default=30, help="requests one at a time on the idle mesh")
    ap.add_argument("--burst", type=int, default=2000, help="requests of the burst")
    ap.add_argument("--concurrency", type=int, default=64, help="the burst's requests in flight at most")
    ap.add_argument("--tokens", type=int, default=16, help="max_tokens of every request")
    ap.add_argument(
        "--policy",
        default="coral",
        choices=POLICIES,
        help="the mesh's planning policy (coral up --policy; pd-homo: prefill/decode)",
    )
    ap.add_argument(
        "--no-deadline",
        action="store_true",
        help="solve every plan to completion (coral up --no-deadline); default: the scenario's deadline, as coral up",
    )
    ap.add_argument("--store", type=Path, help="the mesh-* template store (built in a temporary folder if absent)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--serve", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve[0], args.serve[1], float(args.serve[2]), args.serve[3], args.serve[4] == "1")
        return
    import anyio

    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp) / "templates.sqlite"
        if not store.exists():
            from coral.catalog import load_catalog
            from coral.perf import PerfModel
            from tests.mesh.helpers import build_store

            catalog = load_catalog()
            build_store(store, PerfModel(catalog), catalog)
        journal = Path(tmp) / "bench.journal"
        p = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve",
                str(store),
                str(journal),
                str(args.speed),
                args.policy,
                "1" if args.no_deadline else "0",
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert p.stdout is not None
        try:
            url = p.stdout.readline().strip()
            if not url.startswith("http://"):
                raise SystemExit("the mesh process did not start")
            got = anyio.run(client, url, args.singles, args.burst, args.concurrency, args.tokens, backend="asyncio")
        finally:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        entered, admitted, times = engine_times(journal)
        where = stalls(journal, args.speed, got["singles"] + got["burst"], len(got["burst"]))
    load1 = os.getloadavg()
    out = {
        "speed": args.speed,
        "policy": args.policy,
        "deadline": not args.no_deadline,
        "tokens": args.tokens,
        "concurrency": args.concurrency,
        "singles": summarize(got["singles"], entered, admitted, times, args.speed),
        "burst": summarize(got["burst"], entered, admitted, times, args.speed),
        "stalls": where,
        "cpus": os.cpu_count(),
        "loadavg_before": list(load0),
        "loadavg_after": list(load1),
    }
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print(
        f"gateway over the simulated mesh at --speed {args.speed:g}, policy {args.policy}, "
        f"{'no deadline' if args.no_deadline else 'the scenario deadline'}, "
        f"{args.tokens} tokens per request "
        f"({os.cpu_count()} CPUs; load average {load0[0]:.1f} / {load0[1]:.1f} before, "
        f"{load1[0]:.1f} / {load1[1]:.1f} after, 1 / 5 min)"
    )
    for name, what in (("singles", f"{args.singles} requests one at a time, idle mesh"),
                       ("burst", f"{args.burst} requests, at most {args.concurrency} in flight")):  # fmt: skip
        r = out[name]
        assert isinstance(r, dict)
        print(f"  {name}: {what} ({r['failed_or_unmatched']} failed or unmatched)")
        print(
            f"    simulated TTFT p50 {r['simulated_ttft_p50_ms']:.1f} ms (the router's wait in it p50 "
            f"{r['router_wait_p50_ms']:.1f} ms, p99 {r['router_wait_p99_ms']:.1f} ms); "
            f"client TTFT p50 {r['client_ttft_p50_ms']:.1f} ms, p99 {r['client_ttft_p99_ms']:.1f} ms"
        )
        ok = "meets" if r["added_ttft_p50_ms"] <= 20 and r["added_ttft_p99_ms"] <= 100 else "MISSES"
        print(
            f"    added to the first token: p50 {r['added_ttft_p50_ms']:.1f} ms, p99 {r['added_ttft_p99_ms']:.1f} ms"
            f"   (target 20 / 100 ms: {ok})"
        )
        ok = "meets" if r["added_token_p50_ms"] <= 20 and r["added_token_p99_ms"] <= 100 else "MISSES"
        print(
            f"    added per token ({r['tokens']} after the first): p50 {r['added_token_p50_ms']:.1f} ms, "
            f"p99 {r['added_token_p99_ms']:.1f} ms   (target 20 / 100 ms: {ok})"
        )
    print(
        f"  the clock stood {where['stalls']} times for {where['stalled_ms']:.0f} ms in all (steps over 20 ms "
        f"beyond their simulated time), {where['stalled_at_plans_ms']:.0f} ms of it at steps that published a "
        "plan (the solve holds the clock); the longest, with the simulated events of that instant:"
    )
    for x in where["worst"]:
        print(f"    t={x['at']:.4f} s: {x['extra_ms']:.0f} ms  {' '.join(x['events']) or '-'}")
    print(f"  the mesh process's CPU per token streamed in the burst: {where['burst_cpu_ms_per_token']:.3f} ms")
    print("  slowest requests: client TTFT ms, stalls in its lifetime ms, their events")
    for ttft, stalled, evs in where["slowest_requests"]:
        print(f"    {ttft:.0f} ms, {stalled:.0f} ms  {evs}")
    b = out["burst"]
    assert isinstance(b, dict)
    ok = "meets" if b["client_ttft_p50_ms"] <= b["simulated_ttft_p50_ms"] + 20 else "MISSES"
    print(f"  burst client TTFT p50 <= simulated TTFT p50 + 20 ms: {ok}")


if __name__ == "__main__":
    main()
