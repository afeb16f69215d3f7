"""The numeric placement problem shared by every placer (MILP, fast exact method, brute force).

A placement problem is one model on one multiset of nodes, already reduced to per-node option menus by
the perf model (see ``solvers/options.py``). Each option o of node i is a pair (k layers held, batch
limit b) with:

- ``cap[o]``: the node's capacity in flow units per second when it runs this option;
- ``lat[m, o]``: its contribution to latency metric m along a path (m = 0 is TPOT for ``decode`` and
  ``aggregated``; TTFT for ``prefill``; m = 1 is TTFT for ``aggregated``);
- ``mem[o]``: bytes the option occupies (reported, already checked against the node's memory);
- its *role*, what that memory and those figures were charged for: ``d[o]``, the micro-batches in flight
  through the stage, and ``ends[o]``, the model's ends its memory holds (bit ``FIRST``: the embedding, with
  layer 0; bit ``LAST``: the LM head, with the last layer). A node may run option o only where it holds at
  most ``d[o]`` micro-batches (the sum, over the source-to-sink paths through it, of their stage counts:
  a path of p stages keeps p micro-batches in flight) and only the ends of ``ends[o]`` (a node that starts
  at layer 0 needs ``FIRST``, one that ends at layer L needs ``LAST``). Charging more than a stage holds is
  safe, so these are one-sided tests. Without roles (``d`` and ``ends`` not given) an option may run
  anywhere (``ANY_DEPTH``, both ends).

Edges: source -> i, i -> j (i != j) and i -> sink. An edge u -> v adds ``link_lat[m, u, v]`` to metric m
and carries at most ``link_cap[u, v]`` flow units per second. Row/column ``n`` of these (n x n+1 ... see
below) stands for the source (as u) and the sink (as v): arrays are indexed ``[u, v]`` with u in
0..n (n = source) and v in 0..n (n = sink).

A placement picks one option and one start layer per node and a set of edges, such that
layer ranges chain (source edge: start 0; sink edge: end L; i -> j: start_j = end_i), every node has an
incoming and an outgoing edge, and every source-to-sink path over chosen edges meets every latency limit.
Its value is the maximum flow from source to sink with node capacities ``cap`` and edge capacities
``link_cap``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np
from numpy.typing import NDArray

from coral.errors import CoralError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

FIRST = 1
"""``NodeMenu.ends`` bit: the option's memory holds the embedding (the stage may hold layer 0)."""
LAST = 2
"""``NodeMenu.ends`` bit: the option's memory holds the LM head (the stage may hold the last layer)."""
BOTH = FIRST | LAST
ANY_DEPTH = 1 << 20
"""``NodeMenu.d`` of an option charged for any number of micro-batches (a menu without roles)."""


@attrs.frozen(eq=False)
class NodeMenu:
    """Options of one node; all arrays have one entry per option."""

    k: IntArray
    b: IntArray
    cap: FloatArray
    lat: FloatArray  # shape (num_metrics, num_options)
    mem: FloatArray
    d: IntArray = attrs.field(default=None)
    ends: IntArray = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        n = len(self.k)
        if self.d is None:
            object.__setattr__(self, "d", np.full(n, ANY_DEPTH, np.int64))
        if self.ends is None:
            object.__setattr__(self, "ends", np.full(n, BOTH, np.int64))
        if not (
            len(self.b) == len(self.cap) == len(self.mem) == len(self.d) == len(self.ends) == n
            and self.lat.shape[1:] == (n,)
        ):
            raise ValueError("NodeMenu arrays must have one entry per option")

    @property
    def has_roles(self) -> bool:
        """Whether some option may not run in every position (see the module docstring)."""
        return bool(np.any(np.asarray(self.d) < ANY_DEPTH) or np.any(np.asarray(self.ends) != BOTH))

    def allowed(self, depth: int, ends: int) -> np.ndarray:
        """Mask of the options a node holding ``depth`` micro-batches and the ends ``ends`` may run."""
        return (np.asarray(self.d) >= depth) & ((np.asarray(self.ends) & ends) == ends)

    @property
    def size(self) -> int:
        return len(self.k)


@attrs.frozen(eq=False)
class PlacementProblem:
    """One model on one node multiset, as numbers. ``kinds[i]`` names node i's type (for symmetry)."""

    num_layers: int
    kinds: tuple[str, ...]
    menus: tuple[NodeMenu, ...]
    link_lat: FloatArray  # (num_metrics, n + 1, n + 1): [u, v], u = n is the source, v = n is the sink
    link_cap: FloatArray  # (n + 1, n + 1) flow units/s; inf where unlimited
    lat_limit: FloatArray  # (num_metrics,)

    @property
    def n(self) -> int:
        return len(self.menus)

    @property
    def num_metrics(self) -> int:
        return int(self.lat_limit.shape[0])

    @property
    def has_roles(self) -> bool:
        """Whether some option's role restricts where it may run (``NodeMenu.has_roles``)."""
        return any(m.has_roles for m in self.menus)


