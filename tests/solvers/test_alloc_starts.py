"""Starting plans: a solve is never worse than a plan it is given, however early its deadline cuts it."""

from __future__ import annotations

import itertools

import pytest

from solvers.allocation import AllocationResult, solve_allocation
from solvers.allocation.solve import _restrict, _restrictions
from tests.solvers.alloc_instances import generate


def _no_worse(c: AllocationResult, b: AllocationResult) -> bool:
    tol = 1e-7 * max(1.0, float(c.served_rps.sum() + c.unmet_rps.sum()))
    if c.total_unmet_rps < b.total_unmet_rps - tol:
        return True
    return c.total_unmet_rps <= b.total_unmet_rps + tol and c.objective <= b.objective * (1 + 1e-9) + 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_a_solve_cut_at_once_is_no_worse_than_its_starts(seed: int) -> None:
    """Every baseline's restriction is solved (with time); the whole problem's solve, given their plans and
    a clock that is past its deadline from the first phase on, returns a plan no worse than any of them
    (the portfolio and every other phase are cut), and a replay of its effort returns the same plan."""
    p = generate("core", 4, seed=seed, scarcity=(1.0, 2.5, 6.0)[seed], load=(0.2, 0.5, 1.0)[seed])
    bases, starts = [], []
    for _name, idx in _restrictions(p):
        base = solve_allocation(_restrict(p, idx), deadline_s=30.0, portfolio=False)
        bases.append(base)
        starts.append({(int(idx[i]), r): n for (i, r), n in base.counts.items()})
    ticks = itertools.count()
    cut = solve_allocation(p, deadline_s=1.0, starts=starts, clock=lambda: 0.0 if next(ticks) == 0 else 1e9)
    assert cut.effort.lp == 0  # the deadline had passed before the LP
    for base in bases:
        assert _no_worse(cut, base)
    again = solve_allocation(p, effort=cut.effort, starts=starts)
    assert again.counts == cut.counts and again.objective == cut.objective
