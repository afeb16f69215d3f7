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
Each b after the first is solved only above the best value so far (``place``'s ``floor``).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence

import attrs
import numpy as np

from coral.perf import PerfModel
from coral.templates import SINK, SOURCE, Route, Stage, Template, vllm_compatibility
from coral.workload import Slo, WorkloadShape
from solvers.combos import limit_less_ends, path_limit
from solvers.fastplace import PLACER, place
from solvers.options import (
    build_problem,
    concat_menus,
    depth_menu,
    depths,
    formulation,
    prefill_bubble,
    problem_links,
)
from solvers.problem import ANY_DEPTH, FIRST, LAST, NodeMenu, PlacementProblem, PlacementResult
from solvers.reduce import subset_menu
from solvers.rules import placement_roles
from solvers.small import SMALL_NODES

FLOW_EPS = 1e-9


def formulation_of(num_nodes: int, mode: str) -> str:
    """The placement model that makes ``mode`` templates of ``num_nodes`` nodes now (the menus'
    formulation, and from 4 nodes up the placer's version); a stored template with another one is stale."""
    f = formulation(mode)
    return f if num_nodes <= SMALL_NODES else f"{f}+{PLACER}"


def is_current(t: Template, perf_version: str | None = None) -> bool:
    """Whether a stored template was made by the current formulation (and perf model, when given)."""
    current = t.formulation == formulation_of(len(t.nodes), t.mode)
    return current and (perf_version is None or t.perf_version == perf_version)


def distinct(templates: Sequence[Template]) -> list[Template]:
    """``templates`` with one per model, mode, SLO, shape, perf model, node multiset and KV sender class
    (``Template.kv_sender``: a decode multiset may have one template per class), in their order.

    A store can hold two templates of one multiset, built under different solver parameters (a time
    limit) or an older key layout. The one kept is proven optimal if either is, then has the most
    prefill and decode capacity, then the smaller id."""
    best: dict[tuple[object, ...], tuple[tuple[object, ...], str]] = {}
    for t in templates:
        key = (t.model, t.mode, t.slo, t.shape, t.perf_version, tuple(sorted(t.nodes)), t.kv_sender)
        rank = (t.status != "optimal", -t.prefill_tok_s, -t.decode_tok_s, t.id)
        if key not in best or rank < best[key][0]:
            best[key] = (rank, t.id)
    keep = {tid for _, tid in best.values()}
    return [t for t in templates if t.id in keep]


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
    sender_nic: float | None = None,
) -> Template:
    """Build the Template that a feasible placement result describes (``sender_nic``: the decode
    problem's sender class, ``build_problem``'s)."""
    n = problem.n
    L = problem.num_layers
    stages = []
    ends = [int(result.start[i]) + int(problem.menus[i].k[o]) for i, o in enumerate(result.option)]
    used = [e for e, f in result.flows.items() if f > FLOW_EPS]
    depth, held = placement_roles(n, L, result.start, ends, used)
    for i, (o, s) in enumerate(zip(result.option, result.start, strict=True)):
        menu = problem.menus[i]
        node = problem.kinds[i]
        k, b = int(menu.k[o]), int(menu.b[o])
        nt = perf.catalog.nodes[node]
        at = (bool(held[i] & FIRST), bool(held[i] & LAST))
        mem = perf.stage_bytes(
            model, layers=k, batch=b * max(depth[i], 1), context=shape.max_context, node=node, ends=at
        )
        stages.append(
            Stage(
                index=i,
                node=node,
                gpu=nt.gpu,
                tp=nt.gpu_count,
                start=int(s),
                end=int(s) + k,
                batch=b,
                memory_bytes=float(mem),
                decode_step_s=float(
                    perf.decode_step_s(model, node, layers=k, batch=b, context=shape.mean_context, ends=at)
                ),
                prefill_s=float(perf.prefill_s(model, node, layers=k, batch=b, prompt=shape.mean_in, ends=at)),
            )
        )
    routes = []
    for (u, v), f in sorted(result.flows.items()):
        if f > FLOW_EPS:
            routes.append(Route(SOURCE if u == n else u, SINK if v == n else v, float(f)))
    worst = _worst_path_latency(problem, result, n)
    total = float(result.value)
    if mode == "aggregated":
        charged = [int(problem.menus[i].d[o]) for i, o in enumerate(result.option)]
        charged = [n if d >= ANY_DEPTH else d for d in charged]  # a menu without roles: the old rule
        pre, dec = _pure_capacities(stages, routes, total, shape, charged)
    elif mode == "prefill":
        pre, dec = total, 0.0
    else:
        pre, dec = 0.0, total
    metric_names = {"aggregated": ("tpot", "ttft"), "prefill": ("ttft",), "decode": ("tpot",)}[mode]
    lat = dict(zip(metric_names, worst, strict=True))
    ok, reason = vllm_compatibility(stages, routes)
    cap = math.inf if sender_nic is None else sender_nic
    kv_nic = kv_min_nic(problem, result, [min(cap, perf.catalog.nodes[k].nic_bytes_per_s) for k in problem.kinds])
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
        formulation=formulation_of(n, mode),
        kv_min_nic=kv_nic if mode == "decode" else 0.0,
        kv_sender=sender_nic or 0.0,
    )


