"""What deciding a shape needs that does not depend on its labels (``ShapeLayout``): its elements (cut-node
chains contracted into segments, then the other nodes), kept boundaries, paths and minimal cuts, and
the same as arrays for the row enumeration (``RowPlan``, ``CutTables``, ``NodeTables``)."""

from __future__ import annotations

import functools
import itertools

import attrs
import numpy as np

from solvers.shapes.catalogue import Skeleton


@attrs.frozen(eq=False)
class ShapeLayout:
    """What deciding a shape needs that does not depend on its labels.

    Runs of cut nodes joined by chain links (a boundary where exactly one node ends and one starts) are
    contracted into *segments*; the *elements* are the segments, then the other nodes, each with its
    interval over the kept boundaries. ``paths_el`` lists each path's elements; ``path_edges`` its edges
    outside segments (indices into ``edges``, which is ``Skeleton.all_edges()``); ``path_all`` all of
    its edges. ``cuts`` holds every minimal cut but the single cut nodes, as (elements, edge indices).
    """

    sk: Skeleton
    edges: tuple[tuple[int, int], ...]
    cutnode: tuple[bool, ...]
    segments: tuple[tuple[int, ...], ...]
    kept: tuple[int, ...]
    elements: tuple[tuple[int, ...], ...]
    elem_iv: tuple[tuple[int, int], ...]
    elem_of: tuple[int, ...]
    need: tuple[bool, ...]
    paths_el: tuple[tuple[int, ...], ...]
    path_edges: tuple[tuple[int, ...], ...]
    path_all: tuple[tuple[int, ...], ...]
    cuts: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]


@functools.cache
def shape_layout(sk: Skeleton) -> ShapeLayout:
    s = sk.s
    edges = tuple(sk.all_edges())
    eidx = {e: t for t, e in enumerate(edges)}
    cutset = set(sk.cuts)
    cutnode = tuple(((i,), ()) in cutset for i in range(s))
    ends = {t: [i for i in range(s) if sk.iv[i][1] == t] for t in range(1, sk.m)}
    starts = {t: [i for i in range(s) if sk.iv[i][0] == t] for t in range(1, sk.m)}
    link = {t for t in range(1, sk.m) if len(ends[t]) == 1 and len(starts[t]) == 1}
    nxt = {ends[t][0]: starts[t][0] for t in link}
    prv = {v: u for u, v in nxt.items()}
    segments: list[tuple[int, ...]] = []
    seg_of = [-1] * s
    for i in range(s):
        if not cutnode[i] or (i in prv and cutnode[prv[i]]):
            continue
        run = [i]
        while run[-1] in nxt and cutnode[nxt[run[-1]]]:
            run.append(nxt[run[-1]])
        if len(run) > 1:
            for x in run:
                seg_of[x] = len(segments)
            segments.append(tuple(run))
    inner = {sk.iv[x][1] for seg in segments for x in seg[:-1]}
    kept = tuple(t for t in range(sk.m + 1) if t not in inner)
    pos = {t: q for q, t in enumerate(kept)}
    elements = [*segments, *((i,) for i in range(s) if seg_of[i] < 0)]
    elem_iv = tuple((pos[sk.iv[e[0]][0]], pos[sk.iv[e[-1]][1]]) for e in elements)
    elem_of = [0] * s
    for q, e in enumerate(elements):
        for x in e:
            elem_of[x] = q
    internal = {(seg[j], seg[j + 1]) for seg in segments for j in range(len(seg) - 1)}
    paths_el, path_edges, path_all = [], [], []
    for path in sk.paths:
        pairs = list(itertools.pairwise((s, *path, s)))
        path_all.append(tuple(eidx[e] for e in pairs))
        path_edges.append(tuple(eidx[e] for e in pairs if e not in internal))
        els: list[int] = []
        for x in path:
            if not els or els[-1] != elem_of[x]:
                els.append(elem_of[x])
        paths_el.append(tuple(els))
    cuts = tuple(
        (tuple(elem_of[x] for x in nc), tuple(eidx[e] for e in ec))
        for nc, ec in sk.cuts
        if not (len(nc) == 1 and not ec and cutnode[nc[0]])
    )
    return ShapeLayout(
        sk,
        edges,
        cutnode,
        tuple(segments),
        kept,
        tuple(elements),
        elem_iv,
        tuple(elem_of),
        tuple(cutnode[e[0]] for e in elements),
        tuple(paths_el),
        tuple(path_edges),
        tuple(path_all),
        cuts,
    )


