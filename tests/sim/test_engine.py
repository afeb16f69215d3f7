"""Simulator behaviour: determinism, faults and retries, queues, KV pressure, disaggregation, cost, replans."""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest

from coral.messages.mesh import CloudSetup, DemandTuning
from coral.perf import PerfModel
from coral.plan import Plan, PlanRequest
from coral.scenario import FaultEvent, MarketChange
from coral.sim import LengthDist, PoissonArrivals, SimConfig, SimResult, engine, simulate, state, template_paths
from coral.sim.handmade import FixedPlanner, GreedyPlanner, make_plan, single, stage, template
from coral.templates import SINK, SOURCE
from tests.sim import helpers as h

M = "llama-3.1-8b"
PRICE = {"g6e.xlarge": 1.861, "g6.xlarge": 0.805, "p5.4xlarge": 6.88}


def all_accounted(res: SimResult) -> None:
    for s in res.stats.values():
        assert s.requests == s.completed + s.failed
        assert sum(s.reasons.values()) == s.failed


@pytest.mark.slow
def test_same_seed_same_result_other_seed_differs(perf: PerfModel) -> None:
    tpl = single(perf, M, "g6e.xlarge", 64)
    sc = h.scenario(
        [h.deployment(rps=[(0.0, 6.0), (200.0, 10.0)]), h.deployment("b", rps=2.0)],
        duration_s=400,
        events=(FaultEvent(at=250.0, kind="node_loss", region=h.REGION, node="g6e.xlarge"),),
    )
    planner = GreedyPlanner({tpl.id: tpl}, {"chat": [(tpl.id, h.REGION)], "b": [(tpl.id, h.REGION)]})

    def go(seed: int) -> tuple[str, str]:
        r = simulate(sc, {tpl.id: tpl}, perf, planner, seed=seed)
        return json.dumps(r.to_json(), sort_keys=True), repr(list(r.series))

    a, b, c = go(3), go(3), go(4)
    assert a == b
    assert a[0] != c[0]
    keys = set(json.loads(a[0]))
    assert keys == {"requests", "completed", "failed", "goodput_rps", "attainment", "cost", "per_model"}
    assert set(json.loads(a[0])["attainment"]) == {"ttft", "tpot", "both"}
    assert set(json.loads(a[0])["per_model"]) == {"chat", "b"}


def test_node_loss_retries_requests_and_loses_none(perf: PerfModel) -> None:
    tpl = single(perf, M, "g6e.xlarge", 64)
    sc = h.scenario(
        [h.deployment(rps=8.0)],
        duration_s=400,
        events=(
            FaultEvent(at=150.0, kind="node_loss", region=h.REGION, node="g6e.xlarge", count=2),
            FaultEvent(at=300.0, kind="preemption", region=h.REGION, node="g6e.xlarge"),
        ),
    )
    planner = FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 3})
    res = simulate(sc, {tpl.id: tpl}, perf, planner, seed=1)
    all_accounted(res)
    s = res.stats["chat"]
    assert res.retries == s.retries > 0
    assert s.completed > 0.95 * s.requests
    assert res.faults == [150.0, 300.0]
    assert [r.trigger for r in planner.requests].count("fault") == 2
    fault_reqs = [r for r in planner.requests if r.trigger == "fault"]
    # Two of three instances were lost at t=150; the fault replan sees one live and restarts two.
    assert sum(fault_reqs[0].current.values()) == 1
    assert sum(fault_reqs[1].current.values()) == 2


def test_queue_expiry_and_queue_full_fail_with_reasons(perf: PerfModel) -> None:
    tpl = single(perf, M, "g6e.xlarge", 32)
    sc = h.scenario([h.deployment(rps=20.0)], duration_s=300)
    planner = FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1})
    res = simulate(sc, {tpl.id: tpl}, perf, planner, config=SimConfig(queue_timeout_s=5.0))
    all_accounted(res)
    s = res.stats["chat"]
    assert s.reasons.get("queue_timeout", 0) > 0.5 * s.requests
    assert res.to_json()["attainment"]["both"] < 0.3
    res = simulate(sc, {tpl.id: tpl}, perf, planner, config=SimConfig(queue_limit=50, queue_timeout_s=1e6))
    all_accounted(res)
    assert res.stats["chat"].reasons.get("queue_full", 0) > 0.5 * res.stats["chat"].requests


