"""Actors in a mesh: spawn, supervision (restart, give-up), quiesce, virtual time, journal, shutdown."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from coral.kernel import (
    KERNEL,
    Actor,
    ActorCrashed,
    ActorGaveUp,
    ActorRestarted,
    ActorState,
    Envelope,
    Mesh,
    MeshError,
    MeshState,
    RestartPolicy,
    ShutdownRequested,
    SpawnError,
    VirtualClock,
    read_journal,
)

from .msgs import Ping, Pong, Tick, drain, next_match, next_of


class Counter(Actor):
    """Counts Pings, answers requests with the count, crashes on a negative Ping."""

    def __init__(self, name: str, **kw: object) -> None:
        super().__init__(name, **kw)  # type: ignore[arg-type]
        self.starts = 0
        self.count = 0
        self.stopped = False

    async def on_start(self) -> None:
        self.starts += 1

    async def handle(self, env: Envelope) -> None:
        if isinstance(env.msg, Ping) and env.msg.n < 0:
            raise RuntimeError(f"bad ping {env.msg.n}")
        self.count += 1
        if env.kind == "request":
            await self.ctx.reply(env, Pong(self.count))

    async def on_stop(self) -> None:
        self.stopped = True


class Relay(Actor):
    """Forwards every Ping, plus one, to the next actor."""

    def __init__(self, name: str, to: str) -> None:
        super().__init__(name)
        self.to = to

    async def handle(self, env: Envelope) -> None:
        await self.ctx.send(self.to, Ping(env.msg.n + 1))


class Ticker(Actor):
    """Publishes a Tick every `period` of kernel time."""

    def __init__(self, name: str, period: float) -> None:
        super().__init__(name)
        self.period = period

    async def on_start(self) -> None:
        self.ctx.every(self.period, self.tick)

    async def tick(self) -> None:
        await self.ctx.publish(Tick(self.name, self.ctx.now()))


async def test_spawn_request_and_graceful_stop() -> None:
    counter = Counter("counter")
    async with Mesh() as mesh:
        handle = await mesh.spawn(counter)
        assert handle.state is ActorState.RUNNING and counter.starts == 1
        client = await mesh.client("client")
        assert await client.request("counter", Ping(1)) == Pong(1)
        with pytest.raises(MeshError, match="already used"):
            await mesh.spawn(Counter("counter"))
    assert handle.state is ActorState.STOPPED and counter.stopped
    assert mesh.state is MeshState.STOPPED


async def test_kernel_sends_and_publishes() -> None:
    async with Mesh() as mesh:
        client = await mesh.client("client", subscribe=["test.kernel.pong"])
        assert mesh.send("client", Ping(3))
        env = await next_of(client, Ping)
        assert (env.kind, env.source, env.msg) == ("send", KERNEL, Ping(3))
        mesh.publish(Pong(4))
        env = await next_of(client, Pong)
        assert (env.kind, env.source, env.msg) == ("publish", KERNEL, Pong(4))
        assert not mesh.send("nobody", Ping(0))


async def test_supervisor_restarts_then_gives_up() -> None:
    counter = Counter("flaky")
    async with Mesh(policy=RestartPolicy(max_restarts=2, window=60.0)) as mesh:
        watch = await mesh.client("watch", subscribe=["kernel.actor."])
        handle = await mesh.spawn(counter)
        client = await mesh.client("client")
        for i in (1, 2):
            await client.send("flaky", Ping(-i))
            crashed = await next_of(watch, ActorCrashed)
            assert crashed.msg == ActorCrashed("flaky", f"RuntimeError: bad ping {-i}", i)
            assert crashed.source == KERNEL
            assert (await next_of(watch, ActorRestarted)).msg == ActorRestarted("flaky", crashed.msg.error, i)
        assert await client.request("flaky", Ping(1)) == Pong(1)  # state kept: same instance
        assert counter.starts == 3 and handle.restarts == 2
        await client.send("flaky", Ping(-3))
        assert (await next_of(watch, ActorCrashed)).msg.count == 3
        assert (await next_of(watch, ActorGaveUp)).msg == ActorGaveUp("flaky", "RuntimeError: bad ping -3", 3)
        assert await handle.wait() is ActorState.GAVE_UP
        await mesh.quiesce()  # a dead actor does not hold up quiesce


async def test_restart_budget_window_runs_on_the_kernel_clock() -> None:
    clock = VirtualClock()
    instances: list[Counter] = []

    def make() -> Counter:
        instances.append(Counter("phoenix"))
        return instances[-1]

    async with Mesh(clock=clock, policy=RestartPolicy(max_restarts=1, window=10.0)) as mesh:
        watch = await mesh.client("watch", subscribe=["kernel.actor."])
        handle = await mesh.spawn(make)
        client = await mesh.client("client")
        for _ in range(4):  # one crash per 11 s of kernel time: never two in a window
            await client.send("phoenix", Ping(-1))
            assert (await next_of(watch, ActorCrashed)).msg.count == 1
            await next_of(watch, ActorRestarted)
            await mesh.advance(11.0)
        assert len(instances) == 5 and all(c.starts == 1 for c in instances)  # a factory gives fresh state
        await client.send("phoenix", Ping(-1))
        await client.send("phoenix", Ping(-1))
        assert (await next_match(watch, ActorGaveUp)).msg.count == 2
        assert handle.state is ActorState.GAVE_UP


async def test_crash_on_start_past_budget_fails_spawn() -> None:
    class Broken(Actor):
        async def on_start(self) -> None:
            raise ValueError("no config")

    async with Mesh(policy=RestartPolicy(max_restarts=1)) as mesh:
        watch = await mesh.client("watch", subscribe=["kernel.actor."])
        with pytest.raises(SpawnError, match="crashed on start: ValueError: no config"):
            await mesh.spawn(Broken("broken"))
        assert (await next_of(watch, ActorRestarted)).msg.count == 1
        assert (await next_of(watch, ActorGaveUp)).msg.count == 2
        assert mesh.actors["broken"].state is ActorState.GAVE_UP


async def test_timer_crash_restarts_the_actor() -> None:
    clock = VirtualClock()

    class Bomb(Actor):
        starts = 0

        async def on_start(self) -> None:
            Bomb.starts += 1
            self.ctx.every(5.0, self.boom)

        async def boom(self) -> None:
            raise RuntimeError("timer fired")

    async with Mesh(clock=clock) as mesh:
        watch = await mesh.client("watch", subscribe=["kernel.actor."])
        await mesh.spawn(Bomb("bomb"))
        await mesh.advance_to(5.0)
        crashed = await next_of(watch, ActorCrashed)
        assert crashed.msg.error == "RuntimeError: timer fired"
        await next_of(watch, ActorRestarted)
        assert Bomb.starts == 2


async def test_quiesce_waits_for_a_chain_of_actors() -> None:
    sink = Counter("sink")
    async with Mesh(clock=VirtualClock()) as mesh:
        await mesh.spawn(sink)
        for i in range(5, 0, -1):
            await mesh.spawn(Relay(f"r{i}", "sink" if i == 5 else f"r{i + 1}"))
        client = await mesh.client("client")
        for k in range(10):
            await client.send("r1", Ping(0))
            await mesh.quiesce()
            assert sink.count == k + 1  # every hop done before quiesce returned


async def test_quiesce_looks_only_at_the_actors_that_did_something(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settle step's cost follows the work done, not the mesh's size: with 60 idle actors and a chain
    of 3 relays, quiesce after a send checks the idleness of the chain's actors, not of every actor; and
    an actor that leaves idleness (a message in its inbox, a timer) is always checked again."""
    from coral.kernel.actor import ActorRuntime

    checked: list[str] = []
    idle = ActorRuntime.idle.fget
    assert idle is not None
    monkeypatch.setattr(ActorRuntime, "idle", property(lambda rt: checked.append(rt.name) or idle(rt)))
    sink = Counter("sink")
    async with Mesh(clock=VirtualClock()) as mesh:
        for i in range(60):
            await mesh.spawn(Counter(f"idle{i}"))
        await mesh.spawn(sink)
        await mesh.spawn(Relay("r2", "sink"))
        await mesh.spawn(Relay("r1", "r2"))
        await mesh.spawn(Ticker("ticker", 5.0))
        client = await mesh.client("client")
        await mesh.quiesce()
        checked.clear()
        await mesh.quiesce()
        assert checked == []  # nothing happened: nothing to look at
        for k in range(3):
            await client.send("r1", Ping(0))
            await mesh.quiesce()
            assert sink.count == k + 1
            assert set(checked) <= {"r1", "r2", "sink"} and "sink" in checked
            checked.clear()
        await mesh.advance_to(12.0)  # the ticker fires at 5 and 10
        assert set(checked) <= {"ticker"} and "ticker" in checked


