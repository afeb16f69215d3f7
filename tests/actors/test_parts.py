"""The actors' building blocks without a mesh: hashing, demand estimation, the clouds, the engine, feeds."""

from __future__ import annotations

import pytest

from actors.base import first_tick
from actors.cloud import CloudError, SimCloud, StaticHosts
from actors.feed import ScenarioFeed, Traffic
from actors.replay import Decision, compare
from coral.demand import DemandEstimator
from coral.engines import EngineError, StageAssignment
from coral.engines.sim import SimEngine
from coral.messages import (
    ArrivalBatch,
    FaultInjected,
    FinishTraffic,
    MarketQuotes,
    MarketUpdate,
    MeshTiming,
    Quote,
    WorkItem,
)
from coral.messages.mesh import DemandTuning, Host
from coral.routing import uniform
from coral.store import TemplateStore
from coral.templates import Template

from ..mesh.helpers import World


def test_uniform_is_a_deterministic_hash_in_the_unit_interval() -> None:
    xs = [uniform(7, i, 0) for i in range(20000)]
    assert all(0.0 <= x < 1.0 for x in xs)
    assert xs == [uniform(7, i, 0) for i in range(20000)]
    assert abs(sum(xs) / len(xs) - 0.5) < 0.01
    assert sum(x < 0.25 for x in xs) / len(xs) == pytest.approx(0.25, abs=0.01)
    assert uniform(7, 1, 0) != uniform(7, 1, 1) != uniform(8, 1, 1)
    assert first_tick(-10.0, 1.0) == -9.0 and first_tick(3.0, 0.5) == 3.5 and first_tick(3.2, 0.5) == 3.5


def test_demand_estimate_starts_at_the_prior_covers_a_burst_and_holds_its_peak() -> None:
    tuning = DemandTuning(avg_s=20.0, peak_s=60.0)
    est = DemandEstimator(["a", "b"], {"a": 2.0}, tuning, start=0.0)
    assert est.estimate() == {"a": 2.0, "b": 0.0}
    t = 0.0
    for _ in range(8):  # 40 s at 2 req/s
        est.observe(t, t + 5, {"a": 10})
        t += 5
    assert est.estimate()["a"] == pytest.approx(2.0)
    for _ in range(4):  # a 20 s burst at 6 req/s: the 20 s mean reaches it
        est.observe(t, t + 5, {"a": 30, "b": 5})
        t += 5
    assert est.estimate()["a"] == pytest.approx(6.0)
    assert est.estimate()["b"] == pytest.approx(1.0)
    for _ in range(16):  # back to 2 req/s: held at the peak for the peak window, then it falls
        est.observe(t, t + 5, {"a": 10})
        t += 5
        if t < 60 + 60:
            assert est.estimate()["a"] == pytest.approx(6.0)
    assert est.estimate()["a"] == pytest.approx(2.0)


def test_sim_cloud_provisions_refuses_past_availability_and_kills_on_faults() -> None:
    cloud = SimCloud(provision_s=30.0, seed=1)
    cloud.set_market(MarketUpdate(1, 0.0, (Quote("r", "a", 2.0, 2), Quote("r", "b", 1.0, 5)), ()))
    n1 = cloud.provision("r", "a", 0.0)
    n2 = cloud.provision("r", "a", 0.0, warm=True)
    assert n1 and n2 and cloud.provision("r", "a", 0.0) is None  # availability 2: a stockout
    assert [(e.kind, e.node_id) for e in cloud.poll(0.0)] == [("ready", n2)]
    assert cloud.poll(29.0) == [] and [e.node_id for e in cloud.poll(30.0)] == [n1]
    cloud.release(n1, 31.0)
    assert cloud.provision("r", "a", 31.0) is not None  # a released node frees its slot
    assert cloud.price(n2) == 2.0
    b1, b2 = cloud.provision("r", "b", 40.0, warm=True), cloud.provision("r", "b", 40.0)
    assert b1 and b2
    cloud.poll(40.0)
    killed = cloud.inject(FaultInjected(41.0, "node_loss", "r", "b", 2), 41.0)
    assert killed == [b1]  # the running one dies silently; the provisioning one is reported failed
    assert [(e.kind, e.node_id) for e in cloud.poll(41.0)] == [("failed", b2)]
    n4 = cloud.provision("r", "b", 42.0, warm=True)
    cloud.poll(42.0)
    assert cloud.inject(FaultInjected(43.0, "preemption", "r", "b", 1), 43.0) == [n4]
    assert [(e.kind, e.node_id) for e in cloud.poll(43.0)] == [("preempted", n4)]
    with pytest.raises(CloudError, match="fault kind"):
        cloud.inject(FaultInjected(44.0, "meteor", "r", "b", 1), 44.0)
    with pytest.raises(CloudError, match="unknown node"):
        cloud.release("n99", 0.0)


def test_static_hosts_hand_out_free_hosts_of_the_asked_type() -> None:
    cloud = StaticHosts([Host("h2", "r", "a"), Host("h1", "r", "a"), Host("h3", "r", "b")])
    assert cloud.provision("r", "a", 0.0) == "h1"
    assert cloud.provision("r", "a", 0.0) == "h2"
    assert cloud.provision("r", "a", 0.0) is None
    cloud.release("h1", 1.0)
    assert cloud.provision("r", "a", 2.0) == "h1"
    assert [e.node_id for e in cloud.poll(2.0)] == ["h1", "h2"]
    with pytest.raises(CloudError, match="at least one host"):
        StaticHosts([])


def _templates(world: World, mode: str) -> list[Template]:
    with TemplateStore(world.store, readonly=True) as store:
        return [t for t in store.query(model="llama-3.1-8b") if t.mode == mode and t.shape.mean_in == 512]


