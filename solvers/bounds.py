"""The layer-work bound on a placement's flow: every unit of flow crosses all L layers and no node
carries more than the total F, so L F <= sum_i max_o k_o min(c_o, F); ``work_fixed_point`` is the
largest such F, a bound shared by the menu reductions and the shape search."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def work_fixed_point(ks: Sequence[np.ndarray], caps: Sequence[np.ndarray], L: int) -> float:
    """The largest flow F that the layer work allows: L F <= sum_i max_o k_o min(c_o, F) over each node
    i's options (k_o, c_o), since every unit of flow crosses L layers and a node carries at most F.
    The right side h(F) is concave, piecewise linear (kinks at the capacities) and h(0) = 0, so the
    F with h(F) >= F form an interval [0, F*]; returns an upper end of a bracket of F* narrower than
    1e-9 of the gap between the two capacities around it (a valid bound, nearly exact)."""
    if any(k.size == 0 for k in ks):
        return 0.0
    fronts = [
        _work_front(np.asarray(k, dtype=np.float64), np.asarray(c, dtype=np.float64))
        for k, c in zip(ks, caps, strict=True)
    ]
    ks, caps = [f[0] for f in fronts], [f[1] for f in fronts]
    pts = np.unique(np.concatenate(caps))
    pts = pts[pts > 0]
    if pts.size == 0:
        return 0.0

    def h(u: np.ndarray) -> np.ndarray:
        tot = np.zeros(u.shape)
        for k, c in zip(ks, caps, strict=True):
            tot += np.max(
                np.asarray(k, dtype=np.float64)[:, None] * np.minimum(np.asarray(c)[:, None], u[None, :]), axis=0
            )
        return tot / L

    hp = h(pts)
    ok = np.flatnonzero(hp >= pts * (1 - 1e-12))  # lenient: the bound stays valid
    if ok.size == 0:  # h(F) = s F on [0, pts[0]] with s < 1
        return 0.0
    j = int(ok[-1])
    if j == pts.size - 1:  # beyond the largest capacity h is flat
        return float(hp[j])
    lo, hi = float(pts[j]), float(pts[j + 1])  # h(lo) >= lo, h(hi) < hi: F* in [lo, hi)
    for _ in range(5):  # h is not linear in between (two options' work can cross): narrow the bracket
        grid = np.linspace(lo, hi, 65)
        good = np.flatnonzero(h(grid) >= grid * (1 - 1e-12))
        t = int(good[-1])
        lo, hi = float(grid[t]), float(grid[min(t + 1, 64)])
    return hi


def _work_front(k: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The options (k, c) that no other option matches in both k and c: only they can attain
    max_o k_o min(c_o, F) for some F."""
    order = np.lexsort((-c, -k))
    ks, cs = k[order], c[order]
    best = np.maximum.accumulate(np.concatenate(([-np.inf], cs[:-1])))
    keep = cs > best
    return ks[keep], cs[keep]