async def test_a_client_closing_during_a_sync_ends_it_at_once() -> None:
    """A client whose bus closes while it syncs: the sync fails as closed, at once (not after its timeout),
    and a closed client reports ``closed``."""
    from coral.kernel import BusClient, BusError

    async with Mesh(clock=VirtualClock()) as mesh:
        failed = anyio.Event()
        async with anyio.create_task_group() as tg:
            client = BusClient("closing", mesh.endpoints)
            async with client:

                async def sync_until_closed() -> None:
                    try:
                        while True:
                            await client.sync(timeout=30.0)
                    except BusError as exc:
                        assert "closed" in str(exc)
                        failed.set()

                tg.start_soon(sync_until_closed)
                await anyio.sleep(0.02)
            with anyio.fail_after(2):
                await failed.wait()
        assert client.closed
        with pytest.raises(BusError, match="closed"):
            await client.sync()
        await mesh.quiesce()


async def test_virtual_time_timers_fire_in_order_and_are_journaled(tmp_path: Path) -> None:
    journal = tmp_path / "bus.journal"
    async with Mesh(clock=VirtualClock(), journal=journal) as mesh:
        watch = await mesh.client("watch", subscribe=["test.kernel.tick"])
        await mesh.spawn(Ticker("fast", 2.0))
        await mesh.spawn(Ticker("slow", 3.0))
        await mesh.advance_to(7.0)
        await watch.sync()
        ticks = [e.msg for e in drain(watch)]
    assert ticks == [
        Tick("fast", 2.0),
        Tick("slow", 3.0),
        Tick("fast", 4.0),
        Tick("slow", 6.0),
        Tick("fast", 6.0),
    ]
    records = [r for r in read_journal(journal) if r.tag == "test.kernel.tick"]
    assert [(r.kind, r.source, r.dest, r.time, r.decode()) for r in records] == [
        ("publish", t.actor, "test.kernel.tick", t.time, t) for t in ticks
    ]
    seqs = [r.seq for r in read_journal(journal)]
    assert seqs == list(range(len(seqs)))


