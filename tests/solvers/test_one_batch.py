"""One micro-batch per template (``solvers.library.place_one_batch``) against brute force per batch size."""

from __future__ import annotations

import numpy as np
import pytest

from coral.perf import PerfModel
from coral.workload import Slo, WorkloadShape
from solvers.brute import brute_force_place
from solvers.combos import layer_work_bound
from solvers.library import ProblemCache, batch_work_bounds, place_one_batch, restrict_batch, solve_multiset
from solvers.options import build_problem
from solvers.rules import evaluate_placement

from .instances import random_tiny_problem


@pytest.mark.parametrize("seed", range(3))
def test_one_batch_is_the_best_over_batch_sizes(seed: int) -> None:
    """Per instance: the value is the max over b of brute force on the menus restricted to b, and the
    placement it returns uses one b and is worth what it claims."""
    rng = np.random.default_rng(7000 + seed)
    mixed = 0
    for _ in range(30):
        p = random_tiny_problem(rng, max_options=int(rng.integers(2, 7)))
        best = 0.0
        for b in sorted({int(x) for m in p.menus for x in m.b}):
            sub = restrict_batch(p, b)
            if sub is not None:
                ref = brute_force_place(sub)
                if ref.status == "optimal":
                    best = max(best, ref.value)
        free = brute_force_place(p)
        sub, res = place_one_batch(p)
        assert res.status in ("optimal", "infeasible")
        assert res.value == pytest.approx(best, rel=1e-7, abs=1e-12)
        if free.status == "optimal" and free.value > best * (1 + 1e-7) + 1e-12:
            mixed += 1  # the unrestricted optimum mixed batch sizes: the restriction costs something
        if res.status == "optimal" and res.value > 0:
            assert len({int(sub.menus[i].b[o]) for i, o in enumerate(res.option)}) == 1
            ev = evaluate_placement(sub, res.option, res.start, res.flows.keys())
            assert ev is not None and ev[0] == pytest.approx(res.value, rel=1e-6, abs=1e-9)
    assert mixed > 0  # the instances do exercise the restriction


def test_restrict_batch_needs_every_node() -> None:
    rng = np.random.default_rng(3)
    p = random_tiny_problem(rng, n=2, max_options=4)
    absent = 1 + max(int(x) for m in p.menus for x in m.b)
    assert restrict_batch(p, absent) is None


def test_pipeline_stages_share_one_batch(perf: PerfModel) -> None:
    """A real two-node pipeline: every stage steps the same micro-batch."""
    slo, shape = Slo(2.0, 0.1, 0.9), WorkloadShape(1155, 211)
    tpl, res, _ = solve_multiset(perf, "llama-3.1-8b", ["g6e.xlarge", "g6e.xlarge"], "aggregated", slo, shape, key="t")
    assert tpl is not None and res.status == "optimal"
    assert len({s.batch for s in tpl.stages}) == 1


@pytest.mark.slow
def test_problem_cache_equals_build_problem(perf: PerfModel) -> None:
    """The build's cached problems are exactly ``build_problem``'s, in every mode, for multisets of
    1..6 nodes with repeated and mixed types (seeded: each size twice per mode); so are their per-batch
    layer-work bounds."""
    rng = np.random.default_rng(11)
    slo, shape = Slo(2.0, 0.1, 0.9), WorkloadShape(1155, 211)
    types = sorted(perf.catalog.nodes)[:8]
    repeated = 0
    for mode in ("aggregated", "prefill", "decode"):
        cache = ProblemCache(perf, "llama-3.1-8b", mode, slo, shape)
        for i in range(12):
            nodes = [str(x) for x in rng.choice(types, size=1 + i % 6)]
            repeated += len(set(nodes)) < len(nodes)
            a, b = build_problem(perf, "llama-3.1-8b", nodes, mode, slo, shape), cache.problem(nodes)
            assert a.kinds == b.kinds and a.num_layers == b.num_layers
            for f in ("link_lat", "link_cap", "lat_limit"):
                assert np.array_equal(getattr(a, f), getattr(b, f)), (mode, nodes, f)
            for x, y in zip(a.menus, b.menus, strict=True):
                for f in ("k", "b", "cap", "lat", "mem"):
                    assert np.array_equal(getattr(x, f), getattr(y, f)), (mode, nodes, f)
            assert cache.batch_bounds(nodes) == batch_work_bounds(a)
    assert repeated >= 6  # multisets that repeat a type, where the cache shares a node's menu


def test_batch_work_bounds_match_the_restricted_problems() -> None:
    """``batch_work_bounds`` equals ``layer_work_bound`` of each restricted problem (0 where none)."""
    rng = np.random.default_rng(12)
    for _ in range(200):
        p = random_tiny_problem(rng, max_options=int(rng.integers(1, 7)))
        got = batch_work_bounds(p)
        for b in sorted({int(x) for m in p.menus for x in m.b}):
            sub = restrict_batch(p, b)
            assert got[b] == (layer_work_bound(sub) if sub is not None else 0.0)
