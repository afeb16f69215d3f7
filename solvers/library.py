"""Solve one (model, node multiset, mode, SLO, shape) into a Template: the unit of work of a build.

One micro-batch size per template. The micro-batch of a pipeline passes through every stage, so all the
stages of an instance step the same batch b (vLLM has one ``max_num_seqs`` per engine). A placement whose
stages had different b would claim, on a stage with a larger b, a throughput that the pipeline cannot feed
it. So ``solve_multiset`` solves the placement once per batch size b of the grid, with every node's menu
restricted to its options of that b, and keeps the best:

    max over b of  OPT(problem restricted to options with batch b)

This is exact for the one-b model: each restricted problem is solved exactly (or with its gap), and a b
whose upper bound (the layer-work bound of the restricted menus) cannot beat the incumbent is skipped,
which is a proof that it holds nothing better. The result's bound is the largest bound over all b (a
solved b gives its placer's bound, a skipped one the layer-work bound), so the reported gap is valid.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from coral.perf import PerfModel
from coral.templates import SINK, SOURCE, Route, Stage, Template, vllm_compatibility
from coral.workload import Slo, WorkloadShape
from solvers.combos import layer_work_bound
from solvers.fastplace import PLACER, SMALL_NODES, place
from solvers.options import FORMULATION, build_problem, prefill_bubble
from solvers.problem import NodeMenu, PlacementProblem, PlacementResult

FLOW_EPS = 1e-9


def formulation_of(num_nodes: int) -> str:
    """The placement model that makes templates of ``num_nodes`` nodes now (the menus' formulation, and
    from 4 nodes up the placer's version); a stored template with another one is stale."""
    return FORMULATION if num_nodes <= SMALL_NODES else f"{FORMULATION}+{PLACER}"


def is_current(t: Template, perf_version: str | None = None) -> bool:
    """Whether a stored template was made by the current formulation (and perf model, when given)."""
    return t.formulation == formulation_of(len(t.nodes)) and (perf_version is None or t.perf_version == perf_version)


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
        formulation=formulation_of(n),
    )


def _pure_capacities(
    stages: Sequence[Stage], routes: Sequence[Route], flow: float, shape: WorkloadShape
) -> tuple[float, float]:
    """Prefill-only and decode-only token rates (P, D) of an aggregated template carrying ``flow`` req/s.

    The allocator prices a shape (in, out) as 1 / (in / P + out / D) req/s, which must give ``flow`` at
    the reference shape. Each stage spends, per request, ``g * pre_b / b`` on prompts (g: the pipeline
    prefill bubble of ``solvers.options``) and ``out * tau / b`` on
    decoding; the flow-weighted prefill share s of that time splits the capacity:
    P = flow * in / s and D = flow * out / (1 - s).
    """
    inflow = {s.index: 0.0 for s in stages}
    for r in routes:
        if r.dst != SINK:
            inflow[r.dst] += r.flow
    n = len(stages)
    t_pre = sum(inflow[s.index] * prefill_bubble(n, s.batch, shape.mean_out) * s.prefill_s / s.batch for s in stages)
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


def restrict_batch(problem: PlacementProblem, batch: int) -> PlacementProblem | None:
    """The problem with every node's menu restricted to its options of micro-batch ``batch``; None if a
    node has no such option (every node must be used)."""
    menus = []
    for m in problem.menus:
        keep = np.flatnonzero(m.b == batch)
        if keep.size == 0:
            return None
        menus.append(NodeMenu(m.k[keep], m.b[keep], m.cap[keep], m.lat[:, keep], m.mem[keep]))
    return attrs.evolve(problem, menus=tuple(menus))


def place_one_batch(
    problem: PlacementProblem, *, time_limit: float = 10.0, placer: Callable[..., PlacementResult] = place
) -> tuple[PlacementProblem, PlacementResult]:
    """The best placement in which every stage steps the same micro-batch (see the module docstring).

    Returns the restricted problem the placement refers to (its option indices index those menus) and
    the combined result: its status is ``optimal`` only if every batch size was solved to optimality or
    skipped by its bound. ``placer`` solves each restricted problem (``solvers.fastplace.place`` by
    default; the Helix baseline passes the placement MILP), called as ``placer(problem, time_limit=s)``.
    """
    t0 = time.perf_counter()
    subs = []
    for b in sorted({int(x) for m in problem.menus for x in m.b}):
        sub = restrict_batch(problem, b)
        if sub is not None:
            ub = layer_work_bound(sub)
            if ub > 0:
                subs.append((ub, b, sub))
    subs.sort(key=lambda x: (-x[0], -x[1]))
    best: tuple[PlacementProblem, PlacementResult] | None = None
    bound = 0.0
    proven = True
    for ub, _b, sub in subs:
        value = best[1].value if best is not None else 0.0
        if ub <= value * (1.0 + 1e-9):
            bound = max(bound, ub)
            continue
        left = max(time_limit - (time.perf_counter() - t0), 0.05 * time_limit)
        res = placer(sub, time_limit=left)
        if res.status == "infeasible":
            continue
        bound = max(bound, res.bound if res.bound > 0 else ub)
        proven = proven and res.status == "optimal"
        if res.value > 0 and (best is None or res.value > best[1].value * (1.0 + 1e-12)):
            best = (sub, res)
    elapsed = time.perf_counter() - t0
    if best is None:
        status = "infeasible" if proven else "unknown"
        return problem, PlacementResult(0.0, status, bound, "infeasible", solve_s=elapsed)
    sub, res = best
    bound = max(bound, res.value)
    status = "optimal" if proven or bound <= res.value * (1.0 + 1e-9) else "feasible"
    return sub, attrs.evolve(res, status=status, bound=bound if status != "optimal" else res.value, solve_s=elapsed)


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
    problem, result = place_one_batch(problem, time_limit=time_limit)
    tpl = None
    if result.status != "infeasible" and result.value > 0:
        tpl = template_from_result(perf, problem, result, key=key, model=model, mode=mode, slo=slo, shape=shape)
    return tpl, result, time.perf_counter() - t0
