"""Plan previews: what the allocator's next plan would be after a pin, forbid or allow, applied to nothing.

``preview(allocator, req)`` applies the setting to a shallow copy of the allocator (its own ``_pin`` and
``_forbid`` checks, so a preview is refused exactly as the command would be), then solves the current
demand, market and fleet with the copy's templates as ``Allocator.solve`` does (within its deadline), in
a worker thread. The plan is neither published nor kept; the reply compares it with the latest plan.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import attrs

from coral.messages.control import ForbidTemplate, PinTemplate
from coral.messages.inspect import PlanPreview, PreviewRequest
from coral.plan import PlanRequest
from solvers.allocation import SolverEffort
from solvers.planning import Planner, to_plan

if TYPE_CHECKING:
    from actors.allocator import Allocator


def trial(alloc: Allocator, req: PreviewRequest) -> tuple[Allocator, tuple[str, str] | None]:
    """A copy of ``alloc`` with the setting applied, and (field, reason) if the command would be refused."""
    bad = req.problems()
    if bad is not None:
        return alloc, bad
    t = copy.copy(alloc)
    t.forbidden, t.pins, t.triggers = set(alloc.forbidden), dict(alloc.pins), set()
    if req.action in ("pin", "unpin"):
        return t, t._pin(PinTemplate(req.deployment, req.template_id if req.action == "pin" else None))
    return t, t._forbid(ForbidTemplate(req.template_id, req.action == "forbid"))


async def preview(alloc: Allocator, req: PreviewRequest) -> PlanPreview:
    """The plan ``alloc`` would make now with ``req``'s setting (module docstring)."""
    now = alloc.ctx.now()
    t, bad = trial(alloc, req)
    if bad is not None:
        return PlanPreview(False, now, *bad)
    if alloc.prices is None:
        return PlanPreview(False, now, "market", "the allocator has no market update yet; nothing to plan with")
    sc = alloc.scenario
    if alloc.churn != sc.planner.churn_factor:
        sc = attrs.evolve(sc, planner=attrs.evolve(sc.planner, churn_factor=alloc.churn))
    tpls = {d: t.usable(d) for d in alloc.deployments}
    planner = Planner(alloc.policy, sc, alloc.catalog, alloc.perf, tpls, alloc.deadline_s, columns=alloc.columns)
    preq = PlanRequest(now, dict(alloc.demand), dict(alloc.prices), dict(alloc.avail), dict(alloc.current), "preview")
    effort = SolverEffort() if alloc.deterministic else None

    prob, index = planner.problem(preq)
    res = await alloc.solver_process().solve_async(
        prob, deadline_s=alloc.deadline_s, effort=effort, columns=alloc.columns
    )
    plan = to_plan(planner, preq, prob, index, res, seq=0)
    last = alloc.last_plan
    return PlanPreview(
        True,
        now,
        status=plan.status,
        instances=sum(r.count for r in plan.instances),
        cost_per_hour=plan.cost_per_hour,
        unmet_rps=plan.unmet_rps,
        current_instances=sum(r.count for r in last.instances) if last is not None else 0,
        current_cost_per_hour=last.cost_per_hour if last is not None else 0.0,
        current_unmet_rps=last.unmet_rps if last is not None else 0.0,
        rows=tuple(plan.instances),
    )
