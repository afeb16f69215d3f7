"""Where HiGHS stops: deadlines on an injectable clock, and LP and MIP runs (in this process, on this thread)
that HiGHS's interrupt callbacks stop at the deadline or at a replayed count of improving solutions.

A MIP run takes its improving solutions in the order single-threaded HiGHS finds them. Stopped early (the
deadline, or its ``limit`` in a replay), it keeps the first k solutions and the dual bound HiGHS reported
with the k-th, never a bound found later: what it returns depends on k alone, not on when the clock ran
out, so the count k (``SolverEffort``) replays it exactly. HiGHS checks its interrupt callback often in
the simplex method and between MIP nodes, but at the root of a large MIP its checks were up to 16 s apart:
a caller that needs a hard deadline runs the solve in a process it can kill (``actors.solver_process``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import highspy
import numpy as np
from highspy import cb
from numpy.typing import NDArray

IntArray = NDArray[np.int64]


_INTERRUPT_CALLBACKS = (
    cb.HighsCallbackType.kCallbackSimplexInterrupt,
    cb.HighsCallbackType.kCallbackIpmInterrupt,
    cb.HighsCallbackType.kCallbackMipInterrupt,
)


@attrs.frozen
class _Deadline:
    """A point in time on ``clock`` (seconds) by which a phase must end."""

    at: float
    clock: Callable[[], float]

    def left(self) -> float:
        return self.at - self.clock()

    def passed(self) -> bool:
        return self.left() <= 0

    def share(self, fraction: float) -> _Deadline:
        """The deadline after ``fraction`` of the time left now."""
        now = self.clock()
        return _Deadline(now + fraction * max(self.at - now, 0.0), self.clock)


def _passed(deadline: _Deadline | None) -> bool:
    return deadline is not None and deadline.passed()


class _LpStop:
    """Interrupts an LP (simplex or IPM) at its next check once the deadline has passed."""

    def __init__(self, deadline: _Deadline | None) -> None:
        self.deadline = deadline
        self.interrupted = False

    def attach(self, h: highspy.Highs) -> None:
        h.setCallback(self._callback, None)
        for kind in _INTERRUPT_CALLBACKS:
            h.startCallback(kind)

    def _callback(self, kind: Any, message: str, data_out: Any, data_in: Any, user_data: Any) -> None:
        if data_in is not None and _passed(self.deadline):
            data_in.user_interrupt = True
            self.interrupted = True


class _Mip:
    """A MIP solved by single-threaded HiGHS here, taking improving solutions up to ``limit`` (a replay's
    count; None: all) and stopped at the deadline.

    ``on_solution(k)`` (optional) is called after the k-th solution is taken, with this run's state as it
    would be if stopped right there (``finished`` False, ``dual_bound`` the k-th's).
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.solutions: list[IntArray] = []
        self.dual_bound = -math.inf
        self.nodes = 0
        self.iterations = 0
        self.status: highspy.HighsModelStatus | None = None
        self.finished = False
        self.started = False

    def done(self) -> bool:
        """Finished, or took as many solutions as its limit allows."""
        return self.finished or (self.limit is not None and len(self.solutions) >= self.limit)

    def run(
        self,
        build: Callable[[], highspy.Highs],
        num_int: int,
        deadline: _Deadline | None,
        on_solution: Callable[[_Mip], None] | None = None,
    ) -> None:
        """Solve the model ``build()`` makes (its first ``num_int`` variables integer) until it ends, the
        limit is reached, or the deadline passes; a run with limit 0, or whose deadline has passed, is not
        started (nor built)."""
        if self.limit == 0 or _passed(deadline):
            return
        self.started = True
        h = build()
        bound = [-math.inf]

        def callback(kind: Any, message: str, data_out: Any, data_in: Any, user_data: Any) -> None:
            if kind == cb.HighsCallbackType.kCallbackMipImprovingSolution:
                if self.done():
                    return
                x = np.round(np.asarray(data_out.mip_solution)[:num_int]).astype(np.int64)
                self.solutions.append(x)
                if math.isfinite(data_out.mip_dual_bound):
                    bound[0] = max(bound[0], float(data_out.mip_dual_bound))
                self.dual_bound = bound[0]
                self.nodes = int(data_out.mip_node_count)
                if on_solution is not None:
                    on_solution(self)
            elif data_in is not None and (self.done() or _passed(deadline)):
                data_in.user_interrupt = True

        h.setCallback(callback, None)
        h.startCallback(cb.HighsCallbackType.kCallbackMipImprovingSolution)
        h.startCallback(cb.HighsCallbackType.kCallbackMipInterrupt)
        h.run()
        info = h.getInfo()
        status = h.getModelStatus()
        self.iterations = int(info.simplex_iteration_count)
        self.nodes = max(self.nodes, int(info.mip_node_count))
        if status == highspy.HighsModelStatus.kInterrupt:
            return  # stopped: the k-th solution's bound stands (a later one would depend on the clock)
        self.status = status
        self.finished = True
        if math.isfinite(info.mip_dual_bound):
            self.dual_bound = max(self.dual_bound, float(info.mip_dual_bound))

    def taken(self) -> list[IntArray]:
        return self.solutions if self.limit is None else self.solutions[: self.limit]
