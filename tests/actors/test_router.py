"""The router on its own, with a fake context: where requests go, what waits, what is retried, what it
reports."""

from __future__ import annotations

import math

import attrs
import pytest

from actors.router import Router
from coral.catalog import Catalog
from coral.messages.control import SloChanged
from coral.messages.fleet import FleetUpdate, InstanceInfo
from coral.messages.mesh import MeshTiming
from coral.messages.requests import (
    ArrivalBatch,
    ArrivalCounts,
    Completions,
    Dispatch,
    FinishTraffic,
    Outcome,
    RequestSpec,
    RoutingStats,
)
from coral.scenario import Scenario, load_scenario

from .fake import FakeContext, attach, envelope

DEP = "chat-8b"


@pytest.fixture(scope="module")
def scenario(catalog: Catalog) -> Scenario:
    return load_scenario("mesh-steady", catalog)


def _inst(iid: str, weight: float, state: str = "serving", head: str = "") -> InstanceInfo:
    return InstanceInfo(iid, DEP, "t1", "us-east", "aggregated", state, ("n",), (f"{iid}-n0",), head or f"w-{iid}",
                        weight, 1e9, 0.0)  # fmt: skip


def _fleet(seq: int, *insts: InstanceInfo, lost: tuple[str, ...] = ()) -> FleetUpdate:
    return FleetUpdate(seq, 0.0, tuple(insts), lost=lost)


def _arrivals(ids: range, t: float = 0.25, reply: bool = False) -> ArrivalBatch:
    return ArrivalBatch(0.0, 1.0, tuple(RequestSpec(i, DEP, t, 100, 10) for i in ids), reply=reply)


def _dispatched(ctx: FakeContext) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for dest, msg in ctx.sent:
        if isinstance(msg, Dispatch):
            out.setdefault(dest, []).extend(item.id for item in msg.items)
    return out


async def _router(
    scenario: Scenario, seed: int = 1, kv_need: dict[str, float] | None = None, **timing: float
) -> tuple[Router, FakeContext]:
    r = Router(timing=attrs.evolve(MeshTiming(instance_queue_s=1e6), **timing), deployments=scenario.deployments,
               seed=seed, kv_need=kv_need)  # fmt: skip
    return r, await attach(r)


async def test_requests_go_to_serving_instances_in_proportion_to_their_weight(scenario: Scenario) -> None:
    r, ctx = await _router(scenario)
    await r.handle(envelope(_fleet(1, _inst("i1", 1.0), _inst("i2", 3.0), _inst("i3", 9.0, state="loading"))))
    await r.handle(envelope(_arrivals(range(4000))))
    await ctx.run_until(1.0)
    got = _dispatched(ctx)
    assert set(got) == {"w-i1", "w-i2"}  # never to a loading instance
    assert sorted(got["w-i1"] + got["w-i2"]) == list(range(4000))
    assert 0.7 < len(got["w-i2"]) / 3000 < 1.3 and 0.7 < len(got["w-i1"]) / 1000 < 1.3
    for dest, msg in ctx.sent:
        assert isinstance(msg, Dispatch) and msg.instance == dest.removeprefix("w-")
        assert all(item.attempt == 0 and item.avail == 0.25 for item in msg.items)  # dispatched at 1/1024 s


async def test_the_draw_depends_on_the_seed_and_the_request_only(scenario: Scenario) -> None:
    async def run(seed: int, order: range) -> dict[str, list[int]]:
        r, ctx = await _router(scenario, seed)
        await r.handle(envelope(_fleet(1, _inst("i1", 1.0), _inst("i2", 1.0))))
        for i in order:
            await r.handle(envelope(_arrivals(range(i, i + 1))))
        await ctx.run_until(1.0)
        return {k: sorted(v) for k, v in _dispatched(ctx).items()}

    first = await run(1, range(200))
    assert first == await run(1, range(199, -1, -1))
    assert first != await run(2, range(200))


async def test_a_request_with_nowhere_to_go_waits_then_fails(scenario: Scenario) -> None:
    r, ctx = await _router(scenario, queue_timeout_s=3.0)
    await r.handle(envelope(_arrivals(range(1), reply=True), source="gateway"))
    await ctx.run_until(3.0)
    assert r.stats[DEP].failed == 0 and r.stats[DEP].arrivals == 1
    await ctx.run_until(4.0)  # queued at its wake 1/1024 s after it came, more than 3 s ago
    assert r.stats[DEP].failed_by == {"no_capacity": 1}
    results = [m for d, m in ctx.sent if d == "gateway"]
    assert [(o.id, o.kind, o.reason) for m in results for o in m.outcomes] == [(0, "failed", "no_capacity")]


