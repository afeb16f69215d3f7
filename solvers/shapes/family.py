"""Every labelling of one shape by one sub-multiset at once (``Family``, one row per labelling), and the
cheap necessary tests that rule labellings out before any is decided: ``prefilter``,
``Family.candidates`` and the bounds propagation on layer counts (``Family._length_bounds``,
``Family.spans``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from solvers.shapes.layout import ShapeLayout, cut_tables, node_tables
from solvers.shapes.tables import Tables

ROUNDS = 4
"""Rounds of bounds propagation in ``Family._length_bounds`` (each is exact; more narrow a little more)."""


SCREEN = 64
"""Labellings of one shape whose boundary vectors are enumerated together (``screen``)."""


class Family:
    """Every labelling of one shape by one sub-multiset, as arrays (one row per labelling), with the
    label-dependent data: link latencies per path, edge capacities per cut, and a coverage test."""

    def __init__(self, sh: ShapeLayout, labels: np.ndarray, tb: Tables) -> None:
        self.sh, self.tb = sh, tb
        n, s = tb.n, sh.sk.s
        nt = node_tables(sh)
        ext = np.concatenate([labels, np.full((labels.shape[0], 1), n, np.int64)], axis=1)
        U, V = ext[:, nt.edge_u], ext[:, nt.edge_v]  # (NL, E); index s maps to n (source / sink)
        elat = tb.ll[:, U, V]  # (nm, NL, E)
        padded = np.concatenate([elat, np.zeros((*elat.shape[:2], 1))], axis=2)
        full = padded[:, :, nt.path_edges].sum(axis=3)  # (nm, NL, P)
        masks = (1 << labels) @ nt.path_nodes.T  # (NL, P): a labelling holds distinct nodes
        covers = _fits(full + tb.cover_masks(masks), tb.budget)  # each path's nodes can cover the layers
        self.kept_rows = np.flatnonzero(covers)  # which rows of the ``labels`` given are kept
        labels, U, V, full, masks = labels[covers], U[covers], V[covers], full[:, covers], masks[covers]
        self.labels = labels  # (NL, s) problem nodes
        self.elat = elat[:, covers]
        self.ecap = tb.lc[U, V]  # (NL, E)
        nl = labels.shape[0]
        self.plink = padded[:, covers][:, :, nt.path_outer].sum(axis=3)  # (nm, NL, P): links outside segments
        self._full, self._masks = full, masks  # (nm, NL, P) path link sums, (NL, P) path node sets
        # per cut: sum and largest of its edge capacities; per element: the largest capacity of its nodes
        ct = cut_tables(sh)
        padded = np.concatenate([self.ecap, np.full((nl, 1), -np.inf)], axis=1)[:, ct.edges]  # (NL, C, widest)
        emax = padded.max(axis=2)  # (NL, C): -inf for a cut of nodes only
        live = np.flatnonzero(np.isfinite(emax).any(axis=0) | ~ct.has_edges)
        self.cuts = [sh.cuts[c] for c in live]  # the cuts that some labelling can keep
        self.cut_emax = emax[:, live]
        self.cut_es = np.concatenate([self.ecap, np.zeros((nl, 1))], axis=1)[:, ct.edges[live]].sum(axis=2)
        self.cut_els = [list(els) for els, _ in self.cuts]
        self.cut_mat = ct.elements[live]  # (C, elements): how often a cut holds each
        self.cut_idx = ct.element_idx[live]  # (C, largest): its elements, padded with the element count
        # kappa: per shape node, the largest capacity of an option that fits every path through it
        kap = np.full((nl, s), np.inf)
        bits = 1 << labels  # (NL, s)
        if nl and tb.nm == 1:  # every (labelling, path, node on it) at once
            on = nt.path_nodes > 0  # (P, s)
            keys = labels[:, None, :] * (1 << n) + (masks[:, :, None] - bits[:, None, :])  # (NL, P, s)
            room = np.broadcast_to((tb.budget[0] - full[0])[:, :, None], keys.shape)
            got = np.full(keys.shape, np.inf)
            got[:, on] = tb.fit_cap(keys[:, on].reshape(-1), room[:, on].reshape(-1)).reshape(nl, -1)
            kap = got.min(axis=1)
        for pi, path in enumerate(sh.sk.paths if nl and tb.nm > 1 else ()):
            lk = full[:, :, pi]  # (nm, NL)
            for j in path:
                rest = masks[:, pi] - bits[:, j]  # a labelling holds distinct problem nodes
                keys = labels[:, j] * (1 << n) + rest
                uniq, inv = np.unique(keys, return_inverse=True)
                inv = inv.reshape(-1)
                tabs = [tb.slack(int(u) >> n, int(u) & ((1 << n) - 1)) for u in uniq]
                width = max(t[1].size for t in tabs)
                tot = np.full((len(tabs), tb.nm, width), np.inf)
                cap = np.full((len(tabs), width), -np.inf)
                for u, (tt, cc) in enumerate(tabs):
                    tot[u, :, : cc.size] = tt
                    cap[u, : cc.size] = cc
                fits = np.all(tot[inv].transpose(1, 0, 2) + lk[:, :, None] <= tb.budget[:, None, None], axis=0)
                kap[:, j] = np.minimum(kap[:, j], np.where(fits, cap[inv], -np.inf).max(axis=1))
        self.kappa = kap
        self.viable = np.all(kap > -np.inf, axis=1)
        self.el_maxcap = np.stack([kap[:, list(e)].min(axis=1) for e in sh.elements], axis=1)
        self._spans: tuple[float, dict[int, np.ndarray]] | None = None  # the last candidates' (F, spans)

    def candidates(self, F: float, paths: bool = True) -> np.ndarray:
        """The labellings that pass the cheap tests at threshold F: every path can cover the layers
        within the limits (its cut nodes with options of capacity >= F only, since all the flow crosses
        them, and every node with the options that pass ``work_ok`` at F only: a component that carries
        F uses no other), every cut node can carry F, and every kept cut can. ``paths=False`` skips the
        path test, for labellings that ``prefilter`` kept at the same F (it ran that test)."""
        ok = self.viable.copy()
        if F <= 0 or not ok.any():
            return np.flatnonzero(ok)
        tb = self.tb
        comp = int(np.bitwise_or.reduce(1 << self.labels[0]))  # every labelling holds the same nodes
        if tb.work_mask(comp, F) is None:
            return np.zeros(0, np.int64)
        wmax = tb.work_cap(comp, F)
        elcap = self.el_maxcap.copy()
        for q, e in enumerate(self.sh.elements):
            elcap[:, q] = np.minimum(elcap[:, q], wmax[self.labels[:, list(e)]].min(axis=1))
        for q, need in enumerate(self.sh.need):
            if need:
                ok &= elcap[:, q] >= F
        if paths:
            cmask = (1 << self.labels[:, node_tables(self.sh).cut]).sum(axis=1)
            ok &= _paths_cover(tb, comp, F, self._full, self._masks, cmask)
        if self.cuts:
            with np.errstate(invalid="ignore"):
                padded = np.concatenate([elcap, np.zeros((elcap.shape[0], 1))], axis=1)
                tot = self.cut_es + padded[:, self.cut_idx].sum(axis=2)  # (NL, C)
                ok &= np.all((self.cut_emax >= F) | (tot >= F), axis=1)
        rows = np.flatnonzero(ok)
        if rows.size:
            live, lo, hi = self._length_bounds(rows, F)
            self._spans = (F, self._element_spans(rows, live, lo, hi))
            rows = rows[live]
        return rows

    def spans(self, rows: Sequence[int], F: float) -> dict[int, np.ndarray]:
        """Per labelling of ``rows`` that ``_length_bounds`` keeps at F (> 0): each element's range of
        layer counts (elements, 2) as [least, most]; a labelling left out has no placement of flow F."""
        if self._spans is not None and self._spans[0] == F:  # candidates(F) kept exactly these
            got = self._spans[1]
            return {r: got[r] for r in rows if r in got}
        idx = np.asarray(rows, np.int64)
        if idx.size == 0:
            return {}
        comp = int(np.bitwise_or.reduce(1 << self.labels[0]))
        if self.tb.work_mask(comp, F) is None:
            return {}
        return self._element_spans(idx, *self._length_bounds(idx, F))

    def _element_spans(
        self, rows: np.ndarray, live: np.ndarray, lo: np.ndarray, hi: np.ndarray
    ) -> dict[int, np.ndarray]:
        em = node_tables(self.sh).element_nodes  # (elements, s)
        span = np.stack([lo @ em.T, hi @ em.T], axis=2)  # (R, elements, 2)
        return {int(rows[j]): span[t] for t, j in enumerate(live.tolist())}

    def _length_bounds(self, rows: np.ndarray, F: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The labellings of ``rows`` (indices into it) whose nodes' layer counts can satisfy, together,
        the necessary conditions below, and for each the range [lo, hi] (labellings, s) left to each
        node's count (bounds propagation; a labelling left out has no placement that carries F).

        Node j holds lo_j <= k_j <= hi_j layers (1 <= lo, hi <= L at first). Along every path the k
        add up to L, so lo_j >= L - (sum of the other hi on the path) and hi_j <= L - (sum of the other
        lo). Its capacity is at most cm_j: the largest of its options with k >= lo_j that pass the
        component's ``work_ok`` (the others carry no part of F), and at most kappa_j (the options that
        fit the latency limits of its paths). A cut node needs capacity >= F; a node of a cut whose
        edges all carry less than F needs r_j >= F - (the cut's edge capacities) - (the other cm in the
        cut). So hi_j <= the largest k at which an option passing ``work_ok`` has capacity >= r_j. Each
        round applies every rule once (``ROUNDS`` rounds); an empty range rules the labelling out."""
        tb, sh = self.tb, self.sh
        L = tb.L
        nt = node_tables(sh)
        lab = self.labels[rows]
        R, s = lab.shape
        comp = int(np.bitwise_or.reduce(1 << self.labels[0]))
        ML = tb.work_best(comp, F)[lab]  # (R, s, L + 2): largest work capacity with >= k layers
        kap = self.kappa[rows]
        ecap = np.concatenate([self.ecap[rows], np.zeros((R, 1)), np.full((R, 1), -np.inf)], axis=1)
        pad = ecap[:, nt.cut_edges]  # (R, C, widest): 0 / -inf padding for the sum / the largest
        es = np.where(np.isneginf(pad), 0.0, pad).sum(axis=2)
        kept = pad.max(axis=2) < F  # (R, C); a cut of nodes only has largest 0: kept
        cutT = nt.cut_nodes.T  # (s, C) 0/1
        neg = nt.cut_neg[None]  # (1, C, s): 0 where the cut holds the node, else -inf
        pm = nt.path_nodes  # (P, s) 0/1
        pneg, ppos = nt.path_neg[None], nt.path_pos[None]  # (1, P, s): 0 on the path, else -inf / +inf
        base = np.where(np.array(sh.cutnode)[None, :], F, -np.inf)
        lo = np.ones((R, s), np.int64)
        hi = np.full((R, s), L, np.int64)
        jj = np.arange(s)[None, :]
        live = np.arange(R)  # the rows still possible, and their data below
        for _ in range(ROUNDS):
            cm = np.maximum(np.minimum(ML[np.arange(live.size)[:, None], jj, lo], kap), 0.0)
            req = base
            if cutT.shape[1]:
                slack = np.where(kept, F - es - cm @ cutT, -np.inf)  # (R, C)
                req = np.maximum(base, (slack[:, :, None] + neg).max(axis=1) + cm)
            hi = np.minimum(hi, (req[:, :, None] <= ML).sum(axis=2) - 1)
            shi = hi @ pm.T  # (R, P)
            slo = lo @ pm.T
            nlo = np.maximum(lo, (L - shi[:, :, None] + hi[:, None, :] + pneg).max(axis=1))
            hi = np.minimum(hi, (L - slo[:, :, None] + lo[:, None, :] + ppos).min(axis=1)).astype(np.int64)
            lo = nlo.astype(np.int64)
            ok = np.all(lo <= hi, axis=1)
            if not ok.all():
                live, ML, kap, es, kept, lo, hi = live[ok], ML[ok], kap[ok], es[ok], kept[ok], lo[ok], hi[ok]
                if live.size == 0:
                    break
            lo, hi = np.maximum(lo, 1), np.minimum(hi, L)
        return live, lo, hi


