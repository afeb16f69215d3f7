"""Templates made by an older formulation (or another perf model) stay in a store but are not used."""

from __future__ import annotations

from pathlib import Path

import attrs

from coral.perf import PerfModel
from coral.scenario import Demand, Deployment, Planner, Scenario
from coral.store import Outcome, TemplateStore
from coral.workload import Slo, WorkloadShape
from solvers.library import distinct, formulation_of, is_current, solve_multiset


def test_stale_templates_are_left_out(tmp_path: Path, perf: PerfModel) -> None:
    from actors.compose import library_for
    from coral.cli.planning import deployment_templates

    slo, shape = Slo(2.0, 0.1, 0.9), WorkloadShape(1155, 211)
    tpl, _, _ = solve_multiset(perf, "llama-3.1-8b", ["g6e.xlarge"], "aggregated", slo, shape, key="k-now")
    assert tpl is not None and tpl.formulation == formulation_of(1, tpl.mode) and is_current(tpl, perf.version)
    old = attrs.evolve(tpl, id="k-old", formulation="options-1")
    other_perf = attrs.evolve(tpl, id="k-perf", perf_version="someone-else")
    assert not is_current(old) and is_current(other_perf) and not is_current(other_perf, perf.version)
    dep = Deployment("chat", "llama-3.1-8b", slo, shape, Demand(((0.0, 1.0),)))
    sc = Scenario("s", Path("s.toml"), ("aws-us-east-1",), ("g6e.xlarge",), (dep,), 60.0, Planner(), (), ())
    with TemplateStore(tmp_path / "t.sqlite") as store:
        outs = [Outcome(t.id, t.model, t.mode, slo.key, t.nodes, "kept", t.id, 1.0) for t in (tpl, old, other_perf)]
        store.put(outs, [tpl, old, other_perf])
        assert {t.id for t in store.query(model="llama-3.1-8b")} == {"k-now", "k-old", "k-perf"}
        assert [t.id for t in deployment_templates(store, sc, "coral", perf_version=perf.version)["chat"]] == ["k-now"]
        assert [t.id for t in library_for(store, sc, perf.version)["chat"]] == ["k-now"]
        assert {t.id for t in library_for(store, sc)["chat"]} == {"k-now", "k-perf"}


def test_copies_of_one_multiset_are_used_once(tmp_path: Path, perf: PerfModel) -> None:
    """Two stored templates of one multiset (another time limit or key layout) reach the planner and the
    mesh once: the proven one, else the one with more capacity, else the smaller id."""
    from actors.compose import library_for
    from coral.cli.planning import deployment_templates

    slo, shape = Slo(2.0, 0.1, 0.9), WorkloadShape(1155, 211)
    tpl, _, _ = solve_multiset(perf, "llama-3.1-8b", ["g6e.xlarge"], "aggregated", slo, shape, key="k-b")
    assert tpl is not None and tpl.status == "optimal"
    twin = attrs.evolve(tpl, id="k-c")
    weaker = attrs.evolve(tpl, id="k-a", status="feasible", gap=0.01)
    assert [t.id for t in distinct([weaker, twin, tpl])] == ["k-b"]
    assert [t.id for t in distinct([twin, tpl])] == ["k-b"]
    dep = Deployment("chat", "llama-3.1-8b", slo, shape, Demand(((0.0, 1.0),)))
    sc = Scenario("s", Path("s.toml"), ("aws-us-east-1",), ("g6e.xlarge",), (dep,), 60.0, Planner(), (), ())
    with TemplateStore(tmp_path / "t.sqlite") as store:
        outs = [Outcome(t.id, t.model, t.mode, slo.key, t.nodes, "kept", t.id, 1.0) for t in (tpl, twin, weaker)]
        store.put(outs, [tpl, twin, weaker])
        assert len(store.query(model="llama-3.1-8b")) == 3
        assert [t.id for t in deployment_templates(store, sc, "coral", perf_version=perf.version)["chat"]] == ["k-b"]
        assert [t.id for t in library_for(store, sc, perf.version)["chat"]] == ["k-b"]