async def test_a_lost_instance_s_requests_are_retried_until_the_attempts_run_out(scenario: Scenario) -> None:
    r, ctx = await _router(scenario, max_attempts=2)
    await r.handle(envelope(_fleet(1, _inst("i1", 1.0))))
    await r.handle(envelope(_arrivals(range(3))))
    await ctx.run_until(1.0)
    assert _dispatched(ctx) == {"w-i1": [0, 1, 2]}
    ctx.take()
    await r.handle(envelope(_fleet(2, _inst("i2", 1.0), lost=("i1",))))
    await ctx.run_until(2.0)
    sent, _ = ctx.take()
    assert [(d, [(i.id, i.attempt) for i in m.items]) for d, m in sent] == [("w-i2", [(0, 1), (1, 1), (2, 1)])]
    assert r.stats[DEP].retries == 3
    await r.handle(envelope(_fleet(3, _inst("i3", 1.0), lost=("i2",))))
    await ctx.run_until(3.0)
    assert _dispatched(ctx) == {} and r.stats[DEP].failed_by == {"retries_exhausted": 3}


async def test_completions_are_counted_against_the_slo_and_reported(scenario: Scenario) -> None:
    r, ctx = await _router(scenario, report_s=2.0)
    slo = r.slo[DEP]
    await r.handle(envelope(_fleet(1, _inst("i1", 1.0))))
    await r.handle(envelope(_arrivals(range(2))))
    await ctx.run_until(1.0)
    fast = Outcome(0, "done", 0.25 + slo.ttft_s / 2 + 9 * slo.tpot_s / 2, 0.25 + slo.ttft_s / 2)
    slow = Outcome(1, "done", 0.25 + 2 * slo.ttft_s + 9 * slo.tpot_s / 2, 0.25 + 2 * slo.ttft_s)
    await r.handle(envelope(Completions("i1", 1.0, (fast, slow)), source="w-i1"))
    await r.handle(envelope(Completions("i9", 1.0, (Outcome(1, "failed", 1.0),)), source="w-i9"))  # not its instance
    await ctx.run_until(2.0)
    counts = [m for m in ctx.published if isinstance(m, ArrivalCounts)]
    stats = [m for m in ctx.published if isinstance(m, RoutingStats)]
    assert [c.counts for c in counts] == [{DEP: 2}]
    (row,) = [d for d in stats[-1].deployments if d.deployment == DEP]
    assert (row.arrivals, row.dispatched, row.completed, row.failed, row.slo_met) == (2, 2, 2, 0, 1)
    assert row.window_attainment == 0.5 and not stats[-1].final
    await r.handle(envelope(_arrivals(range(5, 6), t=2.5)))
    await r.handle(envelope(FinishTraffic(3.0)))
    await ctx.run_until(3.0)  # the tick that applies FinishTraffic fails what is open and reports at once
    final = [m for m in ctx.published if isinstance(m, RoutingStats)][-1]
    assert final.final and final.at == 3.0
    (row,) = [d for d in final.deployments if d.deployment == DEP]
    assert (row.completed, row.failed, row.failed_by) == (2, 1, {"unfinished": 1})


async def test_an_instance_holds_what_it_serves_at_capacity_plus_its_queue(scenario: Scenario) -> None:
    # mesh-steady's chat-8b: a request takes up to TTFT + 128 tokens x TPOT (14.8 s) at the SLO, so an
    # instance serving 2 req/s holds about 30 in service: a bound of 2 x 1 s of queue alone would cap it.
    r, ctx = await _router(scenario, instance_queue_s=1.0)
    slo = r.slo[DEP]
    service = slo.ttft_s + scenario.deployments[0].shape.mean_out * slo.tpot_s
    inst = _inst("i1", 2.0)
    assert r.bound(inst) == math.ceil(2.0 * (service + 1.0)) > 2 * service
    await r.handle(envelope(_fleet(1, inst)))
    await r.handle(envelope(_arrivals(range(40))))
    await ctx.run_until(1.0)
    assert len(_dispatched(ctx)["w-i1"]) == r.bound(inst)  # the rest wait in the router


def _pd(iid: str, mode: str, weight: float, nic: float, tid: str = "t1") -> InstanceInfo:
    return InstanceInfo(iid, DEP, tid, "us-east", mode, "serving", ("n",), (f"{iid}-n0",), f"w-{iid}", weight, nic,
                        0.0)  # fmt: skip


