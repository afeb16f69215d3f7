"""The solve driver.

Solution path
-------------
1. Build the columns and rows from numpy arrays (one addRows and one addCols call).
2. LP relaxation: minimise cost with u fixed to 0; if infeasible, minimise sum_m w_m u_m (unmet demand
   weighted by priority), then cost at that service level. With ``columns="generated"``: the same by column generation.
3. Heuristic (numpy, deterministic): round the LP down, then round up its fractional columns, most
   fractional first, while they serve unmet demand; fill what is left (aggregated instances that the
   demand fully uses, best req/s per USD/h first; the cheapest multiset of up to three aggregated
   instances for each model's rest; then best unmet-req/s per USD/h among all instances and
   prefill+decode pairs); drop instances not needed; local search per model (rebuild it from scratch,
   aggregated-first and disaggregated-first; drop up to three of its least efficient instances for the
   cheapest multiset of up to three that serves as much). The same from the current deployment cut to
   the availability; the best of these wins. The empty plan is always feasible, so there is always a
   plan.
   When the LP serves every demand and no plan so far does (5x demand under ``quota``: the greedy fill
   left 6.7 of 40 req/s of one model unmet), an LP dive on the cost LP at full service follows
   (``_dive_job``, as in 7; 18 LP solves, 0.08 s there), so that the master rounds start from a plan.
4. Restricted master MIPs (``master``), when the LP and the best plan so far serve every demand: the cost
   MIP over the integer variables whose LP reduced cost is within a threshold that doubles each round
   (from ``MASTER_FIRST`` of the LP bound), warm-started with the best plan; min(the round's bound, LP bound +
   threshold) bounds the whole program, and a round whose threshold covers the best plan's gap to the LP
   bound proves it optimal. They take ``MASTER_SHARE`` of the time left; at 2x-5x demand on core they
   reached within 0.5% of the optimum where the decomposition's per-model MIPs did not finish. Proven:
   every later phase is skipped.
   Then the neighbourhood search (``neighbourhood``), under the same conditions: cost MIPs over one
   model's or one region's cheaply priced columns with every other variable fixed at the best plan, in
   turn, each neighbourhood widening its price threshold after a step of it without an improvement, in
   ``SEARCH_SHARE`` of the time left. The master rounds come first because on core and ``scarce`` they
   prove the optimum in 0.03 s, which the search cannot; at 5x demand, where their rounds do not finish
   within the deadline, the search found plans 3-6% cheaper in the same time.
   From ``SEARCH_FIRST_COLUMNS`` (template, region) columns up (``extended``: 69,710; core 6,096), the
   search and then the decomposition (5) run first, and the master rounds only when they did not prove the
   plan: there the rounds took their whole share (3.2-3.5 s of 10) without proving, while the search
   reached a plan within 1.4% of the best in 1.0-1.4 s, and the decomposition, pruning by that plan,
   proved it (seven solves of seven optimal in 3.3-7.3 s; with the rounds first, five of seven in
   7.2-10.2 s). On core and ``scarce`` the rounds first were as fast or faster (``scarce``: p50 0.12 s
   against 0.17 s). In this order the search stops after one pass over its neighbourhoods without an
   improvement, at any width (``_search_phase``).
5. Decomposition by model, when the LP serves every demand and the master MIPs did not prove the plan.
   Models share only the availability rows (the service row is then fixed at full service), so each group of
   models solves its own cost MIP over all its columns with the whole availability (every model alone at
   first, one after the other, largest first). The sum of the group optima bounds the program from below,
   and when the union of their plans fits the availability it is optimal. Groups whose plans overrun a
   (region, node type) together are merged and solved again (from the repaired union where the best plan
   leaves demand unmet); at worst one group holds every model. In a group's MIP, a variable whose one
   unit costs more than the group's part of the best plan so far is left out (costs are nonnegative, so it
   cannot be in a better plan), and so is one whose LP reduced cost proves it cannot be in a better plan
   (``decomposition._split_phase``): on ``extended`` the largest model's MIP kept 1,800-3,200 integer
   variables of 16,000-19,000. A group that still keeps more than ``ROUND_MIN`` prunes again by its own
   LP and starts from a first round over its cheapest variables (``_split_phase``'s docstring).
6. The portfolio (``_restrict_phase``), unless the master MIPs or the decomposition proved the plan
   optimal (no restriction can then beat it): each baseline's restriction (``RESTRICTIONS``: homogeneous
   aggregated, homogeneous prefill/decode, their union, every aggregated template) solved alone by this
   same driver, smallest first, each warm-started with the best plan of the restrictions inside it. Of
   ``RESTRICT_SHARE`` of the time left, each of the n gets at least its own n-th (measured when the
   portfolio starts, so an earlier one's overrun on a loaded machine does not shrink it) plus what the
   earlier ones left unused. Each plan is a plan of the whole problem too (``_embed``), serving at least
   as much: the whole problem lets each prefill instance feed every NIC level it may by continuous
   shares, as a restriction with fewer levels does.
   Proving the whole problem first costs little where it can be proven (``core``: 0.35 s alone, where
   the four restrictions took 0.5 s before it) and leaves the restrictions the time otherwise.
7. When the LP cannot serve every demand, rounding loses most, so an LP dive follows (``_dive_job``:
   round up what fits, else bound the least fractional variable down, re-solve, until integral).
8. MIP phase 1 (only when the plan still leaves more unmet demand than the LP bound), then phase 2
   (only when the decomposition did not prove the plan optimal; its groups' bounds are added as cuts
   sum_{v of group} cost_v v >= bound), each warm-started with the best plan so far, on
   single-threaded HiGHS.

Never worse than a baseline: a restriction whose sub-solve proves its optimum (status ``optimal``) puts
a plan at least as good as that baseline's best into the incumbent, and every later phase only keeps a
better one. A restriction cut by its share of the deadline can lose to the same restriction solved alone
with the whole deadline; the result then is no worse than the plan it reached (its effort records where
it stopped). A restriction's plan serves as much in the whole problem as in its own: its templates are
columns of the whole problem, and a prefill column there may feed every pool that it may feed in the
restriction (its pools there are unions of the whole problem's levels, which its shares z may split).

Deadline: everything runs here, on the caller's thread; HiGHS's interrupt callbacks stop each LP and
MIP once the injected ``clock`` passes the phase's deadline (``stopping``). Replay: single-threaded
HiGHS finds the same improving solutions in the same order every run, so the number taken per phase
(``SolverEffort``, per group for the decomposition; LP solves for the dive) fixes the plan without the
clock. Every phase records whether it ran, was skipped, or where the deadline cut it.

Progress: with ``progress``, each time the best plan may have changed (after the portfolio, the
heuristic, each master round, the dive, the decomposition, and at each improving solution of the MIPs) the driver passes
the result that the solve would return had its deadline passed right then: its effort replays that
plan, bound and gap exactly. A caller that must return by a hard deadline (HiGHS's interrupt checks
were up to 16 s apart at the root of an extended-size MIP) runs the solve in a process it owns and
kills (``actors.solver_process``), and takes the last result it received.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import highspy
import numpy as np
from numpy.typing import NDArray

from solvers.allocation.columns import _AGG, _columns, _merged
from solvers.allocation.decomposition import SPLIT_MIN_COLUMNS, SPLIT_SHARE, _mip_phase, _Split, _split_phase
from solvers.allocation.heuristics import (
    _better,
    _Budget,
    _counts,
    _embed,
    _fit,
    _fit_current,
    _objective,
    _repair,
    _State,
    _unmet_total,
)
from solvers.allocation.master import MASTER_SHARE, _master_round, _master_start
from solvers.allocation.model import _highs, _matrix, _service_hi
from solvers.allocation.neighbourhood import SEARCH_CYCLES, SEARCH_SHARE, SEARCH_WIDEN, _neighbourhoods, _step
from solvers.allocation.problem import (
    RESTRICTIONS,
    AllocationInputError,
    AllocationProblem,
    AllocationResult,
    AllocTemplate,
    SolverEffort,
)
from solvers.allocation.relaxation import _AUTO_GENERATED, _cg_job, _dive_job, _DiveOutcome, _lp_job, _LpOutcome
from solvers.allocation.stopping import _Deadline, _LpStop, _Mip

IntArray = NDArray[np.int64]


DIVE_SHARE = 0.3
"""Share of the deadline after the LP that the diving heuristic may use."""


_SKIP_ALL = SolverEffort(lp=0, serve=0, cost=0, dive=0, decompose=0)
"""The effort recorded for a restriction not solved at all (the deadline came first); no solve that ran
records it (with ``lp`` 0 a solve never records ``dive``)."""

RESTRICT_SHARE = 0.5
"""Share of the deadline that the portfolio's restrictions may use together."""


