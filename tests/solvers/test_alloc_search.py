"""The neighbourhood search (``solvers.allocation.neighbourhood``): it only improves the plan, every
progress report inside it replays exactly, and its effort survives a plan record."""

from __future__ import annotations

import pytest

from solvers.allocation import AllocationResult, SolverEffort, solve_allocation
from tests.solvers.alloc_instances import generate
from tests.solvers.test_allocation import check_plan

GAP = 1e-2
ONLY_SEARCH = SolverEffort(master=(0, 0), decompose=0, serve=0, cost=0)
"""Every phase after the search skipped: the plan is the search's."""


def test_the_search_improves_the_heuristic_plan() -> None:
    """On an instance where the heuristic's plan is 6% above the optimum, the search lowers it, each report
    at most the last, and stops at a plan of the program that serves every demand."""
    p = generate("core", 12, seed=3, load=0.2)
    kw: dict[str, object] = {"columns": "all", "mip_gap": GAP, "portfolio": False}
    without = solve_allocation(p, effort=ONLY_SEARCH, search=False, **kw)  # type: ignore[arg-type]
    reports: list[AllocationResult] = []
    res = solve_allocation(p, effort=ONLY_SEARCH, progress=reports.append, **kw)  # type: ignore[arg-type]
    check_plan(p, res)
    assert res.total_unmet_rps == pytest.approx(0.0, abs=1e-6)
    assert res.objective < without.objective - 1.0
    assert res.effort.search is None  # the search ran to its end
    objectives = [r.objective for r in reports]
    assert objectives == sorted(objectives, reverse=True)
    for rep in reports:
        replay = solve_allocation(p, effort=rep.effort, **kw)  # type: ignore[arg-type]
        assert (replay.counts, replay.effort, replay.bound, replay.status) == (rep.counts, rep.effort, rep.bound,
                                                                               rep.status)  # fmt: skip
    whole = solve_allocation(p, effort=SolverEffort(), **kw)  # type: ignore[arg-type]
    assert whole.status == "optimal" and whole.objective <= res.objective


def test_the_search_effort_survives_a_plan_record() -> None:
    effort = SolverEffort(search=(7, 2), master=(1, 0))
    assert SolverEffort.from_mapping(effort.as_mapping()) == effort
    assert effort.as_mapping()["search.7"] == 2
