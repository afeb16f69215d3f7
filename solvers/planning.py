"""From scenario, templates and a plan request to the allocation program, and from its result to a Plan.

Policies, on the same allocation program, prices, availability and demand:

- ``coral``: every template (aggregated, and prefill + decode pairs), heterogeneous ones included;
- ``homo``: aggregated templates whose nodes are all of one node type (homogeneous replicas);
- ``pd-homo``: homogeneous prefill and homogeneous decode instances, paired per region;
- ``helix`` (plan and bench only, not a fleet policy): Helix in single-model mode on the clusters Coral
  chose. Coral's plan is solved first; for each (deployment, region), the nodes it uses there (every
  instance, prefill and decode ones included) are Helix's fixed cluster, which ``solvers.helix.helix_plan``
  splits into groups, each placed by the placement MILP at its own depth and batch size (nodes may idle).
  Cost is all those nodes' price (so equal to Coral's); an instance's capacity is its group's req/s at
  the deployment's shape; each group serves at most that times min(utilisation, the queueing-safe
  utilisation below), as a Coral column does, and the deployment's capacity is that sum (unmet demand
  is the rest). Status and gap are the worst of the
  clusters' (each MILP time-limited by ``helix_limit_s``; with ``bounded``, a cluster is given up after
  ``HELIX_HARD`` times its MILPs' limits: then ``unknown``, capacity 0);
  solve time is that of the placements alone (the cluster is Helix's input, so Coral's solve is not
  counted); churn is not modelled (0).

Queueing headroom: a template's TTFT estimate is that of an idle instance, but at the planned utilisation
requests queue. Each template is modelled as an M/M/c queue (Erlang C) and loaded to at most the largest
utilisation u whose TTFT at the quantile q = 1 - (1 - attainment) / 2 still meets the target (the other
half of the miss budget goes to long prompts, which the template's TTFT counts: ``solvers.options``):

    own + W_q(u) <= TTFT target,  W_q(u) = ln(C(c, c u) / (1 - q)) / (c mu (1 - u))  (0 when C <= 1 - q)

where C is the Erlang C probability of waiting. A prefill template is one server of its prompts
(c = 1, service 1 / mu = in / prefill capacity, which is pre_b / b for one stage; own = its ttft less the
batch in progress, sum of pre_b on its longest chain, which the queue wait stands for);
an aggregated one has c = p * b request slots (p micro-batches of b on its longest path), own = its ttft,
and each slot held for c / capacity (Little's law at the template's capacity in req/s at the deployment's
shape: a slot turns over once per c / capacity seconds when every slot is busy), so that u is the same
utilisation, demand / capacity, that the allocator applies. ``safe_utilisation``
finds that u; the column's capacity is scaled by min(1, u / utilisation), so that the allocator's
utilisation target applies to what is left.

Pure: the caller reads the template store and passes the templates in.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from coral.catalog.types import Catalog
from coral.errors import CoralError
from coral.perf import PerfModel
from coral.plan import DeploymentServing, Plan, PlannedInstances, PlanRequest
from coral.scenario import Deployment, Scenario
from coral.templates import SINK, SOURCE, Template
from solvers.allocation import AllocationProblem, AllocationResult, AllocTemplate, SolverEffort, solve_allocation
from solvers.helix import helix_milps, helix_plan
from solvers.options import ttft_share

POLICIES = ("coral", "homo", "pd-homo")
"""The fleet policies: those a run (``coral up``, ``coral simulate``) may plan with."""
PLAN_POLICIES = (*POLICIES, "helix")
"""Policies ``coral plan`` and ``coral bench`` accept: the fleet policies and the fixed-cluster Helix baseline."""
START_UP_S = 60.0
PLACEMENT_STATUS_ORDER = ("optimal", "infeasible", "feasible", "unknown")
"""Placement statuses from best to worst (``infeasible`` is proven: Helix cannot use every node)."""


def policy_admits(policy: str, t: Template) -> bool:
    """Whether a policy may use a template."""
    homogeneous = len(set(t.nodes)) == 1
    if policy in ("coral", "helix"):
        return True
    if policy == "homo":
        return homogeneous and t.mode == "aggregated"
    if policy == "pd-homo":
        return homogeneous and t.mode in ("prefill", "decode")
    raise CoralError(f"unknown policy {policy!r}; choose from {', '.join(PLAN_POLICIES)}")


def erlang_c(servers: int, load: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with ``servers`` servers and offered ``load``
    (arrival rate times service time, < servers)."""
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = load * blocking / (k + load * blocking)
    return servers * blocking / (servers - load * (1.0 - blocking))