def _restrictions(p: AllocationProblem) -> list[tuple[str, IntArray]]:
    """(name, template indices) of each restriction of ``RESTRICTIONS`` that selects some but not all of
    p's templates, and not the same ones as an earlier restriction."""
    merged = _merged(p)  # per unique template, then per template
    homo = ((merged.nc > 0).sum(axis=1) == 1)[merged.u_of]
    agg = (merged.per_u["mode"] == _AGG)[merged.u_of]
    masks = {"homo": homo & agg, "pd-homo": homo & ~agg, "homo-pd": homo, "agg": agg}
    out: list[tuple[str, IntArray]] = []
    seen: set[bytes] = set()
    for name in RESTRICTIONS:
        mask = masks[name]
        if mask.any() and not mask.all() and mask.tobytes() not in seen:
            seen.add(mask.tobytes())
            out.append((name, np.nonzero(mask)[0]))
    return out


_SUBSETS: list[tuple[tuple[AllocTemplate, ...], bytes, tuple[AllocTemplate, ...]]] = []
"""The last restrictions' template tuples: the same tuple for the same subset of the same tuple, so that
validation and merging (``problem._template_keys``, ``columns._merged``) recognise it the next solve."""


def _restrict(p: AllocationProblem, idx: IntArray) -> AllocationProblem:
    """The same problem over the templates ``idx`` (and their running instances)."""
    sig = idx.tobytes()
    sub = next((s for ts, i, s in _SUBSETS if ts is p.templates and i == sig), None)
    if sub is None:
        sub = tuple(p.templates[i] for i in idx)
        _SUBSETS[:] = [*_SUBSETS[-7:], (p.templates, sig, sub)]
    keep = {t.key for t in sub}
    return attrs.evolve(p, templates=sub, current={k: v for k, v in p.current.items() if k[0] in keep})