async def test_journal_records_directed_traffic(tmp_path: Path) -> None:
    journal = tmp_path / "bus.journal"
    async with Mesh(clock=VirtualClock(start=42.0), journal=journal) as mesh:
        await mesh.spawn(Counter("counter"))
        client = await mesh.client("client")
        await client.send("counter", Ping(1))
        assert await client.request("counter", Ping(2)) == Pong(2)
    kinds = [(r.kind, r.source, r.dest, r.tag, r.time) for r in read_journal(journal) if r.tag.startswith("test.")]
    assert kinds == [
        ("send", "client", "counter", "test.kernel.ping", 42.0),
        ("request", "client", "counter", "test.kernel.ping", 42.0),
        ("reply", "counter", "client", "test.kernel.pong", 42.0),
    ]
    tags = {r.tag for r in read_journal(journal)}
    assert {"kernel.peer.joined", "kernel.shutdown"} <= tags
    assert not tags & {"kernel.hello", "kernel.heartbeat", "kernel.sync", "kernel.sync_mark", "kernel.ready"}


async def test_shutdown_drains_the_inbox() -> None:
    gate = anyio.Event()
    handled: list[int] = []

    class Slow(Actor):
        async def handle(self, env: Envelope) -> None:
            await gate.wait()
            handled.append(env.msg.n)

        async def on_stop(self) -> None:
            handled.append(-1)

    async with Mesh() as mesh:
        handle = await mesh.spawn(Slow("slow", inbox_size=16))
        client = await mesh.client("client", subscribe=["kernel.shutdown"])
        for i in range(6):
            await client.send("slow", Ping(i))
        await client.sync()
        await handle.actor.ctx.bus.sync()  # all six are in the inbox (one of them being handled)
        mesh.request_shutdown("test over")
        assert mesh.state is MeshState.DRAINING
        assert (await next_of(client, ShutdownRequested)).msg == ShutdownRequested(KERNEL, "test over")
        await client.send("slow", Ping(99))  # after shutdown: not taken
        await client.sync()
        gate.set()
        assert await handle.wait() is ActorState.STOPPED
        with pytest.raises(MeshError, match="draining"):
            await mesh.spawn(Counter("late"))
    assert handled == [0, 1, 2, 3, 4, 5, -1]