@functools.lru_cache(maxsize=1 << 16)
def safe_utilisation(
    own_s: float, service_s: float, servers: int, target_s: float, attainment: float, upto: float = 1.0 - 1e-6
) -> float:
    """Largest utilisation u <= ``upto`` (< 1) at which ``own_s`` plus the attainment-quantile M/M/c wait
    (``servers`` servers of mean service ``service_s``) is at most ``target_s``; 0 if even an idle
    instance misses. (Memoised: the planner asks the same of every template at every plan.)"""
    slack = target_s - own_s
    if slack < 0:
        return 0.0
    miss = 1.0 - attainment

    def wait(u: float) -> float:
        c = erlang_c(servers, u * servers)
        return 0.0 if c <= miss else service_s * math.log(c / miss) / (servers * (1.0 - u))

    lo, hi = 0.0, min(upto, 1.0 - 1e-6)
    if wait(hi) <= slack:
        return hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if wait(mid) <= slack else (lo, mid)
    return lo


def queueing_utilisation(t: Template, d: Deployment, upto: float = 1.0 - 1e-6) -> float:
    """``safe_utilisation`` (at most ``upto``) of a template for a deployment (``upto`` for decode
    templates: they add no TTFT)."""
    batch = min(s.batch for s in t.stages)
    if t.mode == "prefill":
        rate = t.prefill_tok_s / d.shape.mean_in
        if rate <= 0:
            return 0.0
        in_progress = max(sum(t.stages[i].prefill_s for i in chain) for chain in template_chains(t))
        own = max(t.ttft_s - in_progress, 0.0)
        return safe_utilisation(own, 1.0 / rate, 1, d.slo.ttft_s, ttft_share(d.slo.attainment), upto)
    if t.mode == "aggregated":
        slots = max(len(p) for p in template_chains(t)) * batch
        rate = t.requests_per_s(d.shape.mean_in, d.shape.mean_out)
        if rate <= 0:
            return 0.0
        return safe_utilisation(t.ttft_s, slots / rate, slots, d.slo.ttft_s, ttft_share(d.slo.attainment), upto)
    return upto


def template_chains(t: Template) -> list[list[int]]:
    """The stage sequences of a template's source-to-sink routes."""
    nxt: dict[int, list[int]] = {}
    for r in t.routes:
        if r.flow > 0:
            nxt.setdefault(r.src, []).append(r.dst)
    out: list[list[int]] = []

    def walk(u: int, path: list[int]) -> None:
        for v in nxt.get(u, []):
            if v == SINK:
                out.append(path)
            elif v not in path:
                walk(v, [*path, v])

    walk(SOURCE, [])
    return out or [[s.index for s in t.stages]]


def instance_load_s(perf: PerfModel, t: Template) -> float:
    """Seconds from start to serving: the slowest stage's weight load plus a fixed start-up."""
    return START_UP_S + max(perf.load_s(t.model, s.node, s.layers) for s in t.stages)


ProgramColumns = tuple[tuple[AllocTemplate, ...], list[tuple[Deployment, Template]]]
"""``Planner.program_columns``: the program's columns, and the (deployment, template) each stands for."""