def _status(proven: bool, service_proven: bool, bound: float) -> str:
    """``optimal`` when proven; ``feasible`` when the service level is proven and a cost bound above 0
    exists (the gap is to it); else ``no bound``: without a proven service level a cost bound says
    nothing of the lexicographic optimum."""
    if proven:
        return "optimal"
    return "feasible" if service_proven and bound > 0 else "no bound"


def solve_allocation(
    problem: AllocationProblem,
    *,
    deadline_s: float = 1.0,
    mip_gap: float = 1e-4,
    effort: SolverEffort | None = None,
    columns: str = "auto",
    decompose: bool | None = None,
    clock: Callable[[], float] = time.perf_counter,
    portfolio: bool = True,
    progress: Callable[[AllocationResult], None] | None = None,
    start: Mapping[tuple[int, int], int] | None = None,
    starts: Sequence[Mapping[tuple[int, int], int]] = (),
    master: bool = True,
    search: bool = True,
) -> AllocationResult:
    """Plan instances per template and region: serve the most demand, then at the least cost plus churn.

    Returns about ``deadline_s`` after the call (HiGHS is interrupted at its next check after the
    deadline; see the module docstring), always with a feasible plan. With ``effort`` the wall clock is
    ignored and each phase stops where ``effort`` says, which makes the solve deterministic: pass a
    result's ``effort`` back to replay exactly its plan.

    ``columns="generated"`` solves the LP by column generation and the MIPs over the generated
    columns plus the current and the heuristic plan's: the MIPs find better plans in time at the
    extended size, but their bounds hold only for those columns, so the reported bound is the LP's.
    ``"all"`` solves the MIPs over all columns; ``"auto"`` (default) generates columns from 5,000
    (template, region) columns up (the extended size, where it measured 1-5% cheaper plans).

    ``decompose``: when the LP serves every demand, first solve each model's MIP alone over all its
    columns, merging models whose plans overrun the same availability (see ``_split_phase``); the full
    MIP runs only when that does not prove the plan optimal, with the group bounds as cuts. ``None``
    (default) decomposes from ``SPLIT_MIN_COLUMNS`` columns up.

    ``search``: when the LP and the best plan so far serve every demand, improve the plan by small MIPs
    over one region's or one model's columns, the rest fixed (``solvers.allocation.neighbourhood``), after
    the master MIPs.

    ``master``: when the LP serves every demand, solve restricted master MIPs over the variables that the
    LP prices cheap, in growing rounds (``solvers.allocation.master``), before the decomposition.

    ``portfolio``: first solve each restriction of ``RESTRICTIONS`` that selects some but not all of the
    templates (a baseline's problem) alone, in ``RESTRICT_SHARE`` of the deadline together (the module
    docstring says what this guarantees); the best of their plans starts every later phase.

    ``start``: a plan (instances per (template index, region)) that fits the availability; the result is
    no worse than it (the portfolio warm-starts a restriction with the plans of those inside it).
    ``starts``: more such plans (a caller's plans over subsets of the templates, such as the baselines' in
    the savings study); the result is no worse than any of them, whatever the deadline.

    ``clock`` (seconds) measures the deadline; a test passes a fake one to cut the solve at any phase.
    Every phase that the deadline cuts or skips is recorded in the result's ``effort``.

    ``progress(result)``: called with the result as it would be if the deadline passed at that moment
    (see the module docstring); the last call's result equals the one returned.
    """
    if columns not in ("auto", "all", "generated"):
        raise AllocationInputError(f"columns: must be 'auto', 'all' or 'generated', got {columns!r}")
    if not (deadline_s > 0 and math.isfinite(deadline_s)):
        raise AllocationInputError(f"deadline_s: must be finite and > 0, got {deadline_s}")
    if not (0 <= mip_gap < 1):
        raise AllocationInputError(f"mip_gap: must be in [0, 1), got {mip_gap}")
    run = _Run(problem, effort, deadline_s, mip_gap, columns, decompose, clock, portfolio, progress, (
        *([start] if start else []), *starts), master, search)  # fmt: skip
    for name, phase in run.order:
        t = time.perf_counter()
        phase(run)
        run.phase_s[name] = time.perf_counter() - t
        if name in _REPORTED:
            run.report(name)
    return run.result()


