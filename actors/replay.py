"""Deterministic replay: run a journal's external inputs through a fresh mesh and check every decision.

A journal (``coral up --record``) starts with the run's ``mesh.setup`` and holds every message. The
external inputs are the records of ``mkt.quote``, ``req.arrivals``, ``req.finish`` and ``fleet.fault``
sent by the input feed, and the operator commands sent to their owners. ``replay_journal`` rebuilds the
mesh from the setup (on a virtual clock from the same start), delivers those inputs at their recorded
times, re-solves each plan with the solver effort the journal recorded, runs to the recorded end
(``mesh.end``) and compares the decisions (the published messages of ``DECISION_TAGS``) tag by tag, in
order. A plan's wall-clock solve time is not a decision and is ignored. A live run's plans land on their
answers (``plan.answer`` inputs, ``actors.allocator``): the replay delivers them at their recorded times,
and its allocator lands each plan then; a journal with plans and no answers was recorded before answers
were journaled, and its plans land at their start + the deadline (``Recording.landing``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from actors.allocator import effort_of
from actors.compose import RunResult, run_mesh, world_of
from actors.feed import Input, ListFeed
from coral.errors import CoralError
from coral.kernel import JournalRecord, read_journal
from coral.messages.control import OWNERS, is_command
from coral.messages.mesh import DECISION_TAGS, INPUT_SOURCES, INPUT_TAGS, MeshEnd, MeshSetup
from coral.messages.plan import NewPlan, PlanAnswer
from solvers.allocation import SolverEffort


class ReplayError(CoralError):
    """A journal that cannot be replayed (no setup record, a catalog that differs, ...)."""


@attrs.frozen
class Decision:
    """One published decision: its tag, kernel time, sender and message."""

    tag: str
    at: float
    source: str
    msg: Any


@attrs.frozen
class Recording:
    """What a journal holds, split for a replay."""

    setup: MeshSetup
    inputs: tuple[Input, ...]
    decisions: tuple[Decision, ...]
    end: MeshEnd | None
    last_time: float

    def efforts(self) -> dict[int, SolverEffort]:
        """Plan sequence -> the solver effort recorded with it."""
        return {d.msg.plan.seq: effort_of(d.msg.plan) for d in self.decisions if isinstance(d.msg, NewPlan)}

    def landing(self) -> str:
        """How the recorded run's plans landed (``actors.allocator.LANDINGS``): on their answers, unless the
        journal holds plans and no answer (recorded before answers were journaled, or deterministic, where
        a plan lands at its start)."""
        if any(isinstance(i.msg, PlanAnswer) for i in self.inputs):
            return "answer"
        return "deadline" if any(isinstance(d.msg, NewPlan) for d in self.decisions) else "answer"


@attrs.frozen
class ReplayReport:
    """The outcome of a replay: ``ok`` when every decision matched; ``diffs`` say where not."""

    ok: bool
    diffs: tuple[str, ...]
    counts: dict[str, int]
    end: float
    inputs: int
    result: RunResult | None = None


_OWNER_NAMES = frozenset(OWNERS.values())


def _is_input(r: JournalRecord) -> bool:
    if r.kind not in ("send", "request"):
        return False
    if r.tag in INPUT_TAGS:
        return r.source in INPUT_SOURCES
    return r.tag.startswith("ctl.") and r.dest in _OWNER_NAMES


def normalize(msg: Any) -> Any:
    """A decision with its non-decision parts (a plan's wall-clock solve time) blanked."""
    if isinstance(msg, NewPlan):
        return attrs.evolve(msg, plan=attrs.evolve(msg.plan, solve_s=0.0))
    return msg


def read_recording(path: str | os.PathLike[str]) -> Recording:
    """Split a journal into its setup, external inputs and decisions."""
    setup: MeshSetup | None = None
    end: MeshEnd | None = None
    inputs: list[Input] = []
    decisions: list[Decision] = []
    last = -float("inf")
    for r in read_journal(path):
        last = max(last, r.time)
        if setup is None and not r.tag.startswith("kernel."):
            if r.tag != "mesh.setup":
                raise ReplayError(f"{path}: no mesh.setup record before {r.tag!r}; not a journal of a coral mesh run")
            setup = _decode(path, r)
        elif r.tag == "mesh.setup":
            raise ReplayError(f"{path}: more than one mesh.setup record (two runs in one journal?)")
        elif r.tag == "mesh.end":
            end = _decode(path, r)
        elif r.tag == "mesh.resumed":
            raise ReplayError(
                f"{path}: record {r.seq} resumes the run after a crash (coral up --resume); a replay reproduces "
                "an uninterrupted run only (the crash lost in-memory state that no input records)"
            )
        elif _is_input(r):
            msg = _decode(path, r)
            if r.tag.startswith("ctl.") and not is_command(msg):
                continue
            inputs.append(Input(r.time, r.source, r.dest, msg))
        elif r.kind == "publish" and r.tag in DECISION_TAGS:
            decisions.append(Decision(r.tag, r.time, r.source, normalize(_decode(path, r))))
    if setup is None:
        raise ReplayError(f"{path}: no mesh.setup record; not a journal of a coral mesh run")
    return Recording(setup, tuple(inputs), tuple(decisions), end, last)


def _decode(path: str | os.PathLike[str], r: JournalRecord) -> Any:
    try:
        return r.decode()
    except CoralError as exc:
        raise ReplayError(f"{path}: record {r.seq} ({r.tag}) does not decode: {exc}") from None


def decisions_of(path: str | os.PathLike[str]) -> list[Decision]:
    """The decisions a journal recorded."""
    return [
        Decision(r.tag, r.time, r.source, normalize(r.decode()))
        for r in read_journal(path)
        if r.kind == "publish" and r.tag in DECISION_TAGS
    ]


def _flat(x: Any, prefix: str = "") -> dict[str, Any]:
    if attrs.has(type(x)):
        x = {f.name: getattr(x, f.name) for f in attrs.fields(type(x))}
    if isinstance(x, dict):
        out: dict[str, Any] = {}
        for k, v in x.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(x, list | tuple):
        out = {f"{prefix}.len": len(x)}
        for i, v in enumerate(x):
            out.update(_flat(v, f"{prefix}[{i}]"))
        return out
    return {prefix: x}


def describe_diff(a: Any, b: Any, limit: int = 6) -> str:
    """The fields in which two decisions differ, recorded -> replayed."""
    fa, fb = _flat(a), _flat(b)
    keys = [k for k in sorted(set(fa) | set(fb)) if fa.get(k, "<absent>") != fb.get(k, "<absent>")]
    parts = [f"{k}: {fa.get(k, '<absent>')!r} -> {fb.get(k, '<absent>')!r}" for k in keys[:limit]]
    if len(keys) > limit:
        parts.append(f"... and {len(keys) - limit} more fields")
    return "; ".join(parts)


def compare(expected: Iterable[Decision], actual: Iterable[Decision], *, per_tag: int = 3) -> list[str]:
    """Readable differences between two decision streams, compared per tag in order."""
    by_tag: dict[str, tuple[list[Decision], list[Decision]]] = {}
    for d in expected:
        by_tag.setdefault(d.tag, ([], []))[0].append(d)
    for d in actual:
        by_tag.setdefault(d.tag, ([], []))[1].append(d)
    diffs: list[str] = []
    for tag in sorted(by_tag):
        exp, act = by_tag[tag]
        shown = 0
        for i, (e, a) in enumerate(zip(exp, act, strict=False)):
            if (e.at, e.source, e.msg) == (a.at, a.source, a.msg):
                continue
            if shown < per_tag:
                where = f"t={e.at:g}" if e.at == a.at else f"t={e.at:g} recorded, t={a.at:g} replayed"
                what = describe_diff(e.msg, a.msg) if e.msg != a.msg else f"sender {e.source} -> {a.source}"
                diffs.append(f"{tag} #{i + 1} ({where}): {what}")
            shown += 1
        if shown > per_tag:
            diffs.append(f"{tag}: {shown - per_tag} more differing messages")
        if len(exp) != len(act):
            n = min(len(exp), len(act))
            extra = exp[n] if len(exp) > n else act[n]
            side = "the journal has" if len(exp) > len(act) else "the replay produced"
            diffs.append(
                f"{tag}: the journal has {len(exp)} messages, the replay {len(act)}; {side} more, "
                f"the first at t={extra.at:g}"
            )
    return diffs


async def replay_journal(
    path: str | os.PathLike[str], *, out: str | os.PathLike[str] | None = None, keep_result: bool = False
) -> ReplayReport:
    """Replay a journal (see the module docstring); ``out`` keeps the replay's own journal."""
    rec = read_recording(path)
    scenario, catalog, perf = world_of(rec.setup)
    until = rec.end.at if rec.end is not None else rec.last_time
    expected = list(rec.decisions)
    if rec.end is None:  # a run cut short: only decisions strictly before its last record are complete
        expected = [d for d in expected if d.at < until]
    with tempfile.TemporaryDirectory() as tmp:
        jpath = Path(out) if out is not None else Path(tmp) / "replay.journal"
        if jpath.exists():
            raise ReplayError(f"{jpath}: exists; give a new file for the replay's journal")
        result = await run_mesh(
            rec.setup,
            scenario,
            catalog,
            perf,
            journal=jpath,
            feed=ListFeed(rec.inputs),
            until=until,
            efforts=rec.efforts(),
            landing=rec.landing(),
        )
        actual = [d for d in decisions_of(jpath) if rec.end is not None or d.at < until]
    diffs = compare(expected, actual)
    counts: dict[str, int] = {}
    for d in expected:
        counts[d.tag] = counts.get(d.tag, 0) + 1
    return ReplayReport(not diffs, tuple(diffs), counts, until, len(rec.inputs), result if keep_result else None)


__all__: Sequence[str] = (
    "Decision",
    "Recording",
    "ReplayError",
    "ReplayReport",
    "compare",
    "decisions_of",
    "describe_diff",
    "normalize",
    "read_recording",
    "replay_journal",
)
