"""The one worker that feeds the TUI: it reads the bus (or a journal) and posts typed messages to the app.

``BusWorker`` owns a ``Source``: ``LiveSource`` attaches to a running mesh (a ``BusClient`` with a SUB for
events and a DEALER for commands) and ``ReplaySource`` plays a recorded journal at a speed. Whatever the
source delivers is queued in a ``Pending`` batch where floods merge: of several snapshot messages with
the same tag (fleet, demand, market, traffic stats) only the latest is kept (a market update keeps the
union of what changed), and past ``max_events`` queued events the oldest are dropped and counted. The
worker posts at most one ``BusBatch`` per frame and none while the app has not consumed the previous one
(``ack``), so the UI stays responsive however fast the bus runs.

Attaching late: right after it connects, a live source asks ``coral up``'s ``operator`` gateway for a
``Snapshot`` (the latest run setup, allocator settings, market, demand, fleet and traffic messages, and
the recent plans) and folds it before any live message, so that a TUI started in the middle of a run
shows the whole state at once. Live messages that the snapshot already covers (an older ``at``, or a
plan sequence it holds) are skipped. A mesh without a gateway answers nothing; the TUI then fills in as
updates arrive.

Asking the mesh: the TUI opens no file of the mesh's. A live source asks the allocator for the scenario's
deployments (``ScenarioRequest``) after attaching and at each new run (again at each ping until it
answers), asks the gateway where the clock
stands (``ClockRequest``) at every ping, and ``ask`` sends any other inspection request (templates, plan
previews); replies are posted as ``Answered`` or pushed as envelopes for the reducer to fold. The kernel's
``ErrorEvent`` about a frame of the TUI's own (an inquiry to an allocator that has not started yet) is
not shown as a mesh error: the request that sent it already reports the failure or asks again.

Liveness: a live source runs a sync round trip with the kernel every ``ping_s``, in a task of its own beside
the inquiries and requests (a request to a peer that is gone waits out its whole timeout, and a mesh that
stops sends remote clients no word); when one fails (or the handshake does) it reports the link ``lost``
within ``ping_s + ping_timeout_s``, keeps retrying and reports ``connected`` when the mesh is back. The
app keeps the last state on screen meanwhile.

Commands go to ``coral up``'s ``operator`` gateway as requests (exact replay of a recorded run); where
no gateway exists they go to the owner of the setting. The answer, a ``CommandResult`` or the reason
none came (an error, or the request's timeout), is posted as ``CommandDone``. A command still in
flight when the session ends gets none: the link reported ``lost`` fails it (``tui.reducer.with_link``),
and it is never resent.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.lowlevel
import zmq
from textual.message import Message

from coral.errors import CoralError
from coral.kernel import BusClient, BusError, ClientKeys, DecodeError, Endpoints, Envelope, ErrorEvent, RequestError
from coral.kernel.address import default_endpoints as default_endpoints
from coral.kernel.address import parse_connect
from coral.kernel.codec import DEFAULT_CODEC, tag_text
from coral.kernel.journal import read_journal
from coral.messages.control import OPERATOR
from tui.model import LINK_LOST, TOPICS, Link
from tui.reducer import (
    clock_mark,
    clock_request,
    covered_by,
    is_snapshot,
    merge_snapshots,
    scenario_request,
    snapshot_request,
    unpack_snapshot,
    wanted,
)
from tui.steering import INSPECTOR, owner_of

parse_address = parse_connect
"""``--connect``'s address (``coral.kernel.address.parse_connect``)."""


# -- messages posted to the app ---------------------------------------------------------------------


class BusBatch(Message):
    """Envelopes received since the previous batch, in order; ``dropped`` events were dropped in a flood."""

    def __init__(self, envelopes: list[Envelope], dropped: int) -> None:
        super().__init__()
        self.envelopes = envelopes
        self.dropped = dropped


class LinkChanged(Message):
    """The connection to the mesh (or the replay) changed."""

    def __init__(self, link: Link) -> None:
        super().__init__()
        self.link = link


