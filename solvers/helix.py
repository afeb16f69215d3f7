"""The Helix baseline: one max-flow placement of one model over every node of a fixed cluster.

Helix (ASPLOS'25) places a single model on a given heterogeneous cluster with a max-flow MILP. Here that
is the placement MILP of ``solvers.placement`` (its docstring states the formulation) applied to the whole
cluster as one multiset: every node must be used, no templates, throughput maximised. Coral, given the
same nodes, may use a subset and several templates (see ``bench/helix.py``).

``helix_place`` is that MILP as it stands (each stage may step its own micro-batch). ``helix_template``
applies the rule Coral's templates obey (``solvers.library``: one micro-batch for every stage of an
instance, as vLLM runs one ``max_num_seqs`` per engine): it solves the same MILP once per batch size and
keeps the best, so that Helix and Coral are judged by one performance model. The ``helix`` planning
policy (``solvers.planning``) uses it.

HiGHS overruns its own time limit (a 10-node cluster given 10 s took 62 s here), so ``helix_template``
can run in a forked child that is killed at a hard limit (``run_bounded``); a placement found before
the kill is lost, and the result says ``unknown``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import select
import signal
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from coral.perf import PerfModel
from coral.templates import Template
from coral.workload import Slo, WorkloadShape
from solvers.combos import layer_work_bound
from solvers.library import place_one_batch, template_from_result
from solvers.options import build_problem
from solvers.placement import milp_place
from solvers.problem import PlacementResult


def helix_place(
    perf: PerfModel, model: str, cluster: Sequence[str], slo: Slo, shape: WorkloadShape, *, time_limit: float = 60.0
) -> PlacementResult:
    """Throughput-optimal aggregated placement of ``model`` using every node of ``cluster``."""
    return milp_place(build_problem(perf, model, cluster, "aggregated", slo, shape), time_limit=time_limit)


def helix_id(perf: PerfModel, model: str, cluster: Sequence[str], slo: Slo, shape: WorkloadShape) -> str:
    """A stable id for the Helix placement of ``model`` on ``cluster`` (content hash, ``helix-`` prefix)."""
    text = repr((model, sorted(cluster), slo, shape, perf.version))
    return "helix-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def helix_template(
    perf: PerfModel,
    model: str,
    cluster: Sequence[str],
    slo: Slo,
    shape: WorkloadShape,
    *,
    time_limit: float,
    hard_limit: float | None = None,
) -> tuple[Template | None, PlacementResult]:
    """The Helix placement of ``model`` over every node of ``cluster``, one micro-batch for all its stages.

    Returns the placement as a Template (None when no placement was found: infeasible, or the time limit
    came first) and the MILP's result (status, bound, gap). ``time_limit`` is shared by the batch sizes
    and passed to HiGHS, which may overrun it; with ``hard_limit`` the solve runs in a child process
    killed after that many seconds (then ``unknown``, value 0, bound the layer-work bound).
    """
    problem = build_problem(perf, model, cluster, "aggregated", slo, shape)

    def solve() -> tuple[Template | None, PlacementResult]:
        sub, res = place_one_batch(problem, time_limit=time_limit, placer=milp_place)
        if res.status in ("infeasible", "unknown") or res.value <= 0:
            return None, res
        key = helix_id(perf, model, cluster, slo, shape)
        tpl = template_from_result(perf, sub, res, key=key, model=model, mode="aggregated", slo=slo, shape=shape)
        return tpl, res

    if hard_limit is None:
        return solve()
    t0 = time.perf_counter()
    out = run_bounded(solve, hard_limit)
    if out is None:
        return None, PlacementResult(
            0.0, "unknown", layer_work_bound(problem), "milp", solve_s=time.perf_counter() - t0
        )
    return out


T = TypeVar("T")


def run_bounded(fn: Callable[[], T], hard_s: float) -> T | None:
    """``fn()`` computed in a forked child process, or None when it takes more than ``hard_s`` seconds (the
    child is killed). The value must pickle; an exception in the child is raised here as a RuntimeError."""
    if not hard_s > 0:
        raise ValueError(f"hard_s must be > 0, got {hard_s}")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_fd)
        code = 0
        try:
            payload = pickle.dumps((True, fn()))
        except BaseException as exc:
            payload = pickle.dumps((False, repr(exc)))
            code = 1
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(write_fd, view) :]
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline = time.perf_counter() + hard_s
    buf = bytearray()
    done = False
    try:
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                break
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                done = True
                break
            buf += chunk
    finally:
        os.close(read_fd)
        if not done:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if not done:
        return None
    ok, value = pickle.loads(bytes(buf))  # our own child's bytes
    if not ok:
        raise RuntimeError(f"the Helix placement failed in its child process: {value}")
    return value
