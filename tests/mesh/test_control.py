"""Operator commands in a running mesh: refused with the field named, confirmed, journaled, and reflected
in the next plan."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.base import HOP_S
from actors.compose import CoralMesh, RunState
from actors.replay import compare, decisions_of, replay_journal
from coral.kernel import Mesh, read_journal
from coral.messages import (
    OPERATOR,
    CommandResult,
    DemandUpdate,
    DrainInstance,
    FleetUpdate,
    ForbidTemplate,
    MarketUpdate,
    NewPlan,
    PauseAllocator,
    PinTemplate,
    Replan,
    SetAvailability,
    SetChurn,
    SetDemand,
    SetPrice,
    SetSlo,
    owner_of,
)
from coral.store import TemplateStore

from .helpers import World

REGION = "aws-us-east-1"


@pytest.mark.slow
async def test_commands_are_validated_confirmed_and_planned(world: World, tmp_path: Path) -> None:
    sc = world.scenario("mesh-steady")
    with TemplateStore(world.store, readonly=True) as store:
        aggregated = sorted(
            t.id for t in store.query(model="llama-3.1-8b") if t.mode == "aggregated" and t.shape.mean_in == 512
        )
    state: dict[str, Any] = {}

    def plan_ids(st: RunState) -> set[str]:
        assert st.plan is not None
        return {i.template_id for i in st.plan.plan.instances}

    def serving(st: RunState) -> str:
        assert st.fleet is not None
        return next(i.id for i in st.fleet.instances if i.state in ("serving", "retiring"))

    script: dict[float, Callable[[RunState], object]] = {
        1.0: lambda st: SetPrice(REGION, "g6.xlarge", -1.0),
        2.0: lambda st: SetAvailability("nowhere", "g6.xlarge", 1),
        3.0: lambda st: SetAvailability(REGION, "p5.48xlarge", 1),
        4.0: lambda st: SetDemand("ghost", 1.0),
        5.0: lambda st: SetSlo("chat-8b", 0.001, 0.0001),
        6.0: lambda st: DrainInstance("i99"),
        7.0: lambda st: ForbidTemplate("no-such-template"),
        10.0: lambda st: ForbidTemplate(sorted(plan_ids(st))[0]),
        14.0: lambda st: PauseAllocator(True),
        16.0: lambda st: Replan(),
        20.0: lambda st: SetDemand("chat-8b", 6.0),
        30.0: lambda st: PauseAllocator(False),
        35.0: lambda st: SetChurn(0.0),
        40.0: lambda st: PinTemplate("chat-8b", aggregated[-1]),
        60.0: lambda st: DrainInstance(serving(st)),
        66.0: lambda st: SetPrice(REGION, "g6e.xlarge", 9.5),
        67.0: lambda st: SetAvailability(REGION, "g5.xlarge", 0),
        70.0: lambda st: PinTemplate("chat-8b", None),
    }

    async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
        state["mesh"] = mesh

    run_state = RunState()

    async def on_step(t: float) -> None:
        make = script.get(t)
        if make is not None:
            cmd = make(run_state)
            state.setdefault("sent", []).append((t, cmd))
            state["mesh"].send(owner_of(cmd), cmd, source=OPERATOR)

    journal = tmp_path / "control.journal"
    setup = world.setup("mesh-steady")
    from actors.compose import run_mesh

    await run_mesh(setup, sc, world.catalog, world.perf, journal=journal, until=80.0, state=run_state,
                   on_start=on_start, on_step=on_step)  # fmt: skip

    results = {r.command + "@" + str(r.at): r for r in run_state.results}
    by_time = {t: r for r in run_state.results for t in [r.at - HOP_S]}  # answered within a hop
    refused = {t: (by_time[t].field, by_time[t].reason) for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0)}
    assert refused[1.0] == ("price", "must be positive, got -1.0")
    assert refused[2.0] == ("region", "unknown region 'nowhere'")
    assert refused[3.0][0] == "node" and "p5.48xlarge" in refused[3.0][1]
    assert refused[4.0][0] == "deployment" and "unknown deployment 'ghost'" in refused[4.0][1]
    assert refused[5.0][0] == "ttft_s" and "no template" in refused[5.0][1]
    assert refused[6.0] == ("instance", "unknown instance 'i99'")
    assert refused[7.0] == ("template_id", "unknown template 'no-such-template'")
    for t in (10.0, 14.0, 16.0, 20.0, 30.0, 35.0, 40.0, 60.0, 66.0, 67.0, 70.0):
        assert by_time[t].ok, (t, by_time[t])
    assert len(results) == len(script)

    decisions = decisions_of(journal)
    plans = [(d.at, d.msg.plan) for d in decisions if isinstance(d.msg, NewPlan)]
    forbidden = state["sent"][7][1].template_id
    assert state["sent"][7][0] == 10.0
    after = [p for at, p in plans if at > 10.0]
    assert after and all(forbidden not in {i.template_id for i in p.instances} for p in after)
    assert not [at for at, _ in plans if 14.0 < at <= 30.0]  # paused: no plan, though re-plan and demand asked
    resumed = next(p for at, p in plans if at > 30.0)
    assert resumed.at == 30.0 + HOP_S and "operator" in resumed.trigger and resumed.demand_rps == 6.0
    pinned = [p for at, p in plans if 40.0 < at <= 70.0]
    assert pinned and all({i.template_id for i in p.instances} <= {aggregated[-1]} for p in pinned)
    fleet = [d.msg for d in decisions if isinstance(d.msg, FleetUpdate) and d.msg.drained_by_operator]
    assert fleet and fleet[0].at == 60.0 + HOP_S
    assert any("fleet" in p.trigger for at, p in plans if at == 60.0 + 2 * HOP_S)
    dem = [d.msg for d in decisions if isinstance(d.msg, DemandUpdate) and d.msg.overrides]
    assert dem[0].at == 20.0 + HOP_S and dem[0].demand == {"chat-8b": 6.0}
    mkt = [d.msg for d in decisions if isinstance(d.msg, MarketUpdate) and d.msg.reason == "operator"]
    assert [(q.node, q.price, q.availability) for m in mkt for q in m.changed] == [
        ("g6e.xlarge", 9.5, 32),
        ("g5.xlarge", 1.006, 0),
    ]
    assert all(not ({"g5.xlarge"} & set(i.nodes)) for at, p in plans if at > 67.0 for i in p.instances)
    # commands are journaled as inputs, so the run replays exactly
    records = list(read_journal(journal))
    cmds = [r for r in records if r.tag.startswith("ctl.") and r.tag not in ("ctl.result", "ctl.alloc_state")]
    assert len(cmds) == len(script) and {r.source for r in cmds} == {OPERATOR}
    # every client sees the allocator's settings change, not only the sender of the command
    shown = [r.decode() for r in records if r.tag == "ctl.alloc_state"]
    assert [s.paused for s in shown].count(True) >= 1 and not shown[0].paused and not shown[-1].paused
    assert any(s.forbidden for s in shown) and any(s.pins for s in shown)
    report = await replay_journal(journal)
    assert report.ok, report.diffs
    assert compare(decisions, decisions) == []
    assert isinstance(run_state.results[0], CommandResult)


@pytest.mark.parametrize(
    ("bad", "good", "field"),
    [(SetChurn(-1.0), SetChurn(2.0), "factor"), (SetDemand("chat-8b", -3.0), SetDemand("chat-8b", 3.0), "rps")],
)
def test_commands_are_checked_before_they_are_sent(bad: object, good: object, field: str) -> None:
    assert bad.problems() == (field, f"must not be negative, got {getattr(bad, field)}")  # type: ignore[attr-defined]
    assert good.problems() is None  # type: ignore[attr-defined]