def test_no_instance_at_all_means_queue_timeouts(perf: PerfModel) -> None:
    tpl = single(perf, M, "g6e.xlarge", 32)
    sc = h.scenario([h.deployment(rps=2.0), h.deployment("orphan", rps=1.0)], duration_s=200)
    planner = FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1})
    res = simulate(sc, {tpl.id: tpl}, perf, planner, config=SimConfig(queue_timeout_s=10.0))
    all_accounted(res)
    orphan = res.stats["orphan"]
    assert orphan.requests > 0
    assert orphan.reasons == {"queue_timeout": orphan.requests}
    assert res.stats["chat"].failed == 0


def test_kv_capacity_bounds_admission_and_preempts(perf: PerfModel) -> None:
    """On an L4 (24 GB) the KV cache holds ~24k tokens: far fewer than batch 128 long sequences."""
    node = "g6.xlarge"
    tpl = single(perf, M, node, 128)
    cap = perf.kv_capacity_tokens(M, node, layers=32)
    sc = h.scenario([h.deployment(rps=0.3)], duration_s=300)
    src = PoissonArrivals(0.3, LengthDist(2000, 600, "exponential"), np.random.default_rng(5), end_s=300)
    planner = FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1})
    res = simulate(sc, {tpl.id: tpl}, perf, planner, arrivals={"chat": src}, config=SimConfig(queue_timeout_s=1e6))
    all_accounted(res)
    key = f"{tpl.id}/0"
    assert 0.9 < res.kv_peak[key] <= 1.0
    assert res.preemptions > 0
    s = res.stats["chat"]
    lengths = LengthDist(2000, 600, "exponential")
    same = PoissonArrivals(0.3, lengths, np.random.default_rng(5), end_s=300)
    assert max(i + o for _, i, o in same) < cap  # no request is longer than the whole cache
    assert s.failed == 0


def test_request_longer_than_kv_fails_too_long(perf: PerfModel) -> None:
    node = "g6.xlarge"
    tpl = single(perf, M, node, 16)
    cap = perf.kv_capacity_tokens(M, node, layers=32)
    sc = h.scenario([h.deployment(rps=0.05)], duration_s=400)
    src = PoissonArrivals(0.05, LengthDist(cap, 10, "fixed"), np.random.default_rng(0), end_s=400)
    planner = FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1})
    res = simulate(sc, {tpl.id: tpl}, perf, planner, arrivals={"chat": src})
    s = res.stats["chat"]
    assert s.requests > 0
    assert s.reasons == {"too_long": s.requests}


def test_disaggregated_prefill_decode_counts_kv_transfer(perf: PerfModel) -> None:
    node = "g6.xlarge"  # 10 Gb/s NIC: the KV transfer of a 1155-token prompt is ~0.12 s
    pre_t = single(perf, M, node, 16, mode="prefill")
    dec_t = single(perf, M, node, 16, mode="decode")
    templates = {pre_t.id: pre_t, dec_t.id: dec_t}
    i, o = 1155, 2
    sc = h.scenario([h.deployment(rps=0.05)], duration_s=2000)
    src = PoissonArrivals(0.05, LengthDist(i, o, "fixed"), np.random.default_rng(1), end_s=2000)
    planner = FixedPlanner(templates, {("chat", pre_t.id, h.REGION): 1, ("chat", dec_t.id, h.REGION): 1})
    res = simulate(sc, templates, perf, planner, arrivals={"chat": src})
    s = res.stats["chat"]
    assert s.completed == s.requests > 40
    m = perf.catalog.models[M]
    prefill = float(perf.prefill_s(M, node, layers=32, batch=1, prompt=i))
    step = float(perf.decode_step_s(M, node, layers=32, batch=1, context=i + 1))
    transfer = i * m.kv_bytes_per_token / perf.catalog.nodes[node].nic_bytes_per_s
    assert transfer > 0.2 * (prefill + step)
    assert s.ttft.quantile(0.5) == pytest.approx(prefill, rel=0.05)
    assert s.e2e.quantile(0.5) == pytest.approx(prefill + transfer + step, rel=0.05)
    assert s.tpot.quantile(0.5) == pytest.approx(transfer + step, rel=0.05)


