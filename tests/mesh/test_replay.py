"""Deterministic replay: the committed journals replay exactly, re-recording reproduces them, and a
journal whose decisions were altered is caught with a readable diff."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from actors.replay import ReplayError, compare, decisions_of, read_recording, replay_journal
from coral.kernel import Journal, encode, read_journal
from coral.messages import FleetAction, NewPlan, RoutingStats

from .helpers import RECORD_OPTIONS, SCENARIOS, World, journal_path


def final_stats(path: Path) -> RoutingStats:
    (last,) = [d.msg for d in decisions_of(path) if isinstance(d.msg, RoutingStats) and d.msg.final]
    return last


@pytest.mark.parametrize("name", SCENARIOS)
async def test_committed_journal_replays_exactly(name: str) -> None:
    path = journal_path(name)
    report = await replay_journal(path)
    assert report.ok, "\n".join(report.diffs)
    assert report.counts["plan.new"] >= 4 and report.counts["req.stats"] > 20 and report.inputs > 50
    for d in final_stats(path).deployments:  # every arrival ended completed or failed with a reason
        assert d.arrivals > 150 and d.arrivals == d.completed + d.failed
        assert d.in_flight == d.queued == 0 and sum(d.failed_by.values()) == d.failed


def test_committed_journals_show_their_scenarios() -> None:
    stock = read_recording(journal_path("mesh-stockout"))
    tags = [d.tag for d in stock.decisions]
    assert "fleet.node_lost" in tags
    triggers = [d.msg.plan.trigger for d in stock.decisions if d.tag == "plan.new"]
    assert "market" in triggers and "fleet" in triggers
    surge = read_recording(journal_path("mesh-surge"))
    assert sum(d.tag == "dem.update" for d in surge.decisions) >= 5
    starts = [d for d in surge.decisions if isinstance(d.msg, FleetAction) and d.msg.action == "start"]
    assert len(starts) >= 3


async def test_re_recording_reproduces_the_committed_journal(world: World, tmp_path: Path) -> None:
    new = tmp_path / "again.journal"
    await world.record("mesh-stockout", new)
    assert compare(decisions_of(journal_path("mesh-stockout")), decisions_of(new)) == []


def tamper(src: Path, dst: Path) -> None:
    """Copy a journal, changing the reason of its first fleet.action."""
    done = False
    with Journal.open(dst) as j:
        for r in read_journal(src):
            body = r.body
            if r.tag == "fleet.action" and not done:
                body = encode(attrs.evolve(r.decode(), reason="tampered"))[1]
                done = True
            j.append(r.time, r.kind, r.source, r.dest, r.tag, body, r.corr)


async def test_an_altered_decision_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.journal"
    tamper(journal_path("mesh-steady"), bad)
    report = await replay_journal(bad)
    assert not report.ok
    (diff,) = report.diffs
    assert diff.startswith("fleet.action #1 (t=-8.99707)") and "reason: 'tampered' -> 'plan 1'" in diff


async def test_a_journal_without_a_setup_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plain.journal"
    with Journal.open(path) as j:
        j.append(0.0, "publish", "x", "mkt.update", "mkt.update", b"\x90")
    with pytest.raises(ReplayError, match=r"no mesh\.setup record before 'mkt\.update'"):
        await replay_journal(path)
    bad = tmp_path / "bad.journal"
    with Journal.open(bad) as j:
        j.append(0.0, "publish", "mesh", "mesh.setup", "mesh.setup", b"\x90")
    with pytest.raises(ReplayError, match=r"record 0 \(mesh.setup\) does not decode"):
        await replay_journal(bad)


async def test_solves_cut_by_the_wall_clock_replay_with_their_recorded_effort(world: World, tmp_path: Path) -> None:
    journal = tmp_path / "cut.journal"
    options = attrs.evolve(RECORD_OPTIONS, deterministic=False, deadline_s=1e-4)
    await world.run("mesh-surge", options=options, journal=journal, until=80.0)
    published = [(d.at, d.msg.plan) for d in decisions_of(journal) if isinstance(d.msg, NewPlan)]
    plans = [p for _, p in published]
    assert any(p.effort for p in plans)  # at least one solve stopped at the deadline, with its effort recorded
    assert all(at == p.at + 1e-4 for at, p in published)  # each published at its start + the deadline
    report = await replay_journal(journal)
    assert report.ok, "\n".join(report.diffs)


async def test_under_a_deadline_the_mesh_runs_while_a_plan_is_in_flight_and_replays(
    world: World, tmp_path: Path
) -> None:
    """Each plan is published at its start + the deadline D; the mesh's other actors act in between (the
    clock is not held for the solve), and the run replays exactly."""
    journal = tmp_path / "flight.journal"
    d = 1.5  # past a tick, where the feed's arrivals enter and the router dispatches them
    options = attrs.evolve(RECORD_OPTIONS, deterministic=False, deadline_s=d)
    await world.run("mesh-surge", options=options, journal=journal, until=60.0)
    decisions = decisions_of(journal)
    published = [(x.at, x.msg.plan) for x in decisions if isinstance(x.msg, NewPlan)]
    assert len(published) >= 2 and all(at == p.at + d for at, p in published)
    later = [(at, p) for at, p in published if p.at > 0]  # after the warm-up, when requests flow
    assert later
    records = list(read_journal(journal))
    for at, p in later:
        assert any(p.at < r.time < at and r.tag == "req.dispatch" for r in records), p.seq
    report = await replay_journal(journal)
    assert report.ok, "\n".join(report.diffs)
