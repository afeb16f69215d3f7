"""The catalogue of connected shapes: every connected placement shape of up to six nodes up to
relabelling (``skeletons``: 1, 1, 3, 10, 45 and 249 for s = 1..6), the shapes with every edge that
some intervals allow (``full_shape``), and the labellings of a shape by classes of interchangeable
nodes, one per orbit of its automorphisms (``class_labels``). Pure combinatorics: no problem data,
so everything here is cached."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence

import attrs
import numpy as np


@attrs.frozen
class Skeleton:
    """A connected shape of ``s`` nodes (see the module docstring).

    ``edges`` are the edges between nodes; ``paths`` every source-to-sink path as a node sequence;
    ``cuts`` every minimal cut as (nodes, edges), where an edge (s, i) leaves the source and (i, s) enters
    the sink; ``aut`` the node permutations that map the shape onto itself.
    """

    m: int
    iv: tuple[tuple[int, int], ...]
    edges: tuple[tuple[int, int], ...]
    aut: tuple[tuple[int, ...], ...]

    @property
    def s(self) -> int:
        return len(self.iv)

    @property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        return _paths(self.iv, self.edges, self.m)

    @property
    def cuts(self) -> tuple[tuple[tuple[int, ...], tuple[tuple[int, int], ...]], ...]:
        return _cuts(self.iv, self.edges, self.m)

    def all_edges(self) -> list[tuple[int, int]]:
        """Source edges, node edges and sink edges (source and sink are index ``s``)."""
        s, m = self.s, self.m
        src = [(s, i) for i in range(s) if self.iv[i][0] == 0]
        return src + list(self.edges) + [(i, s) for i in range(s) if self.iv[i][1] == m]


def _perms_within(iv: Sequence[tuple[int, int]]) -> Iterator[tuple[int, ...]]:
    """Node permutations that keep every node's interval (relabellings of one shape)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, x in enumerate(iv):
        groups.setdefault(x, []).append(i)
    gl = list(groups.values())
    for choice in itertools.product(*(itertools.permutations(g) for g in gl)):
        perm = list(range(len(iv)))
        for g, c in zip(gl, choice, strict=True):
            for a, b in zip(g, c, strict=True):
                perm[a] = b
        yield tuple(perm)


@functools.cache
def _paths(iv: tuple[tuple[int, int], ...], edges: tuple[tuple[int, int], ...], m: int) -> tuple[tuple[int, ...], ...]:
    s = len(iv)
    succ: dict[int, list[int]] = {i: [] for i in range(s)}
    for x, y in edges:
        succ[x].append(y)
    out: list[tuple[int, ...]] = []

    def walk(i: int, seq: tuple[int, ...]) -> None:
        if iv[i][1] == m:
            out.append(seq)
        for j in succ[i]:
            walk(j, (*seq, j))

    for i in range(s):
        if iv[i][0] == 0:
            walk(i, (i,))
    return tuple(out)


@functools.cache
def _cuts(
    iv: tuple[tuple[int, int], ...], edges: tuple[tuple[int, int], ...], m: int
) -> tuple[tuple[tuple[int, ...], tuple[tuple[int, int], ...]], ...]:
    """Minimal cuts of the node-split graph: each node is on the source side, cut (its input half on the
    source side, its output half on the sink side) or on the sink side; an edge is cut when its tail's
    output half is on the source side and its head's input half on the sink side."""
    s = len(iv)
    all_edges = [(s, i) for i in range(s) if iv[i][0] == 0] + list(edges) + [(i, s) for i in range(s) if iv[i][1] == m]
    states = _states(s)
    tail = np.concatenate([states, np.zeros((states.shape[0], 1), np.int64)], axis=1)
    head = np.concatenate([states, np.full((states.shape[0], 1), 2, np.int64)], axis=1)
    mask = np.zeros(states.shape[0], dtype=np.int64)
    for i in range(s):
        mask |= (states[:, i] == 1).astype(np.int64) << i
    for t, (u, v) in enumerate(all_edges):
        mask |= ((tail[:, u] == 0) & (head[:, v] == 2)).astype(np.int64) << (s + t)
    uniq = np.unique(mask)
    sub = (uniq[:, None] & uniq[None, :]) == uniq[:, None]  # [a, b]: a is a subset of b
    np.fill_diagonal(sub, False)
    keep = uniq[~sub.any(axis=0)].tolist()
    out = [
        (tuple(i for i in range(s) if x >> i & 1), tuple(e for t, e in enumerate(all_edges) if x >> (s + t) & 1))
        for x in keep
    ]
    return tuple(sorted(out))


