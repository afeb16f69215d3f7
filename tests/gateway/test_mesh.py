"""The gateway and the metrics on a running mesh (as ``coral up --gateway --metrics`` starts them): simulated
requests get placeholder text at the simulated engine's times, proxied ones reach the instances' own HTTP
servers, both are counted as arrivals for the demand monitor, and the metrics endpoint exposes the mesh."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from actors.compose import CoralMesh, run_mesh
from actors.feed import Feed, Input
from actors.replay import replay_journal
from coral.cli.up_cmd import Serve, start_serving
from coral.engines import Engine
from coral.engines.sim import SimEngine
from coral.gateway import GATEWAY_ID_BASE, MeshLink, serving
from coral.gateway import openai as oa
from coral.gateway.server import bind
from coral.gateway.upstream import PlaceholderServer
from coral.kernel import Mesh, read_journal
from coral.messages import ArrivalBatch, ArrivalCounts, RequestResults
from tests.gateway.helpers import sse

from ..mesh.helpers import RECORD_OPTIONS, World

PACE = 25.0


class NoTraffic:
    """A scenario's inputs without its arrivals: every request comes through the gateway."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed

    def next_at(self) -> float | None:
        return self.feed.next_at()

    def take(self, t: float) -> list[Input]:
        return [i for i in self.feed.take(t) if not isinstance(i.msg, ArrivalBatch)]


async def run_with_gateway(
    world: World,
    client: Callable[[str, str, dict[str, int]], Any],
    *,
    engine_factory: Callable[[str], Engine] | None = None,
    journal: Path | None = None,
) -> None:
    """Run mesh-steady paced, with the gateway and the metrics served as ``coral up`` serves them, until
    ``client(gateway_url, metrics_url, counted)`` returns; ``counted`` sums the router's arrival counts."""
    sc = world.scenario("mesh-steady")
    setup = world.setup("mesh-steady", RECORD_OPTIONS, sc)
    gsock, msock = bind("127.0.0.1", 0, "gateway"), bind("127.0.0.1", 0, "metrics")
    urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in (gsock, msock)]
    serve = Serve(gsock, msock)
    stop = anyio.Event()
    links: list[MeshLink] = []
    counted: dict[str, int] = {}
    feed = NoTraffic(CoralMesh(setup, sc, world.catalog, world.perf).feed())
    async with anyio.create_task_group() as tg:

        async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
            await start_serving(serve, mesh, sc, setup.seed, tg, links, Console(quiet=True))
            counts = await mesh.client("counts", subscribe=["req.counts"])

            async def count() -> None:
                async for env in counts:
                    if isinstance(env.msg, ArrivalCounts):
                        for d, n in env.msg.counts.items():
                            counted[d] = counted.get(d, 0) + n

            async def drive_client() -> None:
                try:
                    with anyio.fail_after(120):
                        await client(urls[0], urls[1], counted)
                finally:
                    stop.set()

            tg.start_soon(count)
            tg.start_soon(drive_client)

        def on_step(now: float) -> None:
            for link in links:
                link.step(now)

        await run_mesh(
            setup, sc, world.catalog, world.perf, feed=feed, pace=PACE, stop=stop, on_start=on_start,
            on_step=on_step, engine_factory=engine_factory, journal=journal,
        )  # fmt: skip
        tg.cancel_scope.cancel()


async def wait_ready(s: aiohttp.ClientSession, url: str, model: str) -> None:
    while True:
        async with s.get(url + "/v1/models") as r:
            if any(m["id"] == model and m["ready"] for m in (await r.json())["data"]):
                return
        await anyio.sleep(0.05)


async def post(s: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, str], bytes]:
    async with s.post(url, json=body) as r:
        return r.status, dict(r.headers), await r.read()


