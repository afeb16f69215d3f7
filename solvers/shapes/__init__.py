r"""Exact placement by shape enumeration: every connected shape of up to six nodes, solved exactly.

The modules, in reading order: ``catalogue`` (the shapes), ``tables`` (per-problem option tables),
``layout`` (a shape's label-free data), ``family`` (all labellings of a shape and their necessary
tests), ``decide`` (one labelled shape at a threshold) and ``search`` (the partition search).

A placement's weakly connected components are independent (their flows add up; their paths are
disjoint), so the optimum is the best partition of the nodes into components, each placed in the best
*connected* way. A connected placement has a *shape* (a ``Skeleton``): m + 1 boundaries
0 = B_0 < B_1 < ... < B_m = L, an interval (a_i, b_i) of boundary indices per node (node i holds layers
B_{a_i} .. B_{b_i} - 1), and the edges between nodes whose intervals abut; edges from the source go to
every node with a_i = 0 and edges to the sink leave every node with b_i = m (a node that starts at layer
0 can have no other input). ``skeletons(s)`` lists every connected shape of s nodes up to relabelling:
1, 1, 3, 10, 45 and 249 for s = 1..6. A *labelled* shape assigns a problem node to each shape node;
interchangeable nodes (same kind, menu and links) make many labellings equal, and the shape's
automorphisms identify more.

Deciding one labelled shape at a flow threshold F (``Labelled.decide``) is exact: is there a choice of
boundaries and options with maximum flow >= F in which every source-to-sink path meets every latency
limit? It uses four exact facts.

- Max-flow min-cut: flow >= F iff every cut of the shape (a set of nodes and edges whose removal
  separates source from sink) has capacity >= F. A cut that contains an edge of capacity >= F always
  has; so only the shape's minimal cuts made of nodes and of edges with capacity < F are checked.
- Capacity clipping: a flow of value F puts at most F on any node, so capacities above F act as F, and
  among the options of one node with the same k and capacity >= F only those with the least latencies
  matter (one option when the latencies grow with the capacity in every metric, which the perf model's
  menus do).
- A *cut node* ({i} is a cut: every path goes through it) needs capacity >= F. A maximal run of cut
  nodes that follow each other with nothing else ending or starting in between (a chain inside the
  shape) is contracted: its least latency for each total length is a min-plus convolution (one metric)
  or a Pareto front of latency vectors (several metrics), with back-pointers to its split and options.
- *Free* nodes: for nodes of which no cut holds two, once the options of every other node are fixed,
  each free node's cuts ask for a capacity of at least F minus the rest of the cut, and the option of
  least latency that meets it is best, because a smaller latency never hurts a path and more capacity
  never hurts a cut (for several metrics this needs the ordered latencies above; other nodes are fixed).

Before a labelled shape is decided, cheap necessary tests run over all labellings of the shape at once
(``prefilter``, then ``Family.candidates``): every path can cover the L layers within the limits (its
cut nodes with options of capacity >= F only, and every node with the options that pass the component's
layer-work test at F only: sum_i k_i min(c_i, F) >= L F), every cut node has such an option of capacity
>= F that fits its paths, every cut whose edges all carry less than F has enough node capacity, and
the nodes' layer counts can meet all of it together: the counts on a path add up to L, a node's
capacity is at most its best with at least its least count, and a cut's capacity need caps each of its
nodes' counts (bounds propagation, ``Family._length_bounds``). The ranges of counts it leaves bound
each element's lengths in the enumeration below (``Family.spans``).

Shapes with the same intervals differ only in their edges; if the shape with every such edge and every
latency set to zero cannot reach F for a labelling, none of them can (``EdgeRelaxation``), so one
decision rules out a labelling for all of them, and the next shapes drop it before their families are built.

The rest is enumerated with numpy (``enumerate_rows``): the remaining boundaries, placed one at a time, each
only at the positions that the lengths with a usable option allow (an element's length is checked as
soon as it is known: at its end, or at its start when it ends at L) and, by bisection, only up to the
last position at which every kept cut may still carry F (``_last_cut_ok``); each prefix kept only while
every path's latency bound and every kept cut (with the capacities its elements may have at their
lengths so far) still allow F; then times the options of the fixed nodes, every row checked against every path's
latency (node latencies plus the labelled links) and every kept cut. A feasible row is a placement of
the component; its value is recomputed by an exact maximum flow. The labellings of one shape are
screened in groups (``screen``): one enumeration of their boundaries together, so that only
those with a boundary vector are decided one by one.

``shape_search`` then finds the best partition (see its docstring): thresholds from an incumbent and
from upper bounds skip most components, and each component's best value is raised by repeated decisions
(a feasible decision at F returns a placement worth v >= F; the next decision asks for more than v)
until none is feasible, which proves it. A sub-multiset's first bound is the layer-work fixed point
(``solvers.bounds.work_fixed_point``). With a ``floor`` the search only asks for placements above it. Everything is
exact; the work is bounded by a deterministic budget of enumerated rows (``budget``); when it runs out
the search returns its best placement, unproven, with an upper bound.
"""

from solvers.shapes.catalogue import Skeleton, skeletons
from solvers.shapes.search import exhaustive_shapes, shape_search

__all__ = ["Skeleton", "exhaustive_shapes", "shape_search", "skeletons"]
