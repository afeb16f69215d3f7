"""Per-problem option tables for the shape search (``Tables``): per node, the options of each layer
count in padded arrays sorted by capacity, the least latencies per layer count, the layer-work tests at
a flow threshold F, and each element's tables at F (``ElementAt``), cached per problem."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from solvers.problem import PlacementProblem
from solvers.rules import LAT_RTOL

Role = tuple[int, int]
"""(micro-batches through a shape node, the model ends it holds): ``NodeMenu.allowed``'s arguments."""


class Tables:
    """Per node: the options of each k, sorted by capacity (then latency), in padded arrays.

    ``cap[i]`` (L + 1, W_i), -1 where padded; ``lat[i]`` (metrics, L + 1, W_i), inf where padded;
    ``opt[i]`` (L + 1, W_i), the option index, -1 where padded. ``ordered[i]``: along the capacity order
    the latencies never fall in any metric, at every k. ``gmin[i]`` (metrics, L + 1): the least latency
    of each metric over the options with k layers.
    """

    def __init__(self, problem: PlacementProblem) -> None:
        self.p = problem
        self.n, self.L, self.nm = problem.n, int(problem.num_layers), problem.num_metrics
        lim = np.asarray(problem.lat_limit, dtype=np.float64)
        self.budget = lim + LAT_RTOL * np.where(np.isfinite(lim), np.maximum(lim, 1.0), 0.0)
        self.ll = np.asarray(problem.link_lat, dtype=np.float64)
        self.lc = np.asarray(problem.link_cap, dtype=np.float64)
        L = self.L
        self.cap: list[np.ndarray] = []
        self.lat: list[np.ndarray] = []
        self.opt: list[np.ndarray] = []
        self.ordered: list[bool] = []
        for menu in problem.menus:
            k = np.asarray(menu.k)
            cap = np.asarray(menu.cap, dtype=np.float64)
            lat = np.asarray(menu.lat, dtype=np.float64)
            sel = np.flatnonzero(k <= L)
            counts = np.bincount(k[sel], minlength=L + 1) if sel.size else np.zeros(L + 1, np.int64)
            w = max(1, int(counts.max()))
            C = np.full((L + 1, w), -1.0)
            T = np.full((self.nm, L + 1, w), np.inf)
            opt = np.full((L + 1, w), -1, np.int64)
            order = sel[np.lexsort((lat[:, sel].sum(axis=0), cap[sel], k[sel]))]
            ks = k[order]
            slot = np.arange(order.size) - np.searchsorted(ks, ks, side="left")
            C[ks, slot] = cap[order]
            T[:, ks, slot] = lat[:, order]
            opt[ks, slot] = order
            ordered = True
            if order.size > 1:
                same = ks[1:] == ks[:-1]
                ordered = not bool(np.any(same & np.any(np.diff(lat[:, order], axis=1) < 0, axis=0)))
            self.cap.append(C)
            self.lat.append(T)
            self.opt.append(opt)
            self.ordered.append(ordered)
        self.roles = problem.has_roles
        self._role: dict[tuple[int, Role], np.ndarray] = {}
        self.maxcap = np.array([float(c.max()) for c in self.cap])
        self.gmin = [t.min(axis=2) for t in self.lat]
        self._useful: dict[tuple[int, float, Role | None], np.ndarray] = {}
        self._cover_at: dict[tuple[int, int, float, int], np.ndarray] = {}
        self._work_mask: dict[tuple[int, float], dict[int, np.ndarray] | None] = {}
        self._cover_work: dict[tuple[int, float, int], np.ndarray | None] = {}
        self._work_best: dict[tuple[int, float], np.ndarray] = {}
        self.collapsed: dict[tuple[int, float, int, Role | None], tuple[np.ndarray, np.ndarray]] = {}
        self.elements: dict[tuple[tuple[int, ...], bool, float, int, tuple[Role | None, ...]], ElementAt] = {}
        self._cover_tab: np.ndarray | None = None
        self._cover_full: np.ndarray | None = None
        self._slack: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._fit: tuple[np.ndarray, np.ndarray] | None = None
        self.fronts: dict[
            tuple[tuple[int, ...], float, tuple[int, ...], tuple[Role | None, ...]],
            tuple[np.ndarray, list[tuple[np.ndarray, int, int]]],
        ] = {}

    def role_mask(self, i: int, role: Role) -> np.ndarray:
        """(L + 1, W) mask of the options of node i that a shape node of role ``role`` (micro-batches
        through it, ends it holds: ``NodeMenu.allowed``) may run (cached)."""
        key = (i, role)
        got = self._role.get(key)
        if got is None:
            opt = self.opt[i]
            allowed = self.p.menus[i].allowed(*role)
            got = (opt >= 0) & allowed[np.maximum(opt, 0)]
            self._role[key] = got
        return got

    def useful(self, i: int, F: float, role: Role | None = None) -> np.ndarray:
        """(L + 1, W) mask of the options of node i worth enumerating at threshold F: every option with
        capacity < F, and among those with capacity >= F only the ones whose latencies no other such
        option beats (the first one when the node is ordered); with ``role``, among the options that role
        allows only (``role_mask``: an option beaten only by options the role forbids stays)."""
        key = (i, F, role)
        if key in self._useful:
            return self._useful[key]
        C, T, opt = self.cap[i], self.lat[i], self.opt[i]
        have = (opt >= 0) if role is None else self.role_mask(i, role)
        big = (C >= F) & have
        if self.ordered[i]:
            seen: np.ndarray = np.cumsum(big, axis=1) - big  # options of capacity >= F before this one
            firstbig = big & (seen == 0)
            out = have & (~big | firstbig)
        else:
            le = np.all(T[:, :, None, :] <= T[:, :, :, None], axis=0)  # [k, x, y]: y <= x
            eq = np.all(T[:, :, None, :] == T[:, :, :, None], axis=0)
            w = C.shape[1]
            earlier = np.arange(w)[None, :] < np.arange(w)[:, None]  # [x, y]: y before x
            beats = big[:, None, :] & big[:, :, None] & le & (~eq | earlier[None])
            beats &= ~np.eye(w, dtype=bool)[None]
            out = have & ~beats.any(axis=2)
        if len(self._useful) > 4096:
            self._useful.clear()
        self._useful[key] = out
        return out

    def work_ok(self, nodes: Sequence[int], F: float) -> list[np.ndarray] | None:
        """Per node of ``nodes``, the (L + 1, W) mask of options whose layer work k * min(cap, F) leaves
        room for flow F: every unit of flow crosses L layers and a node carries at most min(cap, F), so
        sum_i k_i min(c_i, F) >= L F; an option is kept only if it reaches L F minus the most the other
        nodes can add. None when even the most work of every node falls short."""
        kk = np.arange(self.L + 1)[:, None]
        works = [np.where(self.opt[i] >= 0, kk * np.minimum(self.cap[i], F), -np.inf) for i in nodes]
        best = [float(w.max()) for w in works]
        total = sum(best)
        need = self.L * F
        if total < need * (1 - 1e-12):
            return None
        return [w >= need - (total - b) - 1e-9 * need for w, b in zip(works, best, strict=True)]

    def slack(self, i: int, rest: int) -> tuple[np.ndarray, np.ndarray]:
        """For node i on a path with the other nodes ``rest`` (a bit mask): per option of i (flattened),
        its latency plus the least latency with which ``rest`` covers the remaining layers, and its
        capacity. An option fits the path only if that sum plus the path's links fits the limits."""
        key = (i, rest)
        if key not in self._slack:
            self.cover_masks(np.zeros(1, np.int64))
            assert self._cover_full is not None
            need = self._cover_full[rest]  # (nm, L+1): covering exactly j layers
            L = self.L
            kk = np.arange(L + 1)
            rem = need[:, L - kk]  # (nm, L+1) for k layers held by i
            if rest == 0:
                rem = np.where(kk[None, :] == L, 0.0, np.inf)
            tot = self.lat[i] + rem[:, :, None]
            ok = self.opt[i] >= 0
            self._slack[key] = (tot[:, ok], self.cap[i][ok])
        return self._slack[key]

    def fit_cap(self, keys: np.ndarray, room: np.ndarray) -> np.ndarray:
        """One metric only: for row r, node ``keys[r] >> n`` on a path with the other nodes
        ``keys[r] & (2^n - 1)``, the largest capacity of its options whose ``slack`` is at most
        ``room[r]`` (-inf when none is)."""
        if self._fit is None:
            n = self.n
            tabs = {  # a node is never in its own rest
                u: self.slack(u >> n, u & ((1 << n) - 1)) for u in range(n << n) if not (u >> (u >> n)) & 1
            }
            width = max(1, max(c.size for _, c in tabs.values()))
            T = np.full((n << n, width), np.inf)
            C = np.full((n << n, width + 1), -np.inf)
            for u, (tot, cap) in tabs.items():
                if cap.size:
                    order = np.argsort(tot[0], kind="stable")
                    T[u, : cap.size] = tot[0][order]
                    C[u, 1 : cap.size + 1] = np.maximum.accumulate(cap[order])
                    C[u, cap.size + 1 :] = C[u, cap.size]  # padding that fits (infinite room) adds nothing
            self._fit = (T, C)
        T, C = self._fit
        room = room + 1e-12 * np.maximum(np.abs(room), 1.0)  # never stricter than tot + links <= budget
        cnt = (T[keys] <= room[:, None]).sum(axis=1)  # sorted rows: the options that fit come first
        return C[keys, cnt]

    def cover_masks(self, masks: np.ndarray) -> np.ndarray:
        """``cover`` for node sets given as bit masks: (metrics, len(masks))."""
        if self._cover_tab is None:
            tab = self._subset_cover({i: self.gmin[i] for i in range(self.n)}, (1 << self.n) - 1)
            self._cover_tab = tab[:, :, self.L].T.copy()  # (nm, 2^n)
            self._cover_full = tab
        return self._cover_tab[:, masks]

    def _subset_cover(self, g: dict[int, np.ndarray], within: int, base: int = 0) -> np.ndarray:
        """(2^n, metrics, L+1): per node set inside bit mask ``within`` that contains ``base``, the least
        latency with which its nodes, each holding >= 1 layer at latency ``g[i][:, k]`` for k layers,
        cover exactly j layers (inf for the other sets)."""
        n, L = self.n, self.L
        tab = np.full((1 << n, self.nm, L + 1), np.inf)
        kk = np.arange(L + 1)
        d = kk[:, None] - kk[None, :]
        dd = np.clip(d, 0, L)
        step = {}  # per node: [m, j, j'] the latency of holding j - j' layers (inf where j' > j or j == j')
        for i, gi in g.items():
            held = gi.copy()
            held[:, 0] = np.inf
            step[i] = np.where(d[None] >= 0, held[:, dd], np.inf)
        acc = np.full((self.nm, L + 1), np.inf)
        acc[:, 0] = 0.0
        for i in range(n):
            if base >> i & 1:
                acc = (acc[:, None, :] + step[i]).min(axis=2)
        tab[base] = acc
        rest = within & ~base
        for sub in range(1, 1 << n):
            if sub & ~rest:
                continue
            i = (sub & -sub).bit_length() - 1
            tab[base | sub] = (tab[base | (sub & (sub - 1))][:, None, :] + step[i]).min(axis=2)
        return tab

    def cover_work(self, comp: int, F: float, cut: int = 0) -> np.ndarray | None:
        """(metrics, 2^n): per set of nodes within bit mask ``comp`` that contains ``cut``, the least
        latency with which they (each holding >= 1 layer) cover L layers using only the options that pass
        ``work_ok`` of ``comp`` at F, and for the nodes of ``cut`` only those of capacity >= F (equal to
        ``cover_at(set, cut, F, comp)``); inf for the other sets. None when ``work_ok`` fails (cached)."""
        key = (comp, F, cut)
        if key in self._cover_work:
            return self._cover_work[key]
        work = self.work_mask(comp, F)
        out = None
        if work is not None:
            g = {
                i: np.where((w & (self.cap[i] >= F) if cut >> i & 1 else w)[None], self.lat[i], np.inf).min(axis=2)
                for i, w in work.items()
            }
            out = self._subset_cover(g, comp, cut)[:, :, self.L].T.copy()
        if len(self._cover_work) > 1024:
            self._cover_work.clear()
        self._cover_work[key] = out
        return out

    def work_cap(self, comp: int, F: float) -> np.ndarray:
        """Per node, the largest capacity of its options that pass ``work_ok`` of the nodes ``comp`` at F
        (-inf for a node outside ``comp``, or when none passes)."""
        return self.work_best(comp, F)[:, 0]

    def work_best(self, comp: int, F: float) -> np.ndarray:
        """(n, L + 2): [i, k] the largest capacity of node i's options with >= k layers that pass
        ``work_mask(comp, F)``, -inf where none does (cached)."""
        key = (comp, F)
        got = self._work_best.get(key)
        if got is None:
            L = self.L
            got = np.full((self.n, L + 2), -np.inf)
            for i, w in (self.work_mask(comp, F) or {}).items():
                got[i, : L + 1] = np.maximum.accumulate(np.where(w, self.cap[i], -np.inf).max(axis=1)[::-1])[::-1]
            if len(self._work_best) > 4096:
                self._work_best.clear()
            self._work_best[key] = got
        return got

    def work_mask(self, comp: int, F: float) -> dict[int, np.ndarray] | None:
        """``work_ok`` for the nodes of bit mask ``comp`` at F, per node (cached); None when it fails."""
        key = (comp, F)
        if key not in self._work_mask:
            nodes = [i for i in range(self.n) if comp >> i & 1]
            wk = self.work_ok(nodes, F)
            if len(self._work_mask) > 4096:
                self._work_mask.clear()
            self._work_mask[key] = None if wk is None else dict(zip(nodes, wk, strict=True))
        return self._work_mask[key]

    def cover_at(self, mask: int, cut: int, F: float, comp: int = 0) -> np.ndarray:
        """Per metric, the least latency with which the nodes of bit mask ``mask`` (each holding >= 1
        layer) cover all L layers when those of ``cut`` use only options of capacity >= F; with ``comp``
        (a component's nodes, a superset of ``mask``) only the options that pass its ``work_ok`` at F."""
        key = (mask, cut, F, comp)
        got = self._cover_at.get(key)
        if got is not None:
            return got
        L = self.L
        acc = np.full((self.nm, L + 1), np.inf)
        acc[:, 0] = 0.0
        kk = np.arange(L + 1)
        d = kk[:, None] - kk[None, :]
        dd = np.clip(d, 0, L)
        work = self.work_mask(comp, F) if comp else {}
        if work is None:
            self._cover_at[key] = np.full(self.nm, np.inf)
            return self._cover_at[key]
        for i in range(self.n):
            if not mask >> i & 1:
                continue
            if i in work:
                allow = work[i] & (self.cap[i] >= F) if cut >> i & 1 else work[i]
                g = np.where(allow[None], self.lat[i], np.inf).min(axis=2)
            elif cut >> i & 1:
                g = np.where(self.cap[i][None] >= F, self.lat[i], np.inf).min(axis=2)
            else:
                g = self.gmin[i].copy()
            g[:, 0] = np.inf
            cand = acc[:, None, :] + g[:, dd]
            acc = np.where(d[None] >= 0, cand, np.inf).min(axis=2)
        if len(self._cover_at) > 65536:
            self._cover_at.clear()
        self._cover_at[key] = acc[:, L]
        return self._cover_at[key]

    def cover(self, nodes: tuple[int, ...]) -> np.ndarray:
        """Per metric, the least latency with which ``nodes`` (each holding >= 1 layer) cover all L
        layers, metric by metric (a lower bound for any path through exactly these nodes): ``cover_at``
        with no node restricted."""
        mask = 0
        for i in nodes:
            mask |= 1 << i
        return self.cover_at(mask, 0, 0.0)


@attrs.frozen(eq=False)
class ElementAt:
    """One element (a node, or a segment's front) at a threshold: option latencies (metrics, L + 1, W),
    capacities clipped at F and usable options (L + 1, W), a segment's back-pointers, the lengths with a
    usable option, the least latency per length (metrics, L + 1) and overall (metrics,), and the largest
    usable capacity per length (L + 1)."""

    lat: np.ndarray
    cap: np.ndarray
    ok: np.ndarray
    backs: list[tuple[np.ndarray, int, int]]
    allowed: np.ndarray
    lb_lat: np.ndarray
    lbmin: np.ndarray
    ub_cap: np.ndarray