@attrs.frozen(eq=False)
class Step:
    """What ``enumerate_rows`` does when it places kept boundary t at position p.

    ``ends``: the elements whose length becomes known: those ending at t, and those ending at L that
    start at t (at 1 for those that start at 0); ``tail`` marks the latter (their end is L), ``starts``
    holds their start boundaries and ``onpath`` their paths ((ends, paths) 0/1, None when on none).
    Every element's length is at least rows[:, cb] + db - rows[:, ca] - da, exactly once ``ended``.
    The positions worth trying: p >= rows[:, lo_col] + kmin[lo_q] and p <= rows[:, hi_col] +
    kmax[hi_q] - hi_off (columns of boundaries already placed), p >= L - kmax[cl_q] and
    p <= L - kmin[cu_q] - cu_off, with kmin/kmax each element's least and largest allowed length."""

    ends: np.ndarray
    starts: np.ndarray
    tail: np.ndarray
    onpath: np.ndarray | None
    cb: np.ndarray
    db: np.ndarray
    ca: np.ndarray
    da: np.ndarray
    ended: np.ndarray
    lo_col: np.ndarray
    lo_q: np.ndarray
    hi_col: np.ndarray
    hi_q: np.ndarray
    hi_off: np.ndarray
    cl_q: np.ndarray
    cu_q: np.ndarray
    cu_off: np.ndarray


@attrs.frozen(eq=False)
class RowPlan:
    """One ``Step`` per kept boundary 1..r of a shape with L layers, and which elements each path holds
    (elements, paths) 0/1."""

    r: int
    steps: tuple[Step, ...]
    onpath: np.ndarray


@functools.cache
def row_plan(sh: ShapeLayout, L: int) -> RowPlan:
    r = len(sh.kept) - 1
    iv = np.array(sh.elem_iv, np.int64).reshape(-1, 2)
    a, b = iv[:, 0], iv[:, 1]
    tail = b == r
    known = np.where(tail, np.maximum(a, 1), b)  # the step at which each element's length is known
    onp = np.zeros((len(sh.elements), len(sh.paths_el)))
    for pi, els in enumerate(sh.paths_el):
        onp[list(els), pi] = 1.0
    steps = []
    for t in range(1, r + 1):
        ends = np.flatnonzero(known == t)
        op = onp[ends]
        ended = known <= t
        closing = np.flatnonzero((b == t) & (a < t))
        opened = np.flatnonzero((a < t) & (t < b) & ~tail)
        starting = np.flatnonzero((a == t) & ~tail)
        tails = np.flatnonzero(tail & (a == t)) if t < r else np.zeros(0, np.int64)
        steps.append(
            Step(
                ends=ends,
                starts=a[ends],
                tail=tail[ends],
                onpath=op if op.any() else None,
                cb=np.where(ended & tail, 0, np.minimum(b, t)),
                db=np.where(ended & tail, L, np.maximum(b - t, 0)),
                ca=np.minimum(a, t),
                da=np.maximum(a - t, 0),
                ended=ended,
                lo_col=a[closing],
                lo_q=closing,
                hi_col=np.concatenate([a[closing], a[opened]]),
                hi_q=np.concatenate([closing, opened]),
                hi_off=np.concatenate([np.zeros(closing.size, np.int64), b[opened] - t]),
                cl_q=tails,
                cu_q=np.concatenate([tails, starting]),
                cu_off=np.concatenate([np.zeros(tails.size, np.int64), r - b[starting]]),
            )
        )
    return RowPlan(r, tuple(steps), onp)


@attrs.frozen(eq=False)
class CutTables:
    """A shape's cuts (``ShapeLayout.cuts``) as arrays: each cut's edge indices padded with E (an extra column)
    to the widest cut, whether it has edges, how often it holds each element (cuts, elements), and its
    elements as indices padded with the element count (an extra column) to the largest cut."""

    edges: np.ndarray
    has_edges: np.ndarray
    elements: np.ndarray
    element_idx: np.ndarray


