"""Gateway proxy benchmark: the latency the gateway adds per proxied request, and the req/s of one gateway.

Three processes: an instance's HTTP server (``coral.gateway.upstream.PlaceholderServer``: answers at once
with placeholder text, standing for a simulated instance that serves HTTP), one gateway process (as
``coral up --gateway`` serves it: uvicorn with httptools on anyio's asyncio backend, the routing table
holding that one instance) and this client (aiohttp, keep-alive).

1. Added latency: ``--requests`` sequential non-streamed completions (``max_tokens`` 16), alternating
   blocks of 100 sent directly to the instance and through the gateway, with the same client; reported:
   p50 and p99 of each path and their difference (target: under 1 ms added at p50).
2. Throughput: ``--concurrency`` requests kept in flight for ``--seconds`` through the gateway, from
   ``--clients`` client processes; reported: completed requests/s (target: at least 2,000), the gateway
   process's CPU time per request (from /proc) and the requests/s that implies for one core of its own,
   and the same load sent directly to the instance (what the client and instance alone sustain, an upper
   bound on what can be measured here).

All processes share this machine, so the figures include their competition for its cores; say so when
you quote them. Run ``python bench/gateway_proxy.py [--json] [--requests 4000] [--concurrency 64]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BODY = json.dumps({"model": "chat", "prompt": "Tell me about coral reefs.", "max_tokens": 16}).encode()


def serve(kind: str, upstream: str, loop: str = "asyncio") -> None:
    """Child process: serve the placeholder instance or the gateway on a free port; print its URL."""
    import anyio

    from coral.gateway import Gateway, serving
    from coral.gateway.upstream import PlaceholderServer
    from coral.messages import FleetUpdate, InstanceInfo

    async def main() -> None:
        app: Any
        if kind == "upstream":
            app = PlaceholderServer("instance")
        else:
            app = Gateway({"chat": 16}, max_active=1024, max_queue=4096)
            info = InstanceInfo(
                "i1", "chat", "t1", "r1", "aggregated", "serving", ("a",), ("n1",), "w", 1.0, 1e9, 0.0, upstream
            )
            app.on_fleet(FleetUpdate(1, 0.0, (info,)))
        async with serving(app, ("127.0.0.1", 0)) as url:
            print(url, flush=True)
            await anyio.sleep_forever()

    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": loop == "uvloop"})


def start(kind: str, upstream: str = "", loop: str = "asyncio") -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, upstream, loop], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert p.stdout is not None
    url = p.stdout.readline().strip()
    if not url.startswith("http://"):
        p.kill()
        raise SystemExit(f"the {kind} process did not start")
    return p, url


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def latencies(direct: str, via: str, n: int) -> tuple[list[float], list[float]]:
    import aiohttp

    out: dict[str, list[float]] = {direct: [], via: []}
    hdr = {"content-type": "application/json"}
    async with aiohttp.ClientSession() as s:
        for url in (direct, via):  # warm up both connections
            for _ in range(50):
                async with s.post(url + "/v1/completions", data=BODY, headers=hdr) as r:
                    await r.read()
        done = 0
        while done < n:
            for url in (direct, via):
                for _ in range(100):
                    t0 = time.perf_counter()
                    async with s.post(url + "/v1/completions", data=BODY, headers=hdr) as r:
                        await r.read()
                        assert r.status == 200
                    out[url].append(time.perf_counter() - t0)
            done += 100
    return out[direct], out[via]


def load(url: str, concurrency: int, seconds: float, q: Any) -> None:
    """Child process: keep ``concurrency`` requests in flight for ``seconds``; put (completed, errors, wall)."""
    import aiohttp
    import anyio

    async def main() -> None:
        ok = err = 0
        hdr = {"content-type": "application/json"}
        conn = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=conn) as s:
            t_end = time.perf_counter() + seconds
            t0 = time.perf_counter()

            async def worker() -> None:
                nonlocal ok, err
                while time.perf_counter() < t_end:
                    async with s.post(url + "/v1/completions", data=BODY, headers=hdr) as r:
                        await r.read()
                        if r.status == 200:
                            ok += 1
                        else:
                            err += 1

            async with anyio.create_task_group() as tg:
                for _ in range(concurrency):
                    tg.start_soon(worker)
            q.put((ok, err, time.perf_counter() - t0))

    anyio.run(main, backend="asyncio")


def throughput(url: str, concurrency: int, seconds: float, clients: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    per = max(1, concurrency // clients)
    procs = [ctx.Process(target=load, args=(url, per, seconds, q)) for _ in range(clients)]
    for p in procs:
        p.start()
    res = [q.get() for _ in procs]
    for p in procs:
        p.join()
    ok = sum(r[0] for r in res)
    wall = max(r[2] for r in res)
    return {"requests_per_s": ok / wall, "completed": ok, "errors": sum(r[1] for r in res), "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000, help="sequential requests per path (latency)")
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight (throughput)")
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of each throughput run")
    ap.add_argument("--clients", type=int, default=2, help="client processes (throughput)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--uvloop", action="store_true", help="run the gateway on uvloop (coral up runs asyncio's own loop)"
    )
    ap.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    import anyio

    up, up_url = start("upstream")
    gw, gw_url = start("gateway", up_url, "uvloop" if args.uvloop else "asyncio")
    try:
        direct, via = anyio.run(latencies, up_url, gw_url, args.requests, backend="asyncio")
        lat = {
            "direct_p50_ms": pct(direct, 0.5) * 1e3,
            "direct_p99_ms": pct(direct, 0.99) * 1e3,
            "gateway_p50_ms": pct(via, 0.5) * 1e3,
            "gateway_p99_ms": pct(via, 0.99) * 1e3,
        }
        lat["added_p50_ms"] = lat["gateway_p50_ms"] - lat["direct_p50_ms"]
        lat["added_p99_ms"] = lat["gateway_p99_ms"] - lat["direct_p99_ms"]
        lat["added_mean_ms"] = (statistics.fmean(via) - statistics.fmean(direct)) * 1e3
        c0 = cpu_s(gw.pid)
        tp_gw = throughput(gw_url, args.concurrency, args.seconds, args.clients)
        tp_gw["gateway_cpu_ms_per_request"] = (cpu_s(gw.pid) - c0) / max(tp_gw["completed"], 1) * 1e3
        tp_gw["per_core_requests_per_s"] = 1e3 / tp_gw["gateway_cpu_ms_per_request"]
        tp_direct = throughput(up_url, args.concurrency, args.seconds, args.clients)
    finally:
        for p in (gw, up):
            p.terminate()
            p.wait()
    load1, load5, _ = os.getloadavg()
    out = {
        "latency": lat,
        "requests_per_path": args.requests,
        "throughput_gateway": tp_gw,
        "throughput_direct": tp_direct,
        "concurrency": args.concurrency,
        "clients": args.clients,
        "gateway_loop": "uvloop" if args.uvloop else "asyncio",
        "cpus": os.cpu_count(),
        "loadavg_1m_5m": [load1, load5],
    }
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    ok = "meets" if lat["added_p50_ms"] < 1.0 else "MISSES"
    print(
        f"gateway benchmark ({os.cpu_count()} CPUs, load average {load1:.1f} / {load5:.1f} over 1 / 5 min; "
        f"gateway on {out['gateway_loop']})"
    )
    print(f"  added latency, {args.requests} sequential requests per path (non-streamed, 16 tokens):")
    print(f"    direct   p50 {lat['direct_p50_ms']:.3f} ms   p99 {lat['direct_p99_ms']:.3f} ms")
    print(f"    gateway  p50 {lat['gateway_p50_ms']:.3f} ms   p99 {lat['gateway_p99_ms']:.3f} ms")
    print(
        f"    added    p50 {lat['added_p50_ms']:.3f} ms   p99 {lat['added_p99_ms']:.3f} ms   (target p50 < 1 ms: {ok})"
    )
    ok = "meets" if tp_gw["requests_per_s"] >= 2000 else "MISSES"
    print(f"  throughput, {args.concurrency} in flight from {args.clients} client processes, {args.seconds:g} s:")
    print(
        f"    through one gateway process {tp_gw['requests_per_s']:,.0f} req/s ({tp_gw['errors']} errors)"
        f"   (target >= 2,000: {ok})"
    )
    print(
        f"    gateway CPU per request {tp_gw['gateway_cpu_ms_per_request']:.3f} ms: "
        f"{tp_gw['per_core_requests_per_s']:,.0f} req/s per core it gets to itself"
    )
    print(f"    direct to the instance      {tp_direct['requests_per_s']:,.0f} req/s (client + instance alone)")
    print("  the machine is shared: client, gateway and instance compete for its cores with other work.")


if __name__ == "__main__":
    main()