async def _handoffs(r: Router, ctx: FakeContext, ids: range, at: float) -> dict[str, list[int]]:
    """Send ``ids`` in through prefill instance p1 and hand each off at ``at``; where their decode went."""
    await r.handle(envelope(_arrivals(ids)))
    await ctx.run_until(at - 0.5)
    ctx.take()
    outs = tuple(Outcome(i, "handoff", at - 0.5, at - 0.6) for i in ids)
    await r.handle(envelope(Completions("p1", at - 0.5, outs), source="w-p1"))
    await ctx.run_until(at)
    return _dispatched(ctx)


async def test_a_handoff_goes_only_to_decode_instances_priced_for_the_sender_s_nic(scenario: Scenario) -> None:
    # p1 sends at 1.25 GB/s: "fast" was priced for senders of at least 1 GB/s, "slow" needs 5 GB/s
    r, ctx = await _router(scenario, kv_need={"fast": 1e9, "slow": 5e9})
    fleet = _fleet(1, _pd("p1", "prefill", 10.0, 1.25e9), _pd("d1", "decode", 1.0, 25e9, "fast"),
                   _pd("d2", "decode", 9.0, 25e9, "slow"))  # fmt: skip
    await r.handle(envelope(fleet))
    got = await _handoffs(r, ctx, range(300), 2.0)
    assert got == {"w-d1": list(range(300))}  # never to d2, though it weighs 9 of 10
    items = [i for d, m in ctx.sent if isinstance(m, Dispatch) for i in m.items]
    assert {(i.kv_nic, i.attempt) for i in items} == {(1.25e9, 0)}


async def test_handoffs_wait_for_a_full_compatible_instance_and_fall_back_only_when_none_is_left(
    scenario: Scenario,
) -> None:
    r, ctx = await _router(scenario, kv_need={"fast": 1e9, "slow": 5e9}, instance_queue_s=1.0, queue_timeout_s=30.0)
    d1 = _pd("d1", "decode", 0.05, 25e9, "fast")
    await r.handle(envelope(_fleet(1, _pd("p1", "prefill", 10.0, 1.25e9), d1, _pd("d2", "decode", 9.0, 25e9, "slow"))))
    got = await _handoffs(r, ctx, range(20), 2.0)
    assert got == {"w-d1": list(range(r.bound(d1)))}  # the rest wait for d1 rather than go to d2
    assert r.bound(d1) < 20 and r.stats[DEP].failed == 0
    ctx.take()
    await r.handle(envelope(_fleet(2, _pd("p1", "prefill", 10.0, 1.25e9), _pd("d2", "decode", 9.0, 25e9, "slow"),
                                   lost=("d1",))))  # fmt: skip
    await ctx.run_until(3.0)
    # d1's requests start again from their prompt; the waiting ones go to d2, the only decode left
    sent = _dispatched(ctx)
    assert sorted(sent["w-d2"]) == list(range(r.bound(d1), 20))
    assert sorted(sent["w-p1"]) == list(range(r.bound(d1)))


async def test_without_kv_needs_every_decode_instance_of_the_region_takes_handoffs(scenario: Scenario) -> None:
    r, ctx = await _router(scenario)
    await r.handle(envelope(_fleet(1, _pd("p1", "prefill", 10.0, 1.25e9), _pd("d1", "decode", 1.0, 25e9, "fast"),
                                   _pd("d2", "decode", 1.0, 25e9, "slow"))))  # fmt: skip
    got = await _handoffs(r, ctx, range(200), 2.0)
    assert set(got) == {"w-d1", "w-d2"} and 0.7 < len(got["w-d1"]) / 100 < 1.3


async def test_requests_an_instance_has_not_started_count_as_waiting(scenario: Scenario) -> None:
    """Of five requests sent to an instance, the three its last report says it has not started are waiting
    (the demand monitor's backlog), the other two in flight; a lost instance's count is forgotten."""
    r, ctx = await _router(scenario, report_s=2.0)
    await r.handle(envelope(_fleet(1, _inst("i1", 1.0))))
    await r.handle(envelope(_arrivals(range(5))))
    await ctx.run_until(1.0)
    assert _dispatched(ctx) == {"w-i1": [0, 1, 2, 3, 4]}
    await r.handle(envelope(Completions("i1", 1.0, (), waiting=3), source="w-i1"))
    await ctx.run_until(2.0)
    (row,) = [
        d for d in [m for m in ctx.published if isinstance(m, RoutingStats)][-1].deployments if d.deployment == DEP
    ]
    assert (row.in_flight, row.queued) == (2, 3)
    await r.handle(envelope(Completions("i1", 2.5, (Outcome(0, "done", 2.5, 1.0),), waiting=0), source="w-i1"))
    await ctx.run_until(4.0)
    (row,) = [
        d for d in [m for m in ctx.published if isinstance(m, RoutingStats)][-1].deployments if d.deployment == DEP
    ]
    assert (row.in_flight, row.queued) == (4, 0)
    await r.handle(envelope(Completions("i1", 4.5, (), waiting=4), source="w-i1"))
    await ctx.run_until(4.75)
    assert r.waiting_at == {"i1": 4}
    await r.handle(envelope(_fleet(2, _inst("i2", 1.0), lost=("i1",))))
    await ctx.run_until(5.0)
    assert "i1" not in r.waiting_at