@functools.cache
def cut_tables(sh: ShapeLayout) -> CutTables:
    E = len(sh.edges)
    width = max([len(ec) for _, ec in sh.cuts] + [1])
    edges = np.full((len(sh.cuts), width), E, np.int64)
    elements = np.zeros((len(sh.cuts), len(sh.elements)))
    idx = np.full((len(sh.cuts), max([len(els) for els, _ in sh.cuts] + [1])), len(sh.elements), np.int64)
    for c, (els, ec) in enumerate(sh.cuts):
        edges[c, : len(ec)] = ec
        np.add.at(elements[c], list(els), 1.0)
        idx[c, : len(els)] = els
    return CutTables(edges, np.array([bool(ec) for _, ec in sh.cuts], bool), elements, idx)


@attrs.frozen(eq=False)
class NodeTables:
    """A shape's elements, node-level cuts and paths as 0/1 matrices, for ``Family._length_bounds`` and
    ``prefilter``: ``element_nodes`` (elements, s), ``cut`` the cut nodes, ``edge_u``/``edge_v`` the ends
    of ``ShapeLayout.edges``, ``path_edges`` (paths, longest) each path's edges padded with E, ``path_outer``
    the same for its edges outside segments (``ShapeLayout.path_edges``), ``cut_nodes``
    (cuts, s) for every minimal cut but the single cut nodes, ``cut_edges`` (cuts, widest) their edge
    indices into ``ShapeLayout.edges``, padded with E (reads 0) and E + 1 (reads -inf), ``path_nodes``
    (paths, s)."""

    element_nodes: np.ndarray
    cut: np.ndarray
    edge_u: np.ndarray
    edge_v: np.ndarray
    path_edges: np.ndarray
    path_outer: np.ndarray
    cut_nodes: np.ndarray
    cut_neg: np.ndarray
    cut_edges: np.ndarray
    path_nodes: np.ndarray
    path_neg: np.ndarray
    path_pos: np.ndarray


@functools.cache
def node_tables(sh: ShapeLayout) -> NodeTables:
    sk = sh.sk
    s, E = sk.s, len(sh.edges)
    eidx = {e: t for t, e in enumerate(sh.edges)}
    cuts = [(nc, ec) for nc, ec in sk.cuts if not (len(nc) == 1 and not ec)]
    nodes = np.zeros((len(cuts), s))
    width = max([len(ec) for _, ec in cuts] + [1])
    edges = np.full((len(cuts), width), E + 1, np.int64)
    for c, (nc, ec) in enumerate(cuts):
        nodes[c, list(nc)] = 1.0
        edges[c, : len(ec)] = [eidx[e] for e in ec]
        if not ec:
            edges[c, 0] = E
    paths = np.zeros((len(sk.paths), s), np.int64)
    for p, path in enumerate(sk.paths):
        paths[p, list(path)] = 1
    on = paths > 0
    elements = np.zeros((len(sh.elements), s), np.int64)
    for q, e in enumerate(sh.elements):
        elements[q, list(e)] = 1
    path_edges = np.full((len(sh.path_all), max(len(pe) for pe in sh.path_all)), E, np.int64)
    for p, pe in enumerate(sh.path_all):
        path_edges[p, : len(pe)] = pe
    path_outer = np.full((len(sh.path_edges), max([len(pe) for pe in sh.path_edges] + [1])), E, np.int64)
    for p, pe in enumerate(sh.path_edges):
        path_outer[p, : len(pe)] = pe
    return NodeTables(
        elements,
        np.flatnonzero(np.array(sh.cutnode, bool)),
        np.array([u for u, _ in sh.edges], np.int64),
        np.array([v for _, v in sh.edges], np.int64),
        path_edges,
        path_outer,
        nodes,
        np.where(nodes > 0, 0.0, -np.inf),
        edges,
        paths,
        np.where(on, 0.0, -np.inf),
        np.where(on, 0.0, np.inf),
    )
