"""Template library build: enumerate multisets, prune losslessly bottom-up, solve the rest in a pool.

Each (model, mode, SLO, shape) job is processed level by level (multiset size 1..N_max). A level's
multisets only look up results of smaller sizes, so they are solved in parallel by a `Solver`: worker
processes on this machine (`PoolSolver`, one HiGHS solve per process at a time) or the tasks of a Ray
cluster (``coral.cli.build_ray``).

Decode jobs are also solved per KV sender class (``solvers.options``): for each NIC speed c of the
node types below the fastest, a job at ``kv_sender = c``, in its own round of each level after the
faster classes. A multiset whose nodes are all at most c has the uncapped problem there (its value is
copied, nothing is stored). Otherwise a proven template of the multiset at a faster class whose
``kv_min_nic`` is at most c is optimal at c too (the class-c problem is a restriction of the faster one
that still holds that placement), so the class is settled without a solve (stored as ``dominated``
with that capacity); a proven infeasible faster class makes c infeasible; else the multiset is solved at
c, pruned against the class-c values of its smaller multisets like any job.

Every result is written to the store as it arrives, keyed by the content hash of its inputs (a sender
class is one of them), so an interrupted build resumes where it stopped and a rebuild with unchanged
inputs solves nothing.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Protocol

import attrs

from coral.catalog import load_catalog
from coral.perf import PerfModel, load_profiles
from coral.store import Outcome, TemplateStore, template_key
from coral.templates import Template
from coral.workload import Slo, WorkloadShape
from solvers.combos import best_split, best_sub, check_params, enumerate_multisets, prune_verdict
from solvers.fastplace import PLACER
from solvers.library import ProblemCache, solve_multiset
from solvers.options import formulation
from solvers.problem import NodeMenu
from solvers.small import SMALL_NODES

Multiset = tuple[str, ...]
Pending = tuple["BuildJob", Multiset, str, float, float, bool]
"""One multiset to solve: its job, nodes, store key, best split, best sub-multiset, spanning search."""
UNPROVEN = "(unproven)"
"""Marks the detail of an outcome whose capacity is not proven optimal (a template with a gap, or
"infeasible" because nothing was found in time)."""


@attrs.frozen
class BuildJob:
    """One library to build: a model under one SLO and shape, in one mode."""

    model: str
    mode: str
    slo: Slo
    shape: WorkloadShape
    kv_sender: float = 0.0
    """Decode only: the KV sender class (bytes/s) the job's problems are solved behind; 0 for no cap.
    The build derives these jobs from each decode job itself."""


@attrs.frozen
class Solved:
    """What a worker returns for one multiset."""

    key: str
    nodes: Multiset
    capacity: float
    bound: float
    template: Template | None
    path: str
    status: str
    gap: float
    seconds: float


@attrs.define
class BuildReport:
    """Counts and timings of a build, for the CLI and the benchmark."""

    enumerated: int = 0
    reused: int = 0
    solved: int = 0
    kept: int = 0
    infeasible: int = 0
    dominated: int = 0
    split: int = 0
    bound_skipped: int = 0
    by_path: dict[str, int] = attrs.field(factory=dict)
    paths_by_size: dict[int, dict[str, int]] = attrs.field(factory=dict)
    proven: int = 0
    gaps: list[float] = attrs.field(factory=list)
    seconds_by_size: dict[int, list[float]] = attrs.field(factory=dict)
    wall_s: float = 0.0
    workers: int = 1
    unfinished: int = 0
    """Multisets left unsolved when ``deadline_s`` cut the build (with the sender-class problems cut)."""
    top_level: int = 0
    """With ``sample_top``: how many multisets the N_max level has in all (every job together)."""
    top_reused: int = 0
    """With ``sample_top``: how many of the sampled ones were in the store already (not solved)."""
    level_wall_s: dict[int, float] = attrs.field(factory=dict)
    """Per size: wall seconds from the first submission of the level to its last result."""
    level_busy_s: dict[int, float] = attrs.field(factory=dict)
    """Per size: the workers' seconds on the level's multisets (every one solved or bound-settled)."""
    level_tasks: dict[int, int] = attrs.field(factory=dict)
    """Per size: how many multisets were handed to the solver."""
    wait_s: float = 0.0
    """Wall seconds the build spent waiting for the solver's results (the rest of ``wall_s`` is the
    driver's own work: enumeration, keys, store reads and writes)."""
    class_problems: int = 0
    """Decode (multiset, sender class) pairs whose problem differs from the uncapped one (a node faster
    than the class): each is reused, settled by a faster class, or solved (and then counted above)."""
    class_held: int = 0
    """Of those, settled without a solve by a faster class's template that holds behind the class."""