class _Run:
    """One solve's state, shared by its phases: the columns and model, the best plan so far, the bounds
    proven, and the effort each phase took."""

    def __init__(
        self,
        problem: AllocationProblem,
        effort: SolverEffort | None,
        deadline_s: float,
        mip_gap: float,
        columns: str,
        decompose: bool | None,
        clock: Callable[[], float],
        portfolio: bool = True,
        progress: Callable[[AllocationResult], None] | None = None,
        starts: Sequence[Mapping[tuple[int, int], int]] = (),
        master: bool = True,
        search: bool = True,
    ) -> None:
        self.t0 = time.perf_counter()
        self.master = master
        self.search = search
        self.portfolio = portfolio
        self.progress = progress
        self.cut = False  # a snapshot: the deadline counts as passed
        self.problem = problem
        self.clock = clock
        self.deadline = None if effort is not None else _Deadline(clock() + deadline_s, clock)
        self.limits = effort if effort is not None else SolverEffort()
        self.mip_gap = mip_gap
        self.phase_s: dict[str, float] = {}
        self.c = _columns(problem)
        self.mat = _matrix(self.c)
        self.columns = ("generated" if self.c.J >= _AUTO_GENERATED else "all") if columns == "auto" else columns
        self.decompose = self.c.J >= SPLIT_MIN_COLUMNS if decompose is None else decompose
        self.search_first = self.decompose and self.master and self.c.J >= SEARCH_FIRST_COLUMNS
        self.order = _order(self.search_first)
        self.phase_s["build"] = time.perf_counter() - self.t0
        self.svc_tol = 1e-7 * max(1.0, float((self.c.weight * self.c.demand).sum()))
        self.iters = self.nodes = 0
        self.used: dict[str, Any] = dict.fromkeys(
            ("lp", "heuristic", "serve", "cost", "dive", "split", "master", "search")
        )
        self.lp = _LpOutcome()
        self.best = np.zeros(self.c.J, dtype=np.int64)
        for plan in starts:
            self.offer(_fit(self.c, _embed(self.c, plan)))
        self.restricted: list[tuple[str, SolverEffort]] = []
        self.portfolio_plans: list[tuple[IntArray, IntArray]] = []  # (template mask, plan) of each restriction
        self.next_restriction = 0
        self.split = _Split()
        self.split_optimal = False
        self.master_bound = -math.inf  # a lower bound on the cost of every plan serving all demand
        self.master_optimal = False
        self.unmet_bound = float((self.c.weight * self.c.demand).sum()) if self.c.J == 0 else 0.0
        self.cost_bound = -math.inf
        self.cost_optimal = False
        self.service = (0.0, False)  # the best plan's unmet req/s and whether it is proven least (cost phase)

    def optimal(self) -> bool:
        """Whether the best plan is proven optimal already (by the decomposition or the master MIPs)."""
        return self.split_optimal or self.master_optimal

    def out_of_time(self) -> bool:
        return self.cut or (self.deadline is not None and self.deadline.passed())

    def report(self, after: str, partial: Callable[[_Run], None] | None = None) -> None:
        """Pass ``progress`` the result as if the deadline passed now: ``partial`` applies what phase
        ``after`` has found so far, and every later phase is cut (skipped) as the deadline would."""
        if self.progress is None:
            return
        snap = copy.copy(self)
        snap.cut = True
        snap.used, snap.phase_s, snap.restricted = dict(self.used), dict(self.phase_s), list(self.restricted)
        snap.portfolio_plans = list(self.portfolio_plans)
        if partial is not None:
            partial(snap)
        later = [name for name, _phase in self.order].index(after) + 1
        for _name, phase in self.order[later:]:
            phase(snap)
        self.progress(snap.result())

    def offer(self, x: IntArray) -> None:
        """Keep plan x if it beats the best so far."""
        if _better(self.c, x, self.best):
            self.best = x

    def mip_vars(self) -> IntArray | None:
        """All variables, or with generated columns those plus the best plan's and the current ones."""
        c, lp = self.c, self.lp
        if self.columns == "all" or lp.columns is None:
            return None
        x_cols = np.union1d(lp.columns, np.nonzero((self.best > 0) | (c.cur > 0))[0])
        return np.concatenate([x_cols, np.arange(c.J, self.mat.num_cols)])

    def result(self) -> AllocationResult:
        c, best, lp, split = self.c, self.best, self.lp, self.split
        unmet_best, service_proven = self.service
        cost, churn = _objective(c, best)
        objective = cost + churn
        bounds = [0.0, self.cost_bound]
        if lp.done and unmet_best <= lp.unmet + self.svc_tol:
            bounds.append(lp.bound)
        if unmet_best <= self.svc_tol:
            bounds += [split.bound, self.master_bound]
        bound = min(max(bounds), objective)
        gap = (objective - bound) / objective if objective > 0 else 0.0
        proven = c.J == 0 or self.optimal() or (service_proven and (self.cost_optimal or gap <= self.mip_gap))
        status = _status(proven, service_proven, bound)
        if status == "no bound":
            bound, gap = 0.0, 1.0 if objective > 0 else 0.0
        capacity = _State(c, best).capacity() if c.J else np.zeros(c.M)
        served = np.minimum(capacity, c.demand)
        used = self.used
        return AllocationResult(
            counts=_counts(c, best),
            cost_per_hour=cost,
            churn_cost=churn,
            served_rps=served,
            unmet_rps=c.demand - served,
            status=status,
            objective=objective,
            bound=bound,
            gap=gap,
            unmet_bound=self.unmet_bound,
            service_proven=service_proven,
            solve_s=time.perf_counter() - self.t0,
            phase_s=self.phase_s,
            effort=SolverEffort(
                lp=used["lp"],
                heuristic=used["heuristic"],
                serve=used["serve"],
                cost=used["cost"],
                dive=used["dive"],
                decompose=used["split"],
                master=used["master"],
                search=used["search"],
                split=split.stopped.items(),
                restricted=self.restricted,
            ),
            simplex_iterations=self.iters,
            mip_nodes=self.nodes,
            num_columns=self.mat.num_cols,
            num_rows=self.mat.num_rows,
            merged_templates=sum(map(len, c.members)) - len(c.members),
            column_generation=self.columns == "generated",
            capacity_rps=capacity,
            split_groups=split.groups,
        )

    def prove_service(self) -> None:
        """Fix the best plan's unmet demand, and whether the bound proves it least, for the cost phase."""
        unmet_best = _unmet_total(self.c, self.best)
        proven = unmet_best <= self.unmet_bound + self.svc_tol or unmet_best * (1 - self.mip_gap) <= self.unmet_bound
        self.service = (unmet_best, proven)


