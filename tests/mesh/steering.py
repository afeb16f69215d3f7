"""Steering sequences run in the simulated mesh (scenario ``mesh-steer``), and what each did to the
deployments' serving capacity: shared by ``tests/mesh/test_steering.py`` and ``bench/steering.py``.

A sequence is a list of steps, each at a kernel time: an operator command (forbid the template a
deployment serves with, pin a deployment to another template, allow it again, a stockout of the node type
a deployment uses, a demand step) or a node loss (a fault of the node type a deployment uses). Steps
name their target by what the mesh runs when they fire, so the sequence means the same whatever the
planner chose. Capacity is ``coral.capacity.serving_capacity`` of each fleet update.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs

from actors.compose import CoralMesh, run_mesh
from actors.feed import FAULT_SOURCE
from actors.setup import RunOptions, library_for, make_setup
from actors.watch import RunState
from coral.capacity import serving_capacity
from coral.catalog import Catalog
from coral.kernel import Mesh, read_journal
from coral.messages import (
    OPERATOR,
    ROUTABLE_STATES,
    SUPERVISOR,
    CapacityShort,
    FaultInjected,
    FleetUpdate,
    ForbidTemplate,
    PinTemplate,
    SetAvailability,
    SetDemand,
    owner_of,
)
from coral.perf import PerfModel
from coral.scenario import load_scenario
from coral.store import TemplateStore
from coral.templates import Template

SCENARIO = "mesh-steer"
REGION = "aws-us-east-1"
Step = Callable[[RunState], tuple[str, str, object] | None]
"""A step: from what runs now, (destination, source, message) to send, or None to skip."""


def _serving(st: RunState, dep: str) -> list[tuple[str, tuple[str, ...]]]:
    assert st.fleet is not None
    return [
        (i.template_id, i.node_types) for i in st.fleet.instances if i.deployment == dep and i.state in ROUTABLE_STATES
    ]


def _command(make: Callable[[RunState], object | None]) -> Step:
    """A step that sends the operator command ``make`` gives (none: skipped) to its owner."""

    def step(st: RunState) -> tuple[str, str, object] | None:
        cmd = make(st)
        return (owner_of(cmd), OPERATOR, cmd) if cmd is not None else None

    return step


def _first_node(st: RunState, dep: str) -> str | None:
    s = _serving(st, dep)
    return s[0][1][0] if s else None


def forbid(dep: str, memo: dict[str, str]) -> Step:
    """Forbid the template ``dep`` serves with (remembered in ``memo`` for ``allow``)."""

    def make(st: RunState) -> object | None:
        s = _serving(st, dep)
        if not s:
            return None
        memo[dep] = s[0][0]
        return ForbidTemplate(s[0][0])

    return _command(make)


def allow(dep: str, memo: dict[str, str]) -> Step:
    """Allow again the template ``forbid`` forbade for ``dep``."""
    return _command(lambda st: ForbidTemplate(memo[dep], forbid=False) if dep in memo else None)


def pin(dep: str, templates: list[Template]) -> Step:
    """Pin ``dep`` to the first (by id) aggregated template it does not serve with."""

    def make(st: RunState) -> object | None:
        cur = {t for t, _ in _serving(st, dep)}
        ids = sorted(t.id for t in templates if t.mode == "aggregated" and t.id not in cur)
        return PinTemplate(dep, ids[0]) if ids else None

    return _command(make)


def unpin(dep: str) -> Step:
    """Unpin ``dep``."""
    return _command(lambda st: PinTemplate(dep, None))


def stockout(dep: str) -> Step:
    """Set the availability of the first node type ``dep`` serves on to 0."""
    return _command(lambda st: SetAvailability(REGION, n, 0) if (n := _first_node(st, dep)) else None)


def demand(dep: str, rps: float) -> Step:
    """Override ``dep``'s demand."""
    return _command(lambda st: SetDemand(dep, rps))


def lose(dep: str) -> Step:
    """A node loss of the first node type ``dep`` serves on."""

    def step(st: RunState) -> tuple[str, str, object] | None:
        n = _first_node(st, dep)
        return (SUPERVISOR, FAULT_SOURCE, FaultInjected(st.now, "node_loss", REGION, n, 1)) if n else None

    return step