_PERF: PerfModel | None = None
_TIME_LIMIT = 10.0
_PROBLEMS: dict[BuildJob, ProblemCache] = {}
"""Per process: each job's problem parts (node menus by type and size, links by type pair)."""
_PARTS: dict[BuildJob, dict[tuple[str, int], NodeMenu]] = {}
"""Per process and job without its sender class: the node menus by type and micro-batch count, which
the sender classes of a decode job share."""


def _init_worker(catalog_files: Sequence[Path], profile_files: Sequence[Path], time_limit: float) -> None:
    cat = load_catalog(list(catalog_files))
    use_perf(PerfModel(cat, [t for p in profile_files for t in load_profiles(p)]), time_limit)


def use_perf(perf: PerfModel, time_limit: float) -> None:
    """Make this process solve with ``perf`` and ``time_limit`` (and forget the problems of before)."""
    global _PERF, _TIME_LIMIT
    _PERF, _TIME_LIMIT = perf, time_limit
    _PROBLEMS.clear()
    _PARTS.clear()


def solve_pending(item: Pending) -> Solved:
    """Solve one pending multiset in this process (after `use_perf`)."""
    job, s, key, split, sub, span = item
    return _solve_one(job, s, key, max(split, sub), span)


def _solve_one(job: BuildJob, nodes: Multiset, key: str, threshold: float, spanning: bool = False) -> Solved:
    assert _PERF is not None
    t0 = time.perf_counter()
    cache = _PROBLEMS.get(job)
    if cache is None:
        parts = _PARTS.setdefault(attrs.evolve(job, kv_sender=0.0), {})
        cache = _PROBLEMS[job] = ProblemCache(
            _PERF, job.model, job.mode, job.slo, job.shape, job.kv_sender or None, parts=parts
        )
    bounds = cache.batch_bounds(nodes)  # the layer-work bound per batch size (one batch per template)
    ub = max(bounds.values(), default=0.0)
    if ub <= 0:
        return Solved(key, nodes, 0.0, 0.0, None, "bound-infeasible", "infeasible", 0.0, time.perf_counter() - t0)
    if threshold > 0 and ub <= threshold:
        return Solved(key, nodes, 0.0, ub, None, "bound-pruned", "pruned", 0.0, time.perf_counter() - t0)
    tpl, res, _ = solve_multiset(
        _PERF, job.model, nodes, job.mode, job.slo, job.shape, key=key, time_limit=_TIME_LIMIT,
        floor=threshold if threshold > 0 else None, problem=cache.problem(nodes), bounds=bounds,
        spanning=spanning and threshold > 0, lp_floor=job.mode == "prefill", sender_nic=job.kv_sender or None,
    )  # fmt: skip
    if res.status == "below":  # proven worth at most what the smaller templates give
        path = {"below-bound": "bound-pruned", "below-lp": "lp-pruned"}.get(res.method, "search-pruned")
        return Solved(key, nodes, 0.0, res.bound, None, path, "pruned", 0.0, time.perf_counter() - t0)
    cap = res.value if res.status != "infeasible" else 0.0
    bound = cap if res.status == "optimal" else max(cap, res.bound)
    return Solved(key, nodes, cap, bound, tpl, res.method, res.status, res.gap, time.perf_counter() - t0)


