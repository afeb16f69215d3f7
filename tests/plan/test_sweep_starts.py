"""The savings study carries the other columns' plans into Coral's solve: never worse in every cell, even
at a deadline so short that every solve is cut (what a loaded machine does to a longer one)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coral.plan import Plan
from solvers.allocation import SolverEffort
from solvers.planning import request_at
from solvers.study import AVAILABILITY, SCALES, cell_request, sweep_cell
from tests.plan.columns import column_planners


@pytest.mark.slow
def test_coral_is_never_worse_in_every_cell_even_when_every_solve_is_cut(small_env: tuple[Path, Path]) -> None:
    """Every demand scale x availability setting of the default sweep on the small library, every column at
    a 0.02 s deadline: Coral's plan is never worse than any other column's, and its recorded effort (with
    the same starting plans) replays it exactly."""
    sc, cat, made = column_planners(small_env, 0.02)
    planners: dict[str, Callable[..., Plan]] = dict(made)
    coral = planners["coral"]
    calls: list[tuple[Any, tuple[Plan, ...], Plan]] = []

    def kept(req: Any, *, starts: tuple[Plan, ...] = ()) -> Plan:
        calls.append((req, starts, coral(req, starts=starts)))
        return calls[-1][2]

    planners["coral"] = kept
    base = request_at(sc, cat, 0.0, trigger="sweep")
    worse, cut = [], 0
    for setting in AVAILABILITY:
        for scale in SCALES:
            cell = sweep_cell(planners, sc, cell_request(base, scale, setting, cat, 0), scale, setting)
            if cell.worse_than:
                worse.append((scale, setting, cell.worse_than))
            effort = SolverEffort.from_mapping(calls[-1][2].effort)
            cut += effort != SolverEffort()
    assert worse == []
    assert cut >= len(AVAILABILITY) * len(SCALES) // 2  # the deadline did cut most of Coral's solves
    for req, starts, plan in calls[::7]:
        again = coral(req, starts=starts, effort=SolverEffort.from_mapping(plan.effort))
        assert again.instances == plan.instances and again.cost_per_hour == plan.cost_per_hour
