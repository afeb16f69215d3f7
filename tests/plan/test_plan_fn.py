"""The CLI's plan function (``coral simulate``, ``coral bench``): it builds the program's columns once and
plans every later request over them, with the same plans as a planner that builds them per request."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral.catalog.types import Catalog
from coral.cli.planning import make_planner
from coral.perf import PerfModel
from coral.plan import PlanRequest
from coral.scenario import load_scenario
from coral.store import TemplateStore
from solvers.planning import Planner, request_at


def test_the_columns_are_built_once_and_the_plans_are_unchanged(
    small_env: tuple[Path, Path], catalog: Catalog, perf: PerfModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario, store_path = small_env
    sc = load_scenario(str(scenario), catalog)
    base = request_at(sc, catalog, 0.0)
    requests = [
        PlanRequest(0.0, {k: v * scale for k, v in base.demand.items()}, base.prices, base.availability, {}, "test")
        for scale in (1.0, 1.7, 0.6)
    ]
    built: list[int] = []
    real = Planner.program_columns

    def counted(self: Planner) -> object:
        built.append(1)
        return real(self)

    with TemplateStore(store_path) as store:
        fresh = []
        for req in requests:  # a new plan function per request: its columns built for that request
            plan_fn, _ = make_planner("coral", sc, catalog, perf, store, deadline_s=60.0)
            fresh.append(plan_fn(req))
        monkeypatch.setattr(Planner, "program_columns", counted)
        plan_fn, _ = make_planner("coral", sc, catalog, perf, store, deadline_s=60.0)
        kept = [plan_fn(req) for req in requests]
    assert len(built) == 1
    for a, b in zip(fresh, kept, strict=True):
        assert b.status == a.status == "optimal"
        assert b.counts() == a.counts() and b.cost_per_hour == a.cost_per_hour
