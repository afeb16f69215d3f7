"""The restricted master MIPs (``solvers.allocation.master``): the same optimum as the whole MIP, a real
bound when cut after any round, and exact replays of a deadline inside them."""

from __future__ import annotations

import pytest

import solvers.allocation.solve as solve_module
from solvers.allocation import AllocationResult, SolverEffort, solve_allocation
from tests.solvers.alloc_instances import generate
from tests.solvers.test_allocation import check_plan, cuts_replay_exactly

CASES = [(12, 2), (12, 3), (20, 0), (8, 1)]
"""(templates per model n, seed) of ``generate("core", n, seed, load=0.2)``: every demand can be served,
and the master phase takes several rounds on each at a 1% gap (at 1e-4 the first instance's rounds
reach their node limit, and its whole MIP took minutes)."""

GAP = 1e-2


def _optimum(n: int, seed: int) -> tuple[float, float]:
    """(a lower bound on the optimum, unmet req/s) from the whole MIP without the master phase, to GAP."""
    p = generate("core", n, seed=seed, load=0.2)
    full = solve_allocation(p, effort=SolverEffort(), columns="all", mip_gap=GAP, master=False, portfolio=False)
    assert full.status == "optimal"
    return full.bound, full.total_unmet_rps


@pytest.mark.parametrize(("n", "seed"), CASES)
def test_the_master_rounds_reach_and_prove_the_optimum(n: int, seed: int) -> None:
    p = generate("core", n, seed=seed, load=0.2)
    best, unmet = _optimum(n, seed)
    res = solve_allocation(p, effort=SolverEffort(), columns="all", mip_gap=GAP, portfolio=False)
    check_plan(p, res)
    assert res.effort.master is None  # ran to its end
    assert res.status == "optimal"
    assert res.total_unmet_rps == pytest.approx(unmet, abs=1e-6)
    assert best * (1 - 1e-9) <= res.objective <= best / (1 - GAP)  # within the gap of the whole MIP's bound
    assert res.bound <= res.objective / (1 - 1e-9)
    assert res.split_groups == 0  # proven by the master rounds: the decomposition never ran


@pytest.mark.parametrize(("n", "seed"), CASES[:2])
def test_a_master_cut_after_any_round_has_a_real_bound(n: int, seed: int) -> None:
    """Stopped after round k (later phases skipped), the plan is one of the program's and its bound is at
    most the optimum; 'optimal' only where the bound proves it."""
    p = generate("core", n, seed=seed, load=0.2)
    best, _unmet = _optimum(n, seed)  # the whole MIP's lower bound, within GAP of its optimum
    statuses = []
    for k in range(3):
        cut = SolverEffort(master=(k, 0), decompose=0, cost=0)
        res = solve_allocation(p, effort=cut, columns="all", mip_gap=GAP, portfolio=False)
        check_plan(p, res)
        assert res.bound <= best / (1 - GAP)
        assert res.objective >= best * (1 - 1e-9)
        if res.status == "optimal":
            assert res.objective <= best / (1 - GAP)
        statuses.append(res.status)
    assert statuses[0] != "optimal" and "feasible" in statuses  # round 0 alone proves nothing here


@pytest.mark.slow
def test_a_deadline_inside_the_master_rounds_replays_exactly() -> None:
    """Cut the solve at clock readings all through the master phase (between rounds and inside their MIPs):
    each result's effort replays its plan, bound, gap and status exactly."""
    p = generate("core", 12, seed=2, load=0.2)
    kw: dict[str, object] = {"columns": "all", "mip_gap": GAP, "portfolio": False, "decompose": False}
    masters = {first.effort.master for first in cuts_replay_exactly(p, kw, 12)}
    assert len({m for m in masters if m is not None}) >= 2  # cut in different rounds or at different solutions
    assert SolverEffort.from_mapping(SolverEffort(master=(2, 1)).as_mapping()) == SolverEffort(master=(2, 1))


def test_the_cost_dive_gives_the_master_rounds_a_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """No plan serves every demand before the master rounds (here: no heuristic), the LP does: the cost
    LP's dive finds one, so the rounds run and prove the optimum; skipped, no round runs; cut inside it,
    and at each progress report, each result replays exactly."""
    no_heuristic = [(name, (lambda run: None) if name == "heuristic" else f) for name, f in solve_module._PHASES]
    monkeypatch.setattr(solve_module, "_PHASES", no_heuristic)
    p = generate("core", 12, seed=2, load=0.2)
    kw: dict[str, object] = {"columns": "all", "mip_gap": GAP, "portfolio": False, "decompose": False}
    reports: list[AllocationResult] = []
    res = solve_allocation(p, effort=SolverEffort(), progress=reports.append, **kw)  # type: ignore[arg-type]
    check_plan(p, res)
    assert res.total_unmet_rps == pytest.approx(0.0, abs=1e-6)
    # the heuristic's report (the empty plan), then the dive's: a plan that serves every demand
    assert reports[0].total_unmet_rps > 1.0 and reports[1].total_unmet_rps == pytest.approx(0.0, abs=1e-6)
    for rep in reports:
        replay = solve_allocation(p, effort=rep.effort, **kw)  # type: ignore[arg-type]
        assert (replay.counts, replay.effort, replay.bound, replay.status) == (rep.counts, rep.effort, rep.bound,
                                                                               rep.status)  # fmt: skip
    assert res.status == "optimal" and res.effort.master is None and res.split_groups == 0
    skipped = solve_allocation(p, effort=SolverEffort(dive=0, serve=0, cost=0), **kw)  # type: ignore[arg-type]
    assert skipped.total_unmet_rps > 1.0  # no plan, so no master round: nothing but the empty plan
    dives = {first.effort.dive for first in cuts_replay_exactly(p, kw, 8)}
    assert len({d for d in dives if d is not None}) >= 1  # some cut fell inside the dive