def _lp_phase(run: _Run) -> None:
    """The LP relaxation (directly, or by column generation); cut by the deadline, it is not used."""
    c, mat = run.c, run.mat
    if c.J == 0:
        return
    if run.limits.lp == 0 or run.out_of_time():
        run.used["lp"] = 0
        return
    stop = _LpStop(run.deadline)
    lp = _LpOutcome()
    if run.columns == "all":
        h = _highs(mat, mat.cost_obj, _service_hi(c, 0.0), run.mip_gap, mip=False)
        stop.attach(h)
        _lp_job(h, c, mat, lp)
    else:
        _cg_job(c, mat, run.mip_gap, lp, stop)
    if not stop.interrupted:
        run.iters += lp.iterations
        run.lp = lp
        run.unmet_bound = lp.unmet
    else:
        run.used["lp"] = 0


def _heuristic_phase(run: _Run) -> None:
    """Rounding and greedy repair: from the LP, and from the current deployment; their local search stops
    at the deadline (the steps it took are recorded)."""
    c, mat, lp = run.c, run.mat, run.lp
    if c.J == 0:
        return
    budget = _Budget(run.limits.heuristic, run.out_of_time)
    if not lp.done or np.any(c.cur > 0):
        run.offer(_repair(c, _fit_current(c), budget=budget))
    if lp.values is not None:
        v = lp.values[: c.J].copy()
        v[mat.keep_cols] += lp.values[c.J : c.J + len(mat.keep_cols)]
        run.offer(_repair(c, np.floor(v + 1e-6).astype(np.int64), frac=v, budget=budget))
    if budget.cut:
        run.used["heuristic"] = budget.taken


