"""The online allocation program: exactness on tiny instances, modelling, serve-first, churn, replay."""

from __future__ import annotations

import itertools

import attrs
import highspy
import numpy as np
import pytest
import scipy.optimize

from solvers.allocation import (
    RESTRICTIONS,
    AllocationInputError,
    AllocationProblem,
    AllocationResult,
    AllocTemplate,
    SolverEffort,
    columns,
    model,
    relaxation,
    solve_allocation,
    stopping,
)
from solvers.allocation.columns import _columns
from solvers.allocation.decomposition import _split_phase
from solvers.allocation.model import _matrix
from solvers.allocation.solve import _restrict, _restrictions
from tests.solvers.alloc_instances import generate

# --------------------------------------------------------------------------------------------------
# Independent reference: evaluate a plan, and enumerate every plan of a tiny instance


def _template_cost(p: AllocationProblem, t: AllocTemplate, r: int) -> float:
    used = t.node_counts > 0
    if np.any(~np.isfinite(p.price[r][used])):
        return np.inf
    return float((t.node_counts[used] * p.price[r][used]).sum())


def evaluate(p: AllocationProblem, counts: dict[tuple[int, int], int]) -> tuple[np.ndarray, float, float]:
    """(served req/s per model, hourly cost, churn penalty) of a plan, computed from scratch."""
    M, R = p.num_models, p.num_regions
    agg = np.zeros(M)
    pre = np.zeros((M, R))  # req/s the prefill instances can feed, each bound by its compute and its NICs
    dec = np.zeros((M, R))
    cost = churn = 0.0
    for (i, r), n in counts.items():
        t = p.templates[i]
        c = _template_cost(p, t, r)
        cost += n * c
        churn += max(n - p.current.get((t.key, r), 0), 0) * p.churn_factor * t.load_s / 3600 * c
        if t.mode == "aggregated":
            agg[t.m] += n * p.utilisation / (p.mean_in[t.m] / t.prefill_tok_s + p.mean_out[t.m] / t.decode_tok_s)
        elif t.mode == "prefill":
            pre[t.m, r] += n * _prefill_rps(p, t)
        else:
            dec[t.m, r] += n * p.utilisation * t.decode_tok_s
    flow = np.minimum(pre, dec / p.mean_out[:, None])
    served = np.minimum(agg + flow.sum(axis=1), p.demand_rps)
    return served, cost, churn


def _prefill_rps(p: AllocationProblem, t: AllocTemplate) -> float:
    """req/s one prefill instance can feed: its compute, and its NICs carrying each request's KV."""
    kv = float(p.mean_in[t.m] * p.kv_bytes_per_token[t.m])
    nic = float(t.node_counts @ p.nic_bytes_s) / kv if kv > 0 else np.inf
    return min(p.utilisation * t.prefill_tok_s / float(p.mean_in[t.m]), nic)


def node_use(p: AllocationProblem, counts: dict[tuple[int, int], int]) -> np.ndarray:
    use = np.zeros_like(p.avail)
    for (i, r), n in counts.items():
        use[r] += n * p.templates[i].node_counts
    return use


def brute_force(p: AllocationProblem) -> tuple[float, float]:
    """(least total unmet req/s, least cost + churn at that service) over every plan."""
    n = len(p.templates)
    per_region = []
    for r in range(p.num_regions):
        plans: list[tuple[int, ...]] = []

        def extend(
            i: int, left: np.ndarray, plan: tuple[int, ...], r: int = r, plans: list[tuple[int, ...]] = plans
        ) -> None:
            if i == n:
                plans.append(plan)
                return
            t = p.templates[i]
            k = 0
            while True:
                extend(i + 1, left - k * t.node_counts, (*plan, k))
                if not np.isfinite(_template_cost(p, t, r)) or np.any(left - (k + 1) * t.node_counts < 0):
                    break
                k += 1

        extend(0, p.avail[r].copy(), ())
        per_region.append(plans)
    # per region and plan: capacity per model (aggregated + that region's disaggregated flow), cost
    caps, objs = [], []
    for r, plans in enumerate(per_region):
        cap = np.zeros((len(plans), p.num_models))
        obj = np.zeros(len(plans))
        for k, plan in enumerate(plans):
            counts = {(i, r): n for i, n in enumerate(plan) if n}
            served_alone, cost, churn = evaluate(attrs.evolve(p, demand_rps=np.full(p.num_models, 1e9)), counts)
            cap[k], obj[k] = served_alone, cost + churn
        caps.append(cap)
        objs.append(obj)
    total_cap, total_obj = caps[0], objs[0]
    for cap, obj in zip(caps[1:], objs[1:], strict=True):
        total_cap = (total_cap[:, None, :] + cap[None, :, :]).reshape(-1, p.num_models)
        total_obj = (total_obj[:, None] + obj[None, :]).reshape(-1)
    unmet = (p.demand_rps - np.minimum(total_cap, p.demand_rps)).sum(axis=1)
    best_unmet = float(unmet.min())
    return best_unmet, float(total_obj[unmet <= best_unmet + 1e-7].min())


def tiny_instance(seed: int, *, with_current: bool = False) -> AllocationProblem:
    rng = np.random.default_rng(seed)
    T, R, M = 3, 2, 2
    price = rng.uniform(1.0, 4.0, size=(R, T)) * np.array([1.0, 2.0, 4.0])
    price[rng.random((R, T)) < 0.15] = np.inf
    avail = np.where(np.isfinite(price), rng.integers(0, 5, size=(R, T)), 0)
    templates = []
    n_templates = int(rng.integers(4, 7))
    for i in range(n_templates):
        m = int(rng.integers(0, M))
        mode = str(rng.choice(["aggregated", "aggregated", "prefill", "decode"]))
        nc = np.zeros(T, dtype=np.int64)
        nc[rng.integers(0, T)] += 1
        if rng.random() < 0.4:
            nc[rng.integers(0, T)] += 1
        P = float(rng.uniform(3000, 12000) * nc.sum())
        D = float(rng.uniform(400, 1500) * nc.sum())
        templates.append(AllocTemplate(m, mode, nc, P, D, float(rng.uniform(20, 200)), f"t{i}"))
    if rng.random() < 0.5:  # an exact duplicate under another key
        templates.append(attrs.evolve(templates[0], key="t0-dup"))
    current: dict[tuple[str, int], int] = {}
    if with_current:
        for _ in range(3):
            t = templates[int(rng.integers(0, len(templates)))]
            current[(t.key, int(rng.integers(0, R)))] = int(rng.integers(1, 3))
    return AllocationProblem(
        models=("a", "b"),
        demand_rps=rng.uniform(0.5, 5.0, size=M).round(2),
        mean_in=np.array([800.0, 1500.0]),
        mean_out=np.array([200.0, 300.0]),
        kv_bytes_per_token=np.array([1e5, 2e5]),
        node_types=("n0", "n1", "n2"),
        nic_bytes_s=np.array([3e9, 6e9, 1.2e10]),
        regions=("r0", "r1"),
        price=price,
        avail=avail,
        templates=tuple(templates),
        current=current,
        churn_factor=float(rng.choice([0.0, 1.0, 20.0])),
    )


