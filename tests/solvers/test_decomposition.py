"""The allocation's decomposition on generated instances where models compete for nodes: the same optimum
as the full MIP, in both regimes (every demand served, and some left unmet), merging models where needed."""

from __future__ import annotations

import pytest

from solvers.allocation import SolverEffort, solve_allocation
from tests.solvers.alloc_instances import generate
from tests.solvers.test_allocation import check_plan

CASES = [(1.5, 0.15, 0), (1.5, 0.15, 7), (2.0, 0.15, 0), (2.0, 0.15, 7)] + [(2.0, 0.2, s) for s in (0, 3, 4, 7)]
"""(scarcity, load, seed): of the 16 instances of (1.5, 2.0) x (0.15, 0.2) x seeds (0, 3, 4, 7), all four
that leave demand unmet (2.0 / 0.2) and four that serve every demand; six of the eight merge models. The
16 took 36 s of CPU, these 14 s (2026-12-02, load 8-12)."""


@pytest.mark.slow
def test_decomposition_agrees_with_the_full_mip() -> None:
    merged = unmet = 0
    for scarcity, load, seed in CASES:
        p = generate("core", 12, seed=seed, scarcity=scarcity, load=load)
        # run to completion (no clock): a 60 s deadline was not enough on a loaded 2-core machine
        a = solve_allocation(p, effort=SolverEffort(), mip_gap=0.0, columns="all", decompose=True, master=False)
        b = solve_allocation(p, effort=SolverEffort(), mip_gap=0.0, columns="all", decompose=False)
        check_plan(p, a)
        assert a.status == b.status == "optimal"
        assert a.total_unmet_rps == pytest.approx(b.total_unmet_rps, abs=1e-6)
        assert a.objective == pytest.approx(b.objective, rel=1e-7)
        merged += a.split_groups > p.num_models
        unmet += b.total_unmet_rps > 1e-6
    assert merged >= 3  # the decomposition had to merge models
    assert 0 < unmet < len(CASES)  # both regimes were compared
