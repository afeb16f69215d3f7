"""Crash recovery: the fleet state rebuilt from a journal alone, the provider's durable state, and
``coral up --resume`` after a real ``kill -9`` (and after a torn journal tail) with no node rented twice,
no instance duplicated and every request that arrived before the crash completed or counted as failed."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import coral.cli
from actors.cloud import CloudError, SimCloud
from actors.recovery import RecoveryError, fleet_state, load_recovery, provider_state_path
from coral.kernel import Journal, JournalRecord, TornTailWarning, read_journal
from coral.messages.fleet import FleetAction, FleetUpdate
from coral.messages.mesh import MeshResumed
from coral.messages.plan import NewPlan
from coral.messages.requests import ArrivalBatch

from .helpers import ROOT, World, journal_path

RUNNER = "import sys; from coral.cli import main; sys.exit(main(sys.argv[1:]))"


# -- fleet state from the journal alone -------------------------------------------------------------


@pytest.mark.parametrize("name", ["mesh-steady", "mesh-stockout", "mesh-surge"])
def test_fleet_state_is_rebuilt_from_the_journal_alone(name: str) -> None:
    records = list(read_journal(journal_path(name)))
    updates = [i for i, r in enumerate(records) if r.tag == "fleet.update"]
    assert len(updates) >= 3
    for k in updates[:: max(1, len(updates) // 6)]:
        prefix = records[: k + 1]
        state = fleet_state(prefix)
        assert state == fleet_state(iter(prefix))  # a pure function of the records
        upd = records[k].decode()
        assert isinstance(upd, FleetUpdate)
        got = {(i.id, i.template_id, i.region, i.state, i.node_ids) for i in state.instances}
        assert got == {(i.id, i.template_id, i.region, i.state, i.node_ids) for i in upd.instances}
        assert state.fleet_seq == upd.seq and state.spent_usd == upd.spent_usd
        assert state.last_seq == records[k].seq and state.last_time == max(r.time for r in prefix)
        plans = [r.decode() for r in prefix if r.tag == "plan.new"]
        assert state.plan == (plans[-1] if plans else None)
        starts = [r.decode().instance for r in prefix if r.tag == "fleet.action" and r.decode().action == "start"]
        assert state.next_num == max((int(i[1:]) for i in starts), default=0)
        arrived = {s.id for r in prefix if r.tag == "req.arrivals" for s in r.decode().requests}
        assert {s.id for s in state.ledger.arrived} == arrived
        assert state.ledger.completed <= arrived and not state.ledger.completed & state.ledger.failed
    whole = fleet_state(records)
    assert whole.setup is not None and whole.ended is not None and whole.ended.reason == "end of scenario"


def test_fleet_state_sees_starts_a_crash_cut_off_before_the_fleet_update() -> None:
    records = list(read_journal(journal_path("mesh-surge")))
    k = next(i for i, r in enumerate(records) if r.tag == "fleet.action" and r.decode().action == "start" and i > 20)
    state = fleet_state(records[: k + 1])
    act = records[k].decode()
    assert act.instance in {i.id for i in state.unlisted_starts}
    assert act.instance not in {i.id for i in state.instances}


def test_load_recovery_refuses_what_cannot_be_resumed(tmp_path: Path) -> None:
    with pytest.raises(RecoveryError, match="ended cleanly"):
        copy = tmp_path / "done.journal"
        copy.write_bytes(journal_path("mesh-steady").read_bytes())
        load_recovery(copy)
    with pytest.raises(RecoveryError, match="no such journal file"):
        load_recovery(tmp_path / "none.journal")
    empty = tmp_path / "empty.journal"
    Journal.open(empty).close()
    with pytest.raises(RecoveryError, match=r"no mesh\.setup record"):
        load_recovery(empty)


def test_provider_state_is_durable_and_checked(tmp_path: Path) -> None:
    from coral.messages.market import MarketUpdate

    path = tmp_path / "cloud.json"
    cloud = SimCloud(provision_s=10.0, seed=3, state_file=path)
    cloud.avail = {("r", "a"): 3}
    n1 = cloud.provision("r", "a", 0.0, tags={"coral.instance": "i1"})
    n2 = cloud.provision("r", "a", 0.0)
    assert n1 and n2
    cloud.release(n2, 1.0)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = SimCloud(provision_s=10.0, seed=99)
    again.load_state(path)
    assert [(n.id, n.state, n.tags) for n in again.alive()] == [(n1, "provisioning", {"coral.instance": "i1"})]
    assert again.nodes[n2].state == "released"
    again.avail = {("r", "a"): 3}
    assert again.provision("r", "a", 2.0) == "n3"  # ids go on: never one rented before
    assert again.rng.bit_generator.state == SimCloud(seed=3).rng.bit_generator.state
    assert isinstance(MarketUpdate, type)
    path.write_text("{not json")
    with pytest.raises(CloudError, match="unreadable provider state"):
        SimCloud().load_state(path)
    path.write_text(json.dumps({"version": 1, "kind": "StaticHosts", "nodes": []}))
    with pytest.raises(CloudError, match="not of a SimCloud"):
        SimCloud().load_state(path)
    with pytest.raises(CloudError, match="no provider state file"):
        SimCloud().load_state(tmp_path / "none.json")


# -- kill -9 and resume -----------------------------------------------------------------------------


def _last_time(path: Path) -> float:
    if not path.exists():
        return -1e9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)
        t = -1e9
        try:
            for r in read_journal(path):
                t = max(t, r.time)
        except Exception:
            return t
    return t


def _crash(world: World, journal: Path, at: float, *extra: str) -> None:
    """Run `coral up --record` in a subprocess and SIGKILL it once the journal reaches kernel time ``at``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", RUNNER, "up", "--scenario", "mesh-steady", "--store", str(world.store), "--no-build",
           "--no-deadline", "--bind", "tcp://127.0.0.1:0", "--no-status", "--speed", "25", "--record", str(journal),
           *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while _last_time(journal) < at:
            assert proc.poll() is None, f"coral up ended before the crash: {proc.stderr.read() if proc.stderr else ''}"
            assert time.monotonic() < deadline, "coral up did not reach the crash time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _resume(world: World, journal: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[dict[str, Any], str]:
    capsys.readouterr()
    args = ["up", "--resume", str(journal), "--store", str(world.store), "--no-build", "--speed", "max",
            "--bind", "inproc", "--json", *extra]  # fmt: skip
    assert coral.cli.main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def check_resumed(journal: Path, summary: dict[str, Any]) -> MeshResumed:
    """The invariants of a resumed run, from its journal, provider state and summary."""
    records: list[JournalRecord] = list(read_journal(journal))
    tags = Counter(r.tag for r in records)
    assert tags["mesh.setup"] == 1 and tags["mesh.resumed"] == 1 and tags["mesh.end"] == 1
    k = next(i for i, r in enumerate(records) if r.tag == "mesh.resumed")
    resumed = records[k].decode()
    assert isinstance(resumed, MeshResumed)
    pre, post = records[:k], records[k:]
    seqs = [r.seq for r in records]
    assert seqs == list(range(len(records)))  # appended to the same journal, numbering going on

    # No instance duplicated: one start per id, ever; adopted ones were not started again.
    acts = [r.decode() for r in records if r.tag == "fleet.action"]
    starts = Counter(a.instance for a in acts if isinstance(a, FleetAction) and a.action == "start")
    assert all(n == 1 for n in starts.values()), starts
    adopted = [a.instance for a in acts if a.action == "adopt"]
    assert sorted(adopted) == sorted(resumed.adopted)
    post_starts = {a.instance for r in post if r.tag == "fleet.action" and (a := r.decode()).action == "start"}
    assert not post_starts & set(resumed.adopted)
    # Until the resumed run's first plan nothing starts; from then on no (deployment, template, region)
    # holds more live instances than the plan wants, besides the bridges the supervisor keeps on their way
    # (recorded as ``keep``: surplus instances still provisioning or loading while their deployment serves
    # too little; see actors/supervisor.py).
    first_plan = next(i for i, r in enumerate(post) if r.tag == "plan.new")
    assert not [r for r in post[:first_plan] if r.tag == "fleet.action" and r.decode().action == "start"]
    target: dict[tuple[str, str, str], int] = {}
    bridges: set[str] = set()
    for r in post[first_plan:]:
        if r.tag == "plan.new":
            msg = r.decode()
            assert isinstance(msg, NewPlan)
            target = msg.plan.counts()
        elif r.tag == "fleet.action" and (act := r.decode()).action == "keep":
            bridges.add(act.instance)
        elif r.tag == "fleet.update":
            upd = r.decode()
            on_way = {i.id for i in upd.instances if i.id in bridges and i.state in ("provisioning", "loading")}
            live = Counter(
                i.key for i in upd.instances if i.state in ("provisioning", "loading", "serving") and i.id not in on_way
            )
            assert all(n <= target.get(key, 0) for key, n in live.items()), (live, target)

    # No node rented twice: each node belongs to one instance for its whole life, and the provider
    # never has two live nodes for the same instance stage.
    owner: dict[str, str] = {}
    for r in records:
        if r.tag == "fleet.update":
            for i in r.decode().instances:
                for nid in i.node_ids:
                    assert owner.setdefault(nid, i.id) == i.id, f"node {nid} in {owner[nid]} and {i.id}"
    state = json.loads(provider_state_path(journal).read_text())
    live_slots = Counter(
        (n["tags"].get("coral.instance"), n["tags"].get("coral.stage"))
        for n in state["nodes"]
        if n["state"] in ("provisioning", "running")
    )
    assert all(n == 1 for n in live_slots.values()), live_slots
    ids = [n["id"] for n in state["nodes"]]
    assert len(ids) == len(set(ids))

    # Every request that arrived before the crash completed or failed, once.
    ledger = fleet_state(pre).ledger
    assert resumed.resubmitted == len(ledger.open)
    pre_ids = {s.id for s in ledger.arrived}
    new_ids: list[int] = []
    resubmitted: list[int] = []
    for r in post:
        if r.tag == "req.arrivals":
            b = r.decode()
            assert isinstance(b, ArrivalBatch)
            (resubmitted if b.resubmitted else new_ids).extend(s.id for s in b.requests)
    assert sorted(resubmitted) == sorted(s.id for s in ledger.open)
    assert not set(new_ids) & pre_ids and len(new_ids) == len(set(new_ids))
    dep = summary["deployments"]["chat-8b"]
    assert dep["open"] == 0 and dep["arrivals"] == dep["completed"] + dep["failed"]
    assert dep["arrivals"] == len(resubmitted) + len(new_ids)
    pc = summary["resumed"]["pre_crash"]["chat-8b"]
    assert pc["arrived"] == pc["completed"] + pc["failed"] + pc["resubmitted"] == len(pre_ids)
    return resumed