def kv_min_nic(problem: PlacementProblem, result: PlacementResult, nic: Sequence[float]) -> float:
    """The slowest sender NIC (bytes/s) for which a decode placement still meets its TPOT limit.

    ``build_problem`` prices the KV transfer into entry node i at ``nic[i]`` (node i's own NIC, capped
    at the problem's sender class: ``link_lat[0, n, i] = K / nic[i]``); behind a sender of NIC s it takes
    K / min(s, node i's NIC), which is K / min(s, nic[i]) for every s up to the class. With
    d_i the longest latency from node i to the sink over the edges that carry flow (its own stage
    included), the path limit T holds iff K / min(s, nic[i]) <= T - d_i, so the template holds for every
    s >= K / (T - d_i) over its used entry nodes i (the maximum; 0 when no path carries flow).
    """
    n = problem.n
    limit = float(problem.lat_limit[0])
    used = [(u, v) for (u, v), f in result.flows.items() if f > FLOW_EPS]
    own = [float(problem.menus[i].lat[0, result.option[i]]) for i in range(n)]
    down = np.full(n, -np.inf)
    for i in sorted(range(n), key=lambda i: -result.start[i]):
        for u, v in used:
            if u == i:
                down[i] = max(down[i], own[i] + problem.link_lat[0, i, v] + (0.0 if v == n else down[v]))
    need = 0.0
    for u, v in used:
        if u != n:
            continue
        kv = float(problem.link_lat[0, n, v]) * nic[v]
        slack = limit - float(down[v])
        need = max(need, kv / slack if slack > 0 else math.inf)
    return need


def _pure_capacities(
    stages: Sequence[Stage], routes: Sequence[Route], flow: float, shape: WorkloadShape, depth: Sequence[int]
) -> tuple[float, float]:
    """Prefill-only and decode-only token rates (P, D) of an aggregated template carrying ``flow`` req/s.

    The allocator prices a shape (in, out) as 1 / (in / P + out / D) req/s, which must give ``flow`` at
    the reference shape. Each stage spends, per request, ``g * pre_b / b`` on prompts (g: the pipeline
    prefill bubble of ``solvers.options`` at the ``depth`` micro-batches its option was charged for) and
    ``out * tau / b`` on
    decoding; the flow-weighted prefill share s of that time splits the capacity:
    P = flow * in / s and D = flow * out / (1 - s).
    """
    inflow = {s.index: 0.0 for s in stages}
    for r in routes:
        if r.dst != SINK:
            inflow[r.dst] += r.flow
    t_pre = sum(
        inflow[s.index] * prefill_bubble(depth[s.index], s.batch, shape.mean_out) * s.prefill_s / s.batch
        for s in stages
    )
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
        menus.append(subset_menu(m, keep))
    return attrs.evolve(problem, menus=tuple(menus))


