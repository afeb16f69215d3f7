"""The allocator's answers to what a client asks instead of opening the mesh's files (``coral.messages.inspect``).

``answer(allocator, env)`` replies to a ``TemplatesRequest`` (templates with their mode, nodes, capacity
and whether the allocator may plan them now), a ``ScenarioRequest`` (the deployments with the SLO in
force) and a ``PreviewRequest`` (``actors.preview``). It reads the allocator's state and changes nothing,
so it answers at once rather than at the next tick. ``clock_info`` is the operator gateway's answer to
a ``ClockRequest`` (the wall clock is read for display only, never for a decision).

Capacity of one instance of template ``t`` for deployment ``d`` (mean prompt ``I`` and output ``O``
tokens): ``P = t.prefill_tok_s / I`` and ``D = t.decode_tok_s / O`` requests/s; an aggregated template
serves ``min(P, D)``, a prefill template ``P`` and a decode template ``D``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from actors.preview import preview
from coral.kernel import Envelope
from coral.messages.inspect import (
    ClockInfo,
    DeploymentInfo,
    PreviewRequest,
    ScenarioInfo,
    ScenarioRequest,
    TemplateEntry,
    TemplatesReply,
    TemplatesRequest,
)
from coral.scenario import Deployment
from coral.templates import Template

if TYPE_CHECKING:
    from actors.allocator import Allocator


def capacity_rps(t: Template, d: Deployment) -> float:
    """Requests/s one instance of ``t`` serves at ``d``'s mean lengths (module docstring)."""
    p = t.prefill_tok_s / max(d.shape.mean_in, 1e-9)
    q = t.decode_tok_s / max(d.shape.mean_out, 1e-9)
    return p if t.mode == "prefill" else q if t.mode == "decode" else min(p, q)


def clock_info(now: float, pace: tuple[float | None, float, float] | None) -> ClockInfo:
    """Where kernel time ``now`` stands: ``pace`` is (speed, wall time, kernel time) at the start of a paced
    run (speed None: as fast as possible), or None when not known."""
    if pace is None or pace[0] is None:
        return ClockInfo(now, 0.0, 0.0)
    speed, wall0, v0 = float(pace[0]), pace[1], pace[2]
    return ClockInfo(now, speed, max(0.0, (time.monotonic() - wall0) * speed - (now - v0)))


def templates(alloc: Allocator, req: TemplatesRequest) -> TemplatesReply:
    """The templates ``req`` names (by id, then all of its deployment), each with the deployment it serves."""
    owner = {t.id: d for d, ts in alloc.library.items() for t in ts}
    wanted = [(owner[i], alloc.by_id[i]) for i in req.ids if i in owner]
    if req.deployment in alloc.library:
        seen = {t.id for _, t in wanted}
        wanted += [(req.deployment, t) for t in alloc.library[req.deployment] if t.id not in seen]
    usable = {d: {t.id for t in alloc.usable(d)} for d in {d for d, _ in wanted}}
    entries = tuple(TemplateEntry(d, t, capacity_rps(t, alloc.deployments[d]), t.id in usable[d]) for d, t in wanted)
    return TemplatesReply(entries, tuple(i for i in req.ids if i not in owner))


def scenario(alloc: Allocator) -> ScenarioInfo:
    """The scenario's deployments with the SLO the allocator applies now."""
    sc = alloc.scenario
    deps = []
    for d in sc.deployments:
        s = alloc.slo.get(d.name, d.slo)
        deps.append(DeploymentInfo(d.name, d.model, s.ttft_s, s.tpot_s, s.attainment))
    gpus = tuple((n, alloc.catalog.nodes[n].gpu) for n in sc.node_types if n in alloc.catalog.nodes)
    return ScenarioInfo(sc.name, tuple(sc.regions), tuple(sc.node_types), tuple(deps), gpus)


async def answer(alloc: Allocator, env: Envelope) -> bool:
    """Reply to an inspection request; False if ``env`` is not one (the allocator handles it as usual)."""
    msg = env.msg
    if not isinstance(msg, TemplatesRequest | ScenarioRequest | PreviewRequest):
        return False
    if env.kind != "request":
        return True
    if isinstance(msg, TemplatesRequest):
        await alloc.ctx.reply(env, templates(alloc, msg))
    elif isinstance(msg, ScenarioRequest):
        await alloc.ctx.reply(env, scenario(alloc))
    else:
        await alloc.ctx.reply(env, await preview(alloc, msg))
    return True
