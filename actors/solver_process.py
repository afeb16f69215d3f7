"""The solver process: one long-lived process, spawned (never forked), in which allocation solves run.

Why a process: the solve is CPU-bound C++ (HiGHS) that would hold the owner's event loop, and HiGHS's
interrupt checks, which stop it at its deadline (``solvers.allocation.stopping``), were up to 16 s apart
at the root of an extended-size MIP, so only a process can be stopped on time. Why here and not in
``coral``: the child runs ``solvers`` code, which ``coral`` (outside its CLI) may not import, and
``solvers`` may neither fork nor start processes; ``actors`` may import both, and the CLI may import
``actors``. Owners: the allocator actor (``actors.allocator``) and the CLI for ``plan`` and ``bench``.

Protocol, over one ``multiprocessing`` pipe (the messages are the attrs classes below, pickled between
this module's two ends only):

- child -> owner ``Ready(pid)`` once, when it can take requests (the owner waits for it, at most
  ``READY_S``, before it sends its first request; ``start``/``start_async`` wait for it early);
- owner -> child ``Solve(seq, digest, base, changes, deadline_s, options)``: the problem is ``base`` (the
  problem as the child last received it whole, under ``digest``) with the fields of ``changes``
  (demand, prices, availability, current plan, churn factor, priorities). ``digest`` covers every other
  field (templates, models, node types, regions, shapes, utilisation); the owner sends ``base`` only
  when the child does not hold that digest (a new child, or the templates changed), else None. A child
  that does not hold it answers ``Failed(seq, "UnknownProblem", ...)`` and the owner sends it whole;
- the child answers a ``Solve`` with a ``Progress(seq, result)`` for each improving plan
  (``solve_allocation``'s ``progress``: the result as if the deadline passed at that moment, whose effort
  replays it exactly), then ``Done(seq, result)``, or ``Failed(seq, error)``;
- owner -> child ``Call(seq, fn)``: the child answers ``Returned(seq, fn())`` or ``Failed``; the owner
  waits at most a hard limit, then kills the child (the Helix baseline's placements, whose MILPs overrun
  their time limits, run so);
- owner -> child ``Stop()``: the child exits.

Deadline: the child solves with ``deadline_s`` on its own clock, and stops at HiGHS's next interrupt
check after it. The owner waits for ``Done`` until ``hard_s(deadline_s)``; if it has not come, it takes
the last ``Progress`` (replayable, like ``Done``) and leaves the child to end that solve. The next
request first waits up to its own ``hard_s`` (at least ``SETTLE_S``) for that late solve to end; only
if it has not (HiGHS between two interrupt checks) is the child killed, and a new one spawned (its
``Ready`` awaited). On a
loaded machine a solve often ends a little after its deadline, and killing it each time cost a spawn
(seconds of imports) per solve. Before the first ``Progress`` (the heuristic's plan) there is no plan to
return, so the owner waits for that one. Without a deadline (a replay with a given effort) it waits for
``Done``. Nothing here reads the clock for a decision: which result the owner takes depends on time, but
the result carries the effort that reproduces it.

Submit and collect: ``submit`` sends a ``Solve`` and returns its ``Flight`` at once; ``collect`` later
waits for its result under the same rules (the hard deadline counts from the submit), so that the owner
may do other work while the child solves (the allocator lets the mesh's clock run: ``actors.allocator``).
``solve`` is the two in a row. One solve is in flight at a time: a ``submit`` (or ``call``) while one is
uncollected abandons it, and is then treated as after a late solve; a ``solve`` (the allocator's plan
preview) first collects it, and keeps the result for its ``collect``. Until it is collected, a flight's
``Progress`` messages wait in the pipe (about 1.5 KB each, one per improving plan, against a socket buffer
of some 200 KB), so the child does not block on them.

Shutdown: ``close()`` sends ``Stop``, joins the child, and kills it if it does not exit in time; the
owner starts no thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import anyio
import attrs
import numpy as np

from solvers.allocation import (
    AllocationInputError,
    AllocationProblem,
    AllocationResult,
    SolverEffort,
    solve_allocation,
)

# -- messages -----------------------------------------------------------------------------------------


@attrs.frozen
class Ready:
    """The child can take requests."""

    pid: int


CHANGES = ("demand_rps", "price", "avail", "current", "churn_factor", "priority")
"""The fields of an ``AllocationProblem`` that every ``Solve`` sends; the digest covers the others."""


@attrs.frozen
class Changes:
    """The fields of a problem that change from solve to solve (``CHANGES``)."""

    demand_rps: Any
    price: Any
    avail: Any
    current: Any
    churn_factor: float
    priority: Any

    @classmethod
    def of(cls, p: AllocationProblem) -> Changes:
        return cls(**{name: getattr(p, name) for name in CHANGES})


@attrs.frozen
class Solve:
    """Solve ``base`` (or the child's problem under ``digest``, when None) with ``changes`` applied;
    ``options`` are ``solve_allocation``'s keywords (effort, mip_gap, columns, ...)."""

    seq: int
    digest: str
    base: AllocationProblem | None
    changes: Changes
    deadline_s: float
    options: dict[str, Any]


def digest(p: AllocationProblem) -> str:
    """A content digest of every field of ``p`` but ``CHANGES``: equal digests, equal problems up to those."""
    h = hashlib.blake2b(digest_size=20)
    ts = p.templates
    for part in (
        repr((p.models, p.node_types, p.regions, p.utilisation)).encode(),
        np.asarray(p.mean_in).tobytes(), np.asarray(p.mean_out).tobytes(), np.asarray(p.kv_bytes_per_token).tobytes(),
        np.asarray(p.nic_bytes_s).tobytes(),
        "\0".join(f"{t.key}\1{t.mode}\1{t.m}" for t in ts).encode(),
        np.array([(t.prefill_tok_s, t.decode_tok_s, t.load_s, t.kv_min_nic) for t in ts], dtype=np.float64).tobytes(),
        np.array([t.node_counts for t in ts], dtype=np.int64).tobytes(),
    ):  # fmt: skip
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


@attrs.frozen
class Call:
    """Compute ``fn()`` (a picklable job, e.g. a ``functools.partial`` of a module-level function)."""

    seq: int
    fn: Callable[[], Any]


@attrs.frozen
class Returned:
    """What a ``Call`` computed."""

    seq: int
    value: Any


@attrs.frozen
class Progress:
    """An improving plan: the result as if the solve were cut now (its effort replays it)."""

    seq: int
    result: AllocationResult


@attrs.frozen
class Done:
    """The solve's result."""

    seq: int
    result: AllocationResult


@attrs.frozen
class Failed:
    """The solve raised; ``error`` is its one-line description, ``kind`` the exception's class name."""

    seq: int
    kind: str
    error: str


@attrs.frozen
class Stop:
    """Exit."""


@attrs.define(eq=False)
class Flight:
    """A solve sent to the child and not yet collected (``SolverProcess.submit``); the owner's side only.
    ``until`` is the hard deadline on the monotonic clock (None: a replay, which waits for ``Done``),
    ``last`` the last ``Progress`` collected."""

    seq: int
    key: str
    problem: AllocationProblem
    changes: Changes
    deadline_s: float
    options: dict[str, Any]
    whole: bool
    until: float | None
    last: AllocationResult | None = None
    result: AllocationResult | None = None
    """Set when a ``solve`` had to finish this flight first; its ``collect`` then returns it."""
    error: Exception | None = None
    """What collecting it raised then; its ``collect`` raises it."""


# -- the child ----------------------------------------------------------------------------------------


def _child_main(conn: Connection, nice: int = 0) -> None:  # pragma: no cover - runs in the spawned child
    """The child's loop: answer each ``Solve`` until ``Stop`` or the pipe closes; first its CPU priority is
    lowered by ``nice`` (``SolverProcess``)."""
    if nice:
        os.nice(nice)
    held: tuple[str, AllocationProblem] | None = None  # the last problem received whole, and its digest
    conn.send(Ready(os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if isinstance(msg, Stop):
            return
        seq = msg.seq
        if isinstance(msg, Call):
            try:
                value = msg.fn()
            except Exception as exc:
                conn.send(Failed(seq, type(exc).__name__, str(exc)))
            else:
                conn.send(Returned(seq, value))
            continue
        assert isinstance(msg, Solve), msg

        def report(result: AllocationResult, seq: int = seq) -> None:
            conn.send(Progress(seq, result))

        if msg.base is not None:
            held = (msg.digest, msg.base)
        elif held is None or held[0] != msg.digest:
            conn.send(Failed(seq, "UnknownProblem", f"no problem held under digest {msg.digest}"))
            continue
        try:
            problem = attrs.evolve(held[1], **attrs.asdict(msg.changes, recurse=False))
            res = solve_allocation(problem, deadline_s=msg.deadline_s, progress=report, **msg.options)
        except Exception as exc:  # the owner re-raises it as it was
            conn.send(Failed(seq, type(exc).__name__, str(exc)))
        else:
            conn.send(Done(seq, res))


# -- the owner ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _stderr_with_a_descriptor() -> Iterator[None]:
    """Give ``sys.stderr`` a real descriptor while a process is spawned.

    The spawn context starts multiprocessing's resource tracker on first use and passes it
    ``sys.stderr.fileno()``; under a Textual app (``coral up --tui``) stderr is a capture whose descriptor is
    -1, and the spawn fails with ``bad value(s) in fds_to_keep``.
    """
    try:
        ok = sys.stderr.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        ok = False
    if ok or sys.__stderr__ is None:
        yield
        return
    captured, sys.stderr = sys.stderr, sys.__stderr__
    try:
        yield
    finally:
        sys.stderr = captured


class SolverProcessError(RuntimeError):
    """The solver process failed: it died, or a solve raised something other than bad input."""


def hard_s(deadline_s: float) -> float:
    """How long the owner waits for ``Done`` before it takes the last ``Progress`` and kills the child."""
    return 1.25 * deadline_s + 0.1


READY_S = 60.0
"""The longest an owner waits for a new child's ``Ready``: its imports (highspy, numpy, the solvers) took
1-10 s on a loaded 2-core machine."""

SETTLE_S = 5.0
"""The least time a request waits for a late solve to end before it kills the child: a new child costs
its imports (1-10 s on a loaded 2-core machine), so waiting a while is cheaper."""


class SolverProcess:
    """Owns one spawned solver process (see the module docstring). ``solve`` takes ``solve_allocation``'s
    arguments and returns its result; ``solve_async`` does the same without blocking an anyio loop.

    The child is spawned at construction (or at the first solve after a kill) and its ``Ready`` awaited
    at the next solve. Use as a context manager, or call ``close()``. ``nice``: the child lowers its CPU
    priority by that much (``os.nice``) once its imports are done (0: the owner's priority; a live mesh may
    ask for more, ``run_mesh``'s ``solver_nice``, so that its paced clock comes first).
    """

    def __init__(self, nice: int = 0) -> None:
        if not (isinstance(nice, int) and 0 <= nice <= 19):
            raise ValueError(f"nice: expected an integer from 0 to 19, got {nice!r}")
        self.nice = nice
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        self._ready = False
        self._seq = 0
        self._lock: anyio.Lock | None = None  # one solve at a time from anyio tasks
        self._stale: int | None = None  # a solve whose result was taken from its progress, still running
        self._flight: Flight | None = None  # the solve submitted and not yet collected
        self._landed: Flight | None = None  # a flight that a ``solve`` finished first, not yet collected
        self.abandoned = 0
        """Solves submitted and never collected (a later submit or job came first)."""
        self.late = 0
        """Solves whose result was their last progress (no ``Done`` by the hard deadline)."""
        self.kills = 0
        """Children killed: a late solve still running a hard deadline after the next request, or a job
        over its hard limit."""
        self.pid: int | None = None
        self._held: str | None = None  # the digest of the problem the child holds
        self.sent_whole = 0
        """Solves that sent the problem whole (the child did not hold its digest)."""
        self._spawn()

    def __enter__(self) -> SolverProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_child_main, args=(child, self.nice), name="coral-solver", daemon=True)
        with _stderr_with_a_descriptor():
            proc.start()
        child.close()
        self._proc, self._conn, self._ready, self.pid, self._held = proc, parent, False, None, None

    def _kill(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
            self._proc.close()
        self._proc = self._conn = None
        self._ready = False
        self._held = None

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the child: ``Stop``, then a kill if it has not exited after ``timeout_s``."""
        if self._proc is None:
            return
        assert self._conn is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            self._conn.send(Stop())
        self._flight = None
        self._proc.join(timeout_s)
        if self._proc.exitcode is None:
            self._proc.kill()
            self._proc.join()
        self._conn.close()
        self._proc.close()
        self._proc = self._conn = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    # one solve, as a generator of "wait for readability until t" steps, so that the sync and the async
    # front ends share every decision

    def _recv(self) -> object:
        assert self._conn is not None
        try:
            return self._conn.recv()
        except (EOFError, OSError) as exc:
            code = None if self._proc is None else self._proc.exitcode
            self._kill()
            raise SolverProcessError(f"the solver process died (exit code {code})") from exc

    def _await_ready(self, timeout_s: float) -> Any:
        """Steps (as ``_steps``) that wait for the child's ``Ready``, at most ``timeout_s`` seconds; then
        the child is killed and ``SolverProcessError`` names the cause."""
        until = time.monotonic() + timeout_s
        while not self._ready:
            if not (yield until):
                code = None if self._proc is None else self._proc.exitcode
                self._kill()
                self.kills += 1
                raise SolverProcessError(
                    f"the solver process did not start within {timeout_s:g} s (importing highspy, numpy and the "
                    f"solvers; exit code {code}): is the machine overloaded?"
                )
            msg = self._recv()
            if isinstance(msg, Ready):
                self._ready, self.pid = True, msg.pid

    def _start_steps(self, timeout_s: float) -> Any:
        if self._proc is None:
            self._spawn()
        yield from self._await_ready(timeout_s)

    def start(self, timeout_s: float = READY_S) -> None:
        """Wait until the child is ready (spawning one if none runs), at most ``timeout_s`` seconds."""
        self._drive(self._start_steps(timeout_s))

    async def start_async(self, timeout_s: float = READY_S) -> None:
        """``start`` for an anyio task (waits on the pipe in no thread)."""
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            await self._drive_async(self._start_steps(timeout_s))

    def _submit_steps(self, problem: AllocationProblem, deadline_s: float, options: dict[str, Any]) -> Any:
        """Steps (as ``_collect_steps``) that send a ``Solve`` and return its ``Flight``: first an abandoned
        or late solve is given time to end (then the child is killed), and a new child's ``Ready`` awaited."""
        if self._flight is not None:  # submitted and never collected: the child may still be solving it
            self._stale = self._flight.seq
            self._flight = None
            self.abandoned += 1
        if self._stale is not None and self._proc is not None:  # give the late solve time to end, then kill it
            settle = time.monotonic() + max(hard_s(deadline_s), SETTLE_S)
            while self._stale is not None:
                if not (yield settle):
                    self.kills += 1
                    self._kill()
                    break
                msg = self._recv()
                if isinstance(msg, Done | Failed) and msg.seq == self._stale:
                    self._stale = None
        self._stale = None
        if self._proc is None:
            self._spawn()
        self._seq += 1
        seq = self._seq
        yield from self._await_ready(READY_S)
        assert self._conn is not None
        key = digest(problem)
        changes = Changes.of(problem)
        whole = self._held != key
        self._conn.send(Solve(seq, key, problem if whole else None, changes, deadline_s, options))
        self.sent_whole += whole
        self._held = key
        replay = options.get("effort") is not None
        until = None if replay else time.monotonic() + hard_s(deadline_s)
        self._flight = Flight(seq, key, problem, changes, deadline_s, options, whole, until)
        return self._flight

    def _collect_steps(self, flight: Flight, on_progress: Callable[[AllocationResult], None] | None) -> Any:
        """Yields the monotonic time (or None: no limit) until which to wait for the pipe to be readable,
        is sent whether it is, and returns the result of ``flight``."""
        if flight is self._landed:
            self._landed = None
            if flight.error is not None:
                raise flight.error
            assert flight.result is not None
            return flight.result
        if flight is not self._flight:
            raise SolverProcessError(
                f"solve {flight.seq} is not in flight: it was collected, or a later one was submitted"
            )
        self._flight = None
        seq = flight.seq
        assert self._conn is not None
        while True:
            wait_until = None if flight.last is None else flight.until
            readable = yield wait_until
            if not readable:  # the hard deadline passed, and a plan is in hand; the child ends its solve late
                assert flight.last is not None
                self._stale = seq
                self.late += 1
                return flight.last
            msg = self._recv()
            if isinstance(msg, Progress) and msg.seq == seq:
                flight.last = msg.result
                if on_progress is not None:
                    on_progress(flight.last)
            elif isinstance(msg, Done) and msg.seq == seq:
                return msg.result
            elif isinstance(msg, Failed) and msg.seq == seq and msg.kind == "UnknownProblem" and not flight.whole:
                flight.whole = True
                self.sent_whole += 1
                self._conn.send(
                    Solve(seq, flight.key, flight.problem, flight.changes, flight.deadline_s, flight.options)
                )
            elif isinstance(msg, Failed) and msg.seq == seq:
                if msg.kind == "AllocationInputError":
                    raise AllocationInputError(msg.error)
                raise SolverProcessError(f"the solve failed in the solver process: {msg.kind}: {msg.error}")

    def _steps(
        self,
        problem: AllocationProblem,
        deadline_s: float,
        options: dict[str, Any],
        on_progress: Callable[[AllocationResult], None] | None,
    ) -> Any:
        if self._flight is not None:  # finish the solve in flight first: its collect returns what it gave
            landed = self._flight
            try:
                landed.result = yield from self._collect_steps(landed, None)
            except (AllocationInputError, SolverProcessError) as exc:
                landed.error = exc
            self._landed = landed
        flight = yield from self._submit_steps(problem, deadline_s, options)
        return (yield from self._collect_steps(flight, on_progress))

    def call(self, fn: Callable[[], Any], hard_s: float) -> Any:
        """``fn()`` computed in the child, or None when it takes more than ``hard_s`` seconds (the child is
        then killed, and a new one spawned at the next request). A failure is raised here as
        ``SolverProcessError``."""
        if not (hard_s > 0 and math.isfinite(hard_s)):
            raise ValueError(f"hard_s must be finite and > 0, got {hard_s}")
        if self._flight is not None:
            self._stale, self._flight = self._flight.seq, None
            self.abandoned += 1
        if self._stale is not None and self._proc is not None:
            self.kills += 1  # a job waits for no late solve: jobs are long, solves are not
            self._kill()
        self._stale = None
        if self._proc is None:
            self._spawn()
        self._drive(self._await_ready(READY_S))
        assert self._conn is not None
        self._seq += 1
        seq = self._seq
        self._conn.send(Call(seq, fn))
        until = time.monotonic() + hard_s
        while True:
            if not self._conn.poll(max(until - time.monotonic(), 0.0)):
                self.kills += 1
                self._kill()
                return None
            msg = self._recv()
            if isinstance(msg, Returned) and msg.seq == seq:
                return msg.value
            if isinstance(msg, Failed) and msg.seq == seq:
                raise SolverProcessError(f"the job failed in the solver process: {msg.kind}: {msg.error}")

    def solve(
        self,
        problem: AllocationProblem,
        *,
        deadline_s: float = 1.0,
        effort: SolverEffort | None = None,
        on_progress: Callable[[AllocationResult], None] | None = None,
        **options: Any,
    ) -> AllocationResult:
        """``solve_allocation(problem, deadline_s=..., effort=..., **options)`` in the child (blocking)."""
        _check(deadline_s)
        res: AllocationResult = self._drive(
            self._steps(problem, deadline_s, {"effort": effort, **options}, on_progress)
        )
        return res

    def _drive(self, steps: Any) -> Any:
        """Run a generator of steps, blocking on the pipe; its return value."""
        readable = None
        try:
            while True:
                until = steps.send(readable)
                assert self._conn is not None
                left = None if until is None else max(until - time.monotonic(), 0.0)
                readable = self._conn.poll(left)
        except StopIteration as stop:
            return stop.value

    async def solve_async(
        self,
        problem: AllocationProblem,
        *,
        deadline_s: float = 1.0,
        effort: SolverEffort | None = None,
        on_progress: Callable[[AllocationResult], None] | None = None,
        **options: Any,
    ) -> AllocationResult:
        """``solve`` for an anyio task: it waits on the pipe's file descriptor, in no thread."""
        _check(deadline_s)
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            return await self._solve_async(problem, deadline_s, {"effort": effort, **options}, on_progress)

    async def _solve_async(
        self,
        problem: AllocationProblem,
        deadline_s: float,
        options: dict[str, Any],
        on_progress: Callable[[AllocationResult], None] | None,
    ) -> AllocationResult:
        res: AllocationResult = await self._drive_async(self._steps(problem, deadline_s, options, on_progress))
        return res

    def submit(
        self, problem: AllocationProblem, *, deadline_s: float = 1.0, effort: SolverEffort | None = None, **options: Any
    ) -> Flight:
        """Send ``solve_allocation(problem, ...)`` to the child and return at once with its ``Flight``; its
        result comes from ``collect``. It blocks only while a late or abandoned solve ends, or a new child
        starts. A second ``submit`` before the first is collected abandons the first."""
        _check(deadline_s)
        flight: Flight = self._drive(self._submit_steps(problem, deadline_s, {"effort": effort, **options}))
        return flight

    def collect(
        self, flight: Flight, *, on_progress: Callable[[AllocationResult], None] | None = None
    ) -> AllocationResult:
        """The result of a submitted solve (blocking), under the hard deadline counted from its ``submit``."""
        res: AllocationResult = self._drive(self._collect_steps(flight, on_progress))
        return res

    async def submit_async(
        self, problem: AllocationProblem, *, deadline_s: float = 1.0, effort: SolverEffort | None = None, **options: Any
    ) -> Flight:
        """``submit`` for an anyio task (waits on the pipe in no thread)."""
        _check(deadline_s)
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            flight: Flight = await self._drive_async(
                self._submit_steps(problem, deadline_s, {"effort": effort, **options})
            )
            return flight

    async def collect_async(
        self, flight: Flight, *, on_progress: Callable[[AllocationResult], None] | None = None
    ) -> AllocationResult:
        """``collect`` for an anyio task (waits on the pipe in no thread)."""
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            res: AllocationResult = await self._drive_async(self._collect_steps(flight, on_progress))
            return res

    async def _drive_async(self, steps: Any) -> Any:
        """Run a generator of steps, awaiting the pipe's readability; its return value."""
        readable = None
        try:
            while True:
                until = steps.send(readable)
                assert self._conn is not None
                if self._conn.poll(0):
                    readable = True
                    continue
                left = math.inf if until is None else max(until - time.monotonic(), 0.0)
                readable = False
                with anyio.move_on_after(left):
                    await anyio.wait_readable(self._conn.fileno())
                    readable = True
        except StopIteration as stop:
            return stop.value


def _check(deadline_s: float) -> None:
    if not (deadline_s > 0 and math.isfinite(deadline_s)):
        raise AllocationInputError(f"deadline_s: must be finite and > 0, got {deadline_s}")
