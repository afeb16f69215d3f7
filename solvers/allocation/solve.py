"""The solve driver.

Solution path
-------------
1. Build the columns and rows from numpy arrays (one addRows and one addCols call).
2. LP relaxation: minimise cost with u fixed to 0; if infeasible, minimise sum u, then cost at that
   service level. With ``columns="generated"``: the same by column generation.
3. Heuristic (numpy, deterministic): round the LP down, then round up its fractional columns, most
   fractional first, while they serve unmet demand; fill what is left (aggregated instances that the
   demand fully uses, best req/s per USD/h first; the cheapest multiset of up to three aggregated
   instances for each model's rest; then best unmet-req/s per USD/h among all instances and
   prefill+decode pairs); drop instances not needed; local search per model (rebuild it from scratch,
   aggregated-first and disaggregated-first; drop up to three of its least efficient instances for the
   cheapest multiset of up to three that serves as much). The same from the current deployment cut to
   the availability; the better plan wins. The empty plan is always feasible, so there is always a plan.
   When the LP cannot serve every demand, rounding loses most, so an LP dive follows (``_dive_job``:
   round up what fits, else bound the least fractional variable down, re-solve, until integral).
4. Decomposition by model, when the LP serves every demand. Models share only the availability
   rows (the service row is then fixed at full service), so each group of models solves its own cost
   MIP over all its columns with the whole availability (every model alone at first, each in a
   child process, two or more at once). The sum of the group optima bounds the program from below,
   and when the union of their plans fits the availability it is optimal. Groups whose plans overrun
   a (region, node type) together are merged and solved again, from the repaired union; at worst
   one group holds every model. In a group's MIP, a variable whose one unit costs more than the
   group's part of the best plan so far is left out (costs are nonnegative, so it cannot be in a
   better plan).
5. MIP phase 1 (only when the plan still leaves more unmet demand than the LP bound), then phase 2
   (only when the decomposition did not prove the plan optimal; its groups' bounds are added as cuts
   sum_{v of group} cost_v v >= bound), each warm-started with the best plan so far, on
   single-threaded HiGHS.

Deadline, enforced from outside HiGHS: it overran its own ``time_limit`` by 2-3x here, and at the root
of an extended-size model its interrupt checks were up to 16 s apart, so neither its time limit nor
an interrupt callback stops it in time. The LP runs in a thread (its simplex checks are frequent;
at the deadline the thread is abandoned and interrupted at its next check). Each MIP runs in a forked
child process that streams its improving solutions through a pipe; at the deadline the parent keeps
the solutions fully received and kills the child. Replay: single-threaded HiGHS finds the same
improving solutions in the same order every run, so the number taken per phase (``SolverEffort``,
per group for the decomposition) fixes the plan without the clock.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import attrs
import highspy
import numpy as np
from numpy.typing import NDArray

from solvers.allocation.columns import _Columns, _columns
from solvers.allocation.decomposition import SPLIT_MIN_COLUMNS, SPLIT_SHARE, _mip_phase, _Split, _split_phase
from solvers.allocation.heuristics import (
    _better,
    _counts,
    _fit,
    _fit_current,
    _objective,
    _repair,
    _State,
    _unmet_total,
)
from solvers.allocation.model import _highs, _matrix, _service_hi
from solvers.allocation.problem import (
    RESTRICTIONS,
    AllocationInputError,
    AllocationProblem,
    AllocationResult,
    SolverEffort,
)
from solvers.allocation.process import _Deadline, _LpThread
from solvers.allocation.relaxation import _AUTO_GENERATED, _cg_job, _dive_job, _DiveOutcome, _lp_job, _LpOutcome

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


DIVE_SHARE = 0.3
"""Share of the deadline after the LP that the diving heuristic may use."""


_SKIP_ALL = SolverEffort(lp=0, serve=0, cost=0, dive=0, decompose=0)
"""The effort of a solve cut before it began: the greedy plan alone."""

RESTRICT_SHARE = 0.2
"""Share of the time left that each restriction of the portfolio may use."""


def _restrictions(p: AllocationProblem) -> list[tuple[str, IntArray]]:
    """(name, template indices) of each restriction of ``RESTRICTIONS`` that selects some but not all of
    p's templates, and not the same ones as an earlier restriction."""
    homo = np.array([int((t.node_counts > 0).sum()) == 1 for t in p.templates], dtype=bool)
    agg = np.array([t.mode == "aggregated" for t in p.templates], dtype=bool)
    masks = {"homo": homo & agg, "pd-homo": homo & ~agg, "homo-pd": homo}
    out: list[tuple[str, IntArray]] = []
    seen: set[bytes] = set()
    for name in RESTRICTIONS:
        mask = masks[name]
        if mask.any() and not mask.all() and mask.tobytes() not in seen:
            seen.add(mask.tobytes())
            out.append((name, np.nonzero(mask)[0]))
    return out


