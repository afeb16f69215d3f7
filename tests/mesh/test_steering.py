"""Make-before-break under steering: sequences of forbid, pin, allow, stockout, demand steps and node
loss in the simulated mesh (``tests/mesh/steering.py``, scenario ``mesh-steer``). No deployment that
serves drops to zero capacity while none of its nodes is lost, and a deployment whose capacity falls
below its demand gets a ``fleet.unmet`` warning with the cause. ``bench/steering.py`` runs them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral.catalog import Catalog
from coral.cli.build import build_library
from coral.cli.jobs import scenario_jobs
from coral.kernel import read_journal
from coral.messages import CapacityShort, FleetAction
from coral.perf import PerfModel
from coral.scenario import load_scenario
from coral.store import TemplateStore
from tests.conftest import shared_build

from .steering import SCENARIO, library, run_sequence, sequences


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, catalog: Catalog, perf: PerfModel) -> Path:
    def build(path: Path) -> None:
        sc = load_scenario(SCENARIO, catalog)
        with TemplateStore(path) as s:
            build_library(perf, s, scenario_jobs(sc), list(sc.node_types), nmax=sc.planner.nmax, rho=sc.planner.rho)

    return shared_build(tmp_path_factory, "steer-templates.sqlite", build)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["forbid-chat", "loss", "mixed"])
async def test_steering_never_empties_a_serving_deployment(
    name: str, store: Path, catalog: Catalog, perf: PerfModel, tmp_path: Path
) -> None:
    journal = tmp_path / f"{name}.journal"
    steps = sequences(library(store, catalog))[name]
    out = await run_sequence(name, steps, catalog, perf, store, journal)
    assert all(what != "skipped" for _, what in out.sent), out.sent
    assert out.zero_s == {}, f"{name}: zero capacity with no node lost: {out.zero_s}"
    assert set(out.min_capacity) == {"chat-8b", "code-14b"}
    records = [r.decode() for r in read_journal(journal) if r.tag in ("fleet.unmet", "fleet.action")]
    short = [m for m in records if isinstance(m, CapacityShort)]
    drains = [m for m in records if isinstance(m, FleetAction) and m.action == "drain"]
    for m in short:
        assert m.short == (m.capacity_rps < m.demand_rps) and m.cause in (
            ("nodes lost", "waiting for nodes", "replacement loading", "plan") if m.short else ("",)
        )
    if name == "forbid-chat":  # the reported case: the forbidden template's instances serve until replaced
        assert out.min_capacity["chat-8b"] >= 2.9 and out.min_capacity["code-14b"] >= 1.8
        assert drains and all(d.reason == "replacement serving" for d in drains if d.deployment == "chat-8b")
    if name == "loss":
        lost = [m for m in short if m.deployment == "code-14b" and m.at >= 30.0]
        assert lost and lost[0].short and lost[0].cause == "nodes lost" and lost[0].capacity_rps == 0.0
        assert out.zero_after_loss_s.get("code-14b", 0.0) > 0
