"""The Azure conversation trace against a Coral plan of ``core``: the measured SLO attainment of every
deployment whose plans left no demand unmet is at least its target (issue 5, fidelity).

The conversation-shaped deployments of ``core`` (code-14b is sized for the code shape, and the trace would
drive it with conversation-shaped requests), at N_max = 2, over the trace's first 30 minutes, with the
template library built into a temporary store. The allocator gets a deadline long enough to prove each
plan optimal, so that the plans, and the run, do not depend on the machine's speed.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from coral.catalog import Catalog
from coral.cli.build import build_library
from coral.cli.jobs import scenario_jobs
from coral.cli.planning import make_planner
from coral.perf import PerfModel
from coral.plan import Plan, PlanRequest
from coral.scenario import load_scenario
from coral.sim import simulate
from coral.store import TemplateStore
from tests.conftest import shared_path

CONVERSATION = (1155.0, 211.0)
DURATION_S = 1800.0
DEADLINE_S = 20.0


@pytest.mark.slow
def test_core_plan_meets_its_targets_on_the_conversation_trace(
    tmp_path: Path, catalog: Catalog, perf: PerfModel
) -> None:
    trace = shared_path("traces", "azure-llm-2023-conv.csv")
    core = load_scenario("core", catalog)
    deps = tuple(d for d in core.deployments if (d.shape.mean_in, d.shape.mean_out) == CONVERSATION)
    assert len(deps) == 5
    sc = attrs.evolve(core, deployments=deps, planner=attrs.evolve(core.planner, nmax=2, deadline_s=DEADLINE_S))
    with TemplateStore(tmp_path / "core.sqlite") as store:
        rep = build_library(perf, store, scenario_jobs(sc), list(sc.node_types), nmax=2, rho=sc.planner.rho, workers=1)
        assert rep.kept > 0 and rep.proven == rep.kept
        plan_fn, templates = make_planner("coral", sc, catalog, perf, store)
    plans: list[Plan] = []

    def record(req: PlanRequest) -> Plan:
        plan = plan_fn(req)
        plans.append(plan)
        return plan

    res = simulate(sc, templates, perf, record, seed=0, trace=trace, duration_s=DURATION_S)
    assert plans and all(p.status == "optimal" for p in plans)
    checked = []
    for d in deps:
        if any(s.unmet_rps > 1e-9 for p in plans for s in p.serving if s.deployment == d.name):
            continue
        st = res.stats[d.name]
        assert st.requests > 300
        both = st.attainment()["both"]
        assert both >= d.slo.attainment, (
            f"{d.name}: {both:.3f} of {st.requests} requests met both SLOs, target {d.slo.attainment}"
        )
        checked.append(d.name)
    assert len(checked) == len(deps)  # every plan served the whole demand