def check_plan(p: AllocationProblem, res: AllocationResult) -> None:
    """The plan fits the availability and its reported figures match an independent evaluation."""
    assert np.all(node_use(p, dict(res.counts)) <= p.avail)
    served, cost, churn = evaluate(p, dict(res.counts))
    np.testing.assert_allclose(res.served_rps, served, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(res.unmet_rps, p.demand_rps - served, rtol=1e-9, atol=1e-9)
    assert res.cost_per_hour == pytest.approx(cost, rel=1e-9, abs=1e-9)
    assert res.churn_cost == pytest.approx(churn, rel=1e-9, abs=1e-9)
    assert res.objective == pytest.approx(cost + churn, rel=1e-9, abs=1e-9)
    assert res.bound <= res.objective + 1e-9


# --------------------------------------------------------------------------------------------------
# Exactness


@pytest.mark.parametrize("seed", range(24))
def test_tiny_instances_match_exhaustive_enumeration(seed: int) -> None:
    p = tiny_instance(seed, with_current=seed % 2 == 1)
    res = solve_allocation(p, deadline_s=30.0, mip_gap=0.0)
    check_plan(p, res)
    best_unmet, best_obj = brute_force(p)
    assert res.status == "optimal"
    assert res.service_proven
    assert res.total_unmet_rps == pytest.approx(best_unmet, abs=1e-6)
    assert res.objective == pytest.approx(best_obj, rel=1e-6, abs=1e-6)


EFFORTS = [
    SolverEffort(lp=0, serve=0, cost=0),
    SolverEffort(serve=0, cost=0),
    SolverEffort(serve=1, cost=0),
    SolverEffort(cost=0),
    SolverEffort(cost=1),
    SolverEffort(dive=1, serve=1, cost=1),
]


@pytest.mark.parametrize("seed", range(12))
def test_status_claims_only_what_is_proven(seed: int) -> None:
    """Whatever phase a solve stops in: ``optimal`` is the true optimum; ``feasible`` serves the most
    and its bound is below the true optimum; ``no bound`` carries bound 0 and gap 1."""
    p = tiny_instance(seed, with_current=seed % 3 == 0)
    if seed % 2:
        p = attrs.evolve(p, avail=p.avail // 2)  # scarce: not every demand served
    best_unmet, best_obj = brute_force(p)
    for effort in EFFORTS:
        res = solve_allocation(p, effort=effort, mip_gap=0.0)
        check_plan(p, res)
        assert res.status in ("optimal", "feasible", "no bound")
        if res.status == "optimal":
            assert res.total_unmet_rps == pytest.approx(best_unmet, abs=1e-6)
            assert res.objective == pytest.approx(best_obj, rel=1e-6, abs=1e-6)
        elif res.status == "feasible":
            assert res.total_unmet_rps == pytest.approx(best_unmet, abs=1e-6)
            assert 0 < res.bound <= best_obj * (1 + 1e-9) + 1e-9
            assert res.gap == pytest.approx((res.objective - res.bound) / res.objective)
        else:
            assert res.bound == 0.0 and res.gap == (1.0 if res.objective > 0 else 0.0)


def test_generated_instance_plan_is_consistent() -> None:
    p = generate("core", 50, seed=3, load=0.15)
    res = solve_allocation(p, deadline_s=1.0)
    check_plan(p, res)
    assert res.total_unmet_rps == pytest.approx(0.0, abs=1e-6)
    assert 0.0 <= res.gap < 0.2
    assert res.num_columns < len(p.templates) * p.num_regions  # availability-filtered


def _no_worse(c: AllocationResult, b: AllocationResult) -> bool:
    """Plan c serves at least as much as plan b, and when as much, costs no more (cost plus churn)."""
    tol = 1e-7 * max(1.0, float(c.served_rps.sum() + c.unmet_rps.sum()))
    if c.total_unmet_rps < b.total_unmet_rps - tol:
        return True
    return c.total_unmet_rps <= b.total_unmet_rps + tol and c.objective <= b.objective * (1 + 1e-9) + 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_never_worse_than_a_baseline_on_the_same_inputs(seed: int) -> None:
    """Each baseline (homogeneous aggregated, homogeneous prefill/decode, their union) solved to its optimum
    on its own templates never beats Coral, even when Coral's own MIPs are all skipped."""
    p = generate("core", 6, seed=seed, scarcity=(1.0, 2.5)[seed % 2], load=(0.2, 0.5)[seed % 2])
    cut = solve_allocation(p, effort=SolverEffort(serve=0, cost=0, decompose=0), columns="all")
    restrictions = _restrictions(p)
    assert restrictions and {name for name, _ in restrictions} <= set(RESTRICTIONS)
    for _name, idx in restrictions:
        base = solve_allocation(_restrict(p, idx), effort=SolverEffort(), columns="all", portfolio=False)
        assert base.status == "optimal"
        check_plan(p, cut)
        assert _no_worse(cut, base)


# --------------------------------------------------------------------------------------------------
# Modelling


def one_region_problem(
    templates: list[AllocTemplate], *, demand: float, nic: float = 1e10, **kw: object
) -> AllocationProblem:
    fields: dict[str, object] = {
        "models": ("m",),
        "demand_rps": [demand],
        "mean_in": [1000.0],
        "mean_out": [250.0],
        "kv_bytes_per_token": [1e5],
        "node_types": ("big", "small"),
        "nic_bytes_s": [nic, nic],
        "regions": ("east", "west"),
        "price": [[10.0, 2.0], [10.0, 2.0]],
        "avail": [[8, 8], [8, 8]],
        "templates": tuple(templates),
    }
    fields.update(kw)
    return AllocationProblem(**fields)  # type: ignore[arg-type]


def test_disaggregated_serving_pairs_prefill_with_decode_in_one_region() -> None:
    prefill = AllocTemplate(0, "prefill", [0, 1], 20000.0, 0.0, 60.0, "p")
    decode = AllocTemplate(0, "decode", [1, 0], 0.0, 2000.0, 60.0, "d")
    p = one_region_problem([prefill, decode], demand=10.0)
    res = solve_allocation(p, deadline_s=10.0, mip_gap=0.0)
    check_plan(p, res)
    assert res.status == "optimal"
    assert res.total_unmet_rps == pytest.approx(0.0, abs=1e-9)
    regions = {r for (_i, r) in res.counts}
    assert len(regions) == 1
    r = regions.pop()
    # 10 req/s needs 10k prompt tok/s (1 prefill at 0.85 * 20k) and 2.5k decode tok/s (2 decodes)
    assert res.counts == {(0, r): 1, (1, r): 2}

    # prefill offered only in one region and decode only in the other: nothing can be served
    split = one_region_problem([prefill, decode], demand=10.0, avail=[[0, 8], [8, 0]])
    res = solve_allocation(split, deadline_s=10.0)
    check_plan(split, res)
    assert res.counts == {}
    assert res.unmet_rps[0] == pytest.approx(10.0)
    assert res.status == "optimal"


def test_kv_transfer_bandwidth_limits_disaggregated_flow() -> None:
    prefill = AllocTemplate(0, "prefill", [0, 1], 20000.0, 0.0, 60.0, "p")
    decode = AllocTemplate(0, "decode", [1, 0], 0.0, 2000.0, 60.0, "d")
    # KV of one request: 1000 tokens * 1e5 B = 1e8 B; a prefill node's NIC moves 2e8 B/s -> 2 req/s
    p = one_region_problem([prefill, decode], demand=10.0, nic=2e8)
    res = solve_allocation(p, deadline_s=10.0, mip_gap=0.0)
    check_plan(p, res)
    assert res.total_unmet_rps == pytest.approx(0.0, abs=1e-9)
    n_prefill = sum(n for (i, _r), n in res.counts.items() if i == 0)
    assert n_prefill == 5  # NIC-bound: 5 prefill instances, although 1 has the compute

    scarce = one_region_problem([prefill, decode], demand=10.0, nic=2e8, avail=[[8, 3], [0, 0]])
    res = solve_allocation(scarce, deadline_s=10.0, mip_gap=0.0)
    check_plan(scarce, res)
    assert res.served_rps[0] == pytest.approx(6.0)
    assert res.unmet_rps[0] == pytest.approx(4.0)


def test_decode_pairs_only_with_a_prefill_whose_nic_is_fast_enough() -> None:
    """A decode template whose KV transfer needs a 5e9 B/s sender is never fed by a prefill instance on
    a 1e9 B/s node: the cheap slow prefill serves only the decode that takes any sender."""
    slow_pre = AllocTemplate(0, "prefill", [0, 1], 20000.0, 0.0, 60.0, "slow-p")
    fast_pre = AllocTemplate(0, "prefill", [1, 0], 20000.0, 0.0, 60.0, "fast-p")
    picky = AllocTemplate(0, "decode", [1, 0], 0.0, 2000.0, 60.0, "picky-d", kv_min_nic=5e9)
    p = one_region_problem([slow_pre, fast_pre, picky], demand=4.0, nic_bytes_s=[1e10, 1e9])
    res = solve_allocation(p, deadline_s=10.0, mip_gap=0.0)
    assert res.status == "optimal" and res.total_unmet_rps == pytest.approx(0.0, abs=1e-9)
    used = {p.templates[i].key for (i, _r), n in res.counts.items() if n}
    assert used == {"fast-p", "picky-d"}  # the slow prefill is cheaper ($2 against $10) but cannot feed it
    # the same decode needing no more than the slow NIC pairs with the cheap prefill
    easy = attrs.evolve(picky, key="easy-d", kv_min_nic=1e9)
    p2 = one_region_problem([slow_pre, fast_pre, easy], demand=4.0, nic_bytes_s=[1e10, 1e9])
    res2 = solve_allocation(p2, deadline_s=10.0, mip_gap=0.0)
    assert {p2.templates[i].key for (i, _r), n in res2.counts.items() if n} == {"slow-p", "easy-d"}
    # only the slow prefill on offer: the picky decode serves nothing, even with nodes to spare
    p3 = one_region_problem([slow_pre, picky], demand=4.0, nic_bytes_s=[1e10, 1e9])
    res3 = solve_allocation(p3, deadline_s=10.0, mip_gap=0.0)
    assert res3.counts == {} and res3.unmet_rps[0] == pytest.approx(4.0)


def _disaggregated_lp(p: AllocationProblem, plan: tuple[int, ...], m: int) -> float:
    """Most req/s model m serves disaggregated in region 0 with ``plan``'s instances, by a linear program
    over which NIC levels each prefill template's instances feed (any split): each level l serves
    y_l <= decode / out of the decode templates whose least feeding class is l and y_l <= the req/s of
    the prefill shares sent to it (only from templates of class >= l)."""
    nic_class = [float(p.nic_bytes_s[t.node_counts > 0].min()) for t in p.templates]
    pre = [i for i, t in enumerate(p.templates) if t.mode == "prefill" and t.m == m]
    levels = sorted({nic_class[i] for i in pre})
    if not levels:
        return 0.0
    dec = np.zeros(len(levels))
    for i, t in enumerate(p.templates):
        if t.mode == "decode" and t.m == m and plan[i]:
            ok = [k for k, c in enumerate(levels) if c >= t.kv_min_nic * (1 - 1e-12)]
            if ok:
                dec[ok[0]] += plan[i] * p.utilisation * t.decode_tok_s / float(p.mean_out[m])
    pairs = [(i, k) for i in pre for k, c in enumerate(levels) if c <= nic_class[i]]
    L, Z = len(levels), len(pairs)
    a_ub, b_ub = [], []
    for i in pre:  # shares of template i: at most its instances
        a_ub.append([0.0] * L + [1.0 if pi == i else 0.0 for pi, _k in pairs])
        b_ub.append(float(plan[i]))
    for k in range(L):  # y_k <= sum of the prefill req/s of the shares sent to level k
        a_ub.append(
            [1.0 if kk == k else 0.0 for kk in range(L)]
            + [-_prefill_rps(p, p.templates[pi]) if pk == k else 0.0 for pi, pk in pairs]
        )
        b_ub.append(0.0)
    bounds = [(0.0, float(d)) for d in dec] + [(0.0, None)] * Z
    res = scipy.optimize.linprog([-1.0] * L + [0.0] * Z, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    assert res.status == 0
    return float(-res.fun)


def _pairing_brute_force(p: AllocationProblem) -> tuple[float, float]:
    """(least unmet, least cost + churn) over every plan, each serving the most its prefill and decode
    instances can (``_disaggregated_lp``). Independent of the solver's columns; tiny instances only."""
    best: tuple[float, float] | None = None
    ranges = [range(4) for _ in p.templates]
    assert p.num_regions == 1, "one region only"
    usable = [np.isfinite(_template_cost(p, t, 0)) for t in p.templates]
    for plan in itertools.product(*ranges):
        if any(n and not usable[i] for i, n in enumerate(plan)):
            continue
        use = sum((n * t.node_counts for n, t in zip(plan, p.templates, strict=True)), np.zeros(p.num_node_types))
        if np.any(use > p.avail[0]):
            continue
        counts = {(i, 0): n for i, n in enumerate(plan) if n}
        _served, cost, churn = evaluate(p, counts)
        served = np.zeros(p.num_models)
        for i, n in enumerate(plan):
            t = p.templates[i]
            if t.mode == "aggregated" and n:
                served[t.m] += n * p.utilisation / (p.mean_in[t.m] / t.prefill_tok_s + p.mean_out[t.m] / t.decode_tok_s)
        for m in range(p.num_models):
            served[m] += _disaggregated_lp(p, plan, m)
        unmet = float((p.demand_rps - np.minimum(served, p.demand_rps)).sum())
        key = (unmet, cost + churn)
        if best is None or key[0] < best[0] - 1e-7 or (abs(key[0] - best[0]) <= 1e-7 and key[1] < best[1]):
            best = key
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(8))
def test_nic_pairing_matches_exhaustive_enumeration(seed: int) -> None:
    """One region, one model, prefill templates on nodes of three NIC classes and decode templates that
    need a sender of some NIC: the solver's optimum equals the enumeration over plans and prefill-to-level
    assignments."""
    rng = np.random.default_rng(100 + seed)
    nic = np.array([1e9, 4e9, 1.6e10])
    templates = []
    for i in range(5):
        mode = "prefill" if i < 3 else "decode"
        nc = np.zeros(3, dtype=np.int64)
        nc[i % 3 if mode == "prefill" else int(rng.integers(0, 3))] = 1
        need = float(rng.choice([0.0, 2e9, 8e9])) if mode == "decode" else 0.0
        P = float(rng.uniform(3000, 9000)) if mode == "prefill" else 0.0
        D = float(rng.uniform(400, 1200)) if mode == "decode" else 0.0
        templates.append(AllocTemplate(0, mode, nc, P, D, 60.0, f"t{i}", kv_min_nic=need))
    p = AllocationProblem(
        models=("a",),
        demand_rps=[float(rng.uniform(1.0, 4.0))],
        mean_in=[800.0],
        mean_out=[200.0],
        kv_bytes_per_token=[1e5],
        node_types=("n0", "n1", "n2"),
        nic_bytes_s=nic,
        regions=("r0",),
        price=[rng.uniform(1.0, 4.0, size=3).round(2) * np.array([1.0, 2.0, 4.0])],
        avail=[rng.integers(1, 4, size=3)],
        templates=tuple(templates),
    )
    res = solve_allocation(p, deadline_s=30.0, mip_gap=0.0)
    unmet, obj = _pairing_brute_force(p)
    assert res.status == "optimal"
    assert res.total_unmet_rps == pytest.approx(unmet, abs=1e-6)
    assert res.objective == pytest.approx(obj, rel=1e-6, abs=1e-6)


def _two_level_problem() -> AllocationProblem:
    """One fast prefill instance (NIC 1e10, 4.25 req/s), a slow mixed one (NIC 1e9, 0.85 req/s), and one
    decode instance each needing a sender of 5e9 and of any NIC (2.125 req/s each); 4.25 req/s demand."""
    templates = (
        AllocTemplate(0, "prefill", [1, 0, 0, 0, 0], 4000.0, 0.0, 60.0, "fast-p"),
        AllocTemplate(0, "prefill", [0, 1, 1, 0, 0], 800.0, 0.0, 60.0, "slow-mixed-p"),
        AllocTemplate(0, "decode", [0, 0, 0, 1, 0], 0.0, 500.0, 60.0, "picky-d", kv_min_nic=5e9),
        AllocTemplate(0, "decode", [0, 0, 0, 0, 1], 0.0, 500.0, 60.0, "easy-d"),
    )
    return AllocationProblem(
        models=("m",), demand_rps=[4.25], mean_in=[800.0], mean_out=[200.0], kv_bytes_per_token=[1e5],
        node_types=("a", "b", "e", "c", "d"), nic_bytes_s=[1e10, 1e9, 1e9, 1e10, 1e10], regions=("r",),
        price=[[4.0, 1.0, 1.0, 2.0, 2.0]], avail=[[1, 1, 1, 1, 1]], templates=templates,
    )  # fmt: skip


def test_one_prefill_instance_feeds_decode_instances_of_two_nic_levels() -> None:
    """The fast prefill instance feeds the picky decode (level 1e10) and the easy one (level 1e9, where
    the slow prefill also may feed) at once: all 4.25 req/s are served. With the fast instance in one
    level only, 2.125 + 0.85 are; the homogeneous prefill/decode restriction (no slow mixed prefill, so
    one level) served all of it, and the whole problem never serves less than it."""
    p = _two_level_problem()
    alone = solve_allocation(p, deadline_s=30.0, mip_gap=0.0, portfolio=False)
    assert alone.status == "optimal" and alone.total_unmet_rps == pytest.approx(0.0, abs=1e-9)
    check_plan(p, alone)
    assert {p.templates[i].key for (i, _r), n in alone.counts.items() if n} == {"fast-p", "picky-d", "easy-d"}
    whole = solve_allocation(p, deadline_s=30.0, mip_gap=0.0)
    for name, idx in _restrictions(p):
        base = solve_allocation(_restrict(p, idx), deadline_s=30.0, mip_gap=0.0, portfolio=False)
        assert base.status == "optimal", name
        assert _no_worse(whole, base), name
        assert _no_worse(alone, base), name


def test_prefill_carries_hold_the_state_flows() -> None:
    """The warm start's carries v hold exactly the flows the plan's state computes: every prefill row and
    decode row of the program holds at the plan's vector, and the fast instance's supply left over at the
    picky level (4.25 - 2.125 req/s) is passed down to the easy level."""
    p = _two_level_problem()
    c = _columns(p)
    mat = _matrix(c)
    x = np.ones(c.J, dtype=np.int64)
    v = model._plan_vector(c, mat, x)
    rows = np.zeros(mat.num_rows)
    for col in range(mat.num_cols):
        end = mat.start[col + 1] if col + 1 < mat.num_cols else len(mat.value)
        rows[mat.index[mat.start[col] : end]] += mat.value[mat.start[col] : end] * v[col]
    n_dem = len(mat.dem_models)
    assert np.all(rows <= mat.row_hi + 1e-9) and np.all(rows[:n_dem] >= mat.row_lo[:n_dem] - 1e-9)
    assert c.Q == 2 and [len(f) for f in c.by_pool_pre] == [2, 1]  # pools by level: 1e9 (both), 1e10 (fast-p)
    carry = dict(zip(c.pool_level.tolist(), v[c.J : c.J + c.Q], strict=True))
    assert carry[1e10] == pytest.approx(2.125) and carry[1e9] == pytest.approx(0.85)
    assert float(v[-1]) == pytest.approx(0.0)  # all 4.25 req/s served


def test_unmet_demand_is_reported_under_scarcity() -> None:
    agg = AllocTemplate(0, "aggregated", [1, 0], 10000.0, 1000.0, 60.0, "a")
    p = one_region_problem([agg], demand=50.0, avail=[[2, 0], [1, 0]])
    res = solve_allocation(p, deadline_s=10.0)
    check_plan(p, res)
    per_instance = 0.85 / (1000 / 10000 + 250 / 1000)
    assert res.counts == {(0, 0): 2, (0, 1): 1}
    assert res.served_rps[0] == pytest.approx(3 * per_instance)
    assert res.unmet_rps[0] == pytest.approx(50.0 - 3 * per_instance)
    assert res.service_proven


def test_duplicate_templates_are_merged_and_running_ones_kept() -> None:
    a = AllocTemplate(0, "aggregated", [1, 0], 10000.0, 1000.0, 60.0, "a")
    twin = attrs.evolve(a, key="a-twin")
    p = one_region_problem([a, twin], demand=4.0, current={("a-twin", 1): 1}, avail=[[8, 0], [8, 0]])
    res = solve_allocation(p, deadline_s=10.0, mip_gap=0.0)
    check_plan(p, res)
    assert res.merged_templates == 1
    assert res.counts.get((1, 1)) == 1  # the running twin is kept under its own key
    assert res.churn_cost == pytest.approx((sum(res.counts.values()) - 1) * 60.0 / 3600 * 10.0)


# --------------------------------------------------------------------------------------------------
# Serve first


def max_served_reference(p: AllocationProblem) -> float:
    """Phase 1 alone, written independently: maximise served req/s (aggregated templates only)."""
    M, R, T = p.num_models, p.num_regions, p.num_node_types
    cols = [(i, r) for i, t in enumerate(p.templates) for r in range(R) if np.isfinite(_template_cost(p, t, r))]
    h = highspy.Highs()
    h.silent()
    h.setOptionValue("threads", 1)
    rate = [p.utilisation / (p.mean_in[t.m] / t.prefill_tok_s + p.mean_out[t.m] / t.decode_tok_s) for t in p.templates]
    x = [h.addVariable(lb=0, ub=highspy.kHighsInf, type=highspy.HighsVarType.kInteger) for _ in cols]
    s = [h.addVariable(lb=0, ub=float(p.demand_rps[m])) for m in range(M)]
    for m in range(M):
        h.addConstr(h.qsum([rate[i] * x[k] for k, (i, _r) in enumerate(cols) if p.templates[i].m == m]) - s[m] >= 0)
    for r in range(R):
        for g in range(T):
            terms = [
                int(p.templates[i].node_counts[g]) * x[k]
                for k, (i, rr) in enumerate(cols)
                if rr == r and p.templates[i].node_counts[g]
            ]
            if terms:
                h.addConstr(h.qsum(terms) <= int(p.avail[r, g]))
    h.maximize(h.qsum(s))
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return float(h.getInfo().objective_function_value)


def test_serve_first_serves_the_maximum_possible_demand() -> None:
    # a cheap model-0 template and an expensive one that is the only way to serve the last req/s
    cheap = AllocTemplate(0, "aggregated", [0, 1], 10000.0, 1000.0, 60.0, "cheap")
    pricey = AllocTemplate(0, "aggregated", [1, 0], 2000.0, 200.0, 60.0, "pricey")
    p = one_region_problem([cheap, pricey], demand=3.0, avail=[[1, 1], [0, 0]], price=[[1000.0, 1.0], [1000.0, 1.0]])
    res = solve_allocation(p, deadline_s=10.0)
    check_plan(p, res)
    assert res.counts == {(0, 0): 1, (1, 0): 1}  # pays 1000 USD/h for 0.49 req/s more
    assert res.total_unmet_rps == pytest.approx(3.0 - 0.85 / 0.35 - 0.85 / 1.75)

    scarce = generate("core", 10, seed=5, scarcity=6.0, disagg_fraction=0.0, load=0.3)
    res = solve_allocation(scarce, deadline_s=20.0, mip_gap=1e-6)
    check_plan(scarce, res)
    assert res.total_unmet_rps > 1.0  # scarce indeed
    assert res.service_proven
    assert float(res.served_rps.sum()) == pytest.approx(max_served_reference(scarce), rel=1e-5)


# --------------------------------------------------------------------------------------------------
# Churn and hysteresis


def test_running_instances_are_kept_unless_removing_them_pays() -> None:
    # the same capacity on a node type 5% cheaper; loading takes 600 s (1/6 of an hour's price)
    old = AllocTemplate(0, "aggregated", [1, 0], 10000.0, 1000.0, 600.0, "old")
    new = AllocTemplate(0, "aggregated", [0, 1], 10000.0, 1000.0, 600.0, "new")
    demand = 5 * 0.85 / 0.35  # five instances
    base = one_region_problem(
        [old, new],
        demand=demand,
        price=[[10.0, 9.5], [10.0, 9.5]],
        avail=[[10, 10], [0, 0]],
        current={("old", 0): 5},
    )

    # switching saves 0.5 USD/h per instance but each start costs 1.58: keep them
    res = solve_allocation(base, deadline_s=10.0, mip_gap=0.0)
    check_plan(base, res)
    assert res.counts == {(0, 0): 5}
    assert res.churn_cost == 0.0

    # without the churn penalty the optimum moves to the better template
    free = attrs.evolve(base, churn_factor=0.0)
    res = solve_allocation(free, deadline_s=10.0, mip_gap=0.0)
    assert res.counts == {(1, 0): 5}

    # slightly more demand: keep all five, start one more (of the cheaper kind)
    more = attrs.evolve(base, demand_rps=np.array([demand * 1.03]))
    res = solve_allocation(more, deadline_s=10.0, mip_gap=0.0)
    check_plan(more, res)
    assert res.counts == {(0, 0): 5, (1, 0): 1}

    # demand drops: removing instances pays (no penalty for stopping), and they go
    less = attrs.evolve(base, demand_rps=np.array([demand * 0.55]))
    res = solve_allocation(less, deadline_s=10.0, mip_gap=0.0)
    check_plan(less, res)
    assert res.counts == {(0, 0): 3}


def test_resolve_with_current_plan_keeps_most_instances() -> None:
    p = generate("core", 50, seed=11, load=0.15)
    first = solve_allocation(p, deadline_s=1.0)
    current = {(p.templates[i].key, r): n for (i, r), n in first.counts.items()}
    demand = p.demand_rps * np.array([1.02, 0.99, 1.01, 1.0, 0.98, 1.03])
    again = solve_allocation(attrs.evolve(p, demand_rps=demand, current=current), deadline_s=1.0)
    check_plan(attrs.evolve(p, demand_rps=demand, current=current), again)
    kept = sum(min(n, again.counts.get(k, 0)) for k, n in first.counts.items())
    assert kept >= 0.8 * sum(first.counts.values())
    assert again.churn_cost <= 0.05 * again.cost_per_hour


@pytest.mark.parametrize("scarcity", [1.0, 5.0])
def test_column_generation_reaches_the_full_lp_bound(scarcity: float) -> None:

    p = generate("core", 100, seed=7, scarcity=scarcity)
    c = columns._columns(p)
    mat = model._matrix(c)
    full, generated = relaxation._LpOutcome(), relaxation._LpOutcome()
    relaxation._lp_job(model._highs(mat, mat.cost_obj, model._service_hi(c, 0.0), 1e-4, mip=False), c, mat, full)
    relaxation._cg_job(c, mat, 1e-4, generated, stopping._LpStop(None))
    assert full.done and generated.done
    assert generated.columns is not None and len(generated.columns) < c.J
    assert generated.unmet == pytest.approx(full.unmet, rel=1e-6, abs=1e-6)
    assert generated.bound == pytest.approx(full.bound, rel=1e-6)
    res = solve_allocation(p, deadline_s=0.5, columns="generated")
    check_plan(p, res)
    assert res.column_generation
    if scarcity > 1:  # availability cut fivefold: not all demand can be served
        assert res.total_unmet_rps > 1.0
    else:
        assert res.total_unmet_rps == pytest.approx(0.0, abs=1e-6)


def test_auto_generates_columns_at_the_extended_size() -> None:
    small = solve_allocation(generate("core", 50, seed=1), deadline_s=0.2)
    assert not small.column_generation
    p = generate("extended", 50, seed=1)
    res = solve_allocation(p, deadline_s=0.5)
    check_plan(p, res)
    assert res.column_generation


# --------------------------------------------------------------------------------------------------
# Decomposition by model


def test_decomposition_merges_models_that_share_a_scarce_node_type() -> None:
    """Alone, each model takes the one cheap node; together they cannot, so the two are solved jointly."""
    one = np.array([1, 0])
    other = np.array([0, 1])
    p = AllocationProblem(
        models=("a", "b"), demand_rps=[1.0, 1.0], mean_in=[100.0, 100.0], mean_out=[10.0, 10.0],
        kv_bytes_per_token=[0.0, 0.0], node_types=("cheap", "dear"), nic_bytes_s=[1e9, 1e9], regions=("r",),
        price=[[1.0, 3.0]], avail=[[1, 5]],
        templates=[
            AllocTemplate(0, "aggregated", one, 1e4, 1e3, 0.0, "a-cheap"),
            AllocTemplate(0, "aggregated", other, 1e4, 1e3, 0.0, "a-dear"),
            AllocTemplate(1, "aggregated", one, 1e4, 1e3, 0.0, "b-cheap"),
            AllocTemplate(1, "aggregated", other, 1e4, 1e3, 0.0, "b-dear"),
        ],
        churn_factor=0.0,
    )  # fmt: skip
    res = solve_allocation(p, deadline_s=30, mip_gap=0.0, decompose=True, master=False)
    assert res.status == "optimal"
    assert res.split_groups == 3  # a, b, then {a, b}
    assert res.cost_per_hour == pytest.approx(4.0)
    assert node_use(p, dict(res.counts)).tolist() == [[1, 1]]
    # the joint MIP told to stop at its first solution: the full MIP finishes, with the models' bounds as
    # cuts (HiGHS solves this joint MIP before its first interrupt check, so it records no stop: it finished)
    stopped = SolverEffort(split=[(0b11, 1)])
    cut = solve_allocation(p, effort=stopped, mip_gap=0.0, decompose=True, master=False)
    assert cut.effort in (stopped, SolverEffort())
    assert cut.status == "optimal"
    assert cut.cost_per_hour == pytest.approx(4.0)


def test_decomposition_prunes_only_against_a_start_that_serves_the_demand() -> None:
    """A start that under-serves a model costs less than its optimum: it must not prune the columns."""

    def agg(key: str, rate: float) -> AllocTemplate:  # rate req/s at in 100 / out 10, utilisation 1
        return AllocTemplate(0, "aggregated", np.array([1]) if key == "small" else np.array([3]), 200 * rate,
                             20 * rate, 0.0, key)  # fmt: skip

    p = AllocationProblem(
        models=("a",), demand_rps=[1.0], mean_in=[100.0], mean_out=[10.0], kv_bytes_per_token=[0.0],
        node_types=("n",), nic_bytes_s=[1e9], regions=("r",), price=[[1.0]], avail=[[10]],
        templates=[agg("small", 0.3), agg("big", 1.0)], churn_factor=0.0, utilisation=1.0,
    )  # fmt: skip
    c = _columns(p)
    mat = _matrix(c)
    small = int(np.nonzero(c.nc[:, 0] == 1)[0][0])
    start = np.zeros(c.J, dtype=np.int64)
    start[small] = 1  # serves 0.3 of 1 req/s for $1; the optimum is one big instance for $3
    split = _split_phase(c, mat, start, {}, None, 0.0)
    assert split.plan is not None and split.proven and split.fits
    assert split.bound == pytest.approx(3.0)
    assert float(c.cost @ split.plan) == pytest.approx(3.0)


# --------------------------------------------------------------------------------------------------
# Deadline and deterministic replay


@pytest.mark.slow
def test_same_effort_gives_the_same_plan() -> None:
    p = generate("core", 50, seed=2, load=0.2)
    first = solve_allocation(p, deadline_s=0.4)
    replay = solve_allocation(p, effort=first.effort)
    assert replay.effort == first.effort
    assert replay.counts == first.counts
    assert replay.objective == first.objective

    # each model's own MIP stopped at its first solution: the decomposition proves nothing, and the
    # full MIP then stops at its second (16 templates per model: the same path in 2 s of CPU, where 50 took 28)
    p = generate("core", 16, seed=2, load=0.2)
    fixed = SolverEffort(cost=2, split=[(1 << m, 1) for m in range(p.num_models) if p.demand_rps[m] > 0])
    a = solve_allocation(p, effort=fixed, decompose=True, master=False)
    b = solve_allocation(p, effort=fixed, decompose=True, master=False)
    assert a.counts == b.counts
    assert a.effort == b.effort == fixed
    assert a.status != "optimal"
    assert SolverEffort.from_mapping(fixed.as_mapping()) == fixed


def test_scarce_replays_and_diving() -> None:
    """Not every demand can be served: the LP dive's steps are part of the effort, and replay exactly."""
    p = generate("core", 50, seed=3, scarcity=3.0, load=0.6)
    first = solve_allocation(p, deadline_s=0.3, columns="all")
    assert first.total_unmet_rps > 0
    replay = solve_allocation(p, effort=first.effort, columns="all")
    assert replay.counts == first.counts and replay.effort == first.effort
    fixed = SolverEffort(dive=2, serve=0, cost=0)
    a = solve_allocation(p, effort=fixed, columns="all")
    b = solve_allocation(p, effort=fixed, columns="all")
    assert a.counts == b.counts and a.effort == b.effort == fixed
    check_plan(p, a)
    # without the MIPs, the dive serves more than the rounding alone (here 470 -> 457 req/s unmet)
    full = solve_allocation(p, effort=SolverEffort(serve=0, cost=0), columns="all")
    none = solve_allocation(p, effort=SolverEffort(dive=0, serve=0, cost=0), columns="all")
    assert full.total_unmet_rps < none.total_unmet_rps - 1.0


class FakeClock:
    """A clock that stands still for its first ``ticks`` readings and then jumps past every deadline."""

    def __init__(self, ticks: int | None) -> None:
        self.ticks = ticks
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return 0.0 if self.ticks is None or self.reads <= self.ticks else 1e18


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "decompose", "master"),
    [("scarce", False, True), ("plenty", True, False), ("plenty", False, False), ("search", False, False)],
    ids=["scarce", "split", "full", "search"],
)
def test_a_deadline_at_any_phase_replays_exactly(kind: str, decompose: bool, master: bool) -> None:
    """Cut the solve at each of its first clock readings (the phase boundaries: LP, dive, neighbourhood
    search, decomposition, serve, cost) and at readings inside its MIPs: each result's effort replays its
    plan exactly. (The master rounds, which end the plenty case before the decomposition, have their own
    test in ``test_alloc_master``.) ``search``: an instance whose search takes a dozen steps and improves
    the plan; cuts fall inside different steps."""
    if kind == "scarce":
        p = generate("core", 8, seed=3, scarcity=3.0, load=0.6)
    elif kind == "search":
        p = generate("core", 12, seed=3, load=0.2)
    else:
        p = generate("core", 8, seed=2, load=0.2)
    kw = {"columns": "all", "decompose": decompose, "mip_gap": 1e-2, "master": master}
    cut = cuts_replay_exactly(p, kw, 12 if kind == "search" else 8)
    seen = {tuple(sorted(first.effort.as_mapping().items())) for first in cut}
    assert len(seen) >= 3  # the cuts fell in different phases
    if kind == "search":
        assert len({first.effort.search for first in cut if first.effort.search is not None}) >= 2


