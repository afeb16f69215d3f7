"""Prefill/decode in the mesh: every KV handoff reaches its decode engine before that engine's clock passes
the handoff's admission (its time plus its KV transfer), so it is admitted at its exact time, although the
decode engine runs only two hops (``DECODE_LAG_S``) behind the kernel clock and the prefill head reports
handoffs within their transfer time, not at each engine event; and a gateway request's tokens on a decode
instance reach the gateway within milliseconds of their engine times."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from actors.base import HOP_S
from actors.compose import CoralMesh, RunOptions, run_mesh
from actors.feed import Input, ListFeed, MergedFeed
from actors.worker import DECODE_LAG_S
from coral.engines.sim import SimEngine
from coral.gateway import GATEWAY_ID_BASE
from coral.kernel import Mesh, read_journal
from coral.messages import ArrivalBatch, RequestResults, RequestSpec, WorkItem
from coral.messages.control import ROUTER
from coral.messages.requests import GATEWAY
from coral.perf.roofline import NET_LATENCY_S

from .helpers import World

PD = RunOptions(seed=7, policy="pd-homo", deterministic=True)


class Recording(SimEngine):
    """The simulated engine, recording each handed-over request's submission: (engine time, admission time
    (the handoff plus its KV transfer), the engine's own clock, handoff time)."""

    def __init__(self, world: World, log: list[tuple[float, float, float, float]]) -> None:
        super().__init__(world.perf)
        self.log = log

    def submit(self, items: Sequence[WorkItem], now: float) -> None:
        m = self.model
        assert m is not None
        for i in items:
            if i.kv_nic > 0:
                bw = min(i.kv_nic, m.inst.min_nic)
                admit = i.avail + NET_LATENCY_S + (i.prompt + max(i.gen, 1) - 1) * m.kv_bytes / bw
                self.log.append((now, admit, m.now, i.avail))
        super().submit(items, now)


async def test_every_handoff_reaches_its_decode_engine_before_its_time(world: World, tmp_path: Path) -> None:
    log: list[tuple[float, float, float, float]] = []
    sc = world.scenario("mesh-steady")
    setup = world.setup("mesh-steady", PD, sc)
    journal = tmp_path / "pd.journal"
    res = await run_mesh(
        setup, sc, world.catalog, world.perf, journal=journal, engine_factory=lambda _n: Recording(world, log)
    )
    assert res.state.stats is not None
    (chat,) = res.state.stats.deployments
    assert chat.completed > 100 and chat.failed == 0
    assert len(log) > 100  # handed over, not served by an aggregated instance
    late = [(now, t) for now, t, _, _ in log if now > t]
    assert not late, f"{len(late)} of {len(log)} handoffs reached their decode engine after admission: {late[:3]}"
    assert all(clock <= t for _, t, clock, _ in log)
    assert max(t - now for now, t, _, _ in log) < 1.0  # well within a tick: the lag is two hops, not two ticks
    assert max(now - h for now, _, _, h in log) > HOP_S  # some were reported after their time, within the transfer
    assert DECODE_LAG_S == 2 * HOP_S


async def test_a_gateway_request_on_a_decode_instance_streams_within_milliseconds(world: World, tmp_path: Path) -> None:
    rid, at, out = GATEWAY_ID_BASE + 1, 60.3, 12
    sc = world.scenario("mesh-steady")
    setup = world.setup("mesh-steady", PD, sc)
    cm0 = CoralMesh(setup, sc, world.catalog, world.perf)
    spec = RequestSpec(rid, "chat-8b", at, 200, out)
    feed = MergedFeed(cm0.feed(), ListFeed([Input(at, GATEWAY, ROUTER, ArrivalBatch(at, at, (spec,), reply=True))]))

    async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
        await mesh.client(GATEWAY)

    journal = tmp_path / "pd-gw.journal"
    await run_mesh(setup, sc, world.catalog, world.perf, journal=journal, feed=feed, until=90.0, on_start=on_start)
    relays = []
    for r in read_journal(journal):
        if r.tag == "req.result":
            msg = r.decode()
            assert isinstance(msg, RequestResults)
            relays += [(r.time, o) for o in msg.outcomes if o.id == rid]
    assert [o.kind for _, o in relays] == ["progress"] * (out - 1) + ["done"]
    done_t, done = relays[-1]
    assert done.t < done_t <= done.t + DECODE_LAG_S + 2 * HOP_S  # the last token: its engine time, a few hops
    assert [o.tokens for _, o in relays[:-1]] == list(range(1, out))
    first_t, first = relays[0]
    assert first.t == first.t_first < first_t <= first.t_first + HOP_S  # the first token, at its handoff
    for t, o in relays[1:-1]:  # the decode instance's: reported at its engine time plus the lag, relayed a hop later
        assert o.t < t <= o.t + HOP_S
