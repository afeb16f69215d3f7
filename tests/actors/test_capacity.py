"""One definition of serving capacity (``coral.capacity``), and the three places that show it agree:
the Prometheus gauge, ``coral up``'s status table and the TUI's deployment view."""

from __future__ import annotations

import io
from types import SimpleNamespace

import attrs
import pytest
from rich.console import Console

from actors.watch import RunState
from coral.capacity import capacity_rps, serving_capacity
from coral.cli.up_status import render_status
from coral.kernel import Envelope
from coral.messages import CapacityShort, FleetUpdate, InstanceInfo, MeshTiming
from coral.messages.plan import NewPlan
from coral.metrics import MeshMetrics
from coral.plan import DeploymentServing, Plan, PlannedInstances
from tui.model import State
from tui.reducer import apply

E, W = "aws-us-east-1", "aws-us-west-2"


def inst(iid: str, dep: str, region: str, mode: str, weight: float, state: str = "serving") -> InstanceInfo:
    return InstanceInfo(iid, dep, f"t-{iid}", region, mode, state, ("g6.xlarge",), (f"n{iid}",), "", weight, 1e9, 0.0)


FLEET = FleetUpdate(
    1,
    10.0,
    (
        inst("1", "chat", E, "prefill", 6.97),
        inst("2", "chat", E, "decode", 4.79),
        inst("3", "chat", W, "prefill", 2.0),  # no decode in its region: serves nothing
        inst("4", "chat", W, "aggregated", 1.5, "retiring"),
        inst("5", "chat", E, "decode", 9.0, "loading"),  # not routable yet
        inst("6", "code", E, "aggregated", 2.25),
        inst("7", "code", E, "aggregated", 3.0, "draining"),
        inst("8", "idle", E, "aggregated", 1.0, "provisioning"),
    ),
)
EXPECTED = {"chat": 4.79 + 1.5, "code": 2.25, "idle": 0.0}
FLEET = attrs.evolve(FLEET, cost_per_hour=52.17)
PLAN = NewPlan(
    Plan(1, 0.0, "coral", "initial", (PlannedInstances("code", "t6", E, 2, ("g6.xlarge",), "aggregated", 21.43, 2.25),),
         (DeploymentServing("code", "m2", 1.0, 4.5, 0.0),), 42.86, 0.0, "optimal", 0.0, 42.86, 0.01),
    (),
)  # fmt: skip


def test_capacity_pairs_prefill_and_decode_per_region() -> None:
    assert serving_capacity(FLEET.instances) == pytest.approx(EXPECTED)
    rows = [("d", E, "prefill", 3.0), ("d", E, "decode", 5.0), ("d", W, "decode", 7.0), ("d", E, "aggregated", 1.0)]
    assert capacity_rps(rows) == pytest.approx({"d": 3.0 + 0.0 + 1.0})
    assert capacity_rps([("d", E, "decode", 5.0)]) == {"d": 0.0}
    assert capacity_rps([]) == {}


def test_metrics_status_and_tui_show_the_same_capacity() -> None:
    m = MeshMetrics({"chat": "m1", "code": "m2", "idle": "m3"})
    m.update(Envelope("publish", "supervisor", "fleet.update", FLEET))
    gauge = {
        s.labels["deployment"]: s.value
        for fam in m.registry.collect()
        if fam.name == "coral_capacity_requests_per_second"
        for s in fam.samples
    }
    assert gauge == pytest.approx(EXPECTED)
    m.update(Envelope("publish", "allocator", "plan.new", PLAN))
    values = {fam.name: fam.samples[0].value for fam in m.registry.collect() if "cost" in fam.name and fam.samples}
    assert values["coral_fleet_cost_dollars_per_hour"] == 52.17  # running now
    assert values["coral_plan_cost_dollars_per_hour"] == 42.86  # planned

    tui = apply(State(), Envelope("publish", "supervisor", "fleet.update", FLEET))
    assert {d: v.capacity for d, v in tui.deployments.items()} == pytest.approx(EXPECTED)

    st = RunState(fleet=FLEET, plan=PLAN)
    st.update(
        Envelope("publish", "supervisor", "fleet.unmet", CapacityShort(9.0, "code", 3.0, 2.25, True, "nodes lost"))
    )
    st.demand = SimpleNamespace(demand={"chat": 1.0, "code": 1.0, "idle": 1.0})  # type: ignore[assignment]
    setup = SimpleNamespace(scenario_name="s", duration_s=60.0, timing=MeshTiming())
    con = Console(file=io.StringIO(), width=200)
    con.print(render_status(setup, st, 1.0, None, None))
    out = con.file.getvalue()  # type: ignore[attr-defined]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if "│" in line]
    shown = {c[0]: float(c[2]) for c in cells if c and c[0] in EXPECTED}
    assert shown == pytest.approx(EXPECTED, abs=0.005)
    assert "cost running $52.17/h, planned $42.86/h" in out
    assert "code: capacity 2.25 req/s below demand 3.00 (unmet 0.75, nodes lost)" in out
