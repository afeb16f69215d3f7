"""Priority weights: under scarcity the serve-first phase serves the deployment of higher priority first."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from solvers.allocation import AllocationInputError, AllocationProblem, AllocTemplate, solve_allocation


def contested(priority: list[float] | None, *, avail: int = 1) -> AllocationProblem:
    """Two models that each need the same one node type, of which ``avail`` nodes exist: one instance
    serves 0.85 / (1000 / 10000 + 250 / 1000) = 2.43 req/s of either; model 0 asks 2 req/s, model 1 1."""
    return AllocationProblem(
        models=("big-demand", "small-demand"),
        demand_rps=[2.0, 1.0],
        mean_in=[1000.0, 1000.0],
        mean_out=[250.0, 250.0],
        kv_bytes_per_token=[1e5, 1e5],
        node_types=("gpu",),
        nic_bytes_s=[1e10],
        regions=("east",),
        price=[[10.0]],
        avail=[[avail]],
        templates=(
            AllocTemplate(0, "aggregated", [1], 10000.0, 1000.0, 60.0, "a"),
            AllocTemplate(1, "aggregated", [1], 10000.0, 1000.0, 60.0, "b"),
        ),
        priority=priority,
    )


@pytest.mark.parametrize("heuristic_only", [False, True])
def test_priority_decides_who_is_served_under_scarcity(heuristic_only: bool) -> None:
    deadline = 1e-9 if heuristic_only else 10.0  # a deadline that cuts every phase: the greedy path's choice
    plain = solve_allocation(contested(None), deadline_s=deadline)
    assert plain.counts == {(0, 0): 1}  # without weights: the larger demand (2 req/s unmet -> 1)
    assert plain.unmet_rps.tolist() == pytest.approx([0.0, 1.0])
    weighted = solve_allocation(contested([1.0, 3.0]), deadline_s=deadline)
    assert weighted.counts == {(1, 0): 1}  # 3 x 1 req/s outweighs 1 x 2 req/s
    assert weighted.unmet_rps.tolist() == pytest.approx([2.0, 0.0])
    if not heuristic_only:
        assert weighted.status == "optimal" and weighted.service_proven
        assert weighted.unmet_bound == pytest.approx(2.0)  # the bound is on the weighted unmet demand


def test_priority_changes_nothing_when_every_demand_is_served() -> None:
    plain = solve_allocation(contested(None, avail=4), deadline_s=10.0)
    weighted = solve_allocation(contested([5.0, 1.0], avail=4), deadline_s=10.0)
    assert plain.counts == weighted.counts == {(0, 0): 1, (1, 0): 1}
    assert weighted.total_unmet_rps == pytest.approx(0.0)


@pytest.mark.parametrize(
    "priority", [[0.0, 1.0], [-1.0, 1.0], [float("nan"), 1.0], [float("inf"), 1.0], [1.0], ["high", 1.0]]
)
def test_bad_priority_is_rejected_by_name(priority: list[object]) -> None:
    ok = contested(None)
    fields = {f.name: getattr(ok, f.name) for f in attrs.fields(AllocationProblem)}
    fields["priority"] = priority
    with pytest.raises(AllocationInputError, match=r"AllocationProblem\.priority"):
        AllocationProblem(**fields)


def test_default_priority_is_one() -> None:
    assert np.array_equal(contested(None).weights, [1.0, 1.0])
