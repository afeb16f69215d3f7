"""The shape search's exact prunings: the edge relaxation and the cut test on boundaries never drop a
feasible labelled shape, and they do rule things out."""

from __future__ import annotations

import itertools

import attrs
import numpy as np
import pytest

from coral.catalog import load_catalog
from coral.perf import PerfModel
from coral.workload import Slo, WorkloadShape
from solvers.library import restrict_batch
from solvers.options import build_problem
from solvers.problem import PlacementProblem
from solvers.reduce import reduce_problem
from solvers.rules import Classes
from solvers.shapes import decide
from solvers.shapes.catalogue import Skeleton, skeletons, variants
from solvers.shapes.decide import Budget, Labelled, Prep, screen
from solvers.shapes.family import Family, prefilter
from solvers.shapes.layout import shape_layout
from solvers.shapes.search import EdgeRelaxation, labellings
from solvers.shapes.tables import Tables

from .instances import random_tiny_problem

BIG = 10**9


def _thresholds(p: PlacementProblem) -> list[float]:
    top = max(float(np.max(m.cap)) for m in p.menus)
    return [top * f for f in (0.05, 0.2, 0.4, 0.7, 1.0)]


@pytest.mark.slow
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
        tb, cl = Tables(p), Classes(p)
        counts = cl.full
        groups: dict[tuple[object, ...], list[Skeleton]] = {}
        for sk in skeletons(n):
            if variants(n)[(sk.m, sk.iv)] >= 2:
                groups.setdefault((sk.m, sk.iv), []).append(sk)
        for F in _thresholds(p):
            relax = EdgeRelaxation(p, cl)
            for sks in groups.values():
                for sk in sks:
                    fam = Family(shape_layout(sk), labellings(cl, sk, counts), tb)
                    codes = relax.codes(sk, fam.labels)
                    assert codes is not None
                    for row in range(fam.labels.shape[0]):
                        if not relax.open(sk, counts, codes[row : row + 1], F)[0]:
                            assert Labelled(fam, row).decide(F, Budget(BIG)) is None, (sk, fam.labels[row], F)
                        if relax.rules_out(sk, counts, int(codes[row]), F, Budget(BIG)):
                            ruled += 1
                            assert Labelled(fam, row).decide(F, Budget(BIG)) is None, (sk, fam.labels[row], F)
                        else:
                            kept += 1
    assert ruled > 50 and kept > 50, (ruled, kept)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_cut_test_on_boundaries_keeps_every_feasible_placement(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``decide`` with the cut test applied while boundaries are placed finds a placement exactly when it
    finds one without that test, and the test does remove boundary vectors."""
    rng = np.random.default_rng(7200 + seed)
    plain = decide.enumerate_rows
    removed = 0

    def no_cuts(fam, preps, F, budget):  # type: ignore[no-untyped-def]
        bare = [attrs.evolve(pr, kept=np.zeros_like(pr.kept), kept_cuts=[]) for pr in preps]
        return plain(fam, bare, F, budget)

    checked = 0
    for t in range(14):
        n = 3 + t % 3
        p = random_tiny_problem(rng, n=n, num_layers=int(rng.integers(3, 9)), max_options=4)
        tb, cl = Tables(p), Classes(p)
        for sk in skeletons(n):
            fam = Family(shape_layout(sk), labellings(cl, sk, cl.full), tb)
            for F in _thresholds(p):
                for row in range(min(fam.labels.shape[0], 6)):
                    with_cuts = Labelled(fam, row).decide(F, Budget(BIG))
                    got: list[int] = []

                    def count(*args, _got=got, **kw):  # type: ignore[no-untyped-def]
                        out = plain(*args, **kw)
                        _got.append(out[0].shape[0] - no_cuts(*args, **kw)[0].shape[0])
                        return out

                    monkeypatch.setattr(decide, "enumerate_rows", count)
                    Labelled(fam, row).decide(F, Budget(BIG))
                    monkeypatch.setattr(decide, "enumerate_rows", no_cuts)
                    without = Labelled(fam, row).decide(F, Budget(BIG))
                    monkeypatch.setattr(decide, "enumerate_rows", plain)
                    assert (with_cuts is None) == (without is None), (sk, fam.labels[row], F)
                    removed += sum(-x for x in got)
                    checked += 1
    assert checked > 150 and removed > 0, (checked, removed)


def _reference_rows(fam: Family, pr: Prep, F: float) -> np.ndarray:
    """Every kept-boundary vector that meets the final tests of ``enumerate_rows``, by listing them all:
    each element's length allowed (and within its span, when ``pr`` has spans), each path's latency bound
    within the limits, each kept cut able to carry F with its elements' largest capacities at their
    lengths."""
    tb, sh = fam.tb, fam.sh
    L, r = tb.L, len(sh.kept) - 1
    out = []
    for inner in itertools.combinations(range(1, L), r - 1):
        b = (0, *inner, L)
        ks = [b[e] - b[a] for a, e in sh.elem_iv]
        if not all(pr.els[q].allowed[k] for q, k in enumerate(ks)):
            continue
        if pr.span is not None and not all(pr.span[q, 0] <= k <= pr.span[q, 1] for q, k in enumerate(ks)):
            continue
        lat = pr.base.copy()
        for pi, els in enumerate(sh.paths_el):
            for q in els:
                x = pr.els[q]
                lat[:, pi] += x.lb_lat[:, ks[q]] - x.lb_lat[:, x.allowed].min(axis=1)
        if np.any(lat > tb.budget[:, None] * (1 + 1e-12)):
            continue
        if not all(es + sum(pr.els[q].ub_cap[ks[q]] for q in els) >= F for els, es in pr.kept_cuts):
            continue
        out.append(b)
    return np.array(out, np.int64).reshape(-1, r + 1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_enumeration_matches_a_plain_listing_one_and_many_at_once(seed: int) -> None:
    """``enumerate_rows`` (positions bounded by the allowed lengths, lengths checked as soon as they are known,
    prefix tests) gives exactly the boundary vectors that a plain listing of all of them keeps, in the same
    (lexicographic) order; given several labellings at once, each gets the rows it gets alone, and
    ``Family.screen`` keeps exactly the labellings with rows within their elements' spans."""
    rng = np.random.default_rng(7400 + seed)
    compared = nonempty = screened = spanned = 0
    for t in range(16):
        n = 3 + t % 3
        p = random_tiny_problem(rng, n=n, num_layers=int(rng.integers(5, 12)), max_options=4, num_metrics=1 + t % 2)
        tb, cl = Tables(p), Classes(p)
        top = max(float(np.max(m.cap)) for m in p.menus)
        for sk in skeletons(n):
            fam = Family(shape_layout(sk), labellings(cl, sk, cl.full), tb)
            for F in (0.0, *(top * f for f in (0.1, 0.2, 0.3, 0.45, 0.6))):
                labs = [Labelled(fam, row) for row in range(min(fam.labels.shape[0], 4))]
                preps = [(j, pr) for j, lab in enumerate(labs) if (pr := lab.prep(F)) is not None]
                alone = []
                for _, pr in preps:
                    rows, who = decide.enumerate_rows(fam, [pr], F, Budget(BIG))
                    ref = _reference_rows(fam, pr, F)
                    if ref.size:
                        np.testing.assert_array_equal(rows, ref)
                    assert rows.shape[0] == ref.shape[0] and not who.any()
                    alone.append(rows)
                    compared += 1
                    nonempty += rows.shape[0] > 0
                if not preps:
                    continue
                rows, who = decide.enumerate_rows(fam, [pr for _, pr in preps], F, Budget(BIG))
                for j, single in enumerate(alone):
                    if single.size:
                        np.testing.assert_array_equal(rows[who == j], single)
                    assert (who == j).sum() == single.shape[0]
                kept = [lab for lab, _ in screen(fam, range(len(labs)), F, Budget(BIG))]
                spans = fam.spans(range(len(labs)), F) if F > 0 else None
                for j, span in (spans or {}).items():  # with spans too: exactly the plain listing's rows
                    pr = labs[j].prep(F, span)
                    if pr is not None:
                        ref = _reference_rows(fam, pr, F)
                        rows = decide.enumerate_rows(fam, [pr], F, Budget(BIG))[0]
                        assert rows.shape[0] == ref.shape[0]
                        if ref.size:
                            np.testing.assert_array_equal(rows, ref)
                        spanned += 1
                with_rows = []
                for j, lab in enumerate(labs):  # the rows it gets with its elements' spans
                    if spans is not None and j not in spans:
                        continue
                    pr = lab.prep(F, None if spans is None else spans[j])
                    if pr is not None and decide.enumerate_rows(fam, [pr], F, Budget(BIG))[0].size:
                        with_rows.append(lab.nodes)
                assert [lab.nodes for lab in kept] == with_rows
                screened += len(kept)
    assert compared > 150 and nonempty > 50 and compared - nonempty > 30 and screened > 50 and spanned > 50, (
        compared,
        nonempty,
        spanned,
    )


def test_one_metric_kappa_matches_the_general_rule() -> None:
    """``Tables.fit_cap`` (the one-metric shortcut for a shape node's largest usable capacity) gives the
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
        tb1, tb2, cl = Tables(p), Tables(two), Classes(p)
        for sk in skeletons(n):
            labels = labellings(cl, sk, cl.full)
            f1, f2 = Family(shape_layout(sk), labels, tb1), Family(shape_layout(sk), labels, tb2)
            np.testing.assert_array_equal(f1.labels, f2.labels)
            np.testing.assert_array_equal(f1.kappa, f2.kappa)
            compared += f1.kappa.size
            finite += int(np.isfinite(f1.kappa).sum())
    assert compared > 500 and finite > 100, (compared, finite)


def test_prefilter_drops_only_infeasible_labellings() -> None:
    """A labelling that ``prefilter`` drops at F (a cut node with no option of capacity >= F that passes
    the work test, or a path that cannot cover the layers) has no placement of flow >= F by ``decide``."""
    rng = np.random.default_rng(7500)
    dropped = kept = 0
    for t in range(30):
        n = 3 + t % 3
        p = random_tiny_problem(rng, n=n, num_layers=int(rng.integers(4, 10)), max_options=4, style="perf")
        tb, cl = Tables(p), Classes(p)
        for sk in skeletons(n):
            sh = shape_layout(sk)
            labels = labellings(cl, sk, cl.full)
            fam = Family(sh, labels, tb)
            for F in (*_thresholds(p), 0.3 * sum(float(np.max(m.cap)) for m in p.menus)):
                left = {tuple(row) for row in prefilter(sh, fam.labels, tb, F).tolist()}
                for row in range(fam.labels.shape[0]):
                    if tuple(fam.labels[row].tolist()) in left:
                        kept += 1
                    else:
                        dropped += 1
                        assert Labelled(fam, row).decide(F, Budget(BIG)) is None, (sk, fam.labels[row], F)
    assert dropped > 300 and kept > 100, (dropped, kept)


def test_prefilter_runs_the_path_test_of_candidates() -> None:
    """The shape search skips ``candidates``' path test for labellings that ``prefilter`` kept at the
    same F: among those, the labellings that pass all of ``candidates``' tests are exactly the ones that
    pass all but the path test, and none that ``candidates`` keeps is dropped by the prefilter. Real
    menus (the built-in catalog, gemma-3-27b) at thresholds near the upper bound, where the path test
    (cut nodes held to options of capacity >= F) rules out most."""
    cut_by_paths = kept = 0
    for p, ub in _real_problems():
        tb, cl = Tables(p), Classes(p)
        for sk in skeletons(p.n):
            sh = shape_layout(sk)
            fam = Family(sh, labellings(cl, sk, cl.full), tb)
            for F in (ub * f for f in (0.7, 0.85, 0.95, 0.99)):
                left = {tuple(row) for row in prefilter(sh, fam.labels, tb, F).tolist()}
                mask = [tuple(row) in left for row in fam.labels.tolist()]
                full = set(fam.candidates(F).tolist())
                loose = set(fam.candidates(F, paths=False).tolist())
                assert full == {r for r in loose if mask[r]}, (p.kinds, sk, F)
                cut_by_paths += len(loose - full)
                kept += len(full)
    assert cut_by_paths > 50 and kept > 500, (cut_by_paths, kept)  # 78 and 1,976 on the opcurve-3 menus


def test_cover_work_with_cut_nodes_matches_cover_at() -> None:
    """``Tables.cover_work(comp, F, cut)`` equals ``cover_at(mask, cut, F, comp)`` on every node set
    that holds the cut nodes, and is inf elsewhere."""
    rng = np.random.default_rng(7700)
    finite = 0
    for t in range(12):
        n = 3 + t % 3
        p = random_tiny_problem(
            rng, n=n, num_layers=int(rng.integers(4, 10)), max_options=4, num_metrics=1 + t % 2, style="perf"
        )
        tb = Tables(p)
        full = (1 << n) - 1
        for F in _thresholds(p):
            for cut in range(1 << n):
                tab = tb.cover_work(full, F, cut)
                if tab is None:
                    continue
                for mask in range(1 << n):
                    if mask & cut != cut:
                        assert np.all(np.isinf(tab[:, mask]))
                        continue
                    np.testing.assert_allclose(tab[:, mask], tb.cover_at(mask, cut, F, full))
                    finite += int(np.isfinite(tab[:, mask]).all())
    assert finite > 100, finite


def _real_problems() -> list[tuple[PlacementProblem, float]]:
    """Reduced one-batch placement problems of gemma-3-27b on 4 nodes of the built-in catalog, each
    with the reductions' upper bound on its flow."""
    perf = PerfModel(load_catalog())
    slo, shape = Slo(ttft_s=2.0, tpot_s=0.1, attainment=0.9), WorkloadShape(mean_in=1155, mean_out=211)
    out = []
    for nodes in (
        ("g6.xlarge", "g6.xlarge", "g6e.xlarge", "p5.4xlarge"),
        ("a2-highgpu-1g", "g5.xlarge", "g6.xlarge", "p5.4xlarge"),
        ("g4dn.12xlarge", "g6.xlarge", "g6e.xlarge", "a2-highgpu-1g"),
    ):
        for mode in ("prefill", "decode"):
            whole = build_problem(perf, "gemma-3-27b", nodes, mode, slo, shape)
            for b in sorted({int(x) for m in whole.menus for x in m.b}):
                sub = restrict_batch(whole, b)
                red = reduce_problem(sub) if sub is not None else None
                if red is not None:
                    out.append((red.problem, red.ub))
    return out


def test_length_propagation_drops_only_infeasible_labellings() -> None:
    """A labelling that ``Family._length_bounds`` rules out at F (the layer counts cannot meet the path,
    cut and capacity bounds together) has no placement of flow >= F by ``decide``; on random tiny
    problems and on real menus near their upper bound, where it rules out many."""
    rng = np.random.default_rng(7800)
    problems = [
        random_tiny_problem(rng, n=3 + t % 3, num_layers=int(rng.integers(4, 10)), max_options=4, style="perf")
        for t in range(20)
    ]
    dropped = kept = 0
    tiny = [(p, max(float(np.max(m.cap)) for m in p.menus)) for p in problems]
    for p, top in [*tiny, *_real_problems()]:
        tb, cl = Tables(p), Classes(p)
        for sk in skeletons(p.n):
            fam = Family(shape_layout(sk), labellings(cl, sk, cl.full), tb)
            if fam.labels.shape[0] == 0:
                continue
            comp = int(np.bitwise_or.reduce(1 << fam.labels[0]))
            for F in (*_thresholds(p), *(top * f for f in (0.7, 0.85, 0.95, 0.99))):
                if tb.work_mask(comp, F) is None:
                    continue
                ok = np.zeros(fam.labels.shape[0], bool)
                ok[fam._length_bounds(np.arange(fam.labels.shape[0]), F)[0]] = True
                for row in np.flatnonzero(~ok).tolist():
                    dropped += 1
                    assert Labelled(fam, row).decide(F, Budget(BIG)) is None, (sk, fam.labels[row], F)
                kept += int(ok.sum())
    assert dropped > 300 and kept > 300, (dropped, kept)


@pytest.mark.slow
def test_element_spans_keep_every_decision() -> None:
    """Deciding a labelled shape with its elements' layer counts held to ``Family.spans`` gives the same
    answer (a placement of flow >= F or none) as without them, and a labelling left out has none; on
    random tiny problems and on real menus near their upper bound."""
    rng = np.random.default_rng(7900)
    tiny = [
        random_tiny_problem(rng, n=3 + t % 3, num_layers=int(rng.integers(4, 10)), max_options=4, style="perf")
        for t in range(12)
    ]
    narrowed = feasible = 0
    for p, top in [*((q, max(float(np.max(m.cap)) for m in q.menus)) for q in tiny), *_real_problems()]:
        tb, cl = Tables(p), Classes(p)
        for sk in skeletons(p.n):
            fam = Family(shape_layout(sk), labellings(cl, sk, cl.full), tb)
            rows = list(range(fam.labels.shape[0]))
            for F in (top * f for f in (0.3, 0.7, 0.95)):
                spans = fam.spans(rows, F)
                for row in rows:
                    lab = Labelled(fam, row)
                    plain = lab.prep(F)
                    want = plain is not None and lab.decide(F, Budget(BIG), plain) is not None
                    if row not in spans:
                        assert not want, (sk, fam.labels[row], F)
                        continue
                    pr = lab.prep(F, spans[row])
                    assert (pr is not None and lab.decide(F, Budget(BIG), pr) is not None) == want, (sk, row, F)
                    feasible += want
                    allowed = np.array([x.allowed for x in pr.els]) if pr is not None else None
                    if allowed is not None:
                        k = np.arange(p.num_layers + 1)
                        inside = (k >= spans[row][:, :1]) & (k <= spans[row][:, 1:])
                        narrowed += int((allowed & ~inside).any())
    assert narrowed > 100 and feasible > 100, (narrowed, feasible)
