"""Bus benchmark: messages/s and request/reply latency through the kernel, over inproc, tcp loopback and
tcp loopback with CurveZMQ (``tcp+curve``: encrypted and authenticated, in-memory keys).

Two clients in one process talk through one broker (all traffic goes client -> ROUTER -> client, as in
the mesh). For each transport and message size it measures:

- throughput: a sender streams N messages to a receiver that decodes each one, with at most ``--window``
  in flight (the broker drops what a lagging receiver cannot queue, so an unwindowed sender only
  measures drops); msgs/s is N over the time from the first send to the last receive; drops are
  reported and should be 0;
- latency: request/reply round trips to an echo client, one at a time; p50/p99 of the round trip.

Messages: ``small`` (three scalar fields, ~30 bytes of msgpack) and ``plan`` (a ~50 KB plan-like
message: a tuple of nested attrs instances). Run ``python bench/bus_bench.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmq

from coral.kernel import Broker, BusClient, ClientKeys, Endpoints, ServerKeys, encode, inproc_endpoints, message


@message("bench.small")
@attrs.frozen
class Small:
    seq: int
    t_ns: int
    value: float


@attrs.frozen
class BenchInstance:
    region: str
    template: str
    nodes: tuple[str, ...]
    count: int
    cost_per_h: float
    capacity: float


@message("bench.plan")
@attrs.frozen
class BigPlan:
    seq: int
    t_ns: int
    instances: tuple[BenchInstance, ...]
    unmet: dict[str, float]


def make_plan(seq: int) -> BigPlan:
    instances = tuple(
        BenchInstance(
            region=f"region-{i % 7}",
            template=f"llama-70b/tpot-50ms/{i:05d}",
            nodes=("g6e.12xlarge", "g6e.12xlarge", "p5.48xlarge"),
            count=i % 5 + 1,
            cost_per_h=12.5 + i / 7,
            capacity=1000.0 + i,
        )
        for i in range(350)
    )
    return BigPlan(seq, time.perf_counter_ns(), instances, {f"model-{k}": k / 3 for k in range(20)})


def make_msg(kind: str, seq: int) -> Any:
    if kind == "small":
        return Small(seq, time.perf_counter_ns(), 1.5)
    return make_plan(seq)


def endpoints_for(transport: str) -> Endpoints:
    if transport == "inproc":
        return inproc_endpoints()
    return Endpoints("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")


def curve_for(transport: str, *names: str) -> tuple[ServerKeys | None, dict[str, ClientKeys | None]]:
    """For ``tcp+curve``: fresh in-memory kernel keys allowing one client key pair per name."""
    if transport != "tcp+curve":
        return None, dict.fromkeys(names)
    spub, ssec = zmq.curve_keypair()
    clients = {}
    for n in names:
        pub, sec = zmq.curve_keypair()
        clients[n] = ClientKeys(n, spub, pub, sec)
    allowed = tuple((c.public, n) for n, c in clients.items())
    return ServerKeys(spub, ssec, None, allowed), dict(clients)


async def throughput(transport: str, kind: str, n: int, window: int) -> dict[str, Any]:
    server, keys = curve_for(transport, "rx", "tx")
    async with Broker(endpoints_for(transport), hwm=10_000, curve=server) as broker:
        ep = broker.endpoints
        async with (
            BusClient("rx", ep, inbox_size=4096, curve=keys["rx"]) as rx,
            BusClient("tx", ep, curve=keys["tx"]) as tx,
        ):
            msgs = [make_msg(kind, i) for i in range(min(n, 64))]
            received = 0
            progress = anyio.Event()
            step = max(1, window // 4)

            async def receive() -> None:
                nonlocal received, progress
                async for _env in rx:
                    received += 1
                    if received % step == 0 or received + broker.stats.dropped >= n:
                        progress.set()
                        progress = anyio.Event()
                        if received + broker.stats.dropped >= n:
                            return

            async with anyio.create_task_group() as tg:
                tg.start_soon(receive)
                t0 = time.perf_counter()
                for i in range(n):
                    while i - received - broker.stats.dropped >= window:  # at most `window` in flight
                        await progress.wait()
                    await tx.send("rx", msgs[i % len(msgs)])
                while received + broker.stats.dropped < n:
                    await progress.wait()
                elapsed = time.perf_counter() - t0
    size = len(encode(msgs[0])[1])
    return {
        "transport": transport,
        "message": kind,
        "body_bytes": size,
        "n": n,
        "window": window,
        "received": received,
        "dropped": broker.stats.dropped,
        "msgs_per_s": round(received / elapsed),
        "mb_per_s": round(received * size / elapsed / 1e6, 1),
    }


async def latency(transport: str, kind: str, n: int) -> dict[str, Any]:
    server, keys = curve_for(transport, "echo", "ask")
    async with Broker(endpoints_for(transport), curve=server) as broker:
        ep = broker.endpoints
        async with (
            BusClient("echo", ep, curve=keys["echo"]) as echo,
            BusClient("ask", ep, curve=keys["ask"]) as ask,
            anyio.create_task_group() as tg,
        ):

            async def serve() -> None:
                async for env in echo:
                    await echo.reply(env, env.msg)

            tg.start_soon(serve)
            msg = make_msg(kind, 0)
            for _ in range(min(200, n)):  # warm up
                await ask.request("echo", msg)
            samples = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                await ask.request("echo", msg)
                samples.append((time.perf_counter_ns() - t0) / 1e3)
            tg.cancel_scope.cancel()
    samples.sort()
    return {
        "transport": transport,
        "message": kind,
        "n": n,
        "rtt_p50_us": round(statistics.median(samples), 1),
        "rtt_p99_us": round(samples[int(0.99 * (len(samples) - 1))], 1),
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for transport in ("inproc", "tcp", "tcp+curve"):
        for kind, n in (("small", args.small), ("plan", args.plan)):
            results.append({"bench": "throughput", **await throughput(transport, kind, n, args.window)})
            results.append({"bench": "latency", **await latency(transport, kind, args.rtt)})
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=200_000, help="small messages per throughput run")
    parser.add_argument("--plan", type=int, default=5_000, help="plan messages per throughput run")
    parser.add_argument("--window", type=int, default=2_000, help="most messages in flight (sender waits)")
    parser.add_argument("--rtt", type=int, default=2_000, help="round trips per latency run")
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    args = parser.parse_args()
    results = anyio.run(main, args, backend="asyncio")
    if args.json:
        for r in results:
            print(json.dumps(r))
        return
    for r in results:
        if r["bench"] == "throughput":
            print(
                f"throughput {r['transport']:9} {r['message']:5} body={r['body_bytes']:>6} B  "
                f"{r['msgs_per_s']:>9,} msg/s  {r['mb_per_s']:>7} MB/s  "
                f"received={r['received']:,} dropped={r['dropped']}"
            )
        else:
            print(
                f"latency    {r['transport']:9} {r['message']:5} round trip p50={r['rtt_p50_us']:>8} us  "
                f"p99={r['rtt_p99_us']:>8} us  (n={r['n']})"
            )


if __name__ == "__main__":
    cli()