def prefilter(sh: ShapeLayout, labels: np.ndarray, tb: Tables, F: float) -> np.ndarray:
    """The labellings (rows of ``labels``) worth building a ``Family`` for at threshold F: each cut node
    has an option of capacity >= F that passes the component's ``work_ok`` at F, and each path can cover
    the L layers within the limits with the options that pass it, its cut nodes with options of capacity
    >= F only, plus its links (first without the links and the cut nodes' restriction, by
    ``Tables.cover_work``, then with them). These are tests of
    ``Family.candidates`` (the second one is its path test, which it then need not repeat at F), and a
    larger F only makes them stricter."""
    if F <= 0 or labels.shape[0] == 0:
        return labels
    comp = int(np.bitwise_or.reduce(1 << labels[0]))
    tab = tb.cover_work(comp, F)
    if tab is None:
        return labels[:0]
    nt = node_tables(sh)
    ok = np.all(tb.work_cap(comp, F)[labels[:, nt.cut]] >= F, axis=1)  # all the flow crosses a cut node
    bits = 1 << labels
    masks = bits @ nt.path_nodes.T  # (R, P): a labelling holds distinct nodes, so the sum is the union
    ok &= _fits(tab[:, masks], tb.budget)
    if not ok.any():
        return labels[:0]
    labels, bits, masks = labels[ok], bits[ok], masks[ok]
    ext = np.concatenate([labels, np.full((labels.shape[0], 1), tb.n, np.int64)], axis=1)
    pl = _path_links(sh, tb, ext)
    return labels[_paths_cover(tb, comp, F, pl, masks, bits[:, nt.cut].sum(axis=1))]