def _restrict_phase(run: _Run) -> None:
    """The portfolio: each baseline's restriction solved alone, warm-started with the best plan of those
    inside it; each plan is a plan of this problem too. Continues from ``run.next_restriction`` (a
    progress snapshot records the rest as not solved)."""
    c, problem, limits = run.c, run.problem, run.limits
    if c.J == 0 or not run.portfolio or run.optimal():
        return
    todo = _restrictions(problem)
    phase = None if run.deadline is None or run.cut else run.deadline.share(RESTRICT_SHARE)
    own = None if phase is None else phase.left() / max(len(todo) - run.next_restriction, 1)
    while run.next_restriction < len(todo):
        k = run.next_restriction
        name, idx = todo[k]
        run.next_restriction += 1
        kw: dict[str, Any] = {"mip_gap": run.mip_gap, "columns": run.columns, "portfolio": False}
        recorded = dict(limits.restricted).get(name, SolverEffort())
        if run.out_of_time() or (run.deadline is None and recorded == _SKIP_ALL):  # not even its heuristic
            run.restricted.append((name, _SKIP_ALL))
            continue
        sub = _restrict(problem, idx)
        mask = np.zeros(len(problem.templates), dtype=bool)
        mask[idx] = True
        inside = [x for m, x in run.portfolio_plans if not (m & ~mask).any()]
        x0 = None
        for x in inside:
            if x0 is None or _better(c, x, x0):
                x0 = x
        if x0 is not None:
            pos = {int(i): n for n, i in enumerate(idx)}
            kw["start"] = {(pos[i], r): n for (i, r), n in _counts(c, x0).items() if i in pos}
        if run.deadline is None:
            res = solve_allocation(sub, effort=recorded, **kw)
        else:
            assert phase is not None
            assert own is not None
            left = max(phase.left() / (len(todo) - k), own)  # its own slice, and what earlier ones left
            if left <= 0:  # the phase began at (or after) the deadline: as if out of time above
                run.restricted.append((name, _SKIP_ALL))
                continue
            res = solve_allocation(sub, deadline_s=left, clock=run.clock, **kw)
        if res.effort != SolverEffort():
            run.restricted.append((name, res.effort))
        x = _fit(c, _embed(c, {(int(idx[i]), r): n for (i, r), n in res.counts.items()}))
        run.portfolio_plans.append((mask, x))
        run.offer(x)
    if todo and not run.cut:  # one report for the portfolio: each costs a greedy pass over the whole problem
        run.report("restrict")


def _search_phase(run: _Run) -> None:
    """The neighbourhood search (``neighbourhood``), when the LP and the best plan serve every demand and
    the LP bound does not already prove the plan: steps over the neighbourhoods in turn, each widening
    its Delta after a step without an improvement, until n steps in a row without one at the widest,
    ``SEARCH_CYCLES`` n steps, or its share of the deadline. In the search-first order it ends after n
    steps in a row without an improvement at any Delta: the decomposition after it proves or improves the
    plan. On ``extended`` (a profiling run, t = 0 and three re-solves) the steps after that pass took
    1.0-2.5 s and improved one plan of four, by 0.4%, which the decomposition proved optimal in neither."""
    c, mat, lp = run.c, run.mat, run.lp
    if not (run.search and c.J > 0 and lp.done and lp.unmet <= run.svc_tol) or run.optimal():
        return
    if _unmet_total(c, run.best) > run.svc_tol:
        return
    cost = sum(_objective(c, run.best))
    st = _master_start(c, mat, lp)
    if st is None or cost - lp.bound <= run.mip_gap * max(abs(cost), 1e-9):
        return
    hoods = _neighbourhoods(c)
    stop_at = run.limits.search
    share = None if run.deadline is None or run.cut else run.deadline.share(SEARCH_SHARE)
    widths = [0] * len(hoods)
    step = stale = quiet = 0
    while True:
        if stop_at is not None and step == stop_at[0] and stop_at[1] == 0:  # a replay: step not started
            run.used["search"] = (step, 0)
            return
        if stale >= len(hoods) or (run.search_first and quiet >= len(hoods)) or step >= SEARCH_CYCLES * len(hoods):
            return
        if run.out_of_time() or (share is not None and share.passed()):
            run.used["search"] = (step, 0)
            return
        limit = None if stop_at is None or step < stop_at[0] else stop_at[1]
        before, k = run.best, step % len(hoods)
        mip, plans = _step(c, mat, st, run.best, hoods[k], limit, share, run.mip_gap, widths[k])
        run.iters, run.nodes = run.iters + mip.iterations, run.nodes + mip.nodes
        for x in plans:
            run.offer(x)
        if not mip.finished or (stop_at is not None and step == stop_at[0]):
            run.used["search"] = (step, len(mip.taken()))
            return
        step += 1
        if run.best is not before:
            stale = quiet = 0
            run.report("search", functools.partial(_search_cut, at=step))
        else:
            quiet += 1
            stale = stale + 1 if widths[k] == SEARCH_WIDEN else 0
            widths[k] = min(widths[k] + 1, SEARCH_WIDEN)