def _by_instance(r: Router) -> dict[str, set[int]]:
    """What ``Router.at_instance`` must hold: the open requests per instance they were sent to."""
    out: dict[str, set[int]] = {}
    for rid, o in r.open.items():
        if o.instance:
            out.setdefault(o.instance, set()).add(rid)
    return out


async def test_the_requests_held_per_instance_follow_every_change(scenario: Scenario) -> None:
    """Dispatch, completion, failure, handoff, return by a draining instance, loss (retry) and stop: the
    per-instance index the router's bounds read agrees with its open requests after each."""
    r, ctx = await _router(scenario, max_attempts=3)
    await r.handle(envelope(_fleet(1, _pd("p1", "prefill", 5.0, 1e9), _pd("d1", "decode", 5.0, 1e9),
                                   _inst("i1", 1.0), _inst("i2", 1.0))))  # fmt: skip
    await r.handle(envelope(_arrivals(range(40))))
    await ctx.run_until(1.0)
    assert r.at_instance == _by_instance(r) and sum(map(len, r.at_instance.values())) == 40
    first = {iid: sorted(ids) for iid, ids in r.at_instance.items()}
    p1, i1, i2 = first.get("p1", []), first["i1"], first["i2"]
    assert p1 and i1 and i2
    outs = [Outcome(i1[0], "done", 1.5, 1.2), Outcome(i1[1], "failed", 1.5, -1.0, "engine"),
            Outcome(i1[2], "returned", 1.5)]  # fmt: skip
    await r.handle(envelope(Completions("i1", 1.5, tuple(outs)), source="w-i1"))
    await r.handle(envelope(Completions("p1", 1.5, (Outcome(p1[0], "handoff", 1.5, 1.4),)), source="w-p1"))
    await ctx.run_until(2.0)
    assert r.at_instance == _by_instance(r)
    assert i1[0] not in r.open and i1[1] not in r.open and r.open[p1[0]].instance == "d1"
    before = {rid: o.instance for rid, o in r.open.items()}
    await r.handle(envelope(FleetUpdate(2, 2.0, (_pd("p1", "prefill", 5.0, 1e9), _pd("d1", "decode", 5.0, 1e9),
                                                 _inst("i3", 1.0)), lost=("i1",), stopped=("i2",))))  # fmt: skip
    await ctx.run_until(3.0)
    assert r.at_instance == _by_instance(r) and set(r.at_instance) <= {"p1", "d1", "i3"}
    moved = {rid: iid for rid, iid in before.items() if iid in ("i1", "i2")}  # lost (retried) or stopped
    assert len(moved) == len(i1) + len(i2) - 2
    assert all(r.open[rid].instance in ("p1", "i3") for rid in moved)
    assert all(r.open[rid].attempt == (1 if iid == "i1" else 0) for rid, iid in moved.items())
    await r.handle(envelope(FinishTraffic(3.0)))
    await ctx.run_until(4.0)
    assert r.open == {} and r.at_instance == {}


async def test_an_slo_change_moves_the_instances_bounds(scenario: Scenario) -> None:
    r, ctx = await _router(scenario, instance_queue_s=1.0)
    inst = _inst("i1", 2.0)
    await r.handle(envelope(_fleet(1, inst)))
    await r.handle(envelope(_arrivals(range(200))))
    await ctx.run_until(1.0)
    before = r.bound(inst)
    assert len(_dispatched(ctx)["w-i1"]) == before
    slo = r.slo[DEP]
    await r.handle(envelope(SloChanged(DEP, 2 * slo.ttft_s, 2 * slo.tpot_s, slo.attainment, 1.0)))
    await r.handle(envelope(_arrivals(range(200, 201), t=1.5)))  # a wake after the change
    await ctx.run_until(2.0)
    assert r.bound(inst) > before and len(_dispatched(ctx)["w-i1"]) == r.bound(inst)