def build_library(
    perf: PerfModel,
    store: TemplateStore,
    jobs: Sequence[BuildJob],
    node_types: Sequence[str],
    *,
    nmax: int = 6,
    rho: float = 12.0,
    workers: int = 1,
    time_limit: float = 10.0,
    catalog_files: Sequence[Path] = (),
    profile_files: Sequence[Path] = (),
    progress: Callable[[int, int], None] | None = None,
    deadline_s: float | None = None,
    sample_top: int = 0,
    solver: Solver | None = None,
) -> BuildReport:
    """Build (or resume) the template library of every job into ``store``.

    With ``deadline_s`` the build stops taking new multisets after that many wall seconds; what was
    solved is stored (a later build resumes there) and ``report.unfinished`` counts the rest.

    ``sample_top`` (> 0): of the N_max level, solve only a seeded random sample of that many multisets
    per job (every smaller level in full, so their floors are the real ones), to estimate what the whole
    level costs (``bench/templates.py --sample-top``); ``report.top_level`` counts the whole level.

    ``nmax`` and ``rho`` choose which multisets are solved, not what a multiset's outcome is: that
    depends only on the multiset and its sub-multisets, and every sub-multiset of an enumerated one is
    enumerated too (or holds too little memory for the model, the same at any rho). So they are not in
    the keys: a store built at N_max 5 grows to 6 by solving the six-node level alone, and builds at
    different N_max never store one multiset twice.

    ``solver``: where the multisets are solved (default: a `PoolSolver` of ``workers`` processes, closed
    at the end; a solver passed in is left open for its owner to close). Every solver gives the same
    outcomes, so a build may be resumed on another.
    """
    check_params(nmax, rho)
    for job in jobs:
        if job.model not in perf.catalog.models:
            raise ValueError(f"unknown model {job.model!r}; known: {', '.join(sorted(perf.catalog.models))}")
        if job.kv_sender != 0.0:
            raise ValueError(f"job {job.model}/{job.mode}: kv_sender is derived by the build; pass 0")
    for n in node_types:
        if n not in perf.catalog.nodes:
            raise ValueError(f"unknown node type {n!r}; known: {', '.join(sorted(perf.catalog.nodes))}")
    if isinstance(sample_top, bool) or not isinstance(sample_top, int) or sample_top < 0:
        raise ValueError(f"sample_top must be an integer >= 0, got {sample_top!r}")
    own = solver is None
    if solver is None:
        solver = PoolSolver(workers, time_limit, catalog_files, profile_files)
    report = BuildReport(workers=solver.workers)
    t_start = time.perf_counter()
    nic = {n: perf.catalog.nodes[n].nic_bytes_per_s for n in node_types}
    speeds = sorted(set(nic.values()), reverse=True)[1:]
    classes = {j: [attrs.evolve(j, kv_sender=c) for c in speeds] for j in jobs if j.mode == "decode"}
    base_of = {cj: j for j, cjs in classes.items() for cj in cjs}
    levels = {j: enumerate_multisets(perf, j.model, node_types, j.shape, nmax=nmax, rho=rho) for j in jobs}
    if sample_top:
        for lv in levels.values():
            report.top_level += len(lv[nmax])
            lv[nmax] = sorted(random.Random(0).sample(lv[nmax], min(sample_top, len(lv[nmax]))))
    total = sum(len(v) for lv in levels.values() for v in lv.values())
    report.enumerated = total
    done = 0
    use_perf(perf, time_limit)
    writer = _Writer(store)
    every = [*jobs, *base_of]
    partition: dict[BuildJob, dict[Multiset, float]] = {j: {} for j in every}
    unsure: dict[BuildJob, list[Counter[str]]] = {j: [] for j in every}
    held: dict[BuildJob, dict[Multiset, list[tuple[Callable[[], float], float]]]] = {j: {} for j in classes}
    """Per decode job and multiset: (its kv_min_nic, when asked; capacity) of its proven templates at the
    classes so far."""
    dead: dict[BuildJob, set[Multiset]] = {j: set() for j in classes}
    """Per decode job: the multisets proven infeasible at some class so far (so at every slower one)."""

    def note(job: BuildJob, s: Multiset, out: Outcome, need: Callable[[], float]) -> None:
        base = base_of.get(job, job)
        if base not in held or UNPROVEN in out.detail:
            return
        if out.outcome == "template":
            held[base].setdefault(s, []).append((need, out.capacity))
        elif out.outcome == "infeasible":
            dead[base].add(s)

    def stored_need(tid: str | None) -> Callable[[], float]:
        return lambda: store.get(tid or "").kv_min_nic

    try:
        for size in range(1, nmax + 1):
            rounds = [jobs, *([cj[k] for cj in classes.values()] for k in range(len(speeds)))]
            for round_jobs in rounds:
                pending: list[Pending] = []
                for job in round_jobs:
                    base = base_of.get(job, job)
                    level = levels[base][size]
                    P = partition[job]
                    if job is not base:  # a sender class: only multisets with a node faster than it differ
                        same = [s for s in level if max(nic[t] for t in s) <= job.kv_sender]
                        for s in same:
                            P[s] = partition[base][s]
                            if any(Counter(s) == u for u in unsure[base]):
                                unsure[job].append(Counter(s))
                        level = [s for s in level if max(nic[t] for t in s) > job.kv_sender]
                        report.class_problems += len(level)
                    jp = _job_params(job, time_limit)
                    keys = [
                        template_key(
                            perf.catalog, job.model, s, job.mode, job.slo, job.shape, perf.version, _params(jp, s)
                        )
                        for s in level
                    ]
                    known = store.outcomes(keys)
                    for s, key in zip(level, keys, strict=True):
                        split = best_split(s, P)
                        sub = best_sub(s, P)
                        if key in known:
                            got = known[key]
                            P[s] = max(got.capacity, split)
                            if UNPROVEN in got.detail:
                                unsure[job].append(Counter(s))
                            note(job, s, got, stored_need(got.template_id))
                            if job is base:
                                report.reused += 1
                                if sample_top and size == nmax:
                                    report.top_reused += 1
                                done += 1
                            continue
                        if job is not base:
                            out = _settled_by_faster(job, s, key, held[base].get(s, ()), s in dead[base])
                            if out is not None:
                                report.class_held += out.outcome == "dominated"
                                P[s] = max(out.capacity, split)
                                writer.add(out, None)
                                continue
                        pending.append((job, s, key, split, sub, _spanning(s, unsure[job])))
                if progress:
                    progress(done, total)
                stop_at = None if deadline_s is None else t_start + deadline_s
                handled = 0
                busy = 0.0
                t_level = time.perf_counter()
                with closing(solver.solve(pending, stop_at)) as results:
                    while True:
                        t_wait = time.perf_counter()
                        item = next(results, None)
                        report.wait_s += time.perf_counter() - t_wait
                        if item is None:
                            break
                        (job, s, key, split, sub, _), res = item
                        handled += 1
                        busy += res.seconds
                        out = _record(report, job, s, key, split, sub, res, size)
                        if UNPROVEN in out.detail:
                            unsure[job].append(Counter(s))
                        partition[job][s] = max(out.capacity, split)
                        tpl = res.template if out.outcome == "template" else None
                        note(job, s, out, functools.partial(_need, tpl))
                        writer.add(out, tpl)
                        if job in levels:
                            done += 1
                        if progress:
                            progress(done, total)
                writer.flush()
                if pending:
                    report.level_wall_s[size] = report.level_wall_s.get(size, 0.0) + time.perf_counter() - t_level
                    report.level_busy_s[size] = report.level_busy_s.get(size, 0.0) + busy
                    report.level_tasks[size] = report.level_tasks.get(size, 0) + len(pending)
                if handled < len(pending):  # cut by the deadline (a sender class's multisets count too)
                    report.unfinished = total - done + (0 if round_jobs is jobs else len(pending) - handled)
                    break
            if report.unfinished:
                break
    finally:
        writer.flush()
        if own:
            solver.close()
    report.wall_s = time.perf_counter() - t_start
    return report