def test_handoffs_go_only_to_compatible_decode_instances(perf: PerfModel) -> None:
    """The router's decode choice: only instances whose KV transfer holds behind the sender (a faster,
    larger one that needs a faster sender gets nothing), by weight among those with room."""
    pre_t = single(perf, M, "g6.xlarge", 16, mode="prefill")
    small = single(perf, M, "g6.xlarge", 4, mode="decode")  # compatible, busy most of the time
    big = attrs.evolve(single(perf, M, "g6e.xlarge", 64, mode="decode"), kv_min_nic=1e15)  # needs a faster sender
    templates = {t.id: t for t in (pre_t, small, big)}
    counts = {("chat", pre_t.id, h.REGION): 1, ("chat", small.id, h.REGION): 1, ("chat", big.id, h.REGION): 1}
    sc = h.scenario([h.deployment(rps=0.2)], duration_s=300)
    res = simulate(sc, templates, perf, FixedPlanner(templates, counts))
    all_accounted(res)
    assert res.stats["chat"].completed == res.stats["chat"].requests > 40
    assert res.stage_utilisation[f"{small.id}/0"] > 0.9
    assert res.stage_utilisation[f"{big.id}/0"] == 0.0


def test_cost_integrates_loading_serving_and_draining(perf: PerfModel) -> None:
    tpl = single(perf, M, "g6e.xlarge", 64)
    price = PRICE["g6e.xlarge"]

    class StepDown:
        def __init__(self) -> None:
            self.calls = 0

        def __call__(self, req: PlanRequest) -> Plan:
            self.calls += 1
            n = 2 if req.at < 300 else 1
            return make_plan(req, {tpl.id: tpl}, {("chat", tpl.id, h.REGION): n}, "step")

    # No demand: nothing to drain, so the removed instance stops at once.
    sc = h.scenario([h.deployment(rps=0.0)], duration_s=600, replan_interval_s=300)
    res = simulate(sc, {tpl.id: tpl}, perf, StepDown())
    assert res.to_json()["cost"] == pytest.approx(price * (2 * 300 + 1 * 300) / 3600, rel=1e-9)
    # Cold start: the instance is paid for while it loads, and serves nothing until it is ready.
    sc = h.scenario([h.deployment(rps=1.0)], duration_s=600)
    cfg = SimConfig(warm_start=False, startup_s=45.0)
    res = simulate(
        sc, {tpl.id: tpl}, perf, FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1}), config=cfg, interval_s=30
    )
    ready = SimConfig().provision_s + perf.load_s(M, "g6e.xlarge", 32) + 45.0
    assert res.to_json()["cost"] == pytest.approx(price * res.end_s / 3600, rel=1e-9)
    first = [r for r in res.series if r[2] == "chat"]
    assert all(r[4] == 0.0 for r in first if r[1] <= ready)
    assert all(r[4] > 0.0 for r in first if r[0] >= ready)
    assert res.stats["chat"].ttft.quantile(0.01) < 1.0 < res.stats["chat"].ttft.quantile(0.99)
    # Under load the removed instance drains its in-flight requests before its nodes go back.
    sc = h.scenario([h.deployment(rps=6.0)], duration_s=600, replan_interval_s=300)
    res = simulate(sc, {tpl.id: tpl}, perf, StepDown(), config=SimConfig(queue_timeout_s=1e6))
    all_accounted(res)
    base = price * (2 * 300 + 1 * res.end_s - 300) / 3600
    extra = res.to_json()["cost"] - base
    assert 0 < extra < price * 120 / 3600


def test_a_new_instance_waits_for_its_nodes_then_its_engine(perf: PerfModel) -> None:
    """A cold instance serves from provision_s + load + startup_s on, the delays of the mesh's cloud:
    the defaults are CloudSetup's, and for_cloud copies a run's."""
    tpl = single(perf, M, "g6e.xlarge", 64)
    cloud = CloudSetup(provision_s=25.0, startup_s=40.0)
    cfg = SimConfig.for_cloud(cloud, warm_start=False)
    assert (cfg.provision_s, cfg.startup_s) == (25.0, 40.0)
    assert (SimConfig().provision_s, SimConfig().startup_s) == (CloudSetup().provision_s, CloudSetup().startup_s)
    sc = h.scenario([h.deployment(rps=1.0)], duration_s=300)
    res = simulate(
        sc, {tpl.id: tpl}, perf, FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1}), config=cfg, interval_s=5
    )
    ready = 25.0 + perf.load_s(M, "g6e.xlarge", 32) + 40.0
    rows = [r for r in res.series if r[2] == "chat"]
    assert all(r[4] == 0.0 for r in rows if r[1] <= ready)
    assert any(r[4] > 0.0 for r in rows if r[0] >= ready)
    with pytest.raises(state.SimError, match="provision_s"):
        SimConfig(provision_s=-1.0)