def _search_cut(snap: _Run, at: int) -> None:
    """A progress snapshot between steps of the search: the steps from ``at`` on are not run."""
    snap.used["search"] = (at, 0)


def _master_phase(run: _Run) -> None:
    """Restricted master MIPs (``master``), when the LP serves every demand: rounds over the variables the
    LP prices within a growing threshold, until the best plan is proven optimal or the deadline."""
    c, mat, lp = run.c, run.mat, run.lp
    if not (run.master and c.J > 0 and lp.done and lp.unmet <= run.svc_tol) or run.optimal():
        return
    if _unmet_total(c, run.best) > run.svc_tol:
        # no plan yet serves every demand (not even the cost dive's): a round must then find one from
        # scratch, which at 5x quota it did not within the deadline (its root found none in 0.9 s)
        return
    st = _master_start(c, mat, lp)
    if st is None:
        return
    stop_at = run.limits.master
    share = None if run.deadline is None or run.cut else run.deadline.share(MASTER_SHARE)
    while True:
        limit = None if stop_at is None or st.round < stop_at[0] else stop_at[1]
        if limit == 0 or run.out_of_time() or (share is not None and share.passed()):
            run.used["master"] = (st.round, 0)
            return
        full = _unmet_total(c, run.best) <= run.svc_tol
        best_cost = sum(_objective(c, run.best)) if full else math.inf
        at = st.round
        mip, plans = _master_round(c, mat, st, run.best, best_cost, limit, share, run.mip_gap)
        run.iters, run.nodes = run.iters + mip.iterations, run.nodes + mip.nodes
        for x in plans:
            run.offer(x)
        run.master_bound = st.bound
        if not mip.finished:
            run.used["master"] = (at, len(mip.taken()))
            return
        if _unmet_total(c, run.best) <= run.svc_tol:
            cost = sum(_objective(c, run.best))
            run.master_optimal = st.exact or st.bound >= cost - run.mip_gap * max(abs(cost), 1e-9)
        if run.master_optimal or st.whole or not st.solved:
            return
        run.report("master", functools.partial(_master_cut, at=st.round))


def _master_cut(snap: _Run, at: int) -> None:
    """A progress snapshot between master rounds: the rounds from ``at`` on are not run."""
    snap.used["master"] = (at, 0)


def _dive_phase(run: _Run, cost: bool) -> None:
    """LP diving: when not every demand can be served (``cost`` False; rounding loses most there), or
    (``cost`` True) when the LP serves every demand but no plan so far does (the master rounds then have
    no incumbent)."""
    c, lp = run.c, run.lp
    if not (c.J > 0 and lp.done):
        return
    if cost and not (lp.unmet <= run.svc_tol and _unmet_total(c, run.best) > run.svc_tol):
        return
    if not cost and lp.unmet <= run.svc_tol:
        return
    if run.limits.dive == 0 or run.out_of_time():
        run.used["dive"] = 0
        return
    dive = _DiveOutcome()
    stop = _LpStop(None if run.deadline is None else run.deadline.share(DIVE_SHARE))
    _dive_job(c, run.mat, run.mip_gap, run.limits.dive, dive, stop, cost=cost)
    if stop.interrupted or (run.limits.dive is not None and not dive.done):
        run.used["dive"] = dive.steps
    if dive.plan is not None:
        run.offer(_repair(c, _fit(c, dive.plan)))
    if cost:  # reported only when it ran (the serve dive's report is the loop's)
        run.report("cost_dive")


def _decompose_phase(run: _Run) -> None:
    """Per-model MIPs, when the LP serves every demand: their union is optimal when it fits."""
    c, lp = run.c, run.lp
    if not (run.decompose and c.J > 0 and lp.done and lp.unmet <= run.svc_tol) or run.master_optimal:
        return
    if run.limits.decompose == 0 or run.out_of_time():
        run.used["split"] = 0
        return
    share = None if run.deadline is None else run.deadline.share(SPLIT_SHARE)
    split = _split_phase(c, run.mat, run.best, dict(run.limits.split), share, run.mip_gap, lp.duals)
    run.split = split
    run.iters, run.nodes = run.iters + split.iterations, run.nodes + split.nodes
    if split.plan is not None:
        x = split.plan if split.fits else _repair(c, _fit(c, split.plan))
        if _better(c, x, run.best) or (split.fits and split.proven):
            run.best = x
        run.split_optimal = split.fits and split.proven and _unmet_total(c, run.best) <= run.svc_tol