async def test_shutdown_requested_over_the_bus() -> None:
    async with Mesh() as mesh:
        await mesh.spawn(Counter("counter"))
        tui = await mesh.client("tui")
        await tui.send(KERNEL, ShutdownRequested("tui", "user pressed q"))
        with anyio.fail_after(10):
            assert await mesh.wait_shutdown() == "user pressed q"
        assert mesh.state is MeshState.DRAINING


async def test_actor_can_request_shutdown() -> None:
    class Quitter(Actor):
        async def handle(self, env: Envelope) -> None:
            self.ctx.request_shutdown("done")

    async with Mesh() as mesh:
        await mesh.spawn(Quitter("quitter"))
        client = await mesh.client("client")
        await client.send("quitter", Ping(0))
        with anyio.fail_after(10):
            assert await mesh.wait_shutdown() == "done"


async def test_sleep_on_virtual_clock_counts_as_idle() -> None:
    woke_at: list[float] = []

    class Napper(Actor):
        async def handle(self, env: Envelope) -> None:
            await self.ctx.sleep(30.0)
            woke_at.append(self.ctx.now())

    async with Mesh(clock=VirtualClock()) as mesh:
        await mesh.spawn(Napper("napper"))
        client = await mesh.client("client")
        await client.send("napper", Ping(0))
        await mesh.quiesce()  # returns although the handler is still asleep on the clock
        assert woke_at == []
        await mesh.advance_to(100.0)
        assert woke_at == [30.0]


async def test_inject_delivers_inputs_one_at_a_time_in_virtual_time(tmp_path: Path) -> None:
    seen: list[tuple[float, str, int]] = []

    class Recorder(Actor):
        async def handle(self, env: Envelope) -> None:
            seen.append((self.ctx.now(), env.source, env.msg.n))
            if env.msg.n < 3:
                await self.ctx.send("recorder", Ping(env.msg.n + 10))  # follow-ups finish before the next input

    journal = tmp_path / "bus.journal"
    async with Mesh(clock=VirtualClock(), journal=journal) as mesh:
        await mesh.spawn(Recorder("recorder", subscribe=["test.kernel.ping"]))
        await mesh.inject(Ping(1), dest="recorder", at=5.0, source="demand-monitor")
        await mesh.inject(Ping(2), at=9.0)
        await mesh.inject(Ping(7), dest="recorder")
        with pytest.raises(MeshError, match="could not be delivered"):
            await mesh.inject(Ping(0), dest="nobody")
    assert seen == [
        (5.0, "demand-monitor", 1),
        (5.0, "recorder", 11),
        (9.0, KERNEL, 2),
        (9.0, "recorder", 12),
        (9.0, KERNEL, 7),
    ]
    pings = [(r.time, r.kind, r.source, r.dest) for r in read_journal(journal) if r.tag == "test.kernel.ping"]
    assert pings == [
        (5.0, "send", "demand-monitor", "recorder"),
        (5.0, "send", "recorder", "recorder"),
        (9.0, "publish", KERNEL, "test.kernel.ping"),
        (9.0, "send", "recorder", "recorder"),
        (9.0, "send", KERNEL, "recorder"),
    ]


async def test_shutdown_timeout_cancels_a_stuck_actor() -> None:
    entered = anyio.Event()

    class Stuck(Actor):
        async def handle(self, env: Envelope) -> None:
            entered.set()
            await anyio.sleep_forever()

        async def on_stop(self) -> None:
            raise AssertionError("a cancelled actor does not reach on_stop")

    async with Mesh(shutdown_timeout=0.2) as mesh:
        handle = await mesh.spawn(Stuck("stuck"))
        client = await mesh.client("client")
        await client.send("stuck", Ping(0))
        with anyio.fail_after(10):
            await entered.wait()
    assert handle.state is ActorState.STOPPED


async def test_error_in_the_mesh_block_propagates_unwrapped() -> None:
    counter = Counter("counter")
    with pytest.raises(KeyError, match="boom"):
        async with Mesh() as mesh:
            handle = await mesh.spawn(counter)
            raise KeyError("boom")
    assert handle.state is ActorState.STOPPED and not counter.stopped  # cancelled, not drained


async def test_mesh_rejects_misuse() -> None:
    mesh = Mesh()
    with pytest.raises(MeshError, match="not running"):
        await mesh.spawn(Counter("x"))
    async with Mesh() as mesh:
        with pytest.raises(MeshError, match="VirtualClock"):
            await mesh.advance_to(1.0)
    with pytest.raises(ValueError, match="max_restarts"):
        RestartPolicy(max_restarts=-1)