def _menu_batch_work(menu: NodeMenu, limit: np.ndarray) -> dict[int, tuple[float, int]]:
    """Per batch size of ``menu``: the largest k * cap and the largest k over its options within the
    latency limits (-inf and -1 where none), as ``batch_work_bounds`` sums them."""
    bs = np.unique(np.asarray(menu.b))
    idx = np.searchsorted(bs, np.asarray(menu.b))
    ok = np.all(np.asarray(menu.lat) <= limit[:, None] + 1e-12, axis=0)
    w = np.full(bs.size, -np.inf)
    k = np.full(bs.size, -1, np.int64)
    np.maximum.at(w, idx[ok], (np.asarray(menu.k) * np.asarray(menu.cap))[ok])
    np.maximum.at(k, idx[ok], np.asarray(menu.k)[ok])
    return {int(b): (float(x), int(y)) for b, x, y in zip(bs, w, k, strict=True)}


def _sum_batch_work(parts: Sequence[Mapping[int, tuple[float, int]]], num_layers: int) -> dict[int, float]:
    """Per batch size: the nodes' summed work over L when every node has an option of that size within
    the limits and their largest k add up to at least L, else 0 (as ``layer_work_bound`` computes it)."""
    out = {}
    for b in sorted(set().union(*parts)):
        if not all(b in p and p[b][1] > 0 for p in parts):
            out[b] = 0.0
            continue
        work = 0.0
        layers = 0
        for p in parts:
            work += p[b][0]
            layers += p[b][1]
        out[b] = work / num_layers if layers >= num_layers else 0.0
    return out


def batch_work_bounds(problem: PlacementProblem) -> dict[int, float]:
    """Per batch size b: ``layer_work_bound`` of ``restrict_batch(problem, b)`` (0 where that is None),
    computed from the menus at once without building the restricted problems."""
    limit = path_limit(problem)
    return _sum_batch_work([_menu_batch_work(m, limit) for m in problem.menus], int(problem.num_layers))


def place_one_batch(
    problem: PlacementProblem,
    *,
    time_limit: float = 10.0,
    floor: float | None = None,
    bounds: Mapping[int, float] | None = None,
    placer: Callable[..., PlacementResult] = place,
    spanning: bool = False,
    lp_floor: bool = False,
) -> tuple[PlacementProblem, PlacementResult]:
    """The best placement in which every stage steps the same micro-batch (see the module docstring).

    Returns the restricted problem the placement refers to (its option indices index those menus) and
    the combined result: its status is ``optimal`` only if every batch size was solved to optimality or
    skipped by its bound. Each batch size after the first is solved only above the best value so far
    (``place``'s ``floor``), which is exact: a batch size proven no better cannot hold the optimum.

    ``floor`` (> 0): the caller needs the optimum only if it is worth more than ``floor``; when every
    batch size is proven worth at most that, the result has status ``below``, value 0, ``bound`` the
    largest proven bound (<= ``floor``) and ``method`` "below-bound" when upper bounds (the layer work,
    the reductions') proved it for every batch size, "below-lp" when the LP relaxation proved it for
    some (``place``'s ``lp_floor``, passed on) and no search was needed, else "below-search".
    ``bounds``: the problem's ``batch_work_bounds`` when the caller has them already. ``placer`` solves
    each restricted problem (``solvers.fastplace.place`` by default; the Helix baseline passes the
    placement MILP), called as ``placer(problem, time_limit=s)``; only ``place`` is given the floors.
    ``spanning`` (with ``floor``): ``place``'s, for every batch size (a placement of several
    components, each at batch b, is worth no more than the same components as separate templates).
    """
    t0 = time.perf_counter()
    if floor is not None and not (0 < floor < math.inf):
        raise ValueError(f"floor must be > 0 and finite (or None), got {floor!r}")
    if spanning and floor is None:
        raise ValueError("spanning needs a floor")
    subs = [(ub, b) for b, ub in (batch_work_bounds(problem) if bounds is None else bounds).items() if ub > 0]
    subs.sort(key=lambda x: (-x[0], -x[1]))
    best: tuple[PlacementProblem, PlacementResult] | None = None
    bound = 0.0
    proven = True
    floored = 0.0  # the largest bound proven only as "at most the floor"
    searched = False  # whether a batch size needed more than a bound to get there
    by_lp = False  # whether the LP relaxation's bound did, for some batch size
    for ub, b in subs:
        value = best[1].value if best is not None else 0.0
        if ub <= value * (1.0 + 1e-9):
            bound = max(bound, ub)
            continue
        if floor is not None and ub <= floor:
            floored = max(floored, ub)
            continue
        cut = max(value, floor or 0.0)
        sub = restrict_batch(problem, b)
        assert sub is not None  # every node has an option of batch b: its bound is > 0
        left = max(time_limit - (time.perf_counter() - t0), 0.05 * time_limit)
        if placer is place:
            res = place(sub, time_limit=left, floor=cut if cut > 0 else None, spanning=spanning, lp_floor=lp_floor)
        else:
            res = placer(sub, time_limit=left)
        if res.status == "infeasible":
            continue
        if res.status == "below":
            if res.bound > value * (1.0 + 1e-9):
                floored = max(floored, res.bound)
                searched = searched or res.method not in ("reduce", "lp-proven")
                by_lp = by_lp or res.method == "lp-proven"
            continue
        bound = max(bound, res.bound if res.bound > 0 else ub)
        proven = proven and res.status == "optimal"
        if res.value > 0 and (best is None or res.value > best[1].value * (1.0 + 1e-12)):
            best = (sub, res)
    elapsed = time.perf_counter() - t0
    value = best[1].value if best is not None else 0.0
    if proven and floored > value * (1.0 + 1e-9):  # only "nothing beats the floor" is proven
        method = "below-search" if searched or best is not None else "below-lp" if by_lp else "below-bound"
        return problem, PlacementResult(0.0, "below", max(bound, floored), method, solve_s=elapsed)
    bound = max(bound, floored)
    if best is None:
        status = "infeasible" if proven else "unknown"
        return problem, PlacementResult(0.0, status, bound, "infeasible", solve_s=elapsed)
    sub, res = best
    bound = max(bound, res.value)
    status = "optimal" if proven or bound <= res.value * (1.0 + 1e-9) else "feasible"
    return sub, attrs.evolve(res, status=status, bound=bound if status != "optimal" else res.value, solve_s=elapsed)


