"""Why a plan leaves a deployment's demand unmet, in words derived from the problem itself.

For each deployment with unmet demand, in this order:

1. No way to serve it under the policy: no aggregated template, and no prefill or no decode template
   (a prefill template must meet the TTFT target, a decode template the TPOT target; ``homo`` and
   ``pd-homo`` admit only homogeneous ones).
2. Its instances' nominal capacity (each at its template's req/s, prefill and decode paired per region,
   as ``coral.capacity`` counts a fleet) covers the demand, but the plan may load them only to the
   utilisation target and the queueing limit of the TTFT target (``solvers.planning``; the plan's
   capacity counts that), which is less.
3. Availability: in every region, each way to add capacity (an aggregated instance, or a prefill and a
   decode instance, whose node types the region offers) needs a node type whose availability the plan
   already uses up. The node types named are those that block the most of its templates.
   (``helix``: its placement over the nodes of Coral's plan serves less than the demand.)
4. Otherwise a template still fits: the solve ended (deadline) before it used it; the status says so.

Pure: the caller passes the plan, its request, the templates the policy admits and the scenario.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from coral.plan import Plan, PlanRequest
from coral.scenario import Scenario
from coral.templates import Template

TOL = 1e-6
MOST_NAMED = 3


def unmet_reasons(
    plan: Plan, req: PlanRequest, templates: Mapping[str, Sequence[Template]], sc: Scenario, policy: str
) -> dict[str, list[str]]:
    """Reasons, per deployment with unmet demand, that its demand is not all served (see module docstring)."""
    used: Counter[tuple[str, str]] = Counter()
    for inst in plan.instances:
        for n in inst.nodes:
            used[(inst.region, n)] += inst.count
    deps = {d.name: d for d in sc.deployments}
    nominal = _nominal(plan)
    out: dict[str, list[str]] = {}
    for s in plan.serving:
        if s.unmet_rps <= TOL * max(1.0, s.demand_rps):
            continue
        d = deps[s.deployment]
        tpls = templates.get(d.name, [])
        cap = nominal.get(d.name, 0.0)
        out[d.name] = _reasons(plan, req, tpls, used, d.slo.ttft_s, d.slo.tpot_s, cap, s.demand_rps, sc, policy)
    return out


def _nominal(plan: Plan) -> dict[str, float]:
    """Per deployment: its instances' req/s at their templates' capacity, prefill and decode paired per
    region (the lesser side): ``coral.capacity.capacity_rps``'s rule, which ``solvers`` cannot import (it
    loads the bus messages, against the package contract)."""
    out: dict[str, float] = {}
    side: dict[tuple[str, str, str], float] = {}
    for i in plan.instances:
        if i.mode == "aggregated":
            out[i.deployment] = out.get(i.deployment, 0.0) + i.count * i.capacity_rps
        else:
            side[(i.deployment, i.region, i.mode)] = (
                side.get((i.deployment, i.region, i.mode), 0.0) + i.count * i.capacity_rps
            )
    for (dep, region, mode), rps in side.items():
        if mode == "prefill":
            out[dep] = out.get(dep, 0.0) + min(rps, side.get((dep, region, "decode"), 0.0))
    return out


def _reasons(
    plan: Plan,
    req: PlanRequest,
    tpls: Sequence[Template],
    used: Counter[tuple[str, str]],
    ttft: float,
    tpot: float,
    capacity: float,
    demand: float,
    sc: Scenario,
    policy: str,
) -> list[str]:
    kind = {"homo": "homogeneous ", "pd-homo": "homogeneous "}.get(policy, "")
    modes = {t.mode for t in tpls}
    if "aggregated" not in modes:
        missing = [
            f"no {kind}{mode} template meets {target}"
            for mode, target in (("prefill", f"TTFT {ttft:g} s"), ("decode", f"TPOT {tpot:g} s"))
            if mode not in modes
        ]
        if missing:
            if policy != "pd-homo":
                missing.insert(0, f"no {kind}aggregated template meets TTFT {ttft:g} s / TPOT {tpot:g} s")
            return [f"{m} (N_max = {sc.planner.nmax})" for m in missing]
    if capacity >= demand - TOL * max(1.0, demand):
        return [
            f"capacity {capacity:,.2f} req/s covers the demand, but each instance is loaded only to the "
            f"utilisation target {sc.planner.utilisation:g} or less, where its queue still meets TTFT {ttft:g} s"
        ]
    if policy == "helix":
        return [f"Helix's placement over the nodes of Coral's plan serves {capacity:,.2f} of {demand:,.2f} req/s"]
    blocked: Counter[tuple[str, str]] = Counter()
    fits = offered = False
    for r in sc.regions:
        by_mode: dict[str, list[Template]] = {}
        for t in tpls:
            by_mode.setdefault(t.mode, []).append(t)
        ways: list[list[Template]] = [[t] for t in by_mode.get("aggregated", [])]
        if by_mode.get("prefill") and by_mode.get("decode"):
            ways += [[p, dd] for p in by_mode["prefill"] for dd in by_mode["decode"]]
        for way in ways:
            need: Counter[str] = Counter()
            for t in way:
                need.update(t.node_counts)
            if any((r, n) not in req.prices for n in need):
                continue  # not a way to serve it in this region at all
            offered = True
            short = [n for n, k in need.items() if used[(r, n)] + k > req.availability.get((r, n), 0)]
            if not short:
                fits = True
            blocked.update((r, n) for n in short)
    if fits:
        return [f"a template still fits the availability: the solve ended before using it (status {plan.status})"]
    if not offered:
        return ["no region of the scenario offers every node type of any of its templates"]
    out = []
    for (r, n), _count in blocked.most_common(MOST_NAMED):
        avail = req.availability.get((r, n), 0)
        if avail == 0:
            out.append(f"no {n} available in {r}")
        else:
            out.append(f"availability of {n} in {r} exhausted ({used[(r, n)]} of {avail} in use)")
    if len(blocked) > MOST_NAMED:
        out.append(f"and {len(blocked) - MOST_NAMED} more (region, node type) pairs")
    return out
