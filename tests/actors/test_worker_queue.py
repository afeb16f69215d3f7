"""The stage worker's simulated engine times a queued request out ``queue_timeout_s`` after it began to wait
for its phase (its arrival, or its handoff's KV arriving), as the simulator does, not after its admission:
the router may have held it before, and two timeouts in a row would let it wait twice as long."""

from __future__ import annotations

import pytest

from coral.engines import StageAssignment
from coral.engines.sim import SimEngine
from coral.messages import WorkItem
from coral.store import TemplateStore

from ..mesh.helpers import World


@pytest.mark.parametrize("handoff", [False, True], ids=["arrival", "handoff"])
def test_a_request_held_before_admission_times_out_from_when_it_began_to_wait(world: World, handoff: bool) -> None:
    d = world.scenario("mesh-steady").deployments[0]
    mode = "decode" if handoff else "aggregated"
    with TemplateStore(world.store, readonly=True) as store:
        tpl = min(
            (t for t in store.query(model="llama-3.1-8b") if t.mode == mode and t.shape.mean_in == 512),
            key=lambda t: (len(t.nodes), t.id),
        )
    eng = SimEngine(world.perf)
    eng.load(StageAssignment("i", d, tpl, 0, "r", head=True, warm=True), 0.0)
    eng.serve(0.0)
    model = eng.model
    assert model is not None
    kv = (0, 1, 0.0, 1e9) if handoff else ()
    n = 0
    while any(len(p.waiting) < p.batch for p in model.inst.paths):  # long requests: every slot taken
        assert n < 4096, "the instance never filled"
        eng.submit([WorkItem(n, d.name, 99.0, 99.0, 200, 2000, *kv)], 100.0)  # a handoff's KV is there by 100 s
        eng.poll(100.0)
        n += 1
    t0 = 100.0 - 55.0  # held 55 s before it reaches the engine at 100 s
    old = WorkItem(n, d.name, t0, t0 if handoff else 100.0, 200, 10, *kv)
    fresh = WorkItem(n + 1, d.name, 99.0, 99.0, 200, 10, *kv)
    eng.submit([old, fresh], 100.0)
    out = [o for k in range(1, 30) for o in eng.poll(100.0 + k)]
    failed = {o.id: o for o in out if o.kind == "failed"}
    assert set(failed) == {n}  # the fresh one still waits
    assert failed[n].reason == "queue_timeout"
    assert t0 + 60.0 <= failed[n].t < t0 + 62.0  # 60 s after it began to wait, not 60 s after 100 s