@attrs.frozen
class Planner:
    """A plan function bound to a scenario, its templates and a policy."""

    policy: str
    scenario: Scenario
    catalog: Catalog
    perf: PerfModel
    templates: Mapping[str, Sequence[Template]]
    deadline_s: float
    columns: str = "all"
    """``all``: the MIP over every column (exact); ``auto``: column generation at large sizes (LP bound only)."""
    helix_limit_s: float | None = None
    """``helix``: time limit of each cluster's placement MILP (default: ``deadline_s``); HiGHS may overrun it."""
    bounded: Callable[[Callable[[], Any], float], Any] | None = None
    """``helix``: runs a job under a hard limit in seconds, in a process its owner kills (None when it
    overran); without it the placements run here, and HiGHS may overrun their limits."""
    solve: Callable[..., AllocationResult] = solve_allocation
    """Solves the allocation program: ``solve_allocation`` here, or a solver process's ``solve`` (its owner
    passes it in)."""

    def program_columns(self) -> ProgramColumns:
        """The program's columns, one per template of each deployment, and the (deployment, template) each
        stands for. They depend on the templates and the scenario's deployments, node types and utilisation
        only: a caller that plans again over the same templates may keep them (``problem(req, columns)``),
        and the shared tuple also spares their validation (``solvers.allocation.problem``)."""
        sc = self.scenario
        nodes = list(sc.node_types)
        gidx = {n: i for i, n in enumerate(nodes)}
        columns: list[AllocTemplate] = []
        index: list[tuple[Deployment, Template]] = []
        for m, d in enumerate(sc.deployments):
            for t in self.templates[d.name]:
                counts = np.zeros(len(nodes), dtype=np.int64)
                for n, c in t.node_counts.items():
                    counts[gidx[n]] = c
                util = sc.planner.utilisation
                scale = min(1.0, queueing_utilisation(t, d, util) / util)
                columns.append(
                    AllocTemplate(
                        m,
                        t.mode,
                        counts,
                        t.prefill_tok_s * scale,
                        t.decode_tok_s * scale,
                        instance_load_s(self.perf, t),
                        f"{d.name}/{t.id}",
                        t.kv_min_nic,
                    )
                )
                index.append((d, t))
        return tuple(columns), index

    def problem(
        self,
        req: PlanRequest,
        columns: ProgramColumns | None = None,
    ) -> tuple[AllocationProblem, list[tuple[Deployment, Template]]]:
        """The allocation program for ``req`` over ``columns`` (default: ``self.program_columns()``), and its index."""
        sc, cat = self.scenario, self.catalog
        deps = list(sc.deployments)
        nodes = list(sc.node_types)
        regions = list(sc.regions)
        gidx = {n: i for i, n in enumerate(nodes)}
        cols, index = columns if columns is not None else self.program_columns()
        price = np.full((len(regions), len(nodes)), np.inf)
        avail = np.zeros((len(regions), len(nodes)), dtype=np.int64)
        for (r, n), p in req.prices.items():
            if r in regions and n in gidx:
                price[regions.index(r), gidx[n]] = p
        for (r, n), a in req.availability.items():
            if r in regions and n in gidx:
                avail[regions.index(r), gidx[n]] = a
        keys = {c.key for c in cols}
        current = {}
        for (dep, tid, r), cnt in req.current.items():
            key = f"{dep}/{tid}"
            if key in keys and r in regions and cnt > 0:
                current[(key, regions.index(r))] = cnt
        demand = []
        for d in deps:
            v = req.demand.get(d.name, 0.0)
            if v < 0:
                raise CoralError(f"demand for deployment {d.name!r} is negative ({v} req/s)")
            demand.append(v)
        prob = AllocationProblem(
            models=[d.name for d in deps],
            demand_rps=demand,
            mean_in=[d.shape.mean_in for d in deps],
            mean_out=[d.shape.mean_out for d in deps],
            kv_bytes_per_token=[cat.models[d.model].kv_bytes_per_token for d in deps],
            node_types=nodes,
            nic_bytes_s=[cat.nodes[n].nic_bytes_per_s for n in nodes],
            regions=regions,
            price=price,
            avail=avail,
            templates=cols,
            current=current,
            churn_factor=sc.planner.churn_factor,
            utilisation=sc.planner.utilisation,
            priority=[d.priority for d in deps],
        )
        return prob, index

    def __call__(
        self,
        req: PlanRequest,
        *,
        seq: int = 0,
        effort: SolverEffort | None = None,
        starts: Sequence[Plan] = (),
        columns: ProgramColumns | None = None,
    ) -> Plan:
        """The plan for ``req``; with ``starts`` (plans for the same request over some of these templates,
        such as the baselines'), one no worse than any of them. ``columns``: ``program_columns()``, kept
        by a caller that plans again (default: built for this call)."""
        if self.policy == "helix":
            return self.helix_plan(req, seq=seq, effort=effort, columns=columns)[0]
        prob, index = self.problem(req, columns)
        # Coral's solve is a portfolio that contains each baseline's restriction (solvers.allocation)
        kw: dict[str, Any] = {"starts": [_start_of(prob, plan) for plan in starts]} if starts else {}
        res = self.solve(prob, deadline_s=self.deadline_s, effort=effort, columns=self.columns, **kw)
        return to_plan(self, req, prob, index, res, seq=seq)

    def helix_plan(
        self,
        req: PlanRequest,
        *,
        seq: int = 0,
        effort: SolverEffort | None = None,
        columns: ProgramColumns | None = None,
    ) -> tuple[Plan, dict[str, Template]]:
        """The ``helix`` plan (see the module docstring) and the Helix placements it uses, keyed by id."""
        coral = attrs.evolve(self, policy="coral")(req, seq=seq, effort=effort, columns=columns)
        return self.helix_over(coral, req)

    def helix_over(self, coral: Plan, req: PlanRequest) -> tuple[Plan, dict[str, Template]]:
        """Helix on the clusters of the Coral plan ``coral`` made for ``req``, and its placements by id."""
        clusters: dict[tuple[str, str], list[str]] = {}
        for inst in coral.instances:
            clusters.setdefault((inst.deployment, inst.region), []).extend(list(inst.nodes) * inst.count)
        deps = {d.name: d for d in self.scenario.deployments}
        util = self.scenario.planner.utilisation
        limit = self.helix_limit_s if self.helix_limit_s is not None else self.deadline_s
        usable = dict.fromkeys(deps, 0.0)
        insts: list[PlannedInstances] = []
        made: dict[str, Template] = {}
        statuses: list[str] = []
        worst_gap = 0.0
        solve_s = 0.0
        for (name, region), nodes in sorted(clusters.items()):
            d = deps[name]
            cluster = tuple(sorted(nodes))
            t0 = time.perf_counter()
            job = functools.partial(helix_plan, self.perf, d.model, cluster, d.slo, d.shape, time_limit=limit)
            hp = job() if self.bounded is None else self.bounded(job, HELIX_HARD * limit * helix_milps(cluster) + 0.5)
            solve_s += time.perf_counter() - t0  # reported only: menus, MILPs and the templates

            def price(nodes: Sequence[str], region: str = region) -> float:
                return sum(float(req.prices[(region, n)]) for n in nodes)

            if hp is None:
                statuses.append("unknown")
                worst_gap = max(worst_gap, 1.0)
                insts.append(PlannedInstances(name, f"unknown:{'+'.join(cluster)}", region, 1, cluster,
                                              "aggregated", price(cluster), 0.0))  # fmt: skip
                continue
            statuses.append(hp.status if hp.value > 0 or hp.status != "optimal" else "infeasible")
            worst_gap = max(worst_gap, hp.gap)
            for group, tpl in hp.groups:
                made[tpl.id] = tpl
                rps = tpl.requests_per_s(d.shape.mean_in, d.shape.mean_out)
                usable[name] += rps * min(util, queueing_utilisation(tpl, d, util))
                insts.append(PlannedInstances(name, tpl.id, region, 1, group, "aggregated", price(group), rps))
            if hp.idle:
                insts.append(PlannedInstances(name, f"idle:{'+'.join(hp.idle)}", region, 1, hp.idle, "aggregated",
                                              price(hp.idle), 0.0))  # fmt: skip
        serving = []
        for d in self.scenario.deployments:
            demand = float(req.demand.get(d.name, 0.0))
            serving.append(
                DeploymentServing(d.name, d.model, demand, usable[d.name], max(0.0, demand - usable[d.name]))
            )
        worst = max(statuses, key=PLACEMENT_STATUS_ORDER.index, default="optimal")
        status = "optimal" if worst == "infeasible" else worst  # a proven infeasible cluster serves 0: proven
        cost_h = sum(i.cost_per_hour for i in insts)
        plan = Plan(
            seq=coral.seq, at=req.at, policy="helix", trigger=req.trigger, instances=tuple(insts),
            serving=tuple(serving), cost_per_hour=cost_h, churn_cost=0.0, status=status, gap=worst_gap,
            bound=cost_h, solve_s=solve_s, effort=coral.effort,
        )  # fmt: skip
        return plan, made