def _paths_cover(
    tb: Tables, comp: int, F: float, links: np.ndarray, masks: np.ndarray, cmask: np.ndarray
) -> np.ndarray:
    """Per labelling (R,): every path's links (metrics, R, paths) plus the least latency with which its
    nodes (``masks`` (R, paths), bit masks) cover the L layers fit the limits, the cut nodes (``cmask``
    (R,)) held to options of capacity >= F and every node to those passing ``work_ok`` of ``comp``."""
    ok = np.zeros(masks.shape[0], bool)
    for cm in np.unique(cmask).tolist():
        rows = np.flatnonzero(cmask == cm)
        tab = tb.cover_work(comp, F, cm)
        if tab is not None:
            ok[rows] = _fits(links[:, rows] + tab[:, masks[rows]], tb.budget)
    return ok


def _fits(lat: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """(metrics, R, paths) latencies -> (R,): every path finite and within the limits in every metric."""
    b = budget.reshape((-1, *([1] * (lat.ndim - 1))))
    return np.all((lat <= b) & (lat < np.inf), axis=(0, 2))


def _path_links(sh: ShapeLayout, tb: Tables, ext: np.ndarray) -> np.ndarray:
    """(metrics, labellings, paths): each path's summed link latencies, for labellings ``ext`` (one
    column per shape node, then one holding n for the source and sink)."""
    nt = node_tables(sh)
    elat = tb.ll[:, ext[:, nt.edge_u], ext[:, nt.edge_v]]  # (nm, NL, E)
    elat = np.concatenate([elat, np.zeros((*elat.shape[:2], 1))], axis=2)
    return elat[:, :, nt.path_edges].sum(axis=3)