def test_a_replaced_instance_serves_until_its_replacement_does(perf: PerfModel) -> None:
    """Make before break, as the mesh's supervisor: when a plan swaps templates, the old instance keeps
    serving while the new one loads, so the deployment never has zero capacity and nothing times out."""
    old = single(perf, M, "g6e.xlarge", 64)
    new = single(perf, M, "p5.4xlarge", 64)
    tpls = {old.id: old, new.id: new}

    class Swap:
        def __call__(self, req: PlanRequest) -> Plan:
            tid = old.id if req.at < 300 else new.id
            return make_plan(req, tpls, {("chat", tid, h.REGION): 1}, "swap")

    sc = h.scenario([h.deployment(rps=3.0)], duration_s=900, replan_interval_s=300)
    res = simulate(sc, tpls, perf, Swap(), config=SimConfig(queue_timeout_s=30.0), interval_s=30)
    all_accounted(res)
    rows = [r for r in res.series if r[2] == "chat" and r[1] <= 900]
    assert all(r[4] > 0 for r in rows)  # capacity never drops to zero
    assert res.summary()["failed"] == 0
    ready = 300 + SimConfig().provision_s + perf.load_s(M, "p5.4xlarge", 32) + SimConfig().startup_s
    overlap = [r for r in rows if r[0] >= 300 and r[1] <= ready]
    assert overlap and all(r[8] == 2 for r in overlap)  # both held while the new one loads
    assert all(r[8] == 1 for r in rows if r[0] >= ready + 60)


def test_market_change_reprices_and_replans(perf: PerfModel) -> None:
    tpl = single(perf, M, "g6e.xlarge", 64)
    sc = h.scenario(
        [h.deployment(rps=0.0)],
        duration_s=600,
        market=(MarketChange(at=200.0, region=h.REGION, node="g6e.xlarge", price=4.0, availability=1),),
    )
    planner = FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 2})
    res = simulate(sc, {tpl.id: tpl}, perf, planner)
    assert [r.trigger for r in planner.requests] == ["initial", "market", "interval"]
    market = planner.requests[1]
    assert market.prices[(h.REGION, "g6e.xlarge")] == 4.0
    assert market.availability[(h.REGION, "g6e.xlarge")] == 1
    assert res.to_json()["cost"] == pytest.approx(2 * (PRICE["g6e.xlarge"] * 200 + 4.0 * 400) / 3600)


def test_starts_beyond_availability_wait(perf: PerfModel) -> None:
    tpl = single(perf, M, "p5.4xlarge", 64)  # aws-us-east-1 offers 4
    sc = h.scenario([h.deployment(rps=0.0)], duration_s=300)
    res = simulate(sc, {tpl.id: tpl}, perf, FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 6}))
    assert res.to_json()["cost"] == pytest.approx(4 * PRICE["p5.4xlarge"] * 300 / 3600)
    assert max(r[8] for r in res.series) == 4


def test_demand_series_steps_trigger_replans(perf: PerfModel) -> None:
    tpl = single(perf, M, "g6e.xlarge", 64)
    sc = h.scenario([h.deployment(rps=[(0.0, 2.0), (150.0, 12.0)])], duration_s=400, replan_interval_s=1000)
    planner = GreedyPlanner({tpl.id: tpl}, {"chat": [(tpl.id, h.REGION)]})
    res = simulate(sc, {tpl.id: tpl}, perf, planner)
    assert [(r.at, r.trigger) for r in planner.requests] == [(0.0, "initial"), (150.0, "demand")]
    assert planner.requests[1].demand["chat"] == 12.0
    assert res.replans == 2
    assert res.plan_changes == [0.0, 150.0]


def test_with_the_monitor_a_step_is_planned_for_as_the_mesh_estimates_it(perf: PerfModel) -> None:
    """With SimConfig.monitor the plans follow the mesh's demand estimate of the simulated arrivals: the
    step at 150 s is seen after it, as the 20 s mean rises (several plans on the way up, each for the
    estimate then, not the scenario's 12 req/s), and the estimate ends near 12."""
    tpl = single(perf, M, "g6e.xlarge", 64)
    sc = h.scenario([h.deployment(rps=[(0.0, 2.0), (150.0, 12.0)])], duration_s=400, replan_interval_s=1000)
    planner = GreedyPlanner({tpl.id: tpl}, {"chat": [(tpl.id, h.REGION)]})
    tuning = DemandTuning()
    simulate(sc, {tpl.id: tpl}, perf, planner, config=SimConfig(monitor=tuning, queue_timeout_s=1e6))
    first, *rest = planner.requests
    assert (first.at, first.trigger, first.demand["chat"]) == (0.0, "initial", 2.0)
    ups = [r for r in rest if r.at > 150.0]
    assert ups and all(r.trigger == "demand" for r in rest)
    assert 150.0 < ups[0].at < 150.0 + tuning.avg_s and ups[0].demand["chat"] < 12.0
    assert len(ups) >= 3 and [r.demand["chat"] for r in ups[:3]] == sorted(r.demand["chat"] for r in ups[:3])
    assert ups[-1].demand["chat"] == pytest.approx(12.0, rel=0.3)
    with pytest.raises(state.SimError, match="monitor"):
        SimConfig(monitor=DemandTuning(avg_s=0.0))


