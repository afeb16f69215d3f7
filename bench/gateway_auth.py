"""Gateway API-key benchmark: what the key check adds per request (target: under 0.05 ms).

1. The check alone: ``Auth.check`` (find the ``Authorization`` header, SHA-256 of the key, look up its hash)
   and ``Auth.admit`` (the key's model list and its token bucket) on a request's header list as uvicorn
   gives it (8 headers), against a key file of ``--keys`` keys, ``--n`` times; reported: the CPU time per
   request (this thread's, ``time.thread_time``: what the check costs the gateway whatever else runs) and
   the wall time (mean and p99 of batches of 1,000; on a shared machine it includes waiting for a core).
2. In place: the gateway's ASGI application answering ``GET /v1/models`` in this process (no network), with
   and without keys, interleaved in blocks of 500; reported: the median CPU time per request of each and
   their difference.

Both run idle and then again with ``--load`` busy processes spinning beside them (the load), and the machine's
load average is reported with each figure. Run ``python bench/gateway_auth.py [--json] [--load 2]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coral.gateway import Gateway  # noqa: E402
from coral.gateway.auth import ApiKey, Auth, add_key, digest, key_file, save_keys  # noqa: E402


def spin(stop: Any) -> None:
    """A busy process (the load)."""
    x = 0
    while not stop.is_set():
        for _ in range(10000):
            x += 1


def make_keys(d: Path, n: int) -> tuple[Path, str]:
    """A key file of ``n`` keys; the one returned may use model ``chat`` at 1e9 requests/s."""
    path = key_file(d)
    save_keys(path, [ApiKey(f"k{i}", digest(f"key-{i}"), ("chat", "other"), 10.0) for i in range(n - 1)])
    return path, add_key(path, "bench", ("chat", "b", "c"), 1e9)


def headers(key: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"host", b"127.0.0.1:8000"),
        (b"user-agent", b"OpenAI/Python 1.40.0"),
        (b"accept", b"application/json"),
        (b"accept-encoding", b"gzip, deflate"),
        (b"content-type", b"application/json"),
        (b"content-length", b"73"),
        (b"x-stainless-lang", b"python"),
        (b"authorization", b"Bearer " + key.encode()),
    ]


def check_cost(path: Path, key: str, n: int) -> dict[str, float]:
    auth = Auth(path)
    hs = headers(key)
    per, cpu = [], []
    for _ in range(max(1, n // 1000)):
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(1000):
            k = auth.check(hs)
            assert k is not None
            auth.admit(k, "chat")
        cpu.append((time.thread_time() - c) / 1000 * 1e6)
        per.append((time.perf_counter() - t) / 1000 * 1e6)
    per.sort()
    return {
        "cpu_mean_us": statistics.fmean(cpu),
        "mean_us": statistics.fmean(per),
        "p50_us": per[len(per) // 2],
        "p99_us": per[int(len(per) * 0.99)],
    }


def in_place(path: Path, key: str, n: int) -> dict[str, float]:
    import anyio

    async def run() -> dict[str, float]:
        open_gw = Gateway({"chat": 16})
        keyed = Gateway({"chat": 16}, auth=Auth(path))

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(msg: Any) -> None:
            if msg["type"] == "http.response.start":
                assert msg["status"] == 200

        def scope(hs: list[tuple[bytes, bytes]]) -> dict[str, Any]:
            return {"type": "http", "path": "/v1/models", "method": "GET", "headers": hs}

        plain, with_key = scope(headers(key)[:-1]), scope(headers(key))
        t_open: list[float] = []
        t_keyed: list[float] = []
        block = 500
        for _ in range(max(1, n // (2 * block))):
            for gw, sc, out in ((open_gw, plain, t_open), (keyed, with_key, t_keyed)):
                c = time.thread_time()
                for _ in range(block):
                    await gw(sc, receive, send)
                out.append((time.thread_time() - c) / block * 1e6)
        a, b = statistics.median(t_open), statistics.median(t_keyed)
        return {"open_cpu_us": a, "keyed_cpu_us": b, "added_cpu_us": b - a}

    return anyio.run(run)


def measure(path: Path, key: str, n: int) -> dict[str, Any]:
    load1, load5, _ = os.getloadavg()
    return {
        "check": check_cost(path, key, n),
        "gateway_v1_models": in_place(path, key, n // 2),
        "loadavg_1m_5m_before": [load1, load5],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="checks per measurement (default: 200,000)")
    ap.add_argument("--keys", type=int, default=1000, help="keys in the key file (default: 1,000)")
    ap.add_argument("--load", type=int, default=2, help="busy processes beside the loaded run (default: 2)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path, key = make_keys(Path(tmp), a.keys)
        idle = measure(path, key, a.n)
        stop = mp.Event()
        procs = [mp.Process(target=spin, args=(stop,), daemon=True) for _ in range(a.load)]
        for p in procs:
            p.start()
        time.sleep(1.0)
        try:
            loaded = measure(path, key, a.n)
        finally:
            stop.set()
            for p in procs:
                p.join(5)
    out = {"keys": a.keys, "n": a.n, "cpus": os.cpu_count(), "idle": idle, f"with_{a.load}_busy_processes": loaded}
    out["target_us"] = 50.0
    if a.json:
        print(json.dumps(out, indent=2))
        return
    for name, r in (("as found", idle), (f"+{a.load} busy processes", loaded)):
        c, g = r["check"], r["gateway_v1_models"]
        la = r["loadavg_1m_5m_before"]
        print(
            f"{name:>22}: key check {c['cpu_mean_us']:.2f} us CPU/request (wall {c['mean_us']:.2f} us mean, "
            f"{c['p99_us']:.2f} us p99 of batches); GET /v1/models in place {g['open_cpu_us']:.1f} -> "
            f"{g['keyed_cpu_us']:.1f} us CPU (+{g['added_cpu_us']:.2f} us); load avg {la[0]:.2f}/{la[1]:.2f}"
        )
    print(f"target: under {out['target_us']:.0f} us (0.05 ms) per request; {a.keys} keys in the file")


if __name__ == "__main__":
    main()
