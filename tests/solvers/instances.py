"""Seeded random placement problems: tiny ones for brute-force cross-checks, and a hand-made branching one.

``random_tiny_problem`` mixes two menu styles: "perf-like" (capacity falls and latency grows with the
layers held; both grow with the batch) and "integer" (small random integers, so that ties and exact
latency equalities are common). Nodes of the same kind share their menu and their links, so symmetry
breaking can be exercised. Latency limits range from loose to infeasible, link capacities from unlimited
to binding.
"""

from __future__ import annotations

import attrs
import numpy as np

from solvers.problem import NodeMenu, PlacementProblem


def random_tiny_problem(
    rng: np.random.Generator,
    *,
    num_layers: int | None = None,
    n: int | None = None,
    num_metrics: int | None = None,
    max_options: int = 5,
    style: str | None = None,
) -> PlacementProblem:
    """A random problem with L in 2..8 layers and n in 1..3 nodes (unless given), small enough for brute."""
    L = int(rng.integers(2, 9)) if num_layers is None else num_layers
    n = int(rng.integers(1, 4)) if n is None else n
    nm = int(rng.integers(1, 3)) if num_metrics is None else num_metrics
    style = str(rng.choice(["perf", "integer"])) if style is None else style
    num_kinds = int(rng.integers(1, n + 1))
    kind_of = sorted(int(rng.integers(0, num_kinds)) for _ in range(n))
    used = sorted(set(kind_of))
    kind_of = [used.index(x) for x in kind_of]
    num_kinds = len(used)

    menus_by_kind = [_menu(rng, L, n, nm, max_options, style) for _ in range(num_kinds)]
    menus = tuple(menus_by_kind[x] for x in kind_of)
    kinds = tuple(f"kind{x}" for x in kind_of)

    # Links depend only on the kinds at both ends (index num_kinds stands for the source and the sink).
    scale = 0.05 if style == "perf" else 1.0
    kl = rng.integers(0, 3, size=(nm, num_kinds + 1, num_kinds + 1)).astype(np.float64) * scale
    kl[:, num_kinds, :] *= rng.random() < 0.5
    kc = np.full((num_kinds + 1, num_kinds + 1), np.inf)
    if rng.random() < 0.35:
        finite = rng.random(kc.shape) < 0.5
        kc[finite] = rng.integers(1, 8, size=int(finite.sum())).astype(np.float64)
    ext = [*kind_of, num_kinds]
    idx = np.asarray(ext)
    link_lat = kl[:, idx[:, None], idx[None, :]].copy()
    link_cap = kc[idx[:, None], idx[None, :]].copy()
    for i in range(n + 1):
        link_lat[:, i, i] = 0.0
        link_cap[i, i] = np.inf

    # Latency limits: a random multiple of a typical pipeline's latency; sometimes unconstrained.
    per_layer = np.array([np.mean(m.lat[mm] / np.maximum(m.k, 1)) for mm in range(nm) for m in menus])
    per_layer = per_layer.reshape(nm, n).mean(axis=1)
    typical = per_layer * L + link_lat.mean(axis=(1, 2)) * 2
    limit = typical * rng.uniform(0.5, 2.5, size=nm)
    if style == "integer":
        limit = np.maximum(np.round(limit), 1.0)
    limit[rng.random(nm) < 0.1] = np.inf
    return PlacementProblem(
        num_layers=L, kinds=kinds, menus=menus, link_lat=link_lat, link_cap=link_cap, lat_limit=limit
    )