def cuts_replay_exactly(p: AllocationProblem, kw: dict[str, object], k: int) -> list[AllocationResult]:
    """Solve p cut at each of its first k clock readings and at k - 1 readings spread over the rest (how
    many each phase takes depends on HiGHS); assert each replays exactly from its effort. The cut results."""
    counting = FakeClock(None)
    solve_allocation(p, deadline_s=3600.0, clock=counting, **kw)  # type: ignore[arg-type]
    n = counting.reads
    out = []
    for ticks in sorted({*range(1, min(n, k) + 1), *(i * n // k for i in range(1, k))} - {0}):
        first = solve_allocation(p, deadline_s=3600.0, clock=FakeClock(ticks), **kw)  # type: ignore[arg-type]
        replay = solve_allocation(p, effort=first.effort, **kw)  # type: ignore[arg-type]
        assert replay.effort == first.effort, ticks
        assert replay.counts == first.counts, ticks
        assert (replay.objective, replay.bound, replay.gap, replay.status) == (
            first.objective, first.bound, first.gap, first.status
        )  # fmt: skip
        check_plan(p, first)
        out.append(first)
    return out


class _Enough(Exception):
    pass


def test_a_deadline_inside_the_heuristic_replays_exactly() -> None:
    """The heuristic's local search reads the clock before each step: a deadline there records the steps
    taken, and the replay stops at the same step, with the same plan, bound, gap and status."""
    p = generate("core", 50, seed=2, load=0.35)
    kw = {"columns": "all", "portfolio": False}
    counting = FakeClock(None)
    at_report: list[int] = []

    def first_report(res: AllocationResult) -> None:
        at_report.append(counting.reads)
        assert res.effort.heuristic is None  # the heuristic ran to its end
        raise _Enough

    with pytest.raises(_Enough):  # the MIPs after it would take long: stop at the first report
        solve_allocation(p, deadline_s=3600.0, clock=counting, progress=first_report, **kw)  # type: ignore[arg-type]
    # the first report follows the heuristic, whose last clock readings are one per local-search step
    cuts = []
    for ticks in (at_report[0] - 2, at_report[0] - 4, at_report[0] - 8):
        first = solve_allocation(p, deadline_s=3600.0, clock=FakeClock(ticks), **kw)  # type: ignore[arg-type]
        replay = solve_allocation(p, effort=first.effort, **kw)  # type: ignore[arg-type]
        assert replay.effort == first.effort and replay.counts == first.counts
        assert (replay.objective, replay.bound, replay.gap, replay.status) == (
            first.objective, first.bound, first.gap, first.status
        )  # fmt: skip
        check_plan(p, first)
        if first.effort.heuristic is not None:
            cuts.append(first.effort.heuristic)
    assert len(set(cuts)) >= 2  # cut at different steps of the local search
    assert SolverEffort.from_mapping(SolverEffort(heuristic=3).as_mapping()) == SolverEffort(heuristic=3)


@pytest.mark.parametrize(
    ("kind", "decompose"),
    [
        pytest.param("scarce", False, id="scarce"),
        # the split case replays every report of a decomposed solve: 57 s of the fast tier at load 8
        pytest.param("plenty", True, id="split", marks=pytest.mark.slow),
    ],
)
def test_every_progress_report_replays_exactly(kind: str, decompose: bool) -> None:
    """Each result passed to ``progress`` (the solve as if cut at that moment) replays to the same plan,
    bound, gap and status; the last one is the result returned."""
    if kind == "scarce":
        p = generate("core", 8, seed=3, scarcity=3.0, load=0.6)
    else:
        p = generate("core", 8, seed=2, load=0.2)
    kw = {"columns": "all", "decompose": decompose, "mip_gap": 1e-3}
    reports: list[AllocationResult] = []
    final = solve_allocation(p, deadline_s=3600.0, progress=reports.append, **kw)  # type: ignore[arg-type]
    assert len(reports) >= 4
    assert reports[-1].counts == final.counts and reports[-1].effort == final.effort
    for rep in reports:
        replay = solve_allocation(p, effort=rep.effort, **kw)  # type: ignore[arg-type]
        assert replay.effort == rep.effort
        assert replay.counts == rep.counts
        assert (replay.objective, replay.bound, replay.gap, replay.status) == (rep.objective, rep.bound, rep.gap,
                                                                               rep.status)  # fmt: skip
    objectives = [(r.total_unmet_rps, r.objective) for r in reports]
    assert objectives == sorted(objectives, reverse=True)  # each report is at least as good as the last


def test_deadline_cuts_to_the_greedy_path() -> None:
    p = generate("core", 400, seed=4, load=0.2)
    res = solve_allocation(p, deadline_s=1e-6)
    check_plan(p, res)
    assert res.status == "no bound" and res.bound == 0.0 and res.gap == 1.0
    assert (res.effort.lp, res.effort.serve, res.effort.cost) == (0, None, 0)
    assert res.effort.restricted and all(e.lp == 0 and e.cost == 0 for _name, e in res.effort.restricted)
    assert res.total_unmet_rps == pytest.approx(0.0, abs=1e-6)
    # and the replay of that path needs no clock
    assert solve_allocation(p, effort=res.effort).counts == res.counts


def test_no_demand_gives_an_empty_plan() -> None:
    p = attrs.evolve(generate("core", 10, seed=1), demand_rps=np.zeros(6))
    res = solve_allocation(p)
    assert res.counts == {}
    assert res.status == "optimal"
    assert res.objective == 0.0


# --------------------------------------------------------------------------------------------------
# Bad input


def test_bad_input_is_rejected_with_a_clear_error() -> None:
    agg = AllocTemplate(0, "aggregated", [1, 0], 10000.0, 1000.0, 60.0, "a")
    ok = one_region_problem([agg], demand=1.0)
    cases: list[tuple[dict[str, object], str]] = [
        ({"demand_rps": [-1.0]}, "demand_rps"),
        ({"demand_rps": ["lots"]}, "demand_rps"),
        ({"templates": ("a",)}, "must be an AllocTemplate"),
        ({"current": {"a": 1}}, "pairs"),
        ({"avail": [[-1, 0], [0, 0]]}, "avail"),
        ({"avail": [[1.5, 0], [0, 0]]}, "avail"),
        ({"price": [[1.0, 1.0]]}, "price"),
        ({"demand_rps": [1.0, 2.0]}, "demand_rps"),
        ({"nic_bytes_s": [1.0]}, "nic_bytes_s"),
        ({"mean_in": [0.0]}, "mean_in"),
        ({"templates": (attrs.evolve(agg, m=3),)}, "unknown model index 3"),
        ({"templates": (attrs.evolve(agg, mode="hybrid"),)}, "mode"),
        ({"templates": (attrs.evolve(agg, node_counts=np.array([1, 0, 0])),)}, "node_counts"),
        ({"templates": (attrs.evolve(agg, node_counts=np.array([0, 0])),)}, "node_counts"),
        ({"templates": (attrs.evolve(agg, decode_tok_s=0.0),)}, "decode_tok_s"),
        ({"templates": (agg, agg)}, "duplicate key"),
        ({"current": {("nope", 0): 1}}, "unknown template key"),
        ({"current": {("a", 5): 1}}, "region index 5"),
        ({"current": {("a", 0): -2}}, "count"),
        ({"utilisation": 1.5}, "utilisation"),
    ]
    for change, message in cases:
        fields: dict[str, object] = {f.name: getattr(ok, f.name) for f in attrs.fields(AllocationProblem)}
        fields.update(change)
        with pytest.raises(AllocationInputError, match=message):
            AllocationProblem(**fields)  # type: ignore[arg-type]
    with pytest.raises(AllocationInputError, match="deadline_s"):
        solve_allocation(ok, deadline_s=0.0)
    with pytest.raises(AllocationInputError, match="mip_gap"):
        solve_allocation(ok, mip_gap=-0.1)
    with pytest.raises(AllocationInputError, match="columns"):
        solve_allocation(ok, columns="some")