class CommandDone(Message):
    """The answer to command number ``n``: ``result`` (a CommandResult) or ``error`` when none came back."""

    def __init__(self, n: int, cmd: Any, result: Any | None, error: str = "") -> None:
        super().__init__()
        self.n = n
        self.cmd = cmd
        self.result = result
        self.error = error


class Answered(Message):
    """The answer to an inspection request ``key`` (``ask``): ``reply``, or ``error`` when none came back."""

    def __init__(self, key: str, request: Any, reply: Any | None, error: str = "") -> None:
        super().__init__()
        self.key = key
        self.request = request
        self.reply = reply
        self.error = error


def as_envelope(source: str, reply: Any) -> Envelope:
    """A reply as an envelope the reducer folds (tagged as the codec tags it)."""
    return Envelope("reply", source, tag_text(DEFAULT_CODEC.tag_bytes(type(reply))), reply)


# -- flood merging ----------------------------------------------------------------------------------


class Pending:
    """A batch being gathered. In a flood (``merge_after`` or more queued), a snapshot message replaces the
    previous one of its tag (leaving a clock mark where it was, so that later events keep their time), and
    past ``max_events`` queued events the oldest are dropped and counted."""

    def __init__(self, max_events: int = 2000, merge_after: int = 256) -> None:
        self.max_events = max_events
        self.merge_after = merge_after
        self._items: list[Envelope | None] = []
        self._snap: dict[str, tuple[int, int]] = {}
        self._last_mark: tuple[int, int] | None = None
        self._events = 0
        self.dropped = 0
        self.merged = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, env: Envelope) -> None:
        if is_snapshot(env):
            prev = self._snap.get(env.tag)
            if prev is not None and len(self._items) >= self.merge_after:
                i, stamp = prev
                old = self._items[i]
                if old is not None:
                    env = merge_snapshots(old, env)
                    self._items[i] = clock_mark(old)
                    if self._last_mark is not None and self._last_mark[1] == stamp and self._last_mark[0] < i:
                        self._items[self._last_mark[0]] = None  # no event between two marks: the later one will do
                    self._last_mark = (i, stamp)
                    self.merged += 1
            self._snap[env.tag] = (len(self._items), self._events)
            self._items.append(env)
            return
        self._items.append(env)
        self._events += 1
        if self._events > 2 * self.max_events:
            self._compact()

    def _compact(self) -> None:
        events = [i for i, e in enumerate(self._items) if e is not None and not _kept(e)]
        cut = set(events[: len(events) - self.max_events])
        keep: list[Envelope | None] = []
        for i, e in enumerate(self._items):
            if e is None:
                continue
            if i in cut:
                self.dropped += 1
                continue
            keep.append(e)
        self._items = keep
        self._snap = {e.tag: (i, 0) for i, e in enumerate(keep) if e is not None and is_snapshot(e)}
        self._last_mark = None
        self._events = sum(1 for e in keep if e is not None and not _kept(e))

    def take(self) -> tuple[list[Envelope], int]:
        """The batch so far (and how many events were dropped); the batch starts empty again."""
        items = [e for e in self._items if e is not None]
        dropped = self.dropped
        self._items, self._snap, self._last_mark, self._events, self.dropped = [], {}, None, 0, 0
        return items, dropped


def _kept(env: Envelope) -> bool:
    """Never dropped in a flood: snapshots, clock marks, plans and the run's setup and end."""
    return is_snapshot(env) or env.tag.startswith(("plan.", "mesh.", "tui."))


# -- sources ----------------------------------------------------------------------------------------


class Sink(Protocol):
    """What a source feeds."""

    def push(self, env: Envelope) -> None: ...

    def link(self, link: Link) -> None: ...

    async def room(self) -> None:
        """Wait until the sink can take more without merging (a replay's backpressure)."""
        ...