@functools.cache
def _states(s: int) -> np.ndarray:
    return np.array(list(itertools.product(range(3), repeat=s)), dtype=np.int64).reshape(-1, s)


@functools.cache
def skeletons(s: int) -> tuple[Skeleton, ...]:
    """Every connected shape of ``s`` nodes, once up to relabelling."""
    if s < 1:
        raise ValueError(f"s must be >= 1, got {s}")
    out: dict[tuple[object, ...], Skeleton] = {}
    for m in range(1, s + 1):
        ivs = [(a, b) for a in range(m) for b in range(a + 1, m + 1)]
        inner = (1 << m) - 2  # bits 1..m-1
        for combo in itertools.combinations_with_replacement(ivs, s):
            ends = starts = 0
            for a, b in combo:
                ends |= 1 << b
                starts |= 1 << a
            if ends & starts & inner != inner:
                continue
            junctions = []
            for t in range(1, m):
                enders = {i for i, (_, b) in enumerate(combo) if b == t}
                starters = {i for i, (a, _) in enumerate(combo) if a == t}
                pairs = [(x, y) for x in sorted(enders) for y in sorted(starters)]
                opts = []
                for bits in range(1, 1 << len(pairs)):
                    es = [pairs[q] for q in range(len(pairs)) if bits >> q & 1]
                    if {x for x, _ in es} == enders and {y for _, y in es} == starters:
                        opts.append(es)
                junctions.append(opts)
            perms = list(_perms_within(combo))
            for choice in itertools.product(*junctions):
                edges = [e for j in choice for e in j]
                if not _connected(s, edges):
                    continue
                key = min(tuple(sorted((p[x], p[y]) for x, y in edges)) for p in perms)
                if (combo, key) in out:
                    continue
                eset = set(key)
                aut = tuple(p for p in perms if {(p[x], p[y]) for x, y in eset} == eset)
                out[(combo, key)] = Skeleton(m, combo, key, aut)
    return tuple(out.values())


def _connected(s: int, edges: Sequence[tuple[int, int]]) -> bool:
    par = list(range(s))

    def find(x: int) -> int:
        while par[x] != x:
            par[x] = par[par[x]]
            x = par[x]
        return x

    for x, y in edges:
        par[find(x)] = find(y)
    return len({find(i) for i in range(s)}) == 1


_CLASS_LABELS: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}


def class_labels(sk: Skeleton, counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For ``labellings``: the class of each shape node, one row per orbit of the shape's
    automorphisms, and each node's occurrence index within its class (cached: no problem data)."""
    key = (sk.m, sk.iv, sk.edges, counts)
    got = _CLASS_LABELS.get(key)
    if got is not None:
        return got
    classes = tuple(c for c, q in enumerate(counts) for _ in range(q))
    perms = _multiset_perms(classes)  # (P, s) class labels
    base = len(counts) + 1
    weights = base ** np.arange(sk.s - 1, -1, -1, dtype=np.int64)
    code = perms @ weights
    canon = code.copy()
    for a in sk.aut:
        canon = np.minimum(canon, perms[:, list(a)] @ weights)
    lab = perms[code == canon]
    occ = np.zeros_like(lab)
    for j in range(1, sk.s):
        occ[:, j] = (lab[:, :j] == lab[:, j : j + 1]).sum(axis=1)
    if len(_CLASS_LABELS) > 65536:
        _CLASS_LABELS.clear()
    _CLASS_LABELS[key] = (lab, occ)
    return lab, occ


@functools.cache
def _multiset_perms(classes: tuple[int, ...]) -> np.ndarray:
    return np.array(sorted(set(itertools.permutations(classes))), dtype=np.int64).reshape(-1, len(classes))


@functools.cache
def variants(s: int) -> dict[tuple[int, tuple[tuple[int, int], ...]], int]:
    """Per interval pattern (m, iv) of the connected shapes of ``s`` nodes: how many shapes have it."""
    out: dict[tuple[int, tuple[tuple[int, int], ...]], int] = {}
    for sk in skeletons(s):
        out[(sk.m, sk.iv)] = out.get((sk.m, sk.iv), 0) + 1
    return out


@functools.cache
def full_shape(m: int, iv: tuple[tuple[int, int], ...]) -> tuple[Skeleton, np.ndarray]:
    """The shape with intervals ``iv`` and every possible edge (each node ending at a boundary feeds each
    node starting there), and its automorphisms (every permutation that keeps the intervals) as rows."""
    s = len(iv)
    edges = tuple((i, j) for i in range(s) for j in range(s) if iv[i][1] == iv[j][0])
    aut = tuple(_perms_within(iv))
    return Skeleton(m, iv, edges, aut), np.array(aut, dtype=np.int64).reshape(-1, s)
