"""Faults: a stage worker killed mid-run, an actor that crashes, garbage frames sent to the kernel; and a
fleet of static hosts instead of the simulated cloud."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import attrs
import zmq

from actors.base import HOP_S
from actors.compose import CoralMesh
from actors.feed import FAULT_SOURCE, Input
from actors.replay import decisions_of
from coral.kernel import ActorState, Endpoints, Envelope, Mesh, read_journal
from coral.messages import (
    SUPERVISOR,
    CloudSetup,
    Completions,
    FaultInjected,
    FleetUpdate,
    Host,
    MarketUpdate,
    NewPlan,
    NodeLost,
    RoutingStats,
)

from .helpers import RECORD_OPTIONS, World

REGION = "aws-us-east-1"
REASONS = {
    "no_capacity",
    "no_decode_capacity",
    "retries_exhausted",
    "unfinished",
    "queue_timeout",
    "queue_full",
    "too_long",
}
FAST_CLOUD = attrs.evolve(RECORD_OPTIONS, cloud=CloudSetup(provision_s=5.0, startup_s=5.0))


def final(path: Path) -> RoutingStats:
    (s,) = [d.msg for d in decisions_of(path) if isinstance(d.msg, RoutingStats) and d.msg.final]
    return s


def all_accounted(stats: RoutingStats) -> None:
    for d in stats.deployments:
        assert d.arrivals > 100
        assert d.arrivals == d.completed + d.failed, d
        assert d.in_flight == d.queued == 0
        assert sum(d.failed_by.values()) == d.failed and set(d.failed_by) <= REASONS, d.failed_by


async def test_killed_worker_is_found_by_heartbeat_replanned_and_its_requests_retried(
    world: World, tmp_path: Path
) -> None:
    journal = tmp_path / "kill.journal"
    kill = Input(30.0, FAULT_SOURCE, SUPERVISOR, FaultInjected(30.0, "node_loss", REGION, "g5.xlarge", 1))
    seen: dict[str, Any] = {}

    async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
        seen["mesh"] = mesh

    await world.run("mesh-steady", options=FAST_CLOUD, inputs=[kill], journal=journal, on_start=on_start)
    decisions = decisions_of(journal)
    (lost,) = [d.msg for d in decisions if isinstance(d.msg, NodeLost)]
    timing = FAST_CLOUD.timing
    assert lost.cause == "heartbeat" and lost.node_type == "g5.xlarge"
    assert 30.0 + timing.heartbeat_timeout_s - timing.heartbeat_s <= lost.at <= 31.0 + timing.heartbeat_timeout_s + 1
    replans = [d.msg.plan for d in decisions if isinstance(d.msg, NewPlan) and d.at > lost.at]
    assert replans and "fleet" in replans[0].trigger and replans[0].at == lost.at + HOP_S
    stats = final(journal)
    (dep,) = stats.deployments
    assert dep.retries > 0  # what the dead instance held was placed again
    assert dep.completed > 0.8 * dep.arrivals  # the replacement served the retried requests
    all_accounted(stats)
    dead = f"worker-{lost.node_id}"
    assert seen["mesh"].actors[dead].state is ActorState.STOPPED
    tags = {r.tag for r in read_journal(journal)}
    assert "kernel.actor.crashed" not in tags  # a node loss is silence, not a crash


async def test_a_crashed_actor_is_restarted_and_the_run_goes_on(world: World, tmp_path: Path) -> None:
    journal = tmp_path / "crash.journal"
    crashed: list[float] = []

    async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
        router = cm.router
        assert router is not None
        original = router.on_message

        async def flaky(env: Envelope) -> None:
            if isinstance(env.msg, Completions) and router.ctx.now() >= 20.0 and not crashed:
                crashed.append(router.ctx.now())
                raise RuntimeError("router bug")
            await original(env)

        router.on_message = flaky  # type: ignore[method-assign]

    await world.run("mesh-steady", journal=journal, on_start=on_start)
    records = [(r.time, r.tag, r.decode()) for r in read_journal(journal) if r.tag.startswith("kernel.actor.")]
    assert [(t, tag) for t, tag, _ in records] == [
        (crashed[0], "kernel.actor.crashed"),
        (crashed[0], "kernel.actor.restarted"),
    ]
    assert all(m.actor == "router" and m.error == "RuntimeError: router bug" for _, _, m in records)
    stats = final(journal)
    all_accounted(stats)
    (dep,) = stats.deployments
    assert dep.failed_by.get("unfinished", 0) >= 1  # the completions lost with the crashed message
    assert [d.at for d in decisions_of(journal) if d.tag == "req.stats" and d.at > crashed[0]]


async def test_garbage_frames_are_reported_and_the_mesh_keeps_running(world: World, tmp_path: Path) -> None:
    journal = tmp_path / "garbage.journal"
    state: dict[str, Any] = {}

    async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
        state["router"] = mesh.endpoints.router
        state["errors"] = await mesh.client("errors", subscribe=["kernel.error"])

    async def on_step(t: float) -> None:
        if t != 20.0:
            return
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, b"intruder")
        sock.connect(state["router"])
        for frames in (
            [b"lonely"],
            [b"router", b"NOT A TAG", b"x"],
            [b"router", b"req.arrivals", b"\xff\xfe\xfd"],
            [b"nobody", b"req.arrivals", b"\x90"],
            [b"router", b"req.arrivals", b"\x90", b"\x00" * 3],
        ):
            sock.send_multipart(frames)
        seen = 0
        with anyio.fail_after(30):  # the kernel and the router read them in real time
            while seen < 5:
                await state["errors"].receive()
                seen += 1
        sock.close()
        ctx.term()

    eps = Endpoints("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
    await world.run("mesh-steady", journal=journal, on_start=on_start, on_step=on_step, endpoints=eps)
    errors = [r.decode() for r in read_journal(journal) if r.tag == "kernel.error"]
    reasons = " | ".join(e.reason for e in errors)
    assert "malformed envelope from intruder" in reasons
    assert "bad tag frame from intruder" in reasons
    assert "unknown destination 'nobody'" in reasons
    assert "malformed correlation frame" in reasons
    assert any(e.source == "router" and "from intruder" in e.reason for e in errors)  # the body, caught by the router
    all_accounted(final(journal))


async def test_static_hosts_serve_with_the_machines_given(world: World, tmp_path: Path) -> None:
    hosts = (Host("l4-a", REGION, "g6.xlarge"), Host("l4-b", REGION, "g6.xlarge"), Host("l40s", REGION, "g6e.xlarge"))
    options = attrs.evolve(RECORD_OPTIONS, cloud=CloudSetup(kind="hosts", hosts=hosts, startup_s=5.0))
    journal = tmp_path / "hosts.journal"
    await world.run("mesh-steady", options=options, journal=journal)
    decisions = decisions_of(journal)
    market = next(d.msg for d in decisions if isinstance(d.msg, MarketUpdate))
    assert {q.node: q.availability for q in market.quotes} == {"g6.xlarge": 2, "g6e.xlarge": 1, "g5.xlarge": 0}
    nodes = {n for d in decisions if isinstance(d.msg, FleetUpdate) for i in d.msg.instances for n in i.node_ids}
    assert nodes and nodes <= {h.name for h in hosts}
    all_accounted(final(journal))