@pytest.mark.slow
def test_kill_9_then_resume_loses_nothing(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = tmp_path / "run.journal"
    _crash(world, journal, 40.0)
    before = json.loads(provider_state_path(journal).read_text())
    rented = {n["id"] for n in before["nodes"] if n["state"] in ("provisioning", "running")}
    assert rented, "the crash left no node rented: nothing to reconcile"
    summary, err = _resume(world, journal, capsys)
    assert "torn tail" not in err
    resumed = check_resumed(journal, summary)
    assert summary["reason"] == "end of scenario" and summary["bus_errors"] == 0
    assert resumed.at >= 40.0 - 1 and not resumed.lost
    # every node the provider still ran was adopted (as part of an instance) or released
    adopted_nodes = {n for i in fleet_state(read_journal(journal)).instances for n in i.node_ids}
    assert rented <= adopted_nodes | set(resumed.released) | _released_later(journal)


def _released_later(journal: Path) -> set[str]:
    state = json.loads(provider_state_path(journal).read_text())
    return {n["id"] for n in state["nodes"] if n["state"] in ("released", "dead")}


@pytest.mark.slow
def test_torn_tail_then_resume_warns_and_reconciles(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "run.journal"
    _crash(world, journal, 60.0)
    size = journal.stat().st_size
    boundaries = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)
        records = list(read_journal(journal))
    rng = random.Random(20261129)
    cut = rng.randrange(size // 2, size - 1)
    offsets = [12]
    for r in records:  # record boundaries, to make sure the cut tears a record
        from coral.kernel.journal import RECORD_HEAD, _encoder

        payload = _encoder.encode((r.seq, r.time, r.kind, r.source, r.dest, r.tag, r.body, r.corr))
        offsets.append(offsets[-1] + RECORD_HEAD.size + len(payload))
    boundaries = set(offsets)
    while cut in boundaries:
        cut += 1
    with open(journal, "r+b") as f:
        f.truncate(cut)
    kept = max(b for b in boundaries if b < cut)
    summary, err = _resume(world, journal, capsys, "--unknown-nodes", "adopt")
    assert f"torn tail at byte offset {kept}: dropped {cut - kept} bytes" in err
    resumed = check_resumed(journal, summary)
    assert summary["resumed"]["torn_bytes"] == cut - kept
    assert summary["reason"] == "end of scenario" and resumed.resubmitted >= 0


@pytest.mark.slow
def test_resume_marks_vanished_nodes_lost_and_releases_unknown_ones(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "run.journal"
    _crash(world, journal, 40.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)
        known = fleet_state(read_journal(journal))
    path = provider_state_path(journal)
    state = json.loads(path.read_text())
    gone = known.instances[0].node_ids[0]
    for n in state["nodes"]:
        if n["id"] == gone:
            n["state"] = "dead"  # the provider lost it while the kernel was down
    region = known.instances[0].region
    state["next"] += 1
    stranger = f"n{state['next']}"
    state["nodes"].append(
        {"id": stranger, "region": region, "node": "g6.xlarge", "ready_at": 0.0, "state": "running", "tags": {}}
    )
    path.write_text(json.dumps(state))
    summary, _ = _resume(world, journal, capsys, "--unknown-nodes", "release")
    resumed = check_resumed(journal, summary)
    assert gone in resumed.lost and stranger in resumed.released
    assert known.instances[0].id not in resumed.adopted
    lost = [r.decode() for r in read_journal(journal) if r.tag == "fleet.node_lost"]
    assert any(m.node_id == gone and m.cause == "gone after crash" for m in lost)
    final = json.loads(path.read_text())
    assert next(n for n in final["nodes"] if n["id"] == stranger)["state"] == "released"


def test_resume_refuses_bad_arguments(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["up", "--store", str(world.store), "--no-build", "--bind", "inproc"]
    j = tmp_path / "crashed.journal"
    j.write_bytes(journal_path("mesh-steady").read_bytes())
    assert coral.cli.main([*base, "--resume", str(j), "--record", str(tmp_path / "x.journal")]) == 2
    assert "--record: not with --resume" in capsys.readouterr().err
    assert coral.cli.main([*base, "--resume", str(j)]) == 2
    assert "crashed.journal.cloud.json: no provider state next to the journal" in capsys.readouterr().err
    provider_state_path(j).write_text("{}")
    assert coral.cli.main([*base, "--resume", str(j)]) == 2
    assert "ended cleanly" in capsys.readouterr().err
    assert coral.cli.main([*base, "--resume", str(tmp_path / "none.journal")]) == 2
    assert "no such journal file" in capsys.readouterr().err


def test_resume_applies_the_operators_lasting_commands_again(world: World, tmp_path: Path) -> None:
    from actors.compose import CoralMesh, ResumeFeed
    from actors.compose import world_of as world_from
    from coral.kernel import encode
    from coral.messages.control import ALLOCATOR, OPERATOR, PauseAllocator, Replan, SetSlo

    records = list(read_journal(journal_path("mesh-steady")))
    cut = next(i for i, r in enumerate(records) if r.time >= 30.0)
    j = tmp_path / "cmd.journal"
    with Journal.open(j) as out:
        for r in records[:cut]:
            out.append(r.time, r.kind, r.source, r.dest, r.tag, r.body, r.corr)
        for cmd in (SetSlo("chat-8b", 1.5, 0.08, 0.95, ref=-3), Replan(ref=-4), PauseAllocator(True, ref=-5)):
            tag, body = encode(cmd)
            out.append(30.0, "request", OPERATOR, ALLOCATOR, tag.decode(), body, 7)
    rec = load_recovery(j)
    assert rec.commands == (
        (ALLOCATOR, SetSlo("chat-8b", 1.5, 0.08, 0.95)),
        (ALLOCATOR, PauseAllocator(True)),
    )  # lasting settings, in order, without the pre-crash refs; the one-off re-plan is not repeated
    sc, cat, perf = world_from(rec.setup)
    cm = CoralMesh(rec.setup, sc, cat, perf)
    feed = ResumeFeed(cm.feed(), rec, rec.resume_at(rec.setup.timing.tick_s))  # type: ignore[arg-type]
    first = feed.take(rec.resume_at(1.0))
    sent = [(i.source, i.dest, i.msg) for i in first if i.source == OPERATOR]
    assert sent == [
        (OPERATOR, ALLOCATOR, SetSlo("chat-8b", 1.5, 0.08, 0.95)),
        (OPERATOR, ALLOCATOR, PauseAllocator(True)),
    ]
    resub = [i.msg for i in first if isinstance(i.msg, ArrivalBatch)]
    assert (
        resub and resub[-1].resubmitted and {s.id for s in resub[-1].requests} == {s.id for s in rec.fleet.ledger.open}
    )
