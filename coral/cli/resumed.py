"""What a resumed run reports: the ``resumed`` part of ``coral up``'s summary, and its one-line text form."""

from __future__ import annotations

from typing import Any

from actors.recovery import Recovery
from coral.messages.mesh import MeshResumed


def resume_summary(resumed: MeshResumed, rec: Recovery | None) -> dict[str, Any]:
    """The ``resumed`` part of the summary: reconciliation and the pre-crash request ledger."""
    out: dict[str, Any] = {
        "at": resumed.at,
        "from_seq": resumed.from_seq,
        "adopted": list(resumed.adopted),
        "released_nodes": list(resumed.released),
        "lost_nodes": list(resumed.lost),
        "resubmitted": resumed.resubmitted,
        "torn_bytes": resumed.torn_bytes,
    }
    if rec is not None:
        out["journal_complete"] = rec.complete
        if rec.provider is not None:
            p = rec.provider
            out["provider"] = {
                "matches": p.matches,
                "newer_than_journal": p.newer,
                "provider_at": p.provider_at,
                "journal_at": p.journal_at,
                "unknown_nodes": list(p.unknown),
                "gone_nodes": list(p.gone),
            }
        pre = rec.fleet.ledger.counts()
        out["pre_crash"] = {
            d: {"arrived": c["arrived"], "completed": c["completed"], "failed": c["failed"], "resubmitted": c["open"]}
            for d, c in pre.items()
        }
    return out


def describe(r: dict[str, Any]) -> str:
    """One line on what resuming did (for the text summary)."""
    pre = r.get("pre_crash", {})
    arrived = sum(c["arrived"] for c in pre.values())
    done = sum(c["completed"] + c["failed"] for c in pre.values())
    return (
        f"resumed at t={r['at']:g} s: adopted {len(r['adopted'])} instances, released {len(r['released_nodes'])} "
        f"nodes, {len(r['lost_nodes'])} lost; of {arrived} requests that arrived before the crash {done} had "
        f"ended and {r['resubmitted']} were handed to the router again"
        + (f"; {r['torn_bytes']} bytes of torn journal tail dropped" if r["torn_bytes"] else "")
        + ("; the journal was incomplete" if r.get("journal_complete") is False else "")
        + ("; the provider state was newer than the journal" if r.get("provider", {}).get("newer_than_journal") else "")
    )