HELIX_HARD = 2.0
"""A cluster's Helix placements are given up after this many times their MILPs' time limits (plus 0.5 s):
HiGHS overruns its own."""


def _start_of(prob: AllocationProblem, plan: Plan) -> dict[tuple[int, int], int]:
    """A plan's instances as (template index, region index) counts of ``prob`` (those not in it left out)."""
    index = {t.key: i for i, t in enumerate(prob.templates)}
    regions = {r: k for k, r in enumerate(prob.regions)}
    out: dict[tuple[int, int], int] = {}
    for (dep, tid, region), n in plan.counts().items():
        i = index.get(f"{dep}/{tid}")
        if i is not None and region in regions and n > 0:
            out[(i, regions[region])] = out.get((i, regions[region]), 0) + n
    return out


def to_plan(
    planner: Planner,
    req: PlanRequest,
    prob: AllocationProblem,
    index: Sequence[tuple[Deployment, Template]],
    res: AllocationResult,
    *,
    seq: int,
) -> Plan:
    """The Plan that an allocation result describes: each instance with its own nominal req/s (its template's
    at the deployment's shape: prefill or decode side alone for those), each deployment with the capacity
    that the program counts (``AllocationResult.capacity_rps``: after the utilisation target and the
    queueing headroom, each prefill instance's KV limit and the NIC levels that pair it with decode)."""
    insts = []
    for (j, r), cnt in sorted(res.counts.items()):
        if cnt <= 0:
            continue
        d, t = index[j]
        region = prob.regions[r]
        cost = sum(float(prob.price[r, prob.node_types.index(n)]) for n in t.nodes)
        if t.mode == "aggregated":
            rps = t.requests_per_s(d.shape.mean_in, d.shape.mean_out)
        else:
            rps = (t.prefill_tok_s / d.shape.mean_in) if t.mode == "prefill" else (t.decode_tok_s / d.shape.mean_out)
        insts.append(PlannedInstances(d.name, t.id, region, int(cnt), t.nodes, t.mode, cost, rps))
    serving = tuple(
        DeploymentServing(
            d.name, d.model, float(prob.demand_rps[m]), float(res.capacity_rps[m]), float(res.unmet_rps[m])
        )
        for m, d in enumerate(planner.scenario.deployments)
    )
    effort = res.effort.as_mapping()
    return Plan(
        seq=seq,
        at=req.at,
        policy=planner.policy,
        trigger=req.trigger,
        instances=tuple(insts),
        serving=serving,
        cost_per_hour=res.cost_per_hour,
        churn_cost=res.churn_cost,
        status=res.status,
        gap=res.gap,
        bound=res.bound,
        solve_s=res.solve_s,
        effort=effort,
    )


def request_at(sc: Scenario, cat: Catalog, t: float, *, current: Mapping[tuple[str, str, str], int] | None = None,
               trigger: str = "cli") -> PlanRequest:  # fmt: skip
    """The scenario's demand and market at time ``t`` as a plan request."""
    prices, avail = sc.market_at(cat, t)
    demand = {d.name: d.demand.at(t) for d in sc.deployments}
    return PlanRequest(t, demand, prices, avail, dict(current or {}), trigger)
