"""Recovery after a crash: the fleet's durable state rebuilt from a journal, and the resume plan.

``fleet_state(records)`` is a pure function of a journal's records. It rebuilds:

- the run's setup (``mesh.setup``, the first record) and where the journal ends (last time and sequence);
- the fleet: every instance the supervisor's last ``fleet.update`` listed as live, with its template,
  region, state and nodes, less what a later ``fleet.node_lost`` or ``fleet.action`` (stop, release, lost)
  removed; instances whose ``start`` action was journaled but no fleet update followed (their nodes are
  not in the journal: a resumed run finds them by their tags at the provider); the instance counter;
- the current plan (the last ``plan.new``), the last demand estimate and the money spent;
- the request ledger: every request the traffic feed delivered to the router (``req.arrivals``), and
  which of them an engine reported done or failed (``req.done``). The others were open at the crash.

``Recovery`` adds the journal's inputs (to skip what was already delivered) and a resumed journal's
segments (``mesh.resumed`` records, one per resume).

How a resumed run accounts for the requests open at the crash: the router's in-memory queues died with
the process, so each open request is handed again to the new router (its original arrival time kept,
so its latency counts from its first arrival), where it ends completed or failed with a reason like any
other; the summary reports ``pre_crash`` (arrived, completed, failed, resubmitted) next to the resumed
run's own totals, with ``arrived = completed + failed + resubmitted``.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
import warnings
from collections.abc import Iterable
from pathlib import Path

import attrs

from actors.cloud import TAG_DEPLOYMENT
from coral.errors import CoralError
from coral.kernel import DecodeError, Journal, JournalRecord, TornTailWarning, read_journal
from coral.kernel.journal import journal_info
from coral.messages.control import OWNERS
from coral.messages.demand import DemandUpdate
from coral.messages.fleet import FleetAction, FleetUpdate, NodeLost
from coral.messages.mesh import INPUT_TAGS, MeshEnd, MeshResumed, MeshSetup
from coral.messages.plan import NewPlan
from coral.messages.requests import ArrivalBatch, Completions, RequestSpec


class RecoveryError(CoralError):
    """A journal a run cannot be resumed from (no setup, a run that ended, ...)."""


@attrs.frozen
class InstanceState:
    """One instance as the journal last saw it; ``node_ids`` is empty if no fleet update listed it."""

    id: str
    num: int
    deployment: str
    template_id: str
    region: str
    state: str
    node_ids: tuple[str, ...]
    since: float


@attrs.frozen
class RequestLedger:
    """Requests delivered to the router before the crash, and their outcomes as the engines reported them."""

    arrived: tuple[RequestSpec, ...] = ()
    completed: frozenset[int] = frozenset()
    failed: frozenset[int] = frozenset()

    @property
    def open(self) -> tuple[RequestSpec, ...]:
        """The requests that neither completed nor failed before the crash, by id."""
        done = self.completed | self.failed
        return tuple(r for r in self.arrived if r.id not in done)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per deployment: arrived, completed, failed, open."""
        out: dict[str, dict[str, int]] = {}
        for r in self.arrived:
            row = out.setdefault(r.deployment, {"arrived": 0, "completed": 0, "failed": 0, "open": 0})
            row["arrived"] += 1
            key = "completed" if r.id in self.completed else "failed" if r.id in self.failed else "open"
            row[key] += 1
        return dict(sorted(out.items()))


@attrs.frozen
class FleetState:
    """The fleet's durable state as of the end of a journal (see the module docstring)."""

    setup: MeshSetup | None
    last_time: float
    last_seq: int
    ended: MeshEnd | None
    instances: tuple[InstanceState, ...]
    unlisted_starts: tuple[InstanceState, ...]
    lost_nodes: tuple[str, ...]
    next_num: int
    plan: NewPlan | None
    demand: DemandUpdate | None
    fleet_seq: int
    spent_usd: float
    ledger: RequestLedger
    resumes: int

    @property
    def nodes(self) -> dict[str, tuple[str, int]]:
        """Node id -> (instance id, stage) of the live instances."""
        return {n: (i.id, k) for i in self.instances for k, n in enumerate(i.node_ids)}


def _num(iid: str) -> int:
    try:
        return int(iid.lstrip("i"))
    except ValueError:
        return 0


