"""A prefill head polls its simulated engine only inside the engine's handoff window (``handoff_window``, at
``shared_instant``), not at each engine event: its handoffs come out at the same engine times as when it
polls at every event, and each is reported before its KV could reach a decode instance."""

from __future__ import annotations

import math

import numpy as np

from actors.base import HOP_S
from actors.worker import shared_instant
from coral.engines import StageAssignment
from coral.engines.sim import SimEngine
from coral.messages import WorkItem
from coral.messages.requests import Outcome
from coral.perf.roofline import NET_LATENCY_S
from coral.store import TemplateStore

from ..mesh.helpers import World


def _engine(world: World) -> SimEngine:
    d = world.scenario("mesh-steady").deployments[0]
    with TemplateStore(world.store, readonly=True) as store:
        tpl = min(
            (t for t in store.query(model="llama-3.1-8b") if t.mode == "prefill"), key=lambda t: (len(t.nodes), t.id)
        )
    eng = SimEngine(world.perf)
    eng.load(StageAssignment("p", d, tpl, 0, "r", head=True, warm=True), 0.0)
    eng.serve(0.0)
    return eng


def _requests(n: int) -> list[WorkItem]:
    """Arrivals over 20 s with prompts from 30 to 6,000 tokens (a prompt over the token budget takes several
    iterations; short ones share one)."""
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(20.0 / n, n))
    prompts = rng.integers(30, 6000, n)
    return [WorkItem(i, "chat-8b", float(t[i]), float(t[i]), int(prompts[i]), 100) for i in range(n)]


def _run(eng: SimEngine, items: list[WorkItem], *, every_event: bool) -> tuple[list[tuple[Outcome, float]], int]:
    """Submit each item at its arrival and poll at every engine event, or only at the handoff window's shared
    instant; return each outcome with the time it was polled, and the number of polls."""
    out: list[tuple[Outcome, float]] = []
    polls = 0
    pending = list(items)
    now = 0.0
    while True:
        nxt = eng.next_event_at() if every_event else None
        if not every_event:
            w = eng.handoff_window()
            nxt = shared_instant(*w) if w is not None else None
        arrival = pending[0].t_arr if pending else math.inf
        at = min(arrival, nxt if nxt is not None else math.inf)
        if at == math.inf:
            return out, polls
        assert at > now or at == arrival
        now = at
        if pending and arrival == at:
            eng.submit([pending.pop(0)], at)
        polls += 1
        out += [(o, at) for o in eng.poll(at)]


def test_the_prefill_head_reports_every_handoff_within_its_transfer_with_fewer_polls(world: World) -> None:
    items = _requests(120)
    ref, ref_polls = _run(_engine(world), items, every_event=True)
    eng = _engine(world)
    got, polls = _run(eng, items, every_event=False)
    assert [o for o, _ in got] == [o for o, _ in ref]  # the same outcomes, at the same engine times
    handoffs = [(o, at) for o, at in got if o.kind == "handoff"]
    assert len(handoffs) == len(items)
    m = eng.model
    assert m is not None
    prompt = {i.id: i.prompt for i in items}
    for o, at in handoffs:  # reported after it happened, before its KV can reach any decode instance
        assert o.t <= at <= o.t + NET_LATENCY_S + prompt[o.id] * m.kv_bytes / m.inst.min_nic
    assert max(at - o.t for o, at in handoffs) > HOP_S  # the transfer's slack is used, not one hop
    n = len(items)  # a poll at each arrival either way
    assert polls - n < 0.9 * (ref_polls - n)  # deterministic here: 142 against 176


def test_shared_instant_takes_the_coarsest_grid_point_in_the_window() -> None:
    assert shared_instant(10.3, 11.2) == 11.0
    assert shared_instant(10.3, 10.6) == 10.5
    assert shared_instant(10.3, 10.4) == 10.375
    assert shared_instant(10.0, 10.0) == 10.0
    lo = 10.0 + HOP_S / 3
    assert shared_instant(lo, lo + HOP_S / 10) == lo  # no grid point inside: its start
    assert shared_instant(lo, lo + HOP_S) == 10.0 + HOP_S