def test_with_the_monitor_requests_that_wait_keep_their_instances(perf: PerfModel) -> None:
    """A burst (8 req/s for 30 s) on one warm instance, its new instances 150 s away: the burst's peak
    leaves the estimate's window while 160 requests still wait. The demand must not fall while they wait
    (``coral.demand``'s backlog): before, the plan fell to nothing at 119 s and all 160 failed."""
    tpl = single(perf, M, "g6.xlarge", 64)
    sc = h.scenario([h.deployment(rps=[(0.0, 0.5), (10.0, 8.0), (40.0, 0.0)])], duration_s=400, replan_interval_s=1000)
    planner = GreedyPlanner({tpl.id: tpl}, {"chat": [(tpl.id, h.REGION)]})
    cfg = SimConfig(monitor=DemandTuning(), queue_timeout_s=1e6, provision_s=150.0)
    res = simulate(sc, {tpl.id: tpl}, perf, planner, config=cfg)
    peak = max(planner.requests, key=lambda r: r.demand["chat"])
    falls = [r for r in planner.requests if r.at > peak.at]
    assert falls and falls[0].at > 200.0  # not before the new instances served the queue
    totals = res.to_json()
    assert (totals["completed"], totals["failed"]) == (totals["requests"], 0)


def test_template_paths_decomposes_branching_flow(perf: PerfModel) -> None:
    sts = [
        stage(perf, M, "g6e.xlarge", 0, 16, 32, index=0),
        stage(perf, M, "g6.xlarge", 16, 32, 32, index=1),
        stage(perf, M, "g6.xlarge", 16, 32, 32, index=2),
    ]
    routes = [(SOURCE, 0, 3.0), (0, 1, 2.0), (0, 2, 1.0), (1, SINK, 2.0), (2, SINK, 1.0)]
    tpl = template(perf, M, sts, routes=routes)
    assert sorted(template_paths(tpl)) == [([0, 1], 2.0), ([0, 2], 1.0)]
    res = simulate(
        h.scenario([h.deployment(rps=4.0)], duration_s=300),
        {tpl.id: tpl},
        perf,
        FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1}),
        config=SimConfig(queue_timeout_s=1e6),
    )
    all_accounted(res)
    u = res.stage_utilisation
    assert u[f"{tpl.id}/1"] > u[f"{tpl.id}/2"] > 0


def test_template_without_flow_is_rejected(perf: PerfModel) -> None:
    tpl = template(perf, M, [stage(perf, M, "g6e.xlarge", 0, 32, 8)], routes=[(SOURCE, 0, 0.0), (0, SINK, 0.0)])
    with pytest.raises(ValueError, match="carry no flow"):
        template_paths(tpl)


def test_router_splits_by_capacity_weight(perf: PerfModel, monkeypatch: pytest.MonkeyPatch) -> None:
    small = single(perf, M, "g6e.xlarge", 64)
    big = single(perf, M, "p5.4xlarge", 128)
    templates = {small.id: small, big.id: big}
    taken: dict[str, int] = {small.id: 0, big.id: 0}
    original = engine._Sim._take

    def counting(self: engine._Sim, inst: state.Inst, req: state.Req, t: float) -> bool:
        ok = original(self, inst, req, t)
        if ok:
            taken[inst.tpl.id] += 1
        return ok

    monkeypatch.setattr(engine._Sim, "_take", counting)
    sc = h.scenario([h.deployment(rps=4.0)], duration_s=1000)
    planner = FixedPlanner(templates, {("chat", small.id, h.REGION): 2, ("chat", big.id, h.REGION): 1})
    res = simulate(sc, templates, perf, planner)
    all_accounted(res)
    w_small, w_big = small.requests_per_s(1155, 211), big.requests_per_s(1155, 211)
    assert taken[big.id] / sum(taken.values()) == pytest.approx(w_big / (w_big + 2 * w_small), abs=0.03)