def fleet_state(records: Iterable[JournalRecord]) -> FleetState:
    """Rebuild the fleet's durable state from journal records (pure; see the module docstring).

    Raises RecoveryError if a fleet record does not decode (the journal is not from this version).
    """
    setup: MeshSetup | None = None
    end: MeshEnd | None = None
    last_time, last_seq = -math.inf, -1
    live: dict[str, InstanceState] = {}
    unlisted: dict[str, InstanceState] = {}
    lost_nodes: list[str] = []
    next_num = 0
    plan: NewPlan | None = None
    demand: DemandUpdate | None = None
    fleet_seq, spent = 0, 0.0
    arrived: dict[int, RequestSpec] = {}
    completed: set[int] = set()
    failed: set[int] = set()
    resumes = 0
    wanted = {"mesh.setup", "mesh.end", "mesh.resumed", "fleet.update", "fleet.action", "fleet.node_lost"}
    wanted |= {"plan.new", "dem.update", "req.arrivals", "req.done"}
    for r in records:
        last_time, last_seq = max(last_time, r.time), r.seq
        if r.tag not in wanted:
            continue
        try:
            msg = r.decode()
        except DecodeError as exc:
            raise RecoveryError(f"journal record {r.seq} ({r.tag}) does not decode: {exc}") from None
        if isinstance(msg, MeshSetup):
            setup = setup or msg
        elif isinstance(msg, MeshEnd):
            end = msg
        elif isinstance(msg, MeshResumed):
            resumes += 1
            end = None
        elif isinstance(msg, FleetUpdate):
            fleet_seq, spent = msg.seq, msg.spent_usd
            live = {
                i.id: InstanceState(
                    i.id, _num(i.id), i.deployment, i.template_id, i.region, i.state, i.node_ids, i.since
                )
                for i in msg.instances
            }
            for i in live.values():
                unlisted.pop(i.id, None)
                next_num = max(next_num, i.num)
        elif isinstance(msg, FleetAction):
            next_num = max(next_num, _num(msg.instance))
            if msg.action == "start" and msg.instance not in live:
                unlisted[msg.instance] = InstanceState(
                    msg.instance, _num(msg.instance), msg.deployment, msg.template_id, msg.region, "provisioning",
                    (), msg.at,
                )  # fmt: skip
            elif msg.action in ("stop", "release", "lost"):
                live.pop(msg.instance, None)
                unlisted.pop(msg.instance, None)
            elif msg.action in ("retire", "drain", "serving") and msg.instance in live:
                state = {"retire": "retiring", "drain": "draining", "serving": "serving"}[msg.action]
                live[msg.instance] = attrs.evolve(live[msg.instance], state=state)
        elif isinstance(msg, NodeLost):
            lost_nodes.append(msg.node_id)
        elif isinstance(msg, NewPlan):
            plan = msg
        elif isinstance(msg, DemandUpdate):
            demand = msg
        elif isinstance(msg, ArrivalBatch) and r.kind == "send":
            for spec in msg.requests:
                arrived.setdefault(spec.id, spec)
        elif isinstance(msg, Completions):
            for o in msg.outcomes:
                if o.kind == "done":
                    completed.add(o.id)
                elif o.kind == "failed":
                    failed.add(o.id)
    failed -= completed
    return FleetState(
        setup=setup,
        last_time=last_time if last_seq >= 0 else 0.0,
        last_seq=last_seq,
        ended=end,
        instances=tuple(sorted(live.values(), key=lambda i: i.num)),
        unlisted_starts=tuple(sorted(unlisted.values(), key=lambda i: i.num)),
        lost_nodes=tuple(lost_nodes),
        next_num=next_num,
        plan=plan,
        demand=demand,
        fleet_seq=fleet_seq,
        spent_usd=spent,
        ledger=RequestLedger(tuple(arrived[k] for k in sorted(arrived)), frozenset(completed), frozenset(failed)),
        resumes=resumes,
    )


LASTING_COMMANDS: tuple[str, ...] = (
    "ctl.demand",
    "ctl.availability",
    "ctl.price",
    "ctl.slo",
    "ctl.forbid",
    "ctl.pin",
    "ctl.pause",
    "ctl.churn",
)
"""Operator commands that set lasting state (overrides, SLOs, template rules, pause, churn): a resumed run
applies them again, in their order, so it goes on with the operator's settings. Drains and re-plans were
one-off actions and are not repeated."""


@attrs.frozen
class Recovery:
    """What ``coral up --resume`` needs from a journal: the fleet state, the inputs already delivered and
    the operator's lasting commands as ``(owner, command)`` in their order."""

    path: Path
    fleet: FleetState
    delivered: frozenset[tuple[str, bytes]]
    torn: TornTailWarning | None
    commands: tuple[tuple[str, object], ...] = ()
    complete: bool = False
    """Whether the journal ended with its end record (a run stopped cleanly, not a crash)."""
    provider: ProviderCheck | None = None
    """The saved provider state against the journal (``check_provider``), once checked."""

    @property
    def setup(self) -> MeshSetup:
        assert self.fleet.setup is not None
        return self.fleet.setup

    def resume_at(self, tick_s: float) -> float:
        """The tick at which the resumed run starts: the last whole tick the journal reached."""
        return float(math.floor(self.fleet.last_time / tick_s) * tick_s)


def provider_state_path(journal: str | os.PathLike[str]) -> Path:
    """Where a recorded run keeps its provider's durable state: ``JOURNAL.cloud.json``."""
    p = Path(journal)
    return p.with_name(p.name + ".cloud.json")


