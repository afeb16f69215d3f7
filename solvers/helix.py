"""The Helix baseline: max-flow placement of one model over a fixed heterogeneous cluster.

Helix (ASPLOS'25) places a single model on a given cluster with a max-flow MILP in which each request
path is charged for its own pipeline, and nodes that do not help may carry no flow. The placement MILP
of ``solvers.placement`` (its docstring states that program) charges every node of its multiset for the
multiset's full depth n (n micro-batches in flight, an n-fold bubble, memory for n b sequences) with one
micro-batch b for all its stages (``solvers.library.place_one_batch``, the rule Coral's templates obey).
Applied to a whole cluster at once, that handicapped Helix: k identical nodes that each hold the model
reached 0.28-0.59 of k replicas, and adding nodes lowered its throughput. So Helix here is that MILP over
each group of the cluster, with the best data-parallel split into groups:

Formulation
-----------
Given the cluster C (a multiset of node types), for each non-empty sub-multiset S of C (a group):

- H(S): the placement MILP over exactly the nodes of S, with menus built for S's own depth n_S = |S|
  (``solvers.options.build_problem``), one micro-batch b_S for all of S's stages, the same SLO model as
  Coral's templates (TPOT along each path, TTFT with its queueing share); H(S) is its req/s at the
  deployment's shape and U_H(S) its proven upper bound (0 when infeasible);
- P(S) = max(H(S), max over splits S = A + B of P(A) + P(B), max over S' = S less one node of P(S')):
  groups side by side (data parallel), each with its own depth and batch size; a node may idle;
- U(S): the same recursion over U_H, an upper bound on P(S) (tight when every MILP is optimal).

Helix's throughput on C is P(C), served by the groups that attain it (``HelixPlan.groups``); its status
is ``optimal`` when every MILP that could matter was proven, and its gap (U(C) - P(C)) / U(C). So k
identical nodes that each hold the model reach at least k replicas (k singleton groups), and adding a
node never lowers P. A path inside one group is still charged for the group's size: a group whose
flow forks is charged as deep as its node count, which is Helix's own MILP at worst.

Pure: no process, no clock decisions. HiGHS overruns its time limit (a 10-node cluster given 10 s took
62 s here), so a caller that needs a hard limit runs ``helix_plan`` in a process it can kill
(``actors.solver_process.SolverProcess.call``).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import Counter
from collections.abc import Sequence

import attrs

from coral.perf import PerfModel
from coral.templates import Template
from coral.workload import Slo, WorkloadShape
from solvers.combos import best_split, best_sub, layer_work_bound, splits, sub_multisets
from solvers.library import place_one_batch, template_from_result
from solvers.options import build_problem
from solvers.placement import milp_place
from solvers.problem import PlacementResult

Multiset = tuple[str, ...]


def helix_place(
    perf: PerfModel, model: str, cluster: Sequence[str], slo: Slo, shape: WorkloadShape, *, time_limit: float = 60.0
) -> PlacementResult:
    """The placement MILP over every node of ``cluster`` at once (each stage its own micro-batch, the depth
    of the whole cluster): Helix as this module computed it before the groups."""
    return milp_place(build_problem(perf, model, cluster, "aggregated", slo, shape), time_limit=time_limit)


def helix_id(perf: PerfModel, model: str, cluster: Sequence[str], slo: Slo, shape: WorkloadShape) -> str:
    """A stable id for the Helix placement of ``model`` on ``cluster`` (content hash, ``helix-`` prefix)."""
    text = repr((model, sorted(cluster), slo, shape, perf.version))
    return "helix-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def helix_template(
    perf: PerfModel, model: str, cluster: Sequence[str], slo: Slo, shape: WorkloadShape, *, time_limit: float
) -> tuple[Template | None, PlacementResult]:
    """H(S) of the module docstring for S = ``cluster``: the placement MILP over every node of it, one
    micro-batch for all its stages. Returns the placement as a Template (None when none was found:
    infeasible, or the time limit came first) and the MILP's result (status, bound, gap)."""
    problem = build_problem(perf, model, cluster, "aggregated", slo, shape)
    if layer_work_bound(problem) <= 0:  # no placement: not worth a MILP
        return None, PlacementResult(0.0, "infeasible", 0.0, "bound")
    sub, res = place_one_batch(problem, time_limit=time_limit, placer=milp_place)
    if res.status in ("infeasible", "unknown") or res.value <= 0:
        return None, res
    key = helix_id(perf, model, cluster, slo, shape)
    tpl = template_from_result(perf, sub, res, key=key, model=model, mode="aggregated", slo=slo, shape=shape)
    return tpl, res