def _restrict(p: AllocationProblem, idx: IntArray) -> AllocationProblem:
    """The same problem over the templates ``idx`` (and their running instances)."""
    keep = {p.templates[i].key for i in idx}
    return attrs.evolve(
        p, templates=[p.templates[i] for i in idx], current={k: v for k, v in p.current.items() if k[0] in keep}
    )


def _column_of(c: _Columns) -> dict[tuple[int, int], int]:
    """Column of each (original template index, region) that has one."""
    out: dict[tuple[int, int], int] = {}
    for j in range(c.J):
        for i in c.members[int(c.tu[j])]:
            out[(i, int(c.r[j]))] = j
    return out


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
) -> AllocationResult:
    """Plan instances per template and region: serve the most demand, then at the least cost plus churn.

    Returns within about ``deadline_s`` (wall clock; HiGHS runs in a worker thread that is abandoned
    and interrupted at the deadline), always with a feasible plan. With ``effort`` the wall clock is
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

    ``portfolio``: first solve each restriction of ``RESTRICTIONS`` that selects some but not all of the
    templates (a baseline's problem) alone, in ``RESTRICT_SHARE`` of the time left each; its plan is a
    plan of this problem, so the result is never worse than a restriction solved to its optimum.

    ``clock`` (seconds) measures the deadline; a test passes a fake one to cut the solve at any phase.
    Every phase that the deadline cuts or skips is recorded in the result's ``effort``.
    """
    if columns not in ("auto", "all", "generated"):
        raise AllocationInputError(f"columns: must be 'auto', 'all' or 'generated', got {columns!r}")
    if not (deadline_s > 0 and math.isfinite(deadline_s)):
        raise AllocationInputError(f"deadline_s: must be finite and > 0, got {deadline_s}")
    if not (0 <= mip_gap < 1):
        raise AllocationInputError(f"mip_gap: must be in [0, 1), got {mip_gap}")
    t0 = time.perf_counter()
    deadline = None if effort is not None else _Deadline(clock() + deadline_s, clock)
    limits = effort if effort is not None else SolverEffort()
    phase_s: dict[str, float] = {}
    c = _columns(problem)
    mat = _matrix(c)
    if columns == "auto":
        columns = "generated" if c.J >= _AUTO_GENERATED else "all"
    t1 = time.perf_counter()
    phase_s["build"] = t1 - t0
    svc_tol = 1e-7 * max(1.0, float(c.demand.sum()))
    iters = nodes = 0
    used: dict[str, int | None] = {"lp": None, "serve": None, "cost": None, "dive": None, "split": None}

    def out_of_time() -> bool:
        return deadline is not None and deadline.passed()

    def mip_vars(plan: IntArray) -> IntArray | None:
        """All variables, or with generated columns those plus the plan's and the current ones."""
        if columns == "all" or lp.columns is None:
            return None
        x_cols = np.union1d(lp.columns, np.nonzero((plan > 0) | (c.cur > 0))[0])
        return np.concatenate([x_cols, np.arange(c.J, mat.num_cols)])

    # LP relaxation
    lp = _LpOutcome()
    if c.J > 0:
        if limits.lp == 0 or out_of_time():
            used["lp"] = 0
        else:
            thread = _LpThread()
            if columns == "all":
                h = _highs(mat, mat.cost_obj, _service_hi(c, 0.0), mip_gap, mip=False)
                thread.attach(h)
                job = functools.partial(_lp_job, h, c, mat, lp)
            else:
                job = functools.partial(_cg_job, c, mat, mip_gap, lp, thread)
            if thread.run(job, deadline):
                iters += lp.iterations
            else:
                lp = _LpOutcome()
                used["lp"] = 0
    t2 = time.perf_counter()
    phase_s["lp"] = t2 - t1

    # rounding and greedy repair: from the LP, and from the current deployment
    best = np.zeros(c.J, dtype=np.int64)
    if c.J > 0:
        if not lp.done or np.any(c.cur > 0):
            best = _repair(c, _fit_current(c))
        if lp.values is not None:
            v = lp.values[: c.J].copy()
            v[mat.keep_cols] += lp.values[c.J : c.J + len(mat.keep_cols)]
            rounded = _repair(c, np.floor(v + 1e-6).astype(np.int64), frac=v)
            if not _better(c, best, rounded):
                best = rounded
    # the portfolio: each baseline's restriction solved alone; its plan is a plan of this problem too
    restricted: list[tuple[str, SolverEffort]] = []
    t_restrict = time.perf_counter()
    if portfolio and c.J > 0:
        where = _column_of(c)
        for name, idx in _restrictions(problem):
            sub = _restrict(problem, idx)
            kw: dict[str, Any] = {"mip_gap": mip_gap, "columns": columns, "portfolio": False}
            if deadline is None:
                res = solve_allocation(sub, effort=dict(limits.restricted).get(name, SolverEffort()), **kw)
            elif out_of_time():
                res = solve_allocation(sub, effort=_SKIP_ALL, **kw)
            else:
                left = max(RESTRICT_SHARE * deadline.left(), 1e-6)
                res = solve_allocation(sub, deadline_s=left, clock=clock, **kw)
            if res.effort != SolverEffort():
                restricted.append((name, res.effort))
            x = np.zeros(c.J, dtype=np.int64)
            for (i, reg), n in res.counts.items():
                x[where[(int(idx[i]), reg)]] += n
            if _better(c, x, best):
                best = x
    phase_s["restrict"] = time.perf_counter() - t_restrict

    # LP diving when not every demand can be served (rounding loses most there)
    if c.J > 0 and lp.done and lp.unmet > svc_tol:
        if limits.dive == 0 or out_of_time():
            used["dive"] = 0
        else:
            dive = _DiveOutcome()
            thread = _LpThread()
            share = None if deadline is None else deadline.share(DIVE_SHARE)
            finished = thread.run(functools.partial(_dive_job, c, mat, mip_gap, limits.dive, dive, thread), share)
            steps, plan, done = dive.snapshot  # one read: an abandoned dive thread may still write
            if not finished or (limits.dive is not None and not done):
                used["dive"] = steps
            if plan is not None:
                dived = _repair(c, _fit(c, plan))
                if _better(c, dived, best):
                    best = dived
    t3 = time.perf_counter()
    phase_s["heuristic"] = t3 - t2

    # per-model MIPs, when the LP serves every demand: their union is optimal when it fits
    split = _Split()
    split_optimal = False
    if decompose is None:
        decompose = c.J >= SPLIT_MIN_COLUMNS
    if decompose and c.J > 0 and lp.done and lp.unmet <= svc_tol and (limits.decompose == 0 or out_of_time()):
        used["split"] = 0
    elif decompose and c.J > 0 and lp.done and lp.unmet <= svc_tol:
        share = None if deadline is None else deadline.share(SPLIT_SHARE)
        split = _split_phase(c, mat, best, dict(limits.split), share, mip_gap)
        iters, nodes = iters + split.iterations, nodes + split.nodes
        if split.plan is not None:
            x = split.plan if split.fits else _repair(c, _fit(c, split.plan))
            if _better(c, x, best) or (split.fits and split.proven):
                best = x
            split_optimal = split.fits and split.proven and _unmet_total(c, best) <= svc_tol
    t_split = time.perf_counter()
    phase_s["split"] = t_split - t3
    t3 = t_split

    # MIP phase 1 (serve), only when the LP bound does not already prove the service level
    unmet_bound = lp.unmet if lp.done else 0.0
    if c.J == 0:
        unmet_bound = float(c.demand.sum())
    if c.J > 0 and _unmet_total(c, best) > unmet_bound + svc_tol:
        if limits.serve == 0 or out_of_time():
            used["serve"] = 0
        else:
            half = None if deadline is None else deadline.share(0.5)
            run, plans = _mip_phase(c, mat, mat.serve_obj, math.inf, best, limits.serve, half, mip_gap, mip_vars(best))
            iters, nodes = iters + run.iterations, nodes + run.nodes
            used["serve"] = None if run.finished else len(run.taken())
            for x in plans:
                if _better(c, x, best):
                    best = x
            if columns == "all":
                unmet_bound = max(unmet_bound, run.dual_bound)
            if columns == "all" and run.status == highspy.HighsModelStatus.kOptimal:
                unmet_bound = max(unmet_bound, _unmet_total(c, best) * (1 - mip_gap))
    unmet_best = _unmet_total(c, best)
    service_proven = unmet_best <= unmet_bound + svc_tol or unmet_best * (1 - mip_gap) <= unmet_bound
    t4 = time.perf_counter()
    phase_s["serve"] = t4 - t3

    # MIP phase 2 (cost) at the best service level found
    cost_bound = -math.inf
    cost_optimal = False
    if c.J > 0 and not split_optimal:
        if limits.cost == 0 or out_of_time():
            used["cost"] = 0
        else:
            hi = _service_hi(c, unmet_best)
            cuts = split.cuts if unmet_best <= svc_tol else None
            run, plans = _mip_phase(
                c, mat, mat.cost_obj, hi, best, limits.cost, deadline, mip_gap, mip_vars(best), cuts
            )  # fmt: skip
            iters, nodes = iters + run.iterations, nodes + run.nodes
            used["cost"] = None if run.finished else len(run.taken())
            for x in plans:
                if _unmet_total(c, x) <= unmet_best + svc_tol and _better(c, x, best):
                    best = x
            if columns == "all":
                cost_bound = run.dual_bound
                cost_optimal = run.status == highspy.HighsModelStatus.kOptimal
    t5 = time.perf_counter()
    phase_s["cost"] = t5 - t4

    cost, churn = _objective(c, best)
    objective = cost + churn
    bounds = [0.0, cost_bound]
    if lp.done and unmet_best <= lp.unmet + svc_tol:
        bounds.append(lp.bound)
    if unmet_best <= svc_tol:
        bounds.append(split.bound)
    bound = min(max(bounds), objective)
    gap = (objective - bound) / objective if objective > 0 else 0.0
    status = _status(c.J == 0 or split_optimal or (service_proven and (cost_optimal or gap <= mip_gap)),
                     service_proven, bound)  # fmt: skip
    if status == "no bound":
        bound, gap = 0.0, 1.0 if objective > 0 else 0.0
    served = np.minimum(_State(c, best).capacity(), c.demand) if c.J else np.zeros(c.M)
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
        unmet_bound=unmet_bound,
        service_proven=service_proven,
        solve_s=time.perf_counter() - t0,
        phase_s=phase_s,
        effort=SolverEffort(
            lp=used["lp"],
            serve=used["serve"],
            cost=used["cost"],
            dive=used["dive"],
            decompose=used["split"],
            split=split.stopped.items(),
            restricted=restricted,
        ),
        simplex_iterations=iters,
        mip_nodes=nodes,
        num_columns=mat.num_cols,
        num_rows=mat.num_rows,
        merged_templates=sum(len(ms) - 1 for ms in c.members),
        column_generation=columns == "generated",
        split_groups=split.groups,
    )