def test_sim_engine_serves_drains_and_hands_over_kv(world: World) -> None:
    d = world.scenario("mesh-steady").deployments[0]
    agg = min(_templates(world, "aggregated"), key=lambda t: (len(t.nodes), t.id))
    eng = SimEngine(world.perf)
    ready = eng.load(StageAssignment("i1", d, agg, 0, "aws-us-east-1", head=True), 0.0)
    assert ready > 60.0  # weight load plus the start-up
    eng.serve(ready)
    items = [WorkItem(i, d.name, ready + i, ready + i, 400, 50) for i in range(10)]
    eng.submit(items, ready)
    out = []
    for k in range(1, 120):
        out += eng.poll(ready + k)
    assert sorted(o.id for o in out) == list(range(10)) and all(o.kind == "done" for o in out)
    assert all(it.t_arr < o.t_first < o.t for it, o in zip(items, sorted(out, key=lambda o: o.id), strict=True))
    assert eng.metrics().completed == 10 and eng.metrics().in_flight == 0

    many = [WorkItem(100 + i, d.name, 500.0, 500.0 + i * 0.01, 400, 50) for i in range(200)]
    eng.submit(many, ready + 119)
    eng.poll(501.0)
    back = eng.drain(501.0)
    assert back and all(o.kind == "returned" for o in back) and not eng.drained
    done = []
    for k in range(2, 200):
        done += eng.poll(500.0 + k)
    assert eng.drained and len(back) + len(done) == 200
    eng.submit([WorkItem(999, d.name, 600.0, 600.0, 10, 10)], 600.0)
    assert [o.kind for o in eng.poll(600.0)] == ["returned"]

    follower = SimEngine(world.perf)
    multi = next((t for t in _templates(world, "aggregated") if len(t.stages) == 2), None)
    if multi is not None:
        follower.load(StageAssignment("i2", d, multi, 1, "aws-us-east-1", head=False), 0.0)
        with pytest.raises(EngineError, match="not the head"):
            follower.submit(items, 0.0)
    with pytest.raises(EngineError, match="stages"):
        SimEngine(world.perf).load(StageAssignment("i3", d, agg, 5, "aws-us-east-1", head=True), 0.0)

    pre = _templates(world, "prefill")[0]
    dec = _templates(world, "decode")[0]
    p, q = SimEngine(world.perf), SimEngine(world.perf)
    p.load(StageAssignment("p", d, pre, 0, "r", head=True, warm=True), 0.0)
    q.load(StageAssignment("q", d, dec, 0, "r", head=True, warm=True), 0.0)
    p.serve(0.0)
    q.serve(0.0)
    p.submit([WorkItem(1, d.name, 1.0, 1.0, 2000, 40)], 0.0)
    (h,) = p.poll(10.0)
    assert h.kind == "handoff" and h.t_first == h.t > 1.0
    q.submit([WorkItem(1, d.name, 1.0, h.t, 2000, 40, 0, 1, h.t_first, 1e9)], 0.0)
    (fin,) = [o for k in range(1, 40) for o in q.poll(float(k))]
    assert fin.kind == "done" and fin.t_first == h.t_first
    assert fin.t > h.t + 2000 * world.catalog.models["llama-3.1-8b"].kv_bytes_per_token / 1e9  # paid the transfer


def test_traffic_is_seeded_and_the_feed_sends_arrivals_ahead(world: World) -> None:
    sc = world.scenario("mesh-surge")
    a = Traffic(sc, seed=3, end_s=60.0).take(0.0, 60.0)
    b = Traffic(sc, seed=3, end_s=60.0).take(0.0, 60.0)
    c = Traffic(sc, seed=4, end_s=60.0).take(0.0, 60.0)
    assert a == b and a != c and [r.id for r in a] == list(range(1, len(a) + 1))
    assert 30 < sum(r.t < 40 for r in a) < 60  # 1 req/s for 40 s
    timing = MeshTiming()
    feed = ScenarioFeed(sc, world.catalog, seed=3, timing=timing, start=-10.0, end=60.0)
    first = feed.take(-10.0)
    assert [type(i.msg) for i in first] == [MarketQuotes]
    batches: list[ArrivalBatch] = []
    finish = []
    while (t := feed.next_at()) is not None:
        for inp in feed.take(t):
            if isinstance(inp.msg, ArrivalBatch):
                assert inp.msg.start == inp.at + timing.lookahead_ticks * timing.tick_s
                batches.append(inp.msg)
            elif isinstance(inp.msg, FinishTraffic):
                finish.append(inp.at)
    assert tuple(r for bt in batches for r in bt.requests) == a
    assert finish == [60.0 + timing.drain_s]

    stock = world.scenario("mesh-stockout")
    feed = ScenarioFeed(stock, world.catalog, seed=0, timing=timing, start=-10.0, end=150.0)
    kinds = []
    while (t := feed.next_at()) is not None:
        kinds += [(i.at, type(i.msg).__name__) for i in feed.take(t) if not isinstance(i.msg, ArrivalBatch)]
    assert kinds == [
        (-10.0, "MarketQuotes"),
        (40.0, "MarketQuotes"),
        (100.0, "FaultInjected"),
        (210.0, "FinishTraffic"),
    ]


def test_compare_names_the_differing_fields() -> None:
    a = [Decision("fleet.action", 1.0, "supervisor", Quote("r", "a", 1.0, 2))]
    b = [Decision("fleet.action", 1.0, "supervisor", Quote("r", "a", 1.5, 2))]
    assert compare(a, a) == []
    (diff,) = compare(a, b)
    assert "fleet.action #1 (t=1)" in diff and "price: 1.0 -> 1.5" in diff
    more = compare(a, [*a, *a])
    assert any("the journal has 1 messages, the replay 2" in d for d in more)
