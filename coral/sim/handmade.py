"""Templates built by hand from the perf model, and two simple planners, for tests, benches and demos.

These do not replace the placement ILP or the allocation ILP (``solvers``): a hand template takes the
stages it is given, and its capacities are closed-form (prefill tokens/s = mean prompt / sum of the
stages' prefill times; decode tokens/s = batch / slowest stage step). ``FixedPlanner`` always returns
the same instances; ``GreedyPlanner`` fills each deployment's demand with its listed (template, region)
options in order, within availability, at a target utilisation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from coral.perf import PerfModel
from coral.plan import DeploymentServing, Plan, PlannedInstances, PlanRequest
from coral.templates import SINK, SOURCE, Route, Stage, Template
from coral.workload import Slo, WorkloadShape

DEFAULT_SLO = Slo(ttft_s=2.0, tpot_s=0.1, attainment=0.9)
DEFAULT_SHAPE = WorkloadShape(1155, 211)


def stage(
    perf: PerfModel,
    model: str,
    node: str,
    start: int,
    end: int,
    batch: int,
    *,
    index: int = 0,
    tp: int | None = None,
    shape: WorkloadShape = DEFAULT_SHAPE,
) -> Stage:
    """A stage of ``model`` layers [start, end) on ``node``, with timings from the perf model."""
    n = perf.catalog.nodes[node]
    t = n.gpu_count if tp is None else tp
    k = end - start
    ctx = shape.mean_context
    return Stage(
        index=index,
        node=node,
        gpu=n.gpu,
        tp=t,
        start=start,
        end=end,
        batch=batch,
        memory_bytes=float(perf.stage_bytes(model, layers=k, batch=batch, context=ctx)),
        decode_step_s=float(perf.decode_step_s(model, node, layers=k, batch=batch, context=ctx, tp=t)),
        prefill_s=float(perf.prefill_s(model, node, layers=k, batch=1, prompt=shape.mean_in, tp=t)),
    )


def template(
    perf: PerfModel,
    model: str,
    stages: Sequence[Stage],
    *,
    tid: str | None = None,
    mode: str = "aggregated",
    routes: Sequence[tuple[int, int, float]] | None = None,
    slo: Slo = DEFAULT_SLO,
    shape: WorkloadShape = DEFAULT_SHAPE,
) -> Template:
    """A template over ``stages``; default routes form one pipeline in index order.

    Capacities: prefill tokens/s = prompt / sum of stage prefill times; decode tokens/s = batch / the
    slowest stage's step (every stage works on its own micro-batch).
    """
    if routes is None:
        idx = [s.index for s in stages]
        edges = [(SOURCE, idx[0]), *itertools.pairwise(idx), (idx[-1], SINK)]
        routes = [(a, b, 1.0) for a, b in edges]
    pre = sum(s.prefill_s for s in stages)
    batch = min(s.batch for s in stages)
    step = max(s.decode_step_s for s in stages)
    return Template(
        id=tid or f"{model}@{'+'.join(s.node for s in stages)}:{mode}",
        model=model,
        num_layers=perf.catalog.models[model].num_layers,
        mode=mode,
        slo=slo,
        shape=shape,
        nodes=tuple(s.node for s in stages),
        stages=tuple(stages),
        routes=tuple(Route(a, b, f) for a, b, f in routes),
        prefill_tok_s=shape.mean_in / pre,
        decode_tok_s=batch / step,
        ttft_s=pre,
        tpot_s=sum(s.decode_step_s for s in stages),
        perf_version=perf.version,
        status="optimal",
        gap=0.0,
        bound=0.0,
        method="hand",
        solve_s=0.0,
    )


def single(
    perf: PerfModel,
    model: str = "llama-3.1-8b",
    node: str = "g6e.xlarge",
    batch: int = 64,
    *,
    mode: str = "aggregated",
    slo: Slo = DEFAULT_SLO,
    shape: WorkloadShape = DEFAULT_SHAPE,
) -> Template:
    """One stage holding every layer of ``model`` on one ``node`` (all its GPUs as TP)."""
    layers = perf.catalog.models[model].num_layers
    st = stage(perf, model, node, 0, layers, batch, shape=shape)
    return template(perf, model, [st], mode=mode, slo=slo, shape=shape)


class FixedPlanner:
    """Always the same instances: {(deployment, template id, region): count}; records its requests."""

    def __init__(self, templates: Mapping[str, Template], counts: Mapping[tuple[str, str, str], int]) -> None:
        self.templates = templates
        self.counts = dict(counts)
        self.requests: list[PlanRequest] = []

    def __call__(self, req: PlanRequest) -> Plan:
        self.requests.append(req)
        return make_plan(req, self.templates, self.counts, policy="fixed")


class GreedyPlanner:
    """Per deployment, fill demand / utilisation with its (template id, region) options in order."""

    def __init__(
        self,
        templates: Mapping[str, Template],
        options: Mapping[str, Sequence[tuple[str, str]]],
        utilisation: float = 0.8,
    ) -> None:
        if not 0 < utilisation <= 1:
            raise ValueError(f"utilisation must be in (0, 1], got {utilisation}")
        self.templates, self.options, self.util = templates, dict(options), utilisation
        self.requests: list[PlanRequest] = []

    def __call__(self, req: PlanRequest) -> Plan:
        self.requests.append(req)
        used: dict[tuple[str, str], int] = {}
        counts: dict[tuple[str, str, str], int] = {}
        for dep in sorted(self.options):
            left = req.demand.get(dep, 0.0)
            for tid, region in self.options[dep]:
                t = self.templates[tid]
                cap = t.requests_per_s(t.shape.mean_in, t.shape.mean_out) * self.util
                if left <= 0 or cap <= 0:
                    break
                room = min(
                    (req.availability.get((region, n), 0) - used.get((region, n), 0)) // c
                    for n, c in t.node_counts.items()
                )
                k = max(0, min(math.ceil(left / cap), room))
                if k:
                    counts[(dep, tid, region)] = counts.get((dep, tid, region), 0) + k
                    for n, c in t.node_counts.items():
                        used[(region, n)] = used.get((region, n), 0) + c * k
                    left -= k * cap
        return make_plan(req, self.templates, counts, policy="greedy")


def make_plan(
    req: PlanRequest, templates: Mapping[str, Template], counts: Mapping[tuple[str, str, str], int], policy: str
) -> Plan:
    """A Plan with ``counts`` instances, its cost at the request's prices and capacity vs demand."""
    insts = []
    cap: dict[str, float] = {}
    cost = 0.0
    for (dep, tid, region), n in sorted(counts.items()):
        t = templates[tid]
        c = sum(req.prices.get((region, node), 0.0) for node in t.nodes)
        rps = t.requests_per_s(t.shape.mean_in, t.shape.mean_out)
        insts.append(PlannedInstances(dep, tid, region, n, t.nodes, t.mode, c * n, rps * n))
        cap[dep] = cap.get(dep, 0.0) + rps * n
        cost += c * n
    serving = tuple(
        DeploymentServing(d, d, v, cap.get(d, 0.0), max(0.0, v - cap.get(d, 0.0))) for d, v in req.demand.items()
    )
    return Plan(
        seq=0,
        at=req.at,
        policy=policy,
        trigger=req.trigger,
        instances=tuple(insts),
        serving=serving,
        cost_per_hour=cost,
        churn_cost=0.0,
        status="optimal",
        gap=0.0,
        bound=0.0,
        solve_s=0.0,
    )
