"""The Helix baseline: one max-flow placement of one model over every node of a fixed cluster.

Helix (ASPLOS'25) places a single model on a given heterogeneous cluster with a max-flow MILP. Here that
is the placement MILP of ``solvers.placement`` (its docstring states the formulation) applied to the whole
cluster as one multiset: every node must be used, no templates, throughput maximised. Coral, given the
same nodes, may use a subset and several templates (see ``bench/helix.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from coral.perf import PerfModel
from coral.workload import Slo, WorkloadShape
from solvers.options import build_problem
from solvers.placement import milp_place
from solvers.problem import PlacementResult


def helix_place(
    perf: PerfModel, model: str, cluster: Sequence[str], slo: Slo, shape: WorkloadShape, *, time_limit: float = 60.0
) -> PlacementResult:
    """Throughput-optimal aggregated placement of ``model`` using every node of ``cluster``."""
    return milp_place(build_problem(perf, model, cluster, "aggregated", slo, shape), time_limit=time_limit)