async def test_simulated_requests_through_the_gateway(world: World, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    async def client(url: str, murl: str, counted: dict[str, int]) -> None:
        async with aiohttp.ClientSession() as s:
            st, hd, body = await post(s, url + "/v1/completions", {"model": "chat-9b", "prompt": "x"})
            assert st == 404
            await wait_ready(s, url, "chat-8b")
            prompt = "tell me about coral reefs " * 20
            st, hd, body = await post(
                s, url + "/v1/completions", {"model": "chat-8b", "prompt": prompt, "max_tokens": 5}
            )
            assert st == 200, body
            doc = json.loads(body)
            rid = int(doc["id"].split("-")[1])
            assert rid >= GATEWAY_ID_BASE
            assert doc["choices"][0]["text"] == oa.words(rid, 0, 5) and len(doc["choices"][0]["text"].split()) == 5
            assert doc["choices"][0]["finish_reason"] == "length"
            assert doc["usage"] == {"prompt_tokens": oa.estimate_tokens(prompt), "completion_tokens": 5,
                                    "total_tokens": oa.estimate_tokens(prompt) + 5}  # fmt: skip

            msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
            req = {"model": "chat-8b", "messages": msgs, "max_tokens": 40, "stream": True,
                   "stream_options": {"include_usage": True}}  # fmt: skip
            st, hd, body = await post(s, url + "/v1/chat/completions", req)
            assert st == 200 and hd["Content-Type"].startswith("text/event-stream"), body
            events = sse(body)
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            text_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"]["content"]]
            assert text_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert len(text_chunks) >= 2  # the tokens came as the simulated engine made them, not all at once
            rid2 = int(chunks[0]["id"].split("-")[1])
            content = "".join(c["choices"][0]["delta"]["content"] for c in text_chunks)
            assert content == oa.words(rid2, 0, 40)
            assert chunks[-2]["choices"][0]["finish_reason"] == "length"
            chat_prompt = (
                2 * oa.CHAT_MESSAGE_TOKENS + oa.estimate_tokens("be brief") + oa.estimate_tokens("hello there")
            )
            assert chunks[-1]["usage"] == {"prompt_tokens": chat_prompt, "completion_tokens": 40,
                                           "total_tokens": chat_prompt + 40}  # fmt: skip

            # several at once, no max_tokens: the deployment's mean output length
            results: list[tuple[int, dict[str, str], bytes]] = []
            async with anyio.create_task_group() as tg:
                for i in range(6):

                    async def one(i: int = i) -> None:
                        results.append(await post(s, url + "/v1/completions", {"model": "chat-8b", "prompt": f"q{i}"}))

                    tg.start_soon(one)
            assert [r[0] for r in results] == [200] * 6
            assert all(json.loads(r[2])["usage"]["completion_tokens"] == 128 for r in results)
            assert all(json.loads(r[2])["choices"][0]["finish_reason"] == "stop" for r in results)

            huge = {"model": "chat-8b", "prompt": list(range(400_000)), "max_tokens": 4}
            st, _hd, body = await post(s, url + "/v1/completions", huge)  # the simulated instance fails it
            assert st == 400 and "too_long" in json.loads(body)["error"]["message"], body

            while counted.get("chat-8b", 0) < 9:  # every request counted once for the demand monitor
                await anyio.sleep(0.05)
            await anyio.sleep(0.5)
            seen["counted"] = dict(counted)
            while True:
                async with s.get(murl + "/metrics") as r:
                    assert r.status == 200
                    text = await r.text()
                fams = {f.name: f for f in text_string_to_metric_families(text)}
                arrived = [x.value for x in fams["coral_requests_arrived"].samples if x.name.endswith("_total")]
                if arrived and arrived[0] >= 9:
                    break
                await anyio.sleep(0.1)
            seen["metrics"] = fams

    journal = tmp_path / "gateway.journal"
    await run_with_gateway(world, client, journal=journal)
    assert seen["counted"] == {"chat-8b": 9}
    report = await replay_journal(journal)  # the gateway's requests are journaled inputs: the run replays
    assert report.ok, report.diffs
    assert report.counts.get("req.stats", 0) > 0
    asked, ends_only, progressed = set(), set(), set()
    for r in read_journal(journal):
        msg = r.decode() if r.tag in ("req.arrivals", "req.result") else None
        if isinstance(msg, ArrivalBatch) and msg.reply:
            asked |= {q.id for q in msg.requests}
            ends_only |= set(msg.ends_only)
        elif isinstance(msg, RequestResults):
            progressed |= {o.id for o in msg.outcomes if o.kind == "progress"}
    assert len(asked) == 9 and len(ends_only) == 8  # only the chat request was streamed
    assert progressed == asked - ends_only  # the others got their end, no token progress
    fams = seen["metrics"]

    def value(name: str, sample: str, **labels: str) -> float:
        vals = [
            s.value
            for s in fams[name].samples
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        assert len(vals) == 1, (name, sample, labels, fams[name].samples)
        return vals[0]

    dep = {"deployment": "chat-8b", "model": "llama-3.1-8b"}
    assert value("coral_requests_arrived", "coral_requests_arrived_total", **dep) == 9
    assert value("coral_requests_completed", "coral_requests_completed_total", **dep) == 8
    assert value("coral_requests_failed", "coral_requests_failed_total", reason="too_long", **dep) == 1
    assert value("coral_ttft_seconds", "coral_ttft_seconds_count", **dep) == 8
    assert value("coral_tpot_seconds", "coral_tpot_seconds_count", **dep) == 8
    assert value("coral_ttft_seconds", "coral_ttft_seconds_sum", **dep) > 0
    assert 0 <= value("coral_slo_attainment_ratio", "coral_slo_attainment_ratio", **dep) <= 1
    assert value("coral_instances", "coral_instances", state="serving", **dep) >= 1
    assert value("coral_instances", "coral_instances", state="lost", **dep) == 0
    assert value("coral_capacity_requests_per_second", "coral_capacity_requests_per_second", **dep) > 0
    assert value("coral_demand_requests_per_second", "coral_demand_requests_per_second", **dep) > 0
    assert value("coral_cost_dollars_per_hour", "coral_cost_dollars_per_hour", **dep) > 0
    assert value("coral_plan_solve_seconds", "coral_plan_solve_seconds_count") >= 1
    assert value("coral_fleet_cost_dollars_per_hour", "coral_fleet_cost_dollars_per_hour") > 0
    assert "coral_goodput_requests_per_second" in fams and "coral_spent_dollars" in fams
    gw = "coral_gateway_responses"
    assert value(gw, gw + "_total", path="/v1/completions", code="200") == 7
    assert value(gw, gw + "_total", path="/v1/chat/completions", code="200") == 1
    assert value(gw, gw + "_total", path="/v1/completions", code="404") == 1
    assert value(gw, gw + "_total", path="/v1/completions", code="400") == 1
    assert value("coral_gateway_shed", "coral_gateway_shed_total") == 0
    assert value("coral_gateway_active_requests", "coral_gateway_active_requests") == 0


class HttpSim(SimEngine):
    """A simulated engine that says its instance serves HTTP at ``endpoint`` (a real placeholder server)."""

    def __init__(self, perf: Any, endpoint: str) -> None:
        super().__init__(perf)
        self.endpoint = endpoint


async def test_proxied_requests_are_counted_for_the_demand_monitor(world: World) -> None:
    up = PlaceholderServer("vllm-stand-in")
    seen: dict[str, Any] = {}
    async with serving(up, ("127.0.0.1", 0)) as uurl:

        async def client(url: str, murl: str, counted: dict[str, int]) -> None:
            async with aiohttp.ClientSession() as s:
                await wait_ready(s, url, "chat-8b")
                for i in range(5):
                    st, _hd, body = await post(s, url + "/v1/completions", {"model": "chat-8b", "prompt": f"p{i}"})
                    assert st == 200 and json.loads(body)["served_by"] == "vllm-stand-in", body
                st, _hd, body = await post(
                    s, url + "/v1/completions", {"model": "chat-8b", "prompt": "s", "max_tokens": 3, "stream": True}
                )
                assert st == 200 and sse(body)[-1] == "[DONE]" and len(sse(body)) == 5
                while counted.get("chat-8b", 0) < 6:
                    await anyio.sleep(0.05)
                await anyio.sleep(0.5)
                seen["counted"] = dict(counted)

        await run_with_gateway(world, client, engine_factory=lambda _node: HttpSim(world.perf, uurl))
    assert up.served == 6
    assert seen["counted"] == {"chat-8b": 6}