class Source(Protocol):
    """A live mesh or a journal."""

    address: str
    read_only: bool

    async def run(self, sink: Sink) -> Link | None:
        """Feed ``sink``; return the final link state when the source is exhausted (a live one never is)."""
        ...

    def submit(self, n: int, cmd: Any, done: Callable[[CommandDone], object]) -> None: ...

    def ask(self, key: str, dest: str, msg: Any, done: Callable[[Answered], object]) -> None:
        """Send an inspection request; its answer comes back to ``done``."""
        ...


class LiveSource:
    """A running mesh, attached through a ``BusClient`` (reconnecting when the mesh comes back)."""

    read_only = False

    def __init__(
        self,
        endpoints: Endpoints,
        *,
        name: str | None = None,
        ping_s: float = 1.0,
        ping_timeout_s: float = 3.0,
        retry_s: float = 1.0,
        handshake_s: float = 2.0,
        request_timeout_s: float = 15.0,
        snapshot_timeout_s: float = 5.0,
        curve: ClientKeys | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.snapshot_timeout_s = snapshot_timeout_s
        self.curve = curve
        self.address = f"{endpoints.router} {endpoints.pub}"
        self.name = name or f"tui-{os.getpid()}"
        self.ping_s = ping_s
        self.ping_timeout_s = ping_timeout_s
        self.retry_s = retry_s
        self.handshake_s = handshake_s
        self.request_timeout_s = request_timeout_s
        self._bus: BusClient | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._session = 0

    async def run(self, sink: Sink) -> Link | None:
        detail = ""
        while True:
            sink.link(Link("connecting" if not detail else "lost", detail, self.address))
            self._session += 1
            try:
                async with BusClient(
                    f"{self.name}.{self._session}",
                    self.endpoints,
                    subscribe=TOPICS,
                    inbox_size=8192,
                    handshake_timeout=self.handshake_s,
                    curve=self.curve,
                ) as bus:
                    sink.link(Link("connected", f"as {bus.name}", self.address))
                    detail = await self._session_loop(bus, sink)
            except (BusError, zmq.ZMQError) as exc:
                detail = f"{exc}; retrying"
            except OSError as exc:
                detail = f"{exc}; retrying"
            if not detail:
                detail = "connection closed; retrying"
            sink.link(Link("lost", detail, self.address))
            await anyio.sleep(self.retry_s)

    async def _session_loop(self, bus: BusClient, sink: Sink) -> str:
        reason = ""
        try:
            async with anyio.create_task_group() as tg:
                self._bus, self._tg = bus, tg

                async def ping() -> None:
                    # a task of its own: a request waiting out its timeout must not delay finding the mesh gone
                    nonlocal reason
                    while True:
                        await anyio.sleep(self.ping_s)
                        try:
                            await bus.sync(timeout=self.ping_timeout_s)
                        except BusError:
                            reason = f"no answer from the kernel within {self.ping_timeout_s:g}s; retrying"
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(ping)
                covered = await self._attach(bus, sink)
                need_scenario = True

                async def read() -> None:
                    nonlocal need_scenario
                    async for env in bus:
                        if isinstance(env.msg, ErrorEvent) and env.msg.origin == bus.name:
                            continue  # a frame of this TUI's own: its request reports the failure (or asks again)
                        if not covered or not covered_by(covered, env):
                            sink.push(env)
                            if env.tag == "mesh.setup":  # a new run: ask for its deployments
                                need_scenario = True

                tg.start_soon(read)
                clock = True
                while True:
                    if need_scenario:  # until the allocator answers (it may start after the kernel)
                        need_scenario = not await self._inquire(bus, sink, INSPECTOR, scenario_request())
                    await anyio.sleep(self.ping_s)
                    if clock:  # a mesh without a gateway cannot say: stop asking
                        clock = await self._inquire(bus, sink, OPERATOR, clock_request())
        finally:
            self._bus, self._tg = None, None
        return reason

    async def _attach(self, bus: BusClient, sink: Sink) -> dict[str, Any]:
        """Fold the gateway's snapshot; return what it covers (tag -> its message), {} if none came."""
        try:
            reply = await bus.request(OPERATOR, snapshot_request(), timeout=self.snapshot_timeout_s)
        except (RequestError, BusError, CoralError):  # no gateway: the state fills in from live updates
            return {}
        envs, covered = unpack_snapshot(reply)
        for env in envs:
            sink.push(env)
        return covered

    async def _inquire(self, bus: BusClient, sink: Sink, dest: str, msg: Any) -> bool:
        """Ask ``dest`` and push its reply to ``sink`` as an envelope; False if none came."""
        try:
            reply = await bus.request(dest, msg, timeout=self.snapshot_timeout_s)
        except (RequestError, BusError, CoralError):
            return False
        sink.push(as_envelope(dest, reply))
        return True

    def ask(self, key: str, dest: str, msg: Any, done: Callable[[Answered], object]) -> None:
        bus, tg = self._bus, self._tg
        if bus is None or tg is None:
            done(Answered(key, msg, None, "not connected to the mesh"))
            return

        async def run() -> None:
            try:
                reply = await bus.request(dest, msg, timeout=self.request_timeout_s)
            except (BusError, CoralError, zmq.ZMQError) as exc:
                done(Answered(key, msg, None, str(exc)))
                return
            except anyio.get_cancelled_exc_class():
                done(Answered(key, msg, None, LINK_LOST))
                raise
            done(Answered(key, msg, reply))

        tg.start_soon(run)

    def submit(self, n: int, cmd: Any, done: Callable[[CommandDone], object]) -> None:
        bus, tg = self._bus, self._tg
        if bus is None or tg is None:
            done(CommandDone(n, cmd, None, "not connected to the mesh; nothing was sent"))
            return
        tg.start_soon(self._request, bus, n, cmd, done)

    async def _request(self, bus: BusClient, n: int, cmd: Any, done: Callable[[CommandDone], object]) -> None:
        try:
            try:
                result = await bus.request(OPERATOR, cmd, timeout=self.request_timeout_s)
            except RequestError:  # no gateway: talk to the owner of the setting
                result = await bus.request(owner_of(cmd), cmd, timeout=self.request_timeout_s)
        except (BusError, CoralError, zmq.ZMQError) as exc:
            done(CommandDone(n, cmd, None, str(exc)))
            return
        done(CommandDone(n, cmd, result))


class ReplaySource:
    """A recorded journal, played at ``speed`` times its kernel time (``inf``: as fast as possible)."""

    read_only = True

    def __init__(self, path: str | os.PathLike[str], *, speed: float = 1.0) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CoralError(f"--replay: {self.path}: no such journal file")
        check_speed(speed)
        self.speed = float(speed)
        self.address = str(self.path)
        self.paused = False
        self.t = 0.0
        self._resume = anyio.Event()
        self._resume.set()

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        if paused:
            self._resume = anyio.Event()
        else:
            self._resume.set()

    def link_state(self, state: str = "replay") -> Link:
        """The link as the header shows it (speed, paused)."""
        pace = "max" if math.isinf(self.speed) else f"x{self.speed:g}"
        return Link(state, f"{pace}{' paused' if self.paused else ''}", self.address)

    def set_speed(self, speed: float) -> None:
        self.speed = check_speed(speed)

    async def run(self, sink: Sink) -> Link | None:
        sink.link(self.link_state())
        first = True
        n = 0
        for rec in read_journal(self.path):
            if not wanted(rec.tag) or (rec.kind != "publish" and not rec.tag.startswith("ctl.")):
                continue
            if rec.kind != "publish" and (rec.source == OPERATOR or rec.kind == "reply"):
                continue
            if first:
                self.t, first = rec.time, False
            await self._advance_to(rec.time)
            await sink.room()
            try:
                msg = rec.decode()
            except DecodeError as exc:
                sink.push(Envelope("publish", "tui", "kernel.error", ErrorEvent("journal", rec.tag, str(exc))))
                continue
            sink.push(Envelope(rec.kind, rec.source, rec.tag, msg, rec.corr))
            n += 1
            if n % 256 == 0:
                await anyio.lowlevel.checkpoint()
        return self.link_state("replay-ended")

    async def _advance_to(self, t: float) -> None:
        """Let the replay clock reach kernel time ``t`` at the current speed (speed and pause may change
        meanwhile: the wait is taken in short steps)."""
        while True:
            if self.paused:
                await self._resume.wait()
                continue
            if self.t >= t or math.isinf(self.speed):
                self.t = max(self.t, t)
                return
            step = min((t - self.t) / self.speed, _STEP_S)
            start = anyio.current_time()
            await anyio.sleep(step)
            self.t = min(t, self.t + (anyio.current_time() - start) * self.speed)

    def submit(self, n: int, cmd: Any, done: Callable[[CommandDone], object]) -> None:
        done(CommandDone(n, cmd, None, "replay is read-only; nothing was sent"))

    def ask(self, key: str, dest: str, msg: Any, done: Callable[[Answered], object]) -> None:
        done(Answered(key, msg, None, "a replay has no mesh to ask"))


_STEP_S = 0.05
"""The longest a paced replay sleeps before it looks at its speed and pause again (wall seconds)."""


def check_speed(speed: float) -> float:
    """``speed`` if it is a number > 0 (``inf`` allowed); raise CoralError naming ``--speed`` otherwise."""
    if isinstance(speed, bool) or not isinstance(speed, int | float) or math.isnan(speed) or not speed > 0:
        raise CoralError(f"--speed: expected a number > 0 (or inf), got {speed!r}")
    return float(speed)


# -- the worker -------------------------------------------------------------------------------------


class BusWorker:
    """Runs a source and posts ``BusBatch``, ``LinkChanged`` and ``CommandDone`` to ``post``."""

    def __init__(
        self,
        source: Source,
        post: Callable[[Message], object],
        *,
        frame_s: float = 0.1,
        max_events: int = 2000,
        merge_after: int = 256,
    ) -> None:
        self.source = source
        self.post = post
        self.frame_s = frame_s
        self.pending = Pending(max_events, merge_after)
        self._taken = anyio.Event()
        self._dirty = anyio.Event()
        self._acked = anyio.Event()
        self._acked.set()
        self.posted = 0

    # Sink
    def push(self, env: Envelope) -> None:
        self.pending.add(env)
        self._dirty.set()

    def link(self, link: Link) -> None:
        self.post(LinkChanged(link))

    async def room(self) -> None:
        while len(self.pending) >= self.pending.merge_after // 2:
            await self._taken.wait()

    def ack(self) -> None:
        """The app consumed the last batch; the next may be posted."""
        self._acked.set()

    def submit(self, n: int, cmd: Any) -> None:
        """Send command number ``n``; its answer comes back as ``CommandDone``."""
        self.source.submit(n, cmd, self.post)

    def ask(self, key: str, dest: str, msg: Any) -> None:
        """Send an inspection request; its answer comes back as ``Answered``."""
        self.source.ask(key, dest, msg, self.post)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._poster)
            final = await self.source.run(self)
            await self.flushed()
            tg.cancel_scope.cancel()
        if final is not None:
            self.link(final)

    async def flushed(self) -> None:
        """Wait until everything pushed so far was posted and consumed."""
        while len(self.pending) or not self._acked.is_set():
            await anyio.sleep(self.frame_s / 2)

    async def _poster(self) -> None:
        while True:
            await self._dirty.wait()
            await self._acked.wait()
            await anyio.sleep(self.frame_s)
            self._dirty = anyio.Event()
            items, dropped = self.pending.take()
            self._taken.set()
            self._taken = anyio.Event()
            if not items and not dropped:
                continue
            self._acked = anyio.Event()
            self.posted += 1
            self.post(BusBatch(items, dropped))
