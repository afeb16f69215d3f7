"""Solve one (model, node multiset, mode, SLO, shape) into a Template: the unit of work of a build."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from coral.perf import PerfModel
from coral.templates import SINK, SOURCE, Route, Stage, Template, vllm_compatibility
from coral.workload import Slo, WorkloadShape
from solvers.fastplace import place
from solvers.options import build_problem
from solvers.problem import PlacementProblem, PlacementResult

FLOW_EPS = 1e-9


def template_from_result(
    perf: PerfModel,
    problem: PlacementProblem,
    result: PlacementResult,
    *,
    key: str,
    model: str,
    mode: str,
    slo: Slo,
    shape: WorkloadShape,
) -> Template:
    """Build the Template that a feasible placement result describes."""
    n = problem.n
    stages = []
    for i, (o, s) in enumerate(zip(result.option, result.start, strict=True)):
        menu = problem.menus[i]
        node = problem.kinds[i]
        k, b = int(menu.k[o]), int(menu.b[o])
        nt = perf.catalog.nodes[node]
        stages.append(
            Stage(
                index=i,
                node=node,
                gpu=nt.gpu,
                tp=nt.gpu_count,
                start=int(s),
                end=int(s) + k,
                batch=b,
                memory_bytes=float(menu.mem[o]),
                decode_step_s=float(perf.decode_step_s(model, node, layers=k, batch=b, context=shape.mean_context)),
                prefill_s=float(perf.prefill_s(model, node, layers=k, batch=b, prompt=shape.mean_in)),
            )
        )
    routes = []
    for (u, v), f in sorted(result.flows.items()):
        if f > FLOW_EPS:
            routes.append(Route(SOURCE if u == n else u, SINK if v == n else v, float(f)))
    worst = _worst_path_latency(problem, result, n)
    total = float(result.value)
    if mode == "aggregated":
        pre, dec = _pure_capacities(stages, routes, total, shape)
    elif mode == "prefill":
        pre, dec = total, 0.0
    else:
        pre, dec = 0.0, total
    metric_names = {"aggregated": ("tpot", "ttft"), "prefill": ("ttft",), "decode": ("tpot",)}[mode]
    lat = dict(zip(metric_names, worst, strict=True))
    ok, reason = vllm_compatibility(stages, routes)
    return Template(
        id=key,
        model=model,
        num_layers=problem.num_layers,
        mode=mode,
        slo=slo,
        shape=shape,
        nodes=problem.kinds,
        stages=tuple(stages),
        routes=tuple(routes),
        prefill_tok_s=pre,
        decode_tok_s=dec,
        ttft_s=lat.get("ttft", 0.0),
        tpot_s=lat.get("tpot", 0.0),
        perf_version=perf.version,
        status=result.status,
        gap=result.gap,
        bound=float(result.bound),
        method=result.method,
        solve_s=result.solve_s,
        vllm_ok=ok,
        vllm_reason=reason,
    )


def _pure_capacities(
    stages: Sequence[Stage], routes: Sequence[Route], flow: float, shape: WorkloadShape
) -> tuple[float, float]:
    """Prefill-only and decode-only token rates (P, D) of an aggregated template carrying ``flow`` req/s.

    The allocator prices a shape (in, out) as 1 / (in / P + out / D) req/s, which must give ``flow`` at
    the reference shape. Each stage spends, per request, ``pre_b / b`` on prompts and ``out * tau / b`` on
    decoding; the flow-weighted prefill share s of that time splits the capacity:
    P = flow * in / s and D = flow * out / (1 - s).
    """
    inflow = {s.index: 0.0 for s in stages}
    for r in routes:
        if r.dst != SINK:
            inflow[r.dst] += r.flow
    t_pre = sum(inflow[s.index] * s.prefill_s / s.batch for s in stages)
    t_dec = sum(inflow[s.index] * shape.mean_out * s.decode_step_s / s.batch for s in stages)
    share = t_pre / (t_pre + t_dec)
    return flow * shape.mean_in / share, flow * shape.mean_out / (1.0 - share)


def _worst_path_latency(problem: PlacementProblem, result: PlacementResult, n: int) -> list[float]:
    """Per metric, the longest source-to-sink latency over edges that carry flow."""
    used = [(u, v) for (u, v), f in result.flows.items() if f > FLOW_EPS]
    order = sorted(range(n), key=lambda i: result.start[i])
    out = []
    for m in range(problem.num_metrics):
        own = [float(problem.menus[i].lat[m, result.option[i]]) for i in range(n)]
        best = np.full(n, -np.inf)
        for i in order:
            for u, v in used:
                if v != i:
                    continue
                base = 0.0 if u == n else best[u]
                best[i] = max(best[i], base + problem.link_lat[m, u, v] + own[i])
        ends = [best[u] + problem.link_lat[m, u, n] for u, v in used if v == n]
        out.append(float(max(ends)) if ends else 0.0)
    return out


def solve_multiset(
    perf: PerfModel,
    model: str,
    nodes: Sequence[str],
    mode: str,
    slo: Slo,
    shape: WorkloadShape,
    *,
    key: str,
    time_limit: float = 10.0,
) -> tuple[Template | None, PlacementResult, float]:
    """Solve one multiset; returns the template (None when infeasible), the raw result and wall seconds."""
    t0 = time.perf_counter()
    problem = build_problem(perf, model, nodes, mode, slo, shape)
    result = place(problem, time_limit=time_limit)
    tpl = None
    if result.status != "infeasible" and result.value > 0:
        tpl = template_from_result(perf, problem, result, key=key, model=model, mode=mode, slo=slo, shape=shape)
    return tpl, result, time.perf_counter() - t0
