"""A stage worker that hangs: it stops heartbeating but keeps its bus connection. The supervisor finds it
within the heartbeat timeout, the provider ends its machine (and the wedged worker with it), the instance
is replaced and what it held is retried."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.compose import CoralMesh
from actors.feed import FAULT_SOURCE, Input
from actors.replay import decisions_of
from coral.kernel import ActorState, Mesh
from coral.messages import SUPERVISOR, FaultInjected, FleetAction, NewPlan, NodeLost

from .helpers import World
from .test_faults import FAST_CLOUD, REGION, all_accounted, final


async def test_hung_worker_is_found_by_heartbeat_and_replaced(world: World, tmp_path: Path) -> None:
    journal = tmp_path / "hang.journal"
    hang = Input(30.0, FAULT_SOURCE, SUPERVISOR, FaultInjected(30.0, "hang", REGION, "g5.xlarge", 1))
    seen: dict[str, Any] = {"hung": []}

    async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
        seen["mesh"], seen["cm"] = mesh, cm

    def on_step(t: float) -> None:
        mesh: Mesh = seen["mesh"]
        for name, handle in mesh.actors.items():
            w = handle.actor
            if name.startswith("worker-") and getattr(w, "state", "") == "hung" and handle.state is ActorState.RUNNING:
                seen["hung"].append((t, name, name in mesh.broker.peers))

    await world.run(
        "mesh-steady", options=FAST_CLOUD, inputs=[hang], journal=journal, on_start=on_start, on_step=on_step
    )
    timing = FAST_CLOUD.timing
    # While wedged, the worker stayed connected: the kernel still counted it as a live peer.
    assert seen["hung"], "no worker hung"
    names = {n for _, n, _ in seen["hung"]}
    assert len(names) == 1 and all(connected for *_, connected in seen["hung"])
    (name,) = names
    decisions = decisions_of(journal)
    (lost,) = [d.msg for d in decisions if isinstance(d.msg, NodeLost)]
    assert f"worker-{lost.node_id}" == name and lost.cause == "heartbeat"
    # Detected within the heartbeat timeout (plus the heartbeat period the hang may have begun in).
    assert 30.0 < lost.at <= 30.0 + timing.heartbeat_timeout_s + timing.heartbeat_s + timing.tick_s
    assert max(t for t, *_ in seen["hung"]) <= lost.at + 2 * timing.tick_s  # then ended with its machine
    assert seen["mesh"].actors[name].state is ActorState.STOPPED
    actions = [d.msg for d in decisions if isinstance(d.msg, FleetAction)]
    (gone,) = [a for a in actions if a.action == "lost"]
    replans = [d.msg.plan for d in decisions if isinstance(d.msg, NewPlan) and d.at > lost.at]
    assert replans and "fleet" in replans[0].trigger
    new = [a for a in actions if a.action == "start" and a.at >= lost.at]
    assert new and any(a.action == "serving" and a.instance == new[0].instance for a in actions)
    assert gone.instance != new[0].instance
    stats = final(journal)
    (dep,) = stats.deployments
    assert dep.retries > 0  # what the wedged instance held was placed again
    all_accounted(stats)
