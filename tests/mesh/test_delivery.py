"""Event-driven delivery (``actors.base``): a request reaches the router, its instance and the gateway
within a 1/1024 s hop each, not at the next tick, and a streamed request's tokens leave the worker one by
one at the simulated engine's times (a request whose client waits for the whole answer gets only its end);
the run stays deterministic."""

from __future__ import annotations

import itertools
from pathlib import Path

from actors.base import next_instant
from actors.compose import CoralMesh
from actors.feed import Input
from coral.gateway import GATEWAY_ID_BASE
from coral.kernel import Mesh, read_journal
from coral.messages import ArrivalBatch, Completions, Dispatch, RequestResults, RequestSpec
from coral.messages.control import ROUTER
from coral.messages.requests import GATEWAY

from .helpers import World

RID = GATEWAY_ID_BASE + 1
AT = 30.3  # between ticks
OUT = 12


async def test_a_gateway_request_is_placed_and_streamed_within_a_hop_per_message(world: World, tmp_path: Path) -> None:
    journal = tmp_path / "delivery.journal"
    spec = RequestSpec(RID, "chat-8b", AT, 200, OUT)
    inputs = [Input(AT, GATEWAY, ROUTER, ArrivalBatch(AT, AT, (spec,), reply=True))]

    async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
        await mesh.client(GATEWAY)  # where the router relays the request's progress

    await world.run("mesh-steady", inputs=inputs, journal=journal, on_start=on_start, until=60.0)
    dispatch, reports, relays = [], [], []
    for r in read_journal(journal):
        if r.tag not in ("req.dispatch", "req.done", "req.result"):
            continue
        msg = r.decode()
        if isinstance(msg, Dispatch) and any(i.id == RID for i in msg.items):
            dispatch.append(r.time)
        elif isinstance(msg, Completions):
            reports += [(r.time, o) for o in msg.outcomes if o.id == RID]
        elif isinstance(msg, RequestResults):
            relays += [(r.time, o) for o in msg.outcomes if o.id == RID]
    assert dispatch == [next_instant(AT)]  # the router placed it at its first instant after the arrival
    kinds = [o.kind for _, o in reports]
    assert kinds == ["progress"] * (OUT - 1) + ["done"]
    assert [o.tokens for _, o in reports[:-1]] == list(range(1, OUT))  # each token on its own
    times = [t for t, _ in reports]
    assert all(a < b for a, b in itertools.pairwise(times))
    assert reports[-1][1].t == times[-1]  # the last token left at its engine time
    assert reports[0][1].t_first == times[0]  # the first token left at its engine time
    assert next_instant(AT) < times[0] < next_instant(AT) + 2.0  # not at a tick: at the engine's time
    assert [t for t, _ in relays] == [next_instant(t) for t in times]  # relayed within a hop
    assert [o.kind for _, o in relays] == kinds


async def test_a_request_that_waits_for_the_whole_answer_gets_no_token_progress(world: World, tmp_path: Path) -> None:
    journal = tmp_path / "ends.journal"
    streamed, whole = RequestSpec(RID, "chat-8b", AT, 200, OUT), RequestSpec(RID + 1, "chat-8b", AT, 200, OUT)
    batch = ArrivalBatch(AT, AT, (streamed, whole), reply=True, ends_only=(whole.id,))
    inputs = [Input(AT, GATEWAY, ROUTER, batch)]

    async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
        await mesh.client(GATEWAY)

    await world.run("mesh-steady", inputs=inputs, journal=journal, on_start=on_start, until=60.0)
    items: dict[int, bool] = {}
    relayed: dict[int, list[str]] = {streamed.id: [], whole.id: []}
    for r in read_journal(journal):
        if r.tag not in ("req.dispatch", "req.result"):
            continue
        msg = r.decode()
        if isinstance(msg, Dispatch):
            items.update((i.id, i.progress) for i in msg.items if i.id in relayed)
        elif isinstance(msg, RequestResults):
            for o in msg.outcomes:
                relayed[o.id].append(o.kind)
    assert items == {streamed.id: True, whole.id: False}
    assert relayed[streamed.id] == ["progress"] * (OUT - 1) + ["done"]
    assert relayed[whole.id] == ["done"]