@attrs.frozen
class ProviderCheck:
    """The saved provider state against the journal: when each was last written (kernel time; None for
    a state saved before it kept its time), the nodes the provider runs that the journal's fleet does not
    know (rented after its last record) and the journal's nodes the provider no longer runs."""

    journal_at: float
    provider_at: float | None
    unknown: tuple[str, ...]
    gone: tuple[str, ...]

    @property
    def newer(self) -> bool:
        """The provider acted after the journal's last record: the journal lost records (cut or torn)."""
        return self.provider_at is not None and self.provider_at > self.journal_at

    @property
    def matches(self) -> bool:
        return not self.newer and not self.unknown and not self.gone

    def describe(self, unknown_nodes: str) -> str:
        """One line: whether the two agree, and how the resume reconciles them."""
        if self.matches:
            return f"provider state matches the journal (t={self.journal_at:g} s)"
        when = (
            f"provider state (t={self.provider_at:g} s) is newer than the journal's last record "
            f"(t={self.journal_at:g} s)"
            if self.newer
            else f"provider state differs from the journal (t={self.journal_at:g} s)"
        )
        what = [
            f"{len(self.unknown)} node(s) the journal does not know ({', '.join(self.unknown)}) will be "
            + ("adopted by their tags where whole" if unknown_nodes == "adopt" else "released"),
            f"{len(self.gone)} journal node(s) gone at the provider ({', '.join(self.gone)}) count as lost",
        ]
        done = "; ".join(w for w, n in zip(what, (self.unknown, self.gone), strict=True) if n)
        return f"{when}; reconciling: " + (done or "the nodes agree; decisions after the journal's end are lost")


def check_provider(fleet: FleetState, state_file: str | os.PathLike[str]) -> ProviderCheck:
    """Compare a saved provider state (``JOURNAL.cloud.json``) with the journal's fleet. Raises
    RecoveryError, in one line, when the file cannot be read or is of another run (nodes of deployments
    the journal's setup does not have)."""
    p = Path(state_file)
    try:
        data = json.loads(p.read_text())
        nodes = [(str(n["id"]), str(n["state"]), dict(n.get("tags", {}))) for n in data["nodes"]]
        at = data.get("at")
        provider_at = float(at) if at is not None else None
    except FileNotFoundError:
        raise RecoveryError(f"--resume: {p}: no provider state file") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RecoveryError(f"--resume: {p}: unreadable provider state: {type(exc).__name__}: {exc}") from None
    assert fleet.setup is not None
    try:
        deployments = {str(d.get("name", "")) for d in tomllib.loads(fleet.setup.scenario_toml).get("deployment", [])}
    except (tomllib.TOMLDecodeError, AttributeError):
        deployments = set()
    alive = {nid: tags for nid, st, tags in nodes if st in ("provisioning", "running")}
    foreign = sorted(n for n, t in alive.items() if t.get(TAG_DEPLOYMENT, "") not in deployments | {""})
    if deployments and foreign:
        raise RecoveryError(
            f"--resume: {p}: refused: node(s) {', '.join(foreign)} serve deployments that the journal's run does "
            "not have (the provider state of another run?)"
        )
    known = set(fleet.nodes)
    unknown = tuple(sorted((n for n in alive if n not in known), key=lambda n: (len(n), n)))
    gone = tuple(sorted((n for n in known if n not in alive), key=lambda n: (len(n), n)))
    return ProviderCheck(fleet.last_time, provider_at, unknown, gone)


def load_recovery(path: str | os.PathLike[str]) -> Recovery:
    """Open a crashed run's journal for resuming: truncate a torn tail (returned, not only warned), and
    rebuild its state. Raises RecoveryError for a journal without a setup or whose scenario ran to its end
    (a run stopped early, by a signal or ``--for``, may be resumed like a crashed one)."""
    p = Path(path)
    if not p.is_file():
        raise RecoveryError(f"--resume: {p}: no such journal file")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)
        with Journal.open(p) as j:
            torn = j.torn_tail
    complete = journal_info(p).complete
    delivered: set[tuple[str, bytes]] = set()
    commands: list[tuple[str, object]] = []
    recs = []
    for r in read_journal(p):
        recs.append(r)
        if r.tag in INPUT_TAGS and r.kind in ("send", "publish"):
            delivered.add((r.tag, r.body))
        elif r.tag in LASTING_COMMANDS and r.kind in ("send", "request") and r.dest in OWNERS.values():
            try:
                commands.append((r.dest, attrs.evolve(r.decode(), ref=0)))
            except DecodeError as exc:
                raise RecoveryError(f"journal record {r.seq} ({r.tag}) does not decode: {exc}") from None
    fleet = fleet_state(recs)
    if fleet.setup is None:
        raise RecoveryError(f"--resume: {p}: no mesh.setup record (not a journal of `coral up --record`)")
    if fleet.ended is not None and fleet.ended.reason == "end of scenario":
        raise RecoveryError(
            f"--resume: {p}: the run ended cleanly at t={fleet.ended.at:g} s ({fleet.ended.reason}); nothing to resume"
        )
    return Recovery(p, fleet, frozenset(delivered), torn, tuple(commands), complete)
