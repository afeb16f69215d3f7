"""The shape search's exact prunings: the edge relaxation and the cut test on boundaries never drop a
feasible labelled shape, and they do rule things out."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from solvers import shapes
from solvers.problem import PlacementProblem
from solvers.shapes import _Classes, _EdgeRelaxation, _Family, _Labelled, _shape, _Tables, _variants, skeletons

from .instances import random_tiny_problem

BIG = 10**9


def _thresholds(p: PlacementProblem) -> list[float]:
    top = max(float(np.max(m.cap)) for m in p.menus)
    return [top * f for f in (0.05, 0.2, 0.4, 0.7, 1.0)]


@pytest.mark.parametrize("seed", range(2))
def test_edge_relaxation_rules_out_only_infeasible_labellings(seed: int) -> None:
    """Whenever ``rules_out`` says no shape with these intervals and labels reaches F, every shape with
    those intervals (each labelling of the same identity) is infeasible at F by ``decide``."""
    ruled = kept = 0
    for t in range(20 * seed, 20 * seed + 20):
        rng = np.random.default_rng(t)
        n = 4 + t % 2
        style = ("perf", "integer")[t // 2 % 2]
        p = random_tiny_problem(rng, n=n, num_layers=int(rng.integers(4, 9)), max_options=4, num_metrics=1, style=style)
        tb, cl = _Tables(p), _Classes(p)
        counts = cl.full
        groups: dict[tuple[object, ...], list[shapes.Skeleton]] = {}
        for sk in skeletons(n):
            if _variants(n)[(sk.m, sk.iv)] >= 2:
                groups.setdefault((sk.m, sk.iv), []).append(sk)
        for F in _thresholds(p):
            relax = _EdgeRelaxation(p, cl)
            for sks in groups.values():
                for sk in sks:
                    fam = _Family(_shape(sk), cl.labellings(sk, counts), tb)
                    codes = relax.codes(sk, fam.labels)
                    assert codes is not None
                    for row in range(fam.labels.shape[0]):
                        if relax.rules_out(sk, counts, int(codes[row]), F, [BIG]):
                            ruled += 1
                            assert fam.labelled(row).decide(F, [BIG]) is None, (sk, fam.labels[row], F)
                        else:
                            kept += 1
    assert ruled > 50 and kept > 50, (ruled, kept)


@pytest.mark.parametrize("seed", range(2))
def test_cut_test_on_boundaries_keeps_every_feasible_placement(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``decide`` with the cut test applied while boundaries are placed finds a placement exactly when it
    finds one without that test, and the test does remove boundary vectors."""
    rng = np.random.default_rng(7200 + seed)
    plain = _Labelled._rows
    removed = 0

    def no_cuts(self: _Labelled, allowed, lb_lat, base, budget, cuts=(), ub_cap=(), F=0.0):  # type: ignore[no-untyped-def]
        return plain(self, allowed, lb_lat, base, budget)

    checked = 0
    for t in range(14):
        n = 3 + t % 3
        p = random_tiny_problem(rng, n=n, num_layers=int(rng.integers(3, 9)), max_options=4)
        tb, cl = _Tables(p), _Classes(p)
        for sk in skeletons(n):
            fam = _Family(_shape(sk), cl.labellings(sk, cl.full), tb)
            for F in _thresholds(p):
                for row in range(min(fam.labels.shape[0], 6)):
                    with_cuts = fam.labelled(row).decide(F, [BIG])
                    got: list[int] = []

                    def count(self, *args, _got=got, **kw):  # type: ignore[no-untyped-def]
                        out = plain(self, *args, **kw)
                        _got.append(out.shape[0] - no_cuts(self, *args, **kw).shape[0])
                        return out

                    monkeypatch.setattr(_Labelled, "_rows", count)
                    fam.labelled(row).decide(F, [BIG])
                    monkeypatch.setattr(_Labelled, "_rows", no_cuts)
                    without = fam.labelled(row).decide(F, [BIG])
                    monkeypatch.setattr(_Labelled, "_rows", plain)
                    assert (with_cuts is None) == (without is None), (sk, fam.labels[row], F)
                    removed += sum(-x for x in got)
                    checked += 1
    assert checked > 150 and removed > 0, (checked, removed)


def test_one_metric_kappa_matches_the_general_rule() -> None:
    """``_Tables.fit_cap`` (the one-metric shortcut for a shape node's largest usable capacity) gives the
    same per-node capacities as the general rule, which the same problem with a second, idle metric
    takes."""
    rng = np.random.default_rng(7300)
    compared = finite = 0
    for t in range(12):
        n = 2 + t % 4
        p = random_tiny_problem(rng, n=n, num_layers=int(rng.integers(3, 9)), max_options=5, num_metrics=1)
        if t % 3 == 0:  # no latency limit at all
            p = attrs.evolve(p, lat_limit=np.array([np.inf]))
        menus = tuple(attrs.evolve(m, lat=np.vstack([m.lat, np.zeros_like(m.lat)])) for m in p.menus)
        two = attrs.evolve(
            p,
            menus=menus,
            link_lat=np.concatenate([p.link_lat, np.zeros_like(p.link_lat)]),
            lat_limit=np.array([p.lat_limit[0], np.inf]),
        )
        tb1, tb2, cl = _Tables(p), _Tables(two), _Classes(p)
        for sk in skeletons(n):
            labels = cl.labellings(sk, cl.full)
            f1, f2 = _Family(_shape(sk), labels, tb1), _Family(_shape(sk), labels, tb2)
            np.testing.assert_array_equal(f1.labels, f2.labels)
            np.testing.assert_array_equal(f1.kappa, f2.kappa)
            compared += f1.kappa.size
            finite += int(np.isfinite(f1.kappa).sum())
    assert compared > 500 and finite > 100, (compared, finite)