def _job_params(job: BuildJob, time_limit: float) -> dict[str, object]:
    """The solver parameters in the template keys of ``job``'s multisets (its sender class included)."""
    params: dict[str, object] = {"time_limit": time_limit, "formulation": formulation(job.mode)}
    if job.kv_sender:
        params["kv_sender"] = job.kv_sender
    return params


def _need(tpl: Template | None) -> float:
    return tpl.kv_min_nic if tpl is not None else 0.0


def _settled_by_faster(
    job: BuildJob, s: Multiset, key: str, faster: Sequence[tuple[Callable[[], float], float]], infeasible: bool
) -> Outcome | None:
    """The outcome of ``s`` at ``job``'s sender class when a faster class settles it without a solve:
    a proven template there whose ``kv_min_nic`` is at most the class holds the optimum here too (the
    class's problem is a restriction that keeps its placement), and a proven infeasible one makes this
    one infeasible. None: it must be solved."""
    c = job.kv_sender
    ok = [cap for need, cap in faster if need() <= c * (1.0 + 1e-12)]
    slo_key = job.slo.key
    if ok:
        why = f"sender class: a faster class's template holds behind {c * 8 / 1e9:g} Gbps"
        return Outcome(key, job.model, job.mode, slo_key, s, "dominated", None, max(ok), why)
    if infeasible:
        return Outcome(
            key, job.model, job.mode, slo_key, s, "infeasible", None, 0.0, "infeasible behind a faster sender"
        )
    return None


def _spanning(s: Multiset, unsure: Sequence[Counter[str]]) -> bool:
    """Whether the placer may search only connected placements of all of ``s``'s nodes (``place``'s
    ``spanning``). The build's floor is max(best split, best sub-multiset) of the partition values P,
    and a placement of several components is worth at most the best split if every P below ``s`` is
    exact (by induction on size: a component's value is at most its multiset's P, or else at most a
    smaller multiset's). An unproven template or an unproven "infeasible" below ``s`` breaks that."""
    have = Counter(s)
    return not any(all(have[t] >= q for t, q in u.items()) for u in unsure)


