"""Where HiGHS runs: deadlines on an injectable clock, an LP thread abandoned at its deadline, and MIPs in
child processes that stream their improving solutions and are killed at their deadline."""

from __future__ import annotations

import atexit
import math
import os
import select
import signal
import struct
import threading
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


_LIVE_THREADS: set[threading.Thread] = set()


@atexit.register
def _join_abandoned() -> None:  # pragma: no cover - interpreter shutdown
    for t in list(_LIVE_THREADS):
        t.join()


class _LpThread:
    """An LP job in a worker thread that the caller abandons at the deadline; the interrupt callback
    then stops HiGHS at its next check (frequent in the simplex method)."""

    def __init__(self) -> None:
        self.stop = False
        self.error: BaseException | None = None

    def attach(self, h: highspy.Highs) -> None:
        h.setCallback(self._callback, None)
        for kind in _INTERRUPT_CALLBACKS:
            h.startCallback(kind)

    def _callback(self, kind: Any, message: str, data_out: Any, data_in: Any, user_data: Any) -> None:
        if data_in is not None and self.stop:
            data_in.user_interrupt = True

    def run(self, job: Callable[[], None], deadline: _Deadline | None) -> bool:
        """Run ``job()`` in a thread; True if it finished before the deadline."""

        def target() -> None:
            try:
                job()
            except BaseException as exc:  # re-raised in the caller if it still waits
                self.error = exc
            finally:
                _LIVE_THREADS.discard(thread)

        thread = threading.Thread(target=target, daemon=True)
        _LIVE_THREADS.add(thread)
        thread.start()
        thread.join(None if deadline is None else max(deadline.left(), 0.0))
        if thread.is_alive():
            self.stop = True
            return False
        if self.error is not None:
            raise self.error
        return True


_HEADER = struct.Struct("<cq")  # message kind, payload bytes
_END = struct.Struct("<idqq")  # model status, dual bound, simplex iterations, nodes
_BOUND = struct.Struct("<dq")  # dual bound, nodes


def _send(fd: int, kind: bytes, payload: bytes) -> None:
    data = memoryview(_HEADER.pack(kind, len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


class _ForkedMip:
    """A MIP solved by single-threaded HiGHS in a forked child process, killed at the deadline.

    HiGHS cannot be stopped promptly: at the root of a large model its interrupt checks were up to
    16 s apart, and it overran its own ``time_limit`` by 2-3x. So the child streams each improving
    solution (the integer variables) and its dual bound through a pipe, and at the deadline the parent
    keeps the solutions fully received and kills the child. Single-threaded HiGHS finds the same
    solutions in the same order every run, so the number taken (``limit`` in a replay) fixes the plan.
    Several may run at once (``_run_all``); each is one process with one HiGHS solve.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.solutions: list[IntArray] = []
        self.dual_bound = -math.inf
        self.nodes = 0
        self.iterations = 0
        self.status: highspy.HighsModelStatus | None = None
        self.finished = False
        self.fd = -1
        self.pid = -1
        self._buf = bytearray()

    def start(self, build: Callable[[], highspy.Highs], num_int: int) -> None:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            os.close(read_fd)
            code = 0
            try:
                self._child(build(), num_int, write_fd)
            except BaseException as exc:
                _send(write_fd, b"X", repr(exc).encode())
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        self.fd, self.pid = read_fd, pid

    def done(self) -> bool:
        """Finished, or took as many solutions as its limit allows."""
        return self.finished or (self.limit is not None and len(self.solutions) >= self.limit)

    def feed(self) -> None:
        """Read what the child sent (the fd is readable) and take its messages, up to the limit."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            raise RuntimeError("the HiGHS child process ended without a result")
        self._buf += chunk
        buf = self._buf
        while len(buf) >= _HEADER.size and not self.done():
            kind, size = _HEADER.unpack_from(buf)
            if len(buf) < _HEADER.size + size:
                break
            payload = bytes(buf[_HEADER.size : _HEADER.size + size])
            del buf[: _HEADER.size + size]
            self._message(kind, payload)

    def stop(self) -> None:
        """Close the pipe; kill the child unless it finished."""
        if self.fd < 0:
            return
        os.close(self.fd)
        self.fd = -1
        if not self.finished:
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)

    @staticmethod
    def _child(h: highspy.Highs, num_int: int, fd: int) -> None:  # pragma: no cover - in the child
        last = [-math.inf]

        def callback(kind: Any, message: str, data_out: Any, data_in: Any, user_data: Any) -> None:
            if kind == cb.HighsCallbackType.kCallbackMipImprovingSolution:
                x = np.round(np.asarray(data_out.mip_solution)[:num_int]).astype(np.int64)
                _send(fd, b"S", x.tobytes())
            elif math.isfinite(data_out.mip_dual_bound) and data_out.mip_dual_bound > last[0]:
                last[0] = float(data_out.mip_dual_bound)
                _send(fd, b"B", _BOUND.pack(last[0], int(data_out.mip_node_count)))

        h.setCallback(callback, None)
        h.startCallback(cb.HighsCallbackType.kCallbackMipImprovingSolution)
        h.startCallback(cb.HighsCallbackType.kCallbackMipInterrupt)
        h.run()
        info = h.getInfo()
        status = int(h.getModelStatus())
        _send(
            fd,
            b"E",
            _END.pack(status, float(info.mip_dual_bound), int(info.simplex_iteration_count), int(info.mip_node_count)),
        )

    def _message(self, kind: bytes, payload: bytes) -> None:
        if kind == b"S":
            self.solutions.append(np.frombuffer(payload, dtype=np.int64).copy())
        elif kind == b"B":
            bound, nodes = _BOUND.unpack(payload)
            self.dual_bound, self.nodes = max(self.dual_bound, bound), max(self.nodes, nodes)
        elif kind == b"E":
            status, bound, self.iterations, nodes = _END.unpack(payload)
            self.status = highspy.HighsModelStatus(status)
            self.nodes = max(self.nodes, nodes)
            if math.isfinite(bound):
                self.dual_bound = max(self.dual_bound, bound)
            self.finished = True
        else:
            raise RuntimeError(f"HiGHS child process failed: {payload.decode(errors='replace')}")

    def taken(self) -> list[IntArray]:
        return self.solutions if self.limit is None else self.solutions[: self.limit]


def _run_all(
    jobs: list[tuple[_ForkedMip, Callable[[], highspy.Highs], int]], workers: int, deadline: _Deadline | None
) -> None:
    """Run the MIPs in order, at most ``workers`` children at a time, until each is done or the deadline
    passes; those not started by then stay unstarted (none with limit 0 is started)."""
    queue = [job for job in jobs if job[0].limit != 0]
    live: list[_ForkedMip] = []
    try:
        while queue or live:
            while queue and len(live) < workers:
                run, build, num_int = queue.pop(0)
                run.start(build, num_int)
                live.append(run)
            timeout = None if deadline is None else deadline.left()
            if timeout is not None and timeout <= 0:
                return
            ready = select.select([r.fd for r in live], [], [], timeout)[0]
            if not ready:
                return
            for run in [r for r in live if r.fd in ready]:
                run.feed()
                if run.done():
                    run.stop()
                    live.remove(run)
    finally:
        for run in live:
            run.stop()
