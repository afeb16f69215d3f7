"""The decomposition's reduced-cost pruning keeps each group's optimum, and the search-first order (the
largest programs) replays exactly wherever a deadline cuts it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import solvers.allocation.decomposition as decomposition
import solvers.allocation.solve as solve_module
from solvers.allocation import SolverEffort, solve_allocation
from solvers.allocation.columns import _columns
from solvers.allocation.heuristics import _embed, _fit
from solvers.allocation.model import _highs, _matrix, _service_hi
from solvers.allocation.relaxation import _lp_job, _LpOutcome
from tests.solvers.alloc_instances import generate
from tests.solvers.test_allocation import check_plan, cuts_replay_exactly


@pytest.mark.parametrize("seed", [pytest.param(2, marks=pytest.mark.slow), 3])  # seed 2: 14 s alone on 2 cores
def test_reduced_costs_prune_each_groups_mip_and_keep_its_optimum(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    p = generate("core", 16, seed=seed, load=0.2)
    c = _columns(p)
    mat = _matrix(c)
    lp = _LpOutcome()
    _lp_job(_highs(mat, mat.cost_obj, _service_hi(c, 0.0), 1e-4, mip=False), c, mat, lp)
    assert lp.duals is not None and lp.unmet == pytest.approx(0.0, abs=1e-6)
    best = solve_allocation(p, effort=SolverEffort(), mip_gap=0.0, columns="all", decompose=False)
    start = _fit(c, _embed(c, dict(best.counts)))
    sizes: list[int] = []
    real = decomposition._mip_job

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        sizes.append(out[2])  # the integer variables the group's MIP kept
        return out

    monkeypatch.setattr(decomposition, "_mip_job", spy)
    plain = decomposition._split_phase(c, mat, start, {}, None, 0.0)
    kept_plain, sizes[:] = sum(sizes), []
    pruned = decomposition._split_phase(c, mat, start, {}, None, 0.0, lp.duals)
    kept_pruned = sum(sizes)
    assert plain.proven and pruned.proven and plain.fits and pruned.fits
    assert pruned.bound == pytest.approx(plain.bound, rel=1e-9)
    assert plain.plan is not None and pruned.plan is not None
    assert float(c.cost @ pruned.plan) == pytest.approx(float(c.cost @ plain.plan), rel=1e-9)
    assert float(c.cost @ pruned.plan) == pytest.approx(best.cost_per_hour, rel=1e-9)
    assert kept_pruned < kept_plain  # the duals left variables out


def test_a_dual_against_an_infinite_bound_prunes_nothing() -> None:
    """Duals that are not feasible for a group (a row dual whose sign meets an infinite bound) give no
    floor, so nothing is left out on their account."""
    p = generate("core", 8, seed=2, load=0.2)
    c = _columns(p)
    mat = _matrix(c)
    cols = np.arange(mat.num_cols - len(mat.dem_models))
    wrong = np.zeros(mat.num_rows)
    rows_without_lower = np.nonzero(~np.isfinite(mat.row_lo))[0]
    assert len(rows_without_lower)
    wrong[rows_without_lower] = 1.0  # a positive dual on a row with no lower bound
    d = mat.cost_obj.copy()
    assert decomposition._group_floor(mat, cols, mat.row_lo, wrong, d) == -np.inf
    assert decomposition._group_floor(mat, cols, mat.row_lo, np.zeros(mat.num_rows), d) == 0.0


def test_a_groups_own_lp_and_first_round_keep_its_optimum(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large group (``ROUND_MIN`` set to 0 here, so that every group of this small program is one) is
    pruned by its own LP's duals and warm-started from a first round over its cheapest variables: the
    groups' optima, their bound and the plan stay those of the plain decomposition."""
    p = generate("core", 16, seed=3, load=0.2)
    c = _columns(p)
    mat = _matrix(c)
    lp = _LpOutcome()
    _lp_job(_highs(mat, mat.cost_obj, _service_hi(c, 0.0), 1e-4, mip=False), c, mat, lp)
    best = solve_allocation(p, effort=SolverEffort(), mip_gap=0.0, columns="all", decompose=False)
    rough = SolverEffort(serve=0, cost=0, dive=0, decompose=0)  # the heuristic's plan
    worse = solve_allocation(p, effort=rough, columns="all", portfolio=False, master=False, search=False)
    assert worse.unmet_rps.sum() == 0 and worse.objective > best.objective * 1.001
    start = _fit(c, _embed(c, dict(worse.counts)))
    plain = decomposition._split_phase(c, mat, start, {}, None, 0.0)
    lps: list[bool] = []
    real = decomposition._group_lp

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        lps.append(out[0] is not None and out[1] > 0)
        return out

    monkeypatch.setattr(decomposition, "_group_lp", spy)
    monkeypatch.setattr(decomposition, "ROUND_MIN", 0)
    rounds = decomposition._split_phase(c, mat, start, {}, None, 0.0, lp.duals)
    assert lps and all(lps)  # every group solved its own LP (and counted its iterations)
    assert plain.proven and rounds.proven and rounds.fits
    assert rounds.bound == pytest.approx(plain.bound, rel=1e-9)
    assert rounds.plan is not None
    assert float(c.cost @ rounds.plan) == pytest.approx(best.cost_per_hour, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("rounds", [False, True])
def test_the_search_first_order_replays_exactly_at_any_cut(rounds: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the search and the decomposition before the master rounds (``SEARCH_FIRST_COLUMNS`` set low so
    that this small program takes that order), every cut replays its plan, bound, gap and status; also
    where every group takes its own LP and first round (``ROUND_MIN`` 0), cut inside them too."""
    monkeypatch.setattr(solve_module, "SEARCH_FIRST_COLUMNS", 0)
    if rounds:
        monkeypatch.setattr(decomposition, "ROUND_MIN", 0)
    p = generate("core", 12, seed=3, load=0.2)
    kw: dict[str, object] = {"columns": "all", "decompose": True, "mip_gap": 1e-2, "master": True}
    whole = solve_allocation(p, effort=SolverEffort(), **kw)  # type: ignore[arg-type]
    check_plan(p, whole)
    assert list(whole.phase_s)[1:5] == ["lp", "heuristic", "cost_dive", "search"]
    cut = cuts_replay_exactly(p, kw, 30 if rounds else 10)
    assert len({tuple(sorted(first.effort.as_mapping().items())) for first in cut}) >= 3
    if rounds:  # some cut fell inside a group's own LP or first round (recorded under -mask)
        assert any(k < 0 for first in cut for k, _n in first.effort.split)


@pytest.mark.parametrize("search_first", [False, True])
def test_in_the_search_first_order_the_search_ends_after_one_quiet_pass(
    search_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the search-first order the search ends after n steps in a row without an improvement (one pass
    over the n neighbourhoods), at any width; in the other only after n such steps at the widest. On this
    instance only the widened neighbourhoods improve the plan, so the search-first search ends after its
    first pass with the heuristic's plan, and the decomposition after it proves a plan within the 1% gap of the
    optimum, as the other order does."""
    monkeypatch.setattr(solve_module, "SEARCH_FIRST_COLUMNS", 0 if search_first else 10**9)
    p = generate("core", 12, seed=3, load=0.2)
    n = len(solve_module._neighbourhoods(_columns(p)))
    starts: list[bytes] = []
    real = solve_module._step

    def spy(c: Any, mat: Any, st: Any, best: np.ndarray, *args: Any) -> Any:
        starts.append(best.tobytes())  # the best plan each step starts from
        return real(c, mat, st, best, *args)

    monkeypatch.setattr(solve_module, "_step", spy)
    # the master rounds skipped (they come first in the other order and would prove the plan)
    effort = SolverEffort(master=(0, 0)) if not search_first else SolverEffort()
    kw: dict[str, object] = {"columns": "all", "decompose": True, "mip_gap": 1e-2, "portfolio": False}
    res = solve_allocation(p, effort=effort, **kw)  # type: ignore[arg-type]
    check_plan(p, res)
    if search_first:
        assert len(starts) == n and len(set(starts)) == 1  # one pass at the narrowest Delta, no improvement
    else:
        assert len(starts) > n and len(set(starts)) >= 2  # the widened steps improved the plan
    # within the 1% gap of the optimum (983.44, the whole MIP's at mip_gap 0)
    assert res.status == "optimal" and 983.4414773690087 * (1 - 1e-9) <= res.objective <= 983.4414773690087 * 1.01