Edge = tuple[int, int]
"""(u, v) with u = n for the source and v = n for the sink."""


@attrs.frozen
class PlacementResult:
    """The best placement a placer found.

    ``status`` is ``optimal`` (proven), ``feasible`` (not proven: see ``bound`` and ``gap``),
    ``infeasible`` (proven that no placement exists) or ``unknown`` (a time limit hit before any placement
    was found or infeasibility was proven; ``value`` is 0 and ``bound`` the best known upper bound).
    ``gap`` is (bound - value) / bound. ``flows`` holds every chosen edge, with its flow (possibly 0).
    """

    value: float
    status: str
    bound: float
    method: str
    option: tuple[int, ...] = ()
    start: tuple[int, ...] = ()
    flows: Mapping[Edge, float] = attrs.field(factory=dict)
    solve_s: float = 0.0

    @property
    def gap(self) -> float:
        if self.status == "infeasible" or self.bound <= 0:
            return 0.0
        return max(0.0, (self.bound - self.value) / self.bound)

    @property
    def proven(self) -> bool:
        return self.status in ("optimal", "infeasible")


class PlacementInputError(CoralError):
    """A malformed PlacementProblem: the message names the field and the reason."""


def check_problem(problem: PlacementProblem) -> None:
    """Raise PlacementInputError unless every array of ``problem`` has the right shape and sane values.

    Latencies and capacities must be finite and >= 0 on options; link latencies and capacities must be
    >= 0 and may be +inf (an edge with infinite latency can never be used; infinite capacity is unlimited);
    latency limits must be > 0 and may be +inf (metric unconstrained); layers held must be >= 1.
    """
    L = problem.num_layers
    if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1:
        raise PlacementInputError(f"num_layers must be an integer >= 1, got {L!r}")
    n = problem.n
    if n < 1:
        raise PlacementInputError("menus must hold at least one node")
    if len(problem.kinds) != n:
        raise PlacementInputError(f"kinds has {len(problem.kinds)} entries but menus has {n}")
    lim = np.asarray(problem.lat_limit)
    if lim.ndim != 1 or lim.shape[0] < 1:
        raise PlacementInputError(f"lat_limit must be a 1-D array with >= 1 metric, got shape {lim.shape}")
    if np.isnan(lim).any() or (lim <= 0).any():
        raise PlacementInputError(f"lat_limit must be > 0 (or +inf), got {lim.tolist()}")
    nm = lim.shape[0]
    for i, menu in enumerate(problem.menus):
        where = f"menus[{i}]"
        k, b, cap, lat = (np.asarray(a) for a in (menu.k, menu.b, menu.cap, menu.lat))
        if k.ndim != 1 or b.ndim != 1 or cap.ndim != 1 or np.asarray(menu.mem).ndim != 1:
            raise PlacementInputError(f"{where}: k, b, cap and mem must be 1-D arrays")
        if lat.ndim != 2 or lat.shape != (nm, k.shape[0]):
            raise PlacementInputError(
                f"{where}.lat must have shape (num_metrics={nm}, num_options={k.shape[0]}), got {lat.shape}"
            )
        if k.size and (not np.issubdtype(k.dtype, np.integer) or (k < 1).any()):
            raise PlacementInputError(f"{where}.k must hold integers >= 1")
        if not np.isfinite(cap).all() or (cap < 0).any():
            raise PlacementInputError(f"{where}.cap must be finite and >= 0")
        if not np.isfinite(lat).all() or (lat < 0).any():
            raise PlacementInputError(f"{where}.lat must be finite and >= 0")
        d, ends = np.asarray(menu.d), np.asarray(menu.ends)
        if d.shape != k.shape or (d.size and (not np.issubdtype(d.dtype, np.integer) or (d < 1).any())):
            raise PlacementInputError(f"{where}.d must hold one integer >= 1 per option")
        if ends.shape != k.shape or (ends.size and ((ends < 0) | (ends > BOTH)).any()):
            raise PlacementInputError(f"{where}.ends must hold one of 0, 1, 2, 3 per option")
    link_lat = np.asarray(problem.link_lat)
    if link_lat.shape != (nm, n + 1, n + 1):
        raise PlacementInputError(f"link_lat must have shape ({nm}, {n + 1}, {n + 1}), got {link_lat.shape}")
    if np.isnan(link_lat).any() or (link_lat < 0).any():
        raise PlacementInputError("link_lat must be >= 0 (or +inf)")
    link_cap = np.asarray(problem.link_cap)
    if link_cap.shape != (n + 1, n + 1):
        raise PlacementInputError(f"link_cap must have shape ({n + 1}, {n + 1}), got {link_cap.shape}")
    if np.isnan(link_cap).any() or (link_cap < 0).any():
        raise PlacementInputError("link_cap must be >= 0 (or +inf)")
