"""The Helix baseline: one max-flow placement of one model over every node of a fixed cluster.

Helix (ASPLOS'25) places a single model on a given heterogeneous cluster with a max-flow MILP. Here that
is the placement MILP of ``solvers.placement`` (its docstring states the formulation) applied to the whole
cluster as one multiset: every node must be used, no templates, throughput maximised. Coral, given the
same nodes, may use a subset and several templates (see ``bench/helix.py``).

``helix_place`` is that MILP as it stands (each stage may step its own micro-batch). ``helix_template``
applies the rule Coral's templates obey (``solvers.library``: one micro-batch for every stage of an
instance, as vLLM runs one ``max_num_seqs`` per engine): it solves the same MILP once per batch size and
keeps the best, so that Helix and Coral are judged by one performance model. The ``helix`` planning
policy (``solvers.planning``) uses it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from coral.perf import PerfModel
from coral.templates import Template
from coral.workload import Slo, WorkloadShape
from solvers.library import place_one_batch, template_from_result
from solvers.options import build_problem
from solvers.placement import milp_place
from solvers.problem import PlacementResult


def helix_place(
    perf: PerfModel, model: str, cluster: Sequence[str], slo: Slo, shape: WorkloadShape, *, time_limit: float = 60.0
) -> PlacementResult:
    """Throughput-optimal aggregated placement of ``model`` using every node of ``cluster``."""
    return milp_place(build_problem(perf, model, cluster, "aggregated", slo, shape), time_limit=time_limit)


def helix_id(perf: PerfModel, model: str, cluster: Sequence[str], slo: Slo, shape: WorkloadShape) -> str:
    """A stable id for the Helix placement of ``model`` on ``cluster`` (content hash, ``helix-`` prefix)."""
    text = repr((model, sorted(cluster), slo, shape, perf.version))
    return "helix-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def helix_template(
    perf: PerfModel, model: str, cluster: Sequence[str], slo: Slo, shape: WorkloadShape, *, time_limit: float
) -> tuple[Template | None, PlacementResult]:
    """The Helix placement of ``model`` over every node of ``cluster``, one micro-batch for all its stages.

    Returns the placement as a Template (None when no placement was found: infeasible, or the time limit
    came first) and the MILP's result (status, bound, gap). ``time_limit`` is shared by the batch sizes
    and passed to HiGHS, which may overrun it.
    """
    problem = build_problem(perf, model, cluster, "aggregated", slo, shape)
    sub, res = place_one_batch(problem, time_limit=time_limit, placer=milp_place)
    if res.status in ("infeasible", "unknown") or res.value <= 0:
        return None, res
    key = helix_id(perf, model, cluster, slo, shape)
    return template_from_result(perf, sub, res, key=key, model=model, mode="aggregated", slo=slo, shape=shape), res