def sequences(lib: dict[str, list[Template]]) -> dict[str, dict[float, Step]]:
    """The steering sequences tested, by name (times in kernel seconds)."""
    m: dict[str, str] = {}
    f: dict[str, str] = {}
    return {
        "forbid-code": {20.0: forbid("code-14b", f), 120.0: allow("code-14b", f)},
        "forbid-chat": {20.0: forbid("chat-8b", {})},
        "pin-allow": {20.0: pin("chat-8b", lib["chat-8b"]), 110.0: unpin("chat-8b")},
        "stockout": {20.0: stockout("code-14b")},
        "demand": {20.0: demand("chat-8b", 6.0), 100.0: demand("chat-8b", 1.0)},
        "loss": {30.0: lose("code-14b")},
        "mixed": {
            20.0: forbid("chat-8b", m),
            40.0: stockout("code-14b"),
            60.0: demand("code-14b", 2.5),
            80.0: lose("chat-8b"),
            130.0: allow("chat-8b", m),
        },
    }


def library(store: Path, catalog: Catalog) -> dict[str, list[Template]]:
    """The templates ``mesh-steer`` runs with from ``store``."""
    with TemplateStore(store, readonly=True) as s:
        return library_for(s, load_scenario(SCENARIO, catalog))


@attrs.frozen
class Outcome:
    """What a sequence did: per deployment, the least serving capacity from the first step on, once it
    first served (req/s), the kernel seconds it spent at zero after it first served, with no node of it
    lost and after a loss, and the ``fleet.unmet`` warnings (a deployment falling short)."""

    name: str
    min_capacity: dict[str, float]
    zero_s: dict[str, float]
    zero_after_loss_s: dict[str, float]
    warnings: int
    sent: tuple[tuple[float, str], ...]


async def run_sequence(
    name: str,
    steps: dict[float, Step],
    catalog: Catalog,
    perf: PerfModel,
    store: Path,
    journal: Path,
    *,
    until: float = 200.0,
) -> Outcome:
    """Run ``mesh-steer`` with ``steps`` sent at their times; measure capacity from the journal."""
    sc = load_scenario(SCENARIO, catalog)
    with TemplateStore(store, readonly=True) as s:
        setup = make_setup(sc, catalog, perf, library_for(s, sc), RunOptions(seed=7, deterministic=True))
    holder: dict[str, Mesh] = {}
    st = RunState()
    sent: list[tuple[float, str]] = []

    async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
        holder["mesh"] = mesh

    async def on_step(t: float) -> None:
        step = steps.get(t)
        if step is None:
            return
        out = step(st)
        if out is None:
            sent.append((t, "skipped"))
            return
        dest, source, msg = out
        sent.append((t, repr(msg)))
        holder["mesh"].send(dest, msg, source=source)

    await run_mesh(setup, sc, catalog, perf, journal=journal, until=until, state=st, on_start=on_start,
                   on_step=on_step)  # fmt: skip
    return measure(name, journal, min(steps), tuple(sent))


def measure(name: str, journal: Path, since: float, sent: tuple[tuple[float, str], ...] = ()) -> Outcome:
    """The capacity figures of a recorded run from kernel time ``since`` on (see ``Outcome``)."""
    lo: dict[str, float] = {}
    zero: dict[str, float] = {}
    zero_loss: dict[str, float] = {}
    warnings = 0
    prev: tuple[float, dict[str, float], set[str]] | None = None
    lost_deps: set[str] = set()
    inst_dep: dict[str, str] = {}

    def at_zero(until: float) -> None:  # the time at zero since the previous update
        if prev is None:
            return
        t0, pcap, started = prev
        for d in started:
            if pcap.get(d, 0.0) <= 1e-9:
                bucket = zero_loss if d in lost_deps else zero
                bucket[d] = bucket.get(d, 0.0) + until - t0

    for rec in read_journal(journal):
        if rec.tag == "mesh.end":  # the time from the last update to the end
            at_zero(rec.time)
        if rec.tag == "fleet.unmet":
            msg = rec.decode()
            assert isinstance(msg, CapacityShort)
            warnings += msg.short
        if rec.tag != "fleet.update":
            continue
        fu = rec.decode()
        assert isinstance(fu, FleetUpdate)
        for i in fu.instances:
            inst_dep[i.id] = i.deployment
        lost_deps |= {inst_dep[i] for i in fu.lost if i in inst_dep}
        cap = serving_capacity(fu.instances)
        at_zero(fu.at)
        started = set(prev[2]) if prev is not None else set()
        for d, c in cap.items():
            if c > 0:
                started.add(d)
                lost_deps.discard(d)
        if fu.at >= since:
            for d in started:
                lo[d] = min(lo.get(d, float("inf")), cap.get(d, 0.0))
        prev = (fu.at, cap, started)
    return Outcome(name, lo, zero, zero_loss, warnings, sent)