def _menu(rng: np.random.Generator, L: int, n: int, nm: int, max_options: int, style: str) -> NodeMenu:
    size = int(rng.integers(1, max_options + 1))
    # Bias k towards values that tile L with n nodes, so that feasible placements are common.
    tiles = [L, max(1, L // 2), L - L // 2, max(1, L // 3), max(1, L - 2 * (L // 3))]
    pool = np.concatenate([np.arange(1, L + 1), tiles[: 1 + 2 * (n - 1)] * 2])
    k = rng.choice(pool, size=size).astype(np.int64)
    k[0] = tiles[min(2 * (n - 1), len(tiles) - 1)] if rng.random() < 0.6 else k[0]
    b = rng.choice(np.array([1, 2, 4]), size=size).astype(np.int64)
    if style == "perf":
        power = rng.uniform(0.5, 3.0)
        tau = (k * (0.1 + 0.04 * b) + 0.05) / power
        cap = b / tau
        lat = np.vstack([tau, (k * 0.3 + 0.02) / power][:nm])
    else:
        cap = rng.integers(0, 10, size=size).astype(np.float64)
        lat = rng.integers(0, 4, size=(nm, size)).astype(np.float64)
    mem = k.astype(np.float64) * b
    return NodeMenu(k=k, b=b, cap=np.asarray(cap, np.float64), lat=np.asarray(lat, np.float64), mem=mem)


def branching_problem() -> PlacementProblem:
    """L = 8 on three nodes where one node holding layers 0..3 feeding two nodes holding 4..7 is optimal.

    Node 0 ("big") holds 4 layers at capacity 10 or all 8 at capacity 3; nodes 1 and 2 ("small") hold 4
    layers at capacity 5, and a small node sends at most 2 units/s into the big one. Every node must
    carry flow, so the candidates are: the fork big[0..3] -> {small, small}[4..7] with min(10, 5 + 5) =
    10; the join {small, small}[0..3] -> big[4..7] with min(10, 2 + 2) = 4; the big replica (3) beside
    the small chain (5), 8 in all. The fork is the unique optimum, 10.
    """
    big = NodeMenu(
        k=np.array([4, 8]),
        b=np.array([8, 8]),
        cap=np.array([10.0, 3.0]),
        lat=np.array([[1.0, 2.0]]),
        mem=np.array([4.0, 8.0]),
    )
    small = NodeMenu(k=np.array([4]), b=np.array([4]), cap=np.array([5.0]), lat=np.array([[1.0]]), mem=np.array([4.0]))
    n = 3
    link_cap = np.full((n + 1, n + 1), np.inf)
    link_cap[1, 0] = link_cap[2, 0] = 2.0
    return PlacementProblem(
        num_layers=8,
        kinds=("big", "small", "small"),
        menus=(big, small, small),
        link_lat=np.full((1, n + 1, n + 1), 0.1),
        link_cap=link_cap,
        lat_limit=np.array([3.0]),
    )


def fork_problem() -> PlacementProblem:
    """L = 8 on four nodes where one node holding layers 0..3 feeding three nodes holding 4..7 is optimal.

    Node 0 ("big") holds 4 layers at capacity 15 or all 8 at capacity 3; nodes 1..3 ("small") hold 4
    layers at capacity 5 and send at most 2 units/s into the big node. The fork big -> {small x 3} carries
    min(15, 3 x 5) = 15; the best placement made of chains (pipelines and replicas) is two two-node chains,
    5 + 5 = 10 (a small node cannot hold all 8 layers, so none can stand alone); a fork into two smalls
    leaves the third small to join in, which adds nothing past the two smalls' 10 at the sink.
    """
    big = NodeMenu(
        k=np.array([4, 8]),
        b=np.array([8, 8]),
        cap=np.array([15.0, 3.0]),
        lat=np.array([[1.0, 2.0]]),
        mem=np.array([4.0, 8.0]),
    )
    small = NodeMenu(k=np.array([4]), b=np.array([4]), cap=np.array([5.0]), lat=np.array([[1.0]]), mem=np.array([4.0]))
    n = 4
    link_cap = np.full((n + 1, n + 1), np.inf)
    link_cap[1:4, 0] = 2.0
    return PlacementProblem(
        num_layers=8,
        kinds=("big", "small", "small", "small"),
        menus=(big, small, small, small),
        link_lat=np.full((1, n + 1, n + 1), 0.1),
        link_cap=link_cap,
        lat_limit=np.array([3.0]),
    )


def random_mid_problem(rng: np.random.Generator, *, n: int, num_layers: int, num_metrics: int = 1) -> PlacementProblem:
    """A perf-like problem beyond brute force: every (k, b) with k up to a memory cap, b in 1..8."""
    L = num_layers
    num_kinds = int(rng.integers(1, n + 1))
    kind_of = sorted(int(rng.integers(0, num_kinds)) for _ in range(n))
    used = sorted(set(kind_of))
    kind_of = [used.index(x) for x in kind_of]
    menus_by_kind = []
    for _ in used:
        power = rng.uniform(0.5, 3.0)
        kmax = int(rng.integers(max(1, L // n), L + 1))
        ks, bs = [], []
        for batch in (1, 2, 4, 8):
            top = max(1, kmax - batch // 2)
            ks.append(np.arange(1, top + 1))
            bs.append(np.full(top, batch))
        k = np.concatenate(ks).astype(np.int64)
        b = np.concatenate(bs).astype(np.int64)
        tau = (k * (0.02 + 0.004 * b) + 0.01) / power
        pre = (k * 0.05 + 0.01) / power
        lat = np.vstack([tau, pre][:num_metrics])
        menus_by_kind.append(NodeMenu(k=k, b=b, cap=b / tau, lat=lat, mem=(k * b).astype(np.float64)))
    menus = tuple(menus_by_kind[x] for x in kind_of)
    link_lat = np.full((num_metrics, n + 1, n + 1), 0.001)
    link_cap = np.full((n + 1, n + 1), np.inf)
    per_layer = np.mean([np.median(m.lat / m.k, axis=1) for m in menus], axis=0)
    limit = per_layer * L * rng.uniform(0.8, 2.0, size=num_metrics) + 0.02 * n
    return PlacementProblem(
        num_layers=L,
        kinds=tuple(f"kind{x}" for x in kind_of),
        menus=menus,
        link_lat=link_lat,
        link_cap=link_cap,
        lat_limit=limit,
    )


def with_roles(rng: np.random.Generator, problem: PlacementProblem, *, variants: int = 2) -> PlacementProblem:
    """``problem`` with option roles (``solvers.problem``): each option becomes up to ``variants`` options,
    each charged for a random count of micro-batches (``solvers.options.depths`` of the node count) and a
    random set of model ends (both when it holds every layer), its capacity lower and latency higher the
    more micro-batches it is charged for (as the perf model's menus). Nodes of one kind keep one menu."""
    L, n = int(problem.num_layers), problem.n
    depths = (1, 2, 3, 4) if n <= 3 else (1, 2, 3, 4, 5, 6)
    done: dict[int, NodeMenu] = {}
    menus = []
    for m in problem.menus:
        if id(m) not in done:
            rows: list[tuple[int, int, int]] = []
            for o in range(m.size):
                for d in rng.choice(depths, size=min(variants, len(depths)), replace=False):
                    e = 3 if int(m.k[o]) >= L else int(rng.choice([0, 1, 2, 3]))
                    rows.append((o, int(d), e))
            o_, d_, e_ = (np.array([r[j] for r in rows], dtype=np.int64) for j in range(3))
            slow = 1.0 + 0.15 * (d_ - 1)
            done[id(m)] = NodeMenu(
                k=m.k[o_], b=m.b[o_], cap=m.cap[o_] / slow, lat=m.lat[:, o_] * slow, mem=m.mem[o_] * d_, d=d_, ends=e_
            )
        menus.append(done[id(m)])
    return attrs.evolve(problem, menus=tuple(menus))


def mixed_paths_problem() -> PlacementProblem:
    """Paths of different lengths in one multiset: L = 4 on three nodes.

    Node 0 ("big") holds all 4 layers alone (1 micro-batch) at capacity 6, or 2 layers charged for 2 or
    4 micro-batches at capacity 5 or 4; nodes 1 and 2 ("small") hold 2 layers, at capacity 3 for 2
    micro-batches and 1 for 3; only the big node has an option with the LM head and 2 layers... none: a
    2-layer big option holds the embedding only. The best placement charged by its own paths is the big
    replica (1 micro-batch, 6) beside the two smalls as a chain (2 micro-batches each, 3): 9; the fork
    big -> {small, small} puts 2 + 2 micro-batches through the big node: min(4, 3 + 3) = 4. Charged for the
    multiset's n = 3 micro-batches on every node (the old rule), only the options charged for at least 3
    would count: the fork at min(4, 1 + 1) = 2.
    """
    big = NodeMenu(
        k=np.array([4, 2, 2]),
        b=np.array([4, 4, 4]),
        cap=np.array([6.0, 5.0, 4.0]),
        lat=np.array([[1.0, 0.5, 0.6]]),
        mem=np.array([4.0, 4.0, 8.0]),
        d=np.array([1, 2, 4]),
        ends=np.array([3, 1, 1]),
    )
    small = NodeMenu(
        k=np.array([2, 2, 2, 2]),
        b=np.array([4, 4, 4, 4]),
        cap=np.array([3.0, 3.0, 1.0, 1.0]),
        lat=np.array([[0.5, 0.5, 0.7, 0.7]]),
        mem=np.array([2.0, 2.0, 3.0, 3.0]),
        d=np.array([2, 2, 3, 3]),
        ends=np.array([1, 2, 1, 2]),
    )
    n = 3
    return PlacementProblem(
        num_layers=4,
        kinds=("big", "small", "small"),
        menus=(big, small, small),
        link_lat=np.full((1, n + 1, n + 1), 0.01),
        link_cap=np.full((n + 1, n + 1), np.inf),
        lat_limit=np.array([2.0]),
    )


def random_shaped_roles(rng: np.random.Generator, n: int = 3) -> PlacementProblem:
    """A tiny problem with roles whose nodes hold L, L / 2 or L / 3 layers: replicas,
    chains of two and three, forks and joins all compete, so optima mix paths of different lengths and put
    2 + 2 micro-batches through one node (L in 4, 6). Each (k, depth, ends) option exists with probability 0.7 (as if
    memory decided), with random capacity and latency; nodes of one kind share their menu."""
    L = int(rng.choice([4, 6]))
    kinds = sorted(int(x) for x in rng.integers(0, 2, size=n))
    menus_by_kind = []
    for _ in range(2):
        rows = []
        for k in sorted({L, L // 2, L // 3}):
            for d in (1, 2, 3, 4):
                for e in (3,) if k == L else (0, 1, 2):
                    if rng.random() < 0.7:
                        rows.append((k, d, e))
        if not rows:
            rows.append((L, 1, 3))
        k_, d_, e_ = (np.array([r[j] for r in rows], dtype=np.int64) for j in range(3))
        cap = rng.integers(1, 10, size=len(rows)).astype(np.float64)
        lat = np.round(rng.uniform(0.1, 1.0, size=(1, len(rows))) * k_ / L, 2)
        b = np.full(len(rows), 4)
        menus_by_kind.append(NodeMenu(k=k_, b=b, cap=cap, lat=lat, mem=(k_ * d_).astype(np.float64), d=d_, ends=e_))
    link_cap = np.full((n + 1, n + 1), np.inf)
    if rng.random() < 0.3:
        link_cap[rng.integers(0, n), rng.integers(0, n + 1)] = 2.0
    return PlacementProblem(
        num_layers=L,
        kinds=tuple(f"kind{x}" for x in kinds),
        menus=tuple(menus_by_kind[x] for x in kinds),
        link_lat=np.full((1, n + 1, n + 1), 0.01),
        link_cap=link_cap,
        lat_limit=np.array([float(rng.uniform(0.6, 1.5))]),
    )