def _serve_phase(run: _Run) -> None:
    """MIP phase 1 (serve), only when the LP bound does not already prove the service level."""
    c, mat = run.c, run.mat
    if not (c.J > 0 and _unmet_total(c, run.best) > run.unmet_bound + run.svc_tol):
        return
    if run.limits.serve == 0 or run.out_of_time():
        run.used["serve"] = 0
        return
    half = None if run.deadline is None else run.deadline.share(0.5)

    def apply(r: _Run, mip: _Mip, plans: list[IntArray]) -> None:
        r.iters, r.nodes = r.iters + mip.iterations, r.nodes + mip.nodes
        r.used["serve"] = None if mip.finished else len(mip.taken())
        for x in plans:
            r.offer(x)
        if r.columns == "all":
            r.unmet_bound = max(r.unmet_bound, mip.dual_bound)
            if mip.status == highspy.HighsModelStatus.kOptimal:
                r.unmet_bound = max(r.unmet_bound, _unmet_total(c, r.best) * (1 - r.mip_gap))

    def each(mip: _Mip, plans: list[IntArray]) -> None:
        run.report("serve", functools.partial(apply, mip=mip, plans=plans))

    mip, plans = _mip_phase(
        c, mat, mat.serve_obj, math.inf, run.best, run.limits.serve, half, run.mip_gap, run.mip_vars(),
        on_solution=each if run.progress is not None else None,
    )  # fmt: skip
    apply(run, mip, plans)


def _cost_phase(run: _Run) -> None:
    """MIP phase 2 (cost) at the best service level found, with the decomposition's bounds as cuts."""
    c, mat = run.c, run.mat
    run.prove_service()
    if not (c.J > 0 and not run.optimal()):
        return
    if run.limits.cost == 0 or run.out_of_time():
        run.used["cost"] = 0
        return
    unmet_best = run.service[0]
    hi = _service_hi(c, unmet_best)
    cuts = run.split.cuts if unmet_best <= run.svc_tol else None

    def apply(r: _Run, mip: _Mip, plans: list[IntArray]) -> None:
        r.iters, r.nodes = r.iters + mip.iterations, r.nodes + mip.nodes
        r.used["cost"] = None if mip.finished else len(mip.taken())
        for x in plans:
            if _unmet_total(c, x) <= unmet_best + r.svc_tol:
                r.offer(x)
        if r.columns == "all":
            r.cost_bound = max(r.cost_bound, mip.dual_bound)
            r.cost_optimal = mip.status == highspy.HighsModelStatus.kOptimal

    def each(mip: _Mip, plans: list[IntArray]) -> None:
        run.report("cost", functools.partial(apply, mip=mip, plans=plans))

    mip, plans = _mip_phase(
        c, mat, mat.cost_obj, hi, run.best, run.limits.cost, run.deadline, run.mip_gap, run.mip_vars(), cuts,
        on_solution=each if run.progress is not None else None,
    )  # fmt: skip
    apply(run, mip, plans)


_PHASES: list[tuple[str, Callable[[_Run], None]]] = [
    ("lp", _lp_phase),
    ("heuristic", _heuristic_phase),
    ("cost_dive", functools.partial(_dive_phase, cost=True)),
    ("master", _master_phase),
    ("search", _search_phase),
    ("split", _decompose_phase),
    ("restrict", _restrict_phase),
    ("dive", functools.partial(_dive_phase, cost=False)),
    ("serve", _serve_phase),
    ("cost", _cost_phase),
]
"""The phases in order (the module docstring's solution path)."""

_SEARCH_FIRST_ORDER = (
    "lp", "heuristic", "cost_dive", "search", "split", "master", "restrict", "dive", "serve", "cost"
)  # fmt: skip
"""The order from ``SEARCH_FIRST_COLUMNS`` columns up (the module docstring's solution path says why)."""

SEARCH_FIRST_COLUMNS = 20_000
"""Columns (template, region) from which the search and the decomposition run before the master rounds."""


def _order(search_first: bool) -> list[tuple[str, Callable[[_Run], None]]]:
    """The phases of ``_PHASES`` in the order of a solve (``_SEARCH_FIRST_ORDER`` when ``search_first``)."""
    if not search_first:
        return list(_PHASES)
    by_name = dict(_PHASES)
    return [(name, by_name[name]) for name in _SEARCH_FIRST_ORDER]


_REPORTED = ("heuristic", "master", "search", "dive", "split", "serve", "cost")
"""Phases after which ``progress`` hears of the best plan (the MIP phases also at each solution; the
portfolio and the cost dive report themselves)."""
