"""Node-multiset enumeration and lossless pruning for the template library.

Enumeration: every multiset of node types of size 1..N_max whose total usable memory holds the model's
weights plus one sequence's KV cache, and whose total GPU memory is at most rho x the weight bytes, and in
which every node can hold at least one layer.

Pruning works bottom-up by size on one capacity number per template (requests/s for ``aggregated``,
whose prefill and decode capacities are proportional to it; tokens/s for ``prefill`` and ``decode``).
Let cap(X) be the solved capacity of multiset X (0 when infeasible) and

    P(X) = max(cap(X), max over splits X = A + B (A, B non-empty) of P(A) + P(B)),

the most capacity a partition of X into templates gives. A multiset S is dropped when

- ``dominated``: a proper sub-multiset S' has P(S') >= cap(S): S' serves as much with fewer nodes;
- ``split``: some split has P(A) + P(B) >= cap(S): the same nodes serve at least as much as two templates.

Both are lossless: an optimal fleet that uses S can use the replacement at no more cost and with no more
nodes. When an upper bound ub(S) on cap(S) is already reached by a split or a sub-multiset, S is dropped
without being solved (its P is then the split value, since cap(S) <= ub(S)).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from coral.perf import PerfModel
from coral.workload import WorkloadShape
from solvers.problem import PlacementProblem

Multiset = tuple[str, ...]


def check_params(nmax: int, rho: float) -> None:
    """Validate the enumeration parameters."""
    if not isinstance(nmax, int) or nmax < 1:
        raise ValueError(f"nmax must be an integer >= 1, got {nmax!r}")
    if not rho > 0:
        raise ValueError(f"rho must be > 0, got {rho!r}")


def enumerate_multisets(
    perf: PerfModel, model: str, node_types: Sequence[str], shape: WorkloadShape, *, nmax: int = 6, rho: float = 12.0
) -> dict[int, list[Multiset]]:
    """Candidate multisets by size, each sorted by node type name."""
    check_params(nmax, rho)
    m = perf.catalog.models[model]
    usable = {n: perf.usable_bytes(n) for n in node_types}
    raw = {n: perf.catalog.gpu_of(n).memory_bytes * perf.catalog.nodes[n].gpu_count for n in node_types}
    one_layer = [n for n in sorted(node_types) if perf.max_layers(model, n, batch=1, context=shape.max_context) >= 1]
    need = m.weight_bytes + m.kv_bytes_per_token * shape.max_context
    cap = rho * m.weight_bytes
    out: dict[int, list[Multiset]] = {}
    for size in range(1, nmax + 1):
        level = []
        for combo in itertools.combinations_with_replacement(one_layer, size):
            if sum(raw[n] for n in combo) > cap:
                continue
            if sum(usable[n] for n in combo) < need:
                continue
            level.append(combo)
        out[size] = level
    return out


def sub_multisets(s: Multiset) -> Iterator[Multiset]:
    """Distinct proper, non-empty sub-multisets of ``s`` with one element fewer."""
    seen = set()
    for i in range(len(s)):
        sub = s[:i] + s[i + 1 :]
        if sub and sub not in seen:
            seen.add(sub)
            yield sub


def splits(s: Multiset) -> Iterator[tuple[Multiset, Multiset]]:
    """Distinct unordered splits of ``s`` into two non-empty sub-multisets."""
    n = len(s)
    seen = set()
    for mask in range(1, 2 ** (n - 1)):
        a = tuple(s[i] for i in range(n) if mask >> i & 1)
        b = tuple(s[i] for i in range(n) if not mask >> i & 1)
        key = (a, b) if a <= b else (b, a)
        if key not in seen:
            seen.add(key)
            yield key


def best_split(s: Multiset, partition: Mapping[Multiset, float]) -> float:
    """max over splits of P(A) + P(B), with P of smaller multisets looked up (missing = 0)."""
    return max((partition.get(a, 0.0) + partition.get(b, 0.0) for a, b in splits(s)), default=0.0)


def best_sub(s: Multiset, partition: Mapping[Multiset, float]) -> float:
    """max over proper sub-multisets S' of P(S') (P is monotone, so one element fewer suffices)."""
    return max((partition.get(sub, 0.0) for sub in sub_multisets(s)), default=0.0)


def prune_verdict(cap: float, sub: float, split: float) -> str | None:
    """``dominated``, ``split`` or None (keep) for a solved multiset of capacity ``cap``."""
    if cap <= 0:
        return None
    if sub >= cap:
        return "dominated"
    if split >= cap:
        return "split"
    return None


def path_limit(problem: PlacementProblem) -> np.ndarray:
    """The latency budget a path's nodes and inner links can use, per metric: the limit less the least
    latency into any node from the source and the least out of any node to the sink. Every path starts
    and ends with one such edge, so a node option whose own latency exceeds this carries no flow (a
    decode template's KV-cache transfer sits on its source edges, and can exceed the limit alone)."""
    n = problem.n
    ll = np.asarray(problem.link_lat, dtype=np.float64)
    return limit_less_ends(problem.lat_limit, ll[:, n, :n].min(axis=1), ll[:, :n, n].min(axis=1))


def limit_less_ends(lat_limit: np.ndarray, source: np.ndarray, sink: np.ndarray) -> np.ndarray:
    """``path_limit`` from its parts: the limits less the least source and sink edge latencies (per
    metric); an unlimited metric stays unlimited."""
    limit = np.asarray(lat_limit, dtype=np.float64)
    return limit - np.where(np.isposinf(limit), 0.0, np.asarray(source) + np.asarray(sink))


def layer_work_bound(problem: PlacementProblem) -> float:
    """Upper bound on a placement's flow: every unit crosses all L layers, so
    L * F = sum_i k_i * inflow_i <= sum_i max over latency-feasible options of k * cap, where an option
    is latency-feasible when it fits ``path_limit``.
    0 (no placement) also when those options cannot hold L layers even all together: every path
    covers L layers on distinct nodes."""
    limit = path_limit(problem)
    total = 0.0
    layers = 0
    for menu in problem.menus:
        if menu.size == 0:
            return 0.0
        ok = np.all(menu.lat <= limit[:, None] + 1e-12, axis=0)
        if not ok.any():
            return 0.0
        total += float(np.max(menu.k[ok] * menu.cap[ok]))
        layers += int(np.max(menu.k[ok]))
    if layers < problem.num_layers:
        return 0.0
    return total / problem.num_layers