class Solver(Protocol):
    """Where a level's pending multisets are solved."""

    @property
    def workers(self) -> int:
        """How many multisets it solves at once."""
        ...

    def solve(self, pending: Sequence[Pending], stop_at: float | None) -> Generator[tuple[Pending, Solved], None, None]:
        """Each pending multiset with its result, in any order, until ``stop_at`` (``time.perf_counter``);
        closing the generator early cancels the rest."""
        ...

    def close(self) -> None:
        """Stop the workers and cancel what is still queued."""
        ...


class PoolSolver:
    """Worker processes on this machine (in this process with one worker or one multiset)."""

    def __init__(
        self, workers: int, time_limit: float, catalog_files: Sequence[Path] = (), profile_files: Sequence[Path] = ()
    ) -> None:
        self._workers = workers
        self._initargs = (list(catalog_files), list(profile_files), time_limit)
        self._pool: ProcessPoolExecutor | None = None

    @property
    def workers(self) -> int:
        return self._workers

    def solve(self, pending: Sequence[Pending], stop_at: float | None) -> Generator[tuple[Pending, Solved], None, None]:
        """Results in submission order."""
        if self._pool is None and self._workers > 1 and len(pending) > 1:
            self._pool = ProcessPoolExecutor(
                self._workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=self._initargs,
            )
        if self._pool is None:
            for item in pending:
                if stop_at is not None and time.perf_counter() > stop_at:
                    return
                yield item, solve_pending(item)
            return
        futures: list[Future[Solved]] = [self._pool.submit(solve_pending, item) for item in pending]
        try:
            for item, f in zip(pending, futures, strict=True):
                if stop_at is not None and time.perf_counter() > stop_at:
                    return
                yield item, f.result()
        finally:
            for g in futures:
                g.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class _Writer:
    """Writes outcomes (and their templates) to the store in batches of ``every``; ``flush`` writes the rest."""

    def __init__(self, store: TemplateStore, every: int = 200) -> None:
        self.store = store
        self.every = every
        self.outcomes: list[Outcome] = []
        self.templates: list[Template] = []

    def add(self, outcome: Outcome, template: Template | None) -> None:
        self.outcomes.append(outcome)
        if template is not None:
            self.templates.append(template)
        if len(self.outcomes) >= self.every:
            self.flush()

    def flush(self) -> None:
        if self.outcomes:
            self.store.put(self.outcomes, self.templates)
            self.outcomes, self.templates = [], []


def _params(params: dict[str, object], s: Multiset) -> dict[str, object]:
    """The solver parameters in a multiset's template key: from 4 nodes up, also the placer's version
    (templates of 1-3 nodes keep their keys when only the 4+ node method changes)."""
    return params if len(s) <= SMALL_NODES else {**params, "placer": PLACER}


def _count_path(report: BuildReport, size: int, path: str) -> None:
    report.by_path[path] = report.by_path.get(path, 0) + 1
    per = report.paths_by_size.setdefault(size, {})
    per[path] = per.get(path, 0) + 1


def _record(
    report: BuildReport, job: BuildJob, s: Multiset, key: str, split: float, sub: float, res: Solved, size: int
) -> Outcome:
    slo_key = job.slo.key
    if res.status == "pruned":
        if res.path == "bound-pruned":
            report.bound_skipped += 1
        else:
            report.seconds_by_size.setdefault(size, []).append(res.seconds)
            report.solved += 1
            _count_path(report, size, res.path)
        kind = "dominated" if sub >= split else "split"
        setattr(report, kind, getattr(report, kind) + 1)
        why = "upper bound" if res.path == "bound-pruned" else "placer's proof"
        return Outcome(key, job.model, job.mode, slo_key, s, kind, None, 0.0, f"{why}: smaller templates reach it")
    report.seconds_by_size.setdefault(size, []).append(res.seconds)
    if res.status == "infeasible" or res.capacity <= 0:
        report.infeasible += 1
        if res.path != "bound-infeasible":
            report.solved += 1
            _count_path(report, size, res.path)
        detail = res.path if res.status == "infeasible" else f"{res.path} {UNPROVEN}"
        return Outcome(key, job.model, job.mode, slo_key, s, "infeasible", None, 0.0, detail)
    report.solved += 1
    _count_path(report, size, res.path)
    verdict = prune_verdict(res.bound, sub, split)
    if verdict is not None:
        setattr(report, verdict, getattr(report, verdict) + 1)
        return Outcome(key, job.model, job.mode, slo_key, s, verdict, None, res.capacity, res.path)
    report.kept += 1
    if res.status == "optimal":
        report.proven += 1
    else:
        report.gaps.append(res.gap)
    detail = res.path if res.status == "optimal" else f"{res.path} {UNPROVEN}"
    return Outcome(key, job.model, job.mode, slo_key, s, "template", key, res.capacity, detail)


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))
