"""Template builds on a Ray cluster: the `Solver` behind ``coral templates build --ray [ADDRESS]``.

The driver (this process) keeps the whole build of `build_library`: the levels in order, the keys, the
pruning floors and the store. Each level's pending multisets go to the cluster as tasks of up to
``MAX_CHUNK`` multisets (about ``CHUNKS_PER_WORKER`` tasks per CPU, so that the tasks balance). A task
solves its multisets with `solve_pending`, as a local worker process does, with the driver's perf model
(put once in the object store) and the driver's own ``coral`` and ``solvers`` packages (the job's
``py_modules``, uploaded when this solver connects), so the outcomes are those of a local build whatever
Coral the cluster has installed. The cluster's nodes need Coral's dependencies (the same Python version
and ``pip install coral-serve``, or its requirements). Results come
back as tasks end, in any order, and `build_library` writes them to the local store as they arrive.
"""

from __future__ import annotations

import logging
import math
import socket
import time
import uuid
from collections.abc import Generator, Sequence
from pathlib import Path

import ray  # optional dependency: the `ray` extra (pip install -e ".[ray]")

import coral
import solvers.library  # binds `solvers`, the package the tasks run (their py_modules)
from coral.cli.build import Pending, Solved, solve_pending, use_perf
from coral.errors import CoralError
from coral.perf import PerfModel

MAX_CHUNK = 256
CHUNKS_PER_WORKER = 4
CONNECT_TIMEOUT_S = 5.0
ADDRESS_FORMS = "HOST:PORT (the head's GCS port), ray://HOST:PORT (Ray Client), auto or local"

_BUILD: str | None = None
"""In a Ray worker process: the build whose perf model this process solves with."""


@ray.remote
def _solve_chunk(build: str, perf: PerfModel, time_limit: float, chunk: Sequence[Pending]) -> list[Solved]:
    global _BUILD
    if build != _BUILD:
        use_perf(perf, time_limit)
        _BUILD = build
    return [solve_pending(item) for item in chunk]


def check_address(address: str | None, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse an address that is not one of Ray's forms, or whose host does not answer on its port.

    ``ray.init`` waits minutes on a GCS address where nothing listens; this answers in ``timeout``."""
    if address is None or address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CoralError(f"--ray {address}: not a Ray address (give {ADDRESS_FORMS})")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout).close()
    except OSError as e:
        raise CoralError(f"--ray {address}: cannot reach a Ray cluster there ({e.strerror or e})") from None


class RaySolver:
    """Solves each level's multisets as Ray tasks; results stream back as the tasks end.

    Connects on construction (``address`` None: Ray's default, which is RAY_ADDRESS, else the cluster
    that ``ray start`` runs here, else a new local instance). A process already connected to Ray (a test's
    ``ray.init``) keeps its connection, and `close` leaves it open."""

    def __init__(self, address: str | None, perf: PerfModel, time_limit: float) -> None:
        self.address = address
        check_address(address)
        self._owns = not ray.is_initialized()
        if self._owns:
            packages = [str(Path(f).parent) for f in (coral.__file__, solvers.__file__) if f]
            try:
                ray.init(
                    address=address,
                    runtime_env={"py_modules": packages},
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
            except Exception as e:  # Ray raises bare Exception too (a local instance that did not start in 30 s)
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise CoralError(f"--ray {address or '(default)'}: cannot connect ({first})") from None
        self._workers = int(ray.cluster_resources().get("CPU", 0))
        if self._workers < 1:
            self.close()
            raise CoralError(f"--ray {address or '(default)'}: the Ray cluster has no CPUs")
        self._perf = ray.put(perf)
        self._time_limit = time_limit
        self._build = uuid.uuid4().hex

    @property
    def workers(self) -> int:
        """The cluster's CPUs when it was joined."""
        return self._workers

    def chunk_size(self, n: int) -> int:
        """Multisets per task for a level of ``n``."""
        return max(1, min(MAX_CHUNK, math.ceil(n / (CHUNKS_PER_WORKER * self._workers))))

    def solve(self, pending: Sequence[Pending], stop_at: float | None) -> Generator[tuple[Pending, Solved], None, None]:
        """Results in the order the tasks end; at ``stop_at``, or when closed, the rest are cancelled."""
        size = self.chunk_size(len(pending))
        chunks = {}
        for i in range(0, len(pending), size):
            chunk = list(pending[i : i + size])
            chunks[_solve_chunk.remote(self._build, self._perf, self._time_limit, chunk)] = chunk
        left = list(chunks)
        try:
            while left:
                wait = None if stop_at is None else stop_at - time.perf_counter()
                if wait is not None and wait <= 0:
                    return
                ready, left = ray.wait(left, num_returns=1, timeout=wait)
                for ref in ready:
                    yield from zip(chunks[ref], ray.get(ref), strict=True)
        finally:
            for ref in left:
                ray.cancel(ref)

    def close(self) -> None:
        """Disconnect (and stop a local instance) if this solver connected."""
        if self._owns and ray.is_initialized():
            ray.shutdown()