class ProblemCache:
    """``build_problem`` for many multisets of one model, mode, SLO and shape, assembled from cached
    parts: a node's menu in a multiset of n nodes is its ``role_menu``, the concatenation of its
    ``depth_menu`` over ``depths(n)``, each of which depends only on the node type and the micro-batch
    count d; a link depends only on the types at its two ends (``problem_links`` of that pair). Tests
    check equality with ``build_problem``; the formulas stay in ``solvers.options``.

    ``parts``: a dict of ``depth_menu`` results by (type, d) to share with other caches of the same
    model, mode, SLO and shape (the sender classes of a decode job: the menus do not depend on it)."""

    def __init__(
        self,
        perf: PerfModel,
        model: str,
        mode: str,
        slo: Slo,
        shape: WorkloadShape,
        sender_nic: float | None = None,
        parts: dict[tuple[str, int], NodeMenu] | None = None,
    ) -> None:
        self._args = (perf, model, mode, slo, shape)
        self._sender = sender_nic
        self._parts: dict[tuple[str, int], NodeMenu] = {} if parts is None else parts
        self._menus: dict[tuple[str, int], NodeMenu] = {}
        self._pairs: dict[tuple[str, str], tuple[np.ndarray, float]] = {}
        self._ends: dict[str, tuple[np.ndarray, np.ndarray, float, float]] = {}
        self._limit: np.ndarray | None = None
        self._layers = int(perf.catalog.models[model].num_layers)
        self._work: dict[tuple[str, int, bytes], dict[int, tuple[float, int]]] = {}

    def _pair(self, a: str, b: str) -> None:
        perf, model, mode, slo, shape = self._args
        kinds = tuple(sorted((a, b)))
        ll, lc, limit = problem_links(perf, model, kinds, mode, slo, shape, self._sender)
        x, y = (0, 1) if kinds == (a, b) else (1, 0)
        self._pairs[(a, b)] = (ll[:, x, y].copy(), float(lc[x, y]))
        self._pairs[(b, a)] = (ll[:, y, x].copy(), float(lc[y, x]))
        for t, i in ((a, x), (b, y)):
            self._ends.setdefault(t, (ll[:, 2, i].copy(), ll[:, i, 2].copy(), float(lc[2, i]), float(lc[i, 2])))
        if self._limit is None:
            self._limit = limit

    def _menu(self, t: str, n: int) -> NodeMenu:
        if (t, n) not in self._menus:
            perf, model, mode, slo, shape = self._args
            for d in depths(n):
                if (t, d) not in self._parts:
                    self._parts[(t, d)] = depth_menu(perf, model, t, mode, slo, shape, d)
            self._menus[(t, n)] = concat_menus([self._parts[(t, d)] for d in depths(n)])
        if (t, t) not in self._pairs:
            self._pair(t, t)
        return self._menus[(t, n)]

    def batch_bounds(self, nodes: Sequence[str]) -> dict[int, float]:
        """``batch_work_bounds`` of the multiset's problem, from per-type parts (equal, tested)."""
        kinds = tuple(sorted(nodes))
        n = len(kinds)
        for t in kinds:
            self._menu(t, n)
        assert self._limit is not None
        ends = [self._ends[t] for t in kinds]
        limit = limit_less_ends(self._limit, np.min([e[0] for e in ends], axis=0), np.min([e[1] for e in ends], axis=0))
        key = limit.tobytes()
        parts = []
        for t in kinds:
            if (t, n, key) not in self._work:
                self._work[(t, n, key)] = _menu_batch_work(self._menus[(t, n)], limit)
            parts.append(self._work[(t, n, key)])
        return _sum_batch_work(parts, self._layers)

    def problem(self, nodes: Sequence[str]) -> PlacementProblem:
        """The placement problem of the multiset ``nodes``, equal to ``build_problem``'s."""
        kinds = tuple(sorted(nodes))
        n = len(kinds)
        types = sorted(set(kinds))
        for t in types:
            self._menu(t, n)
        for a, b in itertools.combinations(types, 2):
            if (a, b) not in self._pairs:
                self._pair(a, b)
        assert self._limit is not None
        nm = self._limit.shape[0]
        ll = np.zeros((nm, n + 1, n + 1))
        lc = np.full((n + 1, n + 1), np.inf)
        for i, a in enumerate(kinds):
            src, snk, csrc, csnk = self._ends[a]
            ll[:, n, i], ll[:, i, n], lc[n, i], lc[i, n] = src, snk, csrc, csnk
            for j, b in enumerate(kinds):
                if i != j:
                    ll[:, i, j], lc[i, j] = self._pairs[(a, b)]
        return PlacementProblem(
            num_layers=self._layers,
            kinds=kinds,
            menus=tuple(self._menus[(t, n)] for t in kinds),
            link_lat=ll,
            link_cap=lc,
            lat_limit=self._limit.copy(),
        )


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
    floor: float | None = None,
    problem: PlacementProblem | None = None,
    bounds: Mapping[int, float] | None = None,
    spanning: bool = False,
    lp_floor: bool = False,
    sender_nic: float | None = None,
) -> tuple[Template | None, PlacementResult, float]:
    """Solve one multiset; returns the template (None when infeasible or below ``floor``), the raw result
    and wall seconds. ``floor`` is ``place_one_batch``'s; ``problem``, when given, is the multiset's
    ``build_problem`` (so that a caller that built it already does not build it twice), ``bounds`` its
    ``batch_work_bounds``; ``spanning`` and ``lp_floor`` are ``place_one_batch``'s; ``sender_nic`` the
    decode problem's sender class (``build_problem``'s, recorded as the template's ``kv_sender``)."""
    t0 = time.perf_counter()
    if problem is None:
        problem = build_problem(perf, model, nodes, mode, slo, shape, sender_nic)
    problem, result = place_one_batch(
        problem, time_limit=time_limit, floor=floor, bounds=bounds, spanning=spanning, lp_floor=lp_floor
    )
    tpl = None
    if result.status not in ("infeasible", "below") and result.value > 0:
        tpl = template_from_result(
            perf, problem, result, key=key, model=model, mode=mode, slo=slo, shape=shape, sender_nic=sender_nic
        )
    return tpl, result, time.perf_counter() - t0