@attrs.frozen
class HelixPlan:
    """Helix on one cluster: the groups that serve (each a multiset and its placement), the idle nodes,
    the throughput P(C) in req/s at the shape, its upper bound U(C), and the status of the MILPs."""

    groups: tuple[tuple[Multiset, Template], ...]
    idle: Multiset
    value: float
    bound: float
    status: str
    solve_s: float
    milps: int

    @property
    def gap(self) -> float:
        return max(0.0, (self.bound - self.value) / self.bound) if self.bound > 0 else 0.0


def helix_milps(cluster: Sequence[str]) -> int:
    """How many placement MILPs ``helix_plan`` solves for ``cluster`` (one per sub-multiset, at most)."""
    return len(all_sub_multisets(tuple(sorted(cluster))))


def all_sub_multisets(cluster: Multiset) -> list[Multiset]:
    """Every non-empty sub-multiset of ``cluster`` (sorted), smallest first."""
    c = Counter(cluster)
    types = sorted(c)
    out = []
    for counts in itertools.product(*(range(c[t] + 1) for t in types)):
        ms = tuple(t for t, k in zip(types, counts, strict=True) for _ in range(k))
        if ms:
            out.append(ms)
    return sorted(out, key=lambda s: (len(s), s))


def helix_plan(
    perf: PerfModel, model: str, cluster: Sequence[str], slo: Slo, shape: WorkloadShape, *, time_limit: float
) -> HelixPlan:
    """P(C) of the module docstring: the best data-parallel split of ``cluster`` into groups, each placed by
    the placement MILP at its own depth and batch size (``time_limit`` per MILP; HiGHS may overrun it)."""
    t0 = time.perf_counter()
    whole = tuple(sorted(cluster))
    value: dict[Multiset, float] = {}  # P
    upper: dict[Multiset, float] = {}  # U
    own: dict[Multiset, tuple[Template | None, PlacementResult]] = {}
    choice: dict[Multiset, tuple[str, Multiset, Multiset]] = {}  # how P(S) is attained
    for s in all_sub_multisets(whole):
        tpl, res = helix_template(perf, model, s, slo, shape, time_limit=time_limit)
        own[s] = (tpl, res)
        h = res.value if tpl is not None else 0.0
        u_h = 0.0 if res.status == "infeasible" else max(res.bound, h)
        split, sub = best_split(s, value), best_sub(s, value)
        value[s] = max(h, split, sub)
        upper[s] = max(u_h, best_split(s, upper), best_sub(s, upper))
        if h > 0 and h >= value[s]:
            choice[s] = ("own", s, ())
        elif value[s] <= 0:
            choice[s] = ("none", (), ())
        elif split >= sub:
            a, b = max(splits(s), key=lambda ab: value.get(ab[0], 0.0) + value.get(ab[1], 0.0))
            choice[s] = ("split", a, b)
        else:
            choice[s] = ("sub", max(sub_multisets(s), key=lambda x: value.get(x, 0.0)), ())
    groups: list[tuple[Multiset, Template]] = []

    def collect(s: Multiset) -> None:
        kind, a, b = choice[s]
        if kind == "own":
            tpl = own[s][0]
            assert tpl is not None
            groups.append((s, tpl))
        elif kind == "split":
            collect(a)
            collect(b)
        elif a:
            collect(a)

    if value.get(whole, 0.0) > 0:
        collect(whole)
    used = Counter(n for s, _t in groups for n in s)
    idle = tuple(sorted((Counter(whole) - used).elements()))
    statuses = {r.status for _t, r in own.values()}
    proven = statuses <= {"optimal", "infeasible"}
    return HelixPlan(
        groups=tuple(groups),
        idle=idle,
        value=value.get(whole, 0.0),
        bound=max(upper.get(whole, 0.0), value.get(whole, 0.0)),
        status="optimal" if proven else ("feasible" if value.get(whole, 0.0) > 0 else "unknown"),
        solve_s=time.perf_counter() - t0,
        milps=len(own),
    )
