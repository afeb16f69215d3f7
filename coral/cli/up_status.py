"""``coral up``'s live status (clock, cost, plan, demand against capacity, instances per region) and
its end-of-run summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from coral.capacity import serving_capacity
from coral.cli.resumed import describe
from coral.display import abbreviate_all, fit_table
from coral.kernel import Endpoints
from coral.messages.fleet import ROUTABLE_STATES


def summarize(setup: Any, st: Any, end: float, reason: str, wall_s: float, journal: Path | None) -> dict[str, Any]:
    """The end-of-run summary (what ``--json`` prints)."""
    deps = {}
    if st.stats is not None:
        for d in st.stats.deployments:
            deps[d.deployment] = {
                "arrivals": d.arrivals,
                "completed": d.completed,
                "failed": d.failed,
                "failed_by": d.failed_by,
                "retries": d.retries,
                "open": d.in_flight + d.queued,
                "slo_attainment": d.attainment,
                "ttft_p50_s": d.ttft_p50,
                "tpot_p50_s": d.tpot_p50,
            }
    fleet = st.fleet
    return {
        "scenario": setup.scenario_name,
        "end_s": end,
        "reason": reason,
        "wall_s": round(wall_s, 3),
        "plans": st.plans,
        "cost_per_hour": fleet.cost_per_hour if fleet is not None else 0.0,
        "spent_usd": fleet.spent_usd if fleet is not None else 0.0,
        "instances": len(fleet.instances) if fleet is not None else 0,
        "actor_crashes": st.crashes,
        "bus_errors": st.errors,
        "refused_connections": st.refusals(),
        "deployments": deps,
        "journal": str(journal) if journal is not None else None,
    }


def print_summary(s: dict[str, Any], con: Console) -> None:
    con.print(
        f"coral up: {s['scenario']} stopped at t={s['end_s']:.0f} s ({s['reason']}) after {s['wall_s']:.1f} s; "
        f"{s['plans']} plans, ${s['spent_usd']:.2f} spent" + (f"; journal {s['journal']}" if s["journal"] else "")
    )
    for r in s.get("refused_connections", []):
        con.print(f"coral up: refused {r['count']} connection(s) from {r['address']}: {r['reason']}", markup=False)
    if "resumed" in s:
        con.print(describe(s["resumed"]))


def render_status(
    setup: Any, st: Any, wall: float, speed: float | None, endpoints: Endpoints | None, width: int | None = None
) -> Group:
    """The live status: clock, cost, plan, demand vs capacity with SLO attainment, instances per region
    (within ``width`` characters when given: see ``coral.display``)."""
    end = setup.duration_s
    lag = ""
    if st.pace is not None:  # against the pace the driver keeps (its origin, any change of speed)
        info = st.pace()
        speed = info.speed or speed
        if info.behind_s > 5 * setup.timing.tick_s:
            lag = f"  [yellow]{info.behind_s:,.0f} s behind[/]"
    fleet = st.fleet
    rate, spent = (fleet.cost_per_hour, fleet.spent_usd) if fleet is not None else (0.0, 0.0)
    head = (
        f"[bold]{setup.scenario_name}[/]  t={st.now:,.0f}/{end:,.0f} s  "
        f"speed {'max' if speed is None else f'{speed:g}x'}  wall {wall:,.0f} s{lag}  "
        f"cost running [bold]${rate:,.2f}/h[/]"
        + (f", planned ${st.plan.plan.cost_per_hour:,.2f}/h" if st.plan is not None else "")
        + f" (spent ${spent:,.2f})"
    )
    lines: list[Any] = [Text.from_markup(head)]
    for d, m in sorted(st.short.items()):
        lines.append(
            Text(
                f"{d}: capacity {m.capacity_rps:,.2f} req/s below demand {m.demand_rps:,.2f} "
                f"(unmet {m.unmet_rps:,.2f}, {m.cause})",
                style="bold red",
            )
        )
    if st.refused:
        r = st.refused[-1]
        total = sum(x.count for x in st.refused)
        lines.append(Text(f"refused {total} connection(s); latest from {r.address}: {r.reason}", style="yellow"))
    if endpoints is not None:
        lines.append(
            Text(f"kernel {endpoints.router}  events {endpoints.pub}  control: send to 'operator'", style="dim")
        )
    if st.plan is not None:
        p = st.plan.plan
        diff = " ".join(
            f"{'+' if c.delta > 0 else ''}{c.delta} {c.deployment}/{c.template_id[:6]}@{c.region}" for c in st.plan.diff
        )
        landed = f", landed +{st.landed - p.at:,.1f} s" if st.landed is not None else ""
        lines.append(
            Text(
                f"plan #{p.seq} at t={p.at:,.0f} ({p.trigger}{landed}): ${p.cost_per_hour:,.2f}/h, {p.status}, "
                f"solve {p.solve_s * 1e3:,.0f} ms; diff {diff or 'none'}"
            )
        )
    cap = serving_capacity(fleet.instances) if fleet is not None else {}
    serving: dict[str, int] = {}
    for i in fleet.instances if fleet is not None else ():
        if i.state in ROUTABLE_STATES:
            serving[i.deployment] = serving.get(i.deployment, 0) + 1
    traffic = {d.deployment: d for d in st.stats.deployments} if st.stats is not None else {}
    demand = st.demand.demand if st.demand is not None else {}
    names = [d for d in traffic] or list(demand)
    rows: list[list[str]] = []
    for name in names:
        d = traffic.get(name)
        row = [name, f"{demand.get(name, 0.0):,.2f}", f"{cap.get(name, 0.0):,.2f}", str(serving.get(name, 0))]
        if d is not None:
            att = d.attainment
            color = "green" if att >= 0.9 else "yellow" if att >= 0.5 else "red"
            row += [
                f"{d.completed:,}", f"{d.failed:,}", f"{d.in_flight + d.queued:,}", f"[{color}]{att:.0%}[/]",
                f"{d.ttft_p50:.2f} s", f"{d.tpot_p50 * 1e3:.0f} ms",
            ]  # fmt: skip
        else:
            row += ["-"] * 6
        rows.append(row)
    lines.append(_table("deployments", DEPLOYMENT_HEADS, rows, DEPLOYMENT_PRIORITY, width, DEPLOYMENT_SHORT))
    if fleet is not None:
        per: dict[str, dict[str, int]] = {}
        for i in fleet.instances:
            row_d = per.setdefault(i.region, {})
            row_d[i.state] = row_d.get(i.state, 0) + 1
            row_d["nodes"] = row_d.get("nodes", 0) + len(i.node_ids)
        region_rows = [[region, *(str(per[region].get(k, 0)) for k in REGION_HEADS[1:])] for region in sorted(per)]
        lines.append(_table("instances per region", REGION_HEADS, region_rows, REGION_PRIORITY, width, REGION_SHORT))
    return Group(*lines)


DEPLOYMENT_HEADS = ("deployment", "demand req/s", "capacity req/s", "serving", "done", "failed", "open", "SLO met",
                    "TTFT p50", "TPOT p50")  # fmt: skip
DEPLOYMENT_PRIORITY = (9, 8, 8, 4, 5, 6, 3, 8, 2, 2)
DEPLOYMENT_SHORT = {"demand req/s": "demand/s", "capacity req/s": "cap/s", "serving": "srv", "failed": "fail",
                    "SLO met": "SLO", "TTFT p50": "TTFT", "TPOT p50": "TPOT"}  # fmt: skip
REGION_HEADS = ("region", "provisioning", "loading", "serving", "retiring", "draining", "nodes")
REGION_PRIORITY = (9, 5, 6, 8, 5, 4, 7)
REGION_SHORT = {"provisioning": "prov", "loading": "load", "serving": "srv", "retiring": "ret", "draining": "drn"}
NAME_WIDTH = 12
"""Deployment and region names are abbreviated to this many characters when a table is too wide."""


def _table(
    title: str,
    heads: tuple[str, ...],
    rows: list[list[str]],
    priorities: tuple[int, ...],
    width: int | None,
    short: dict[str, str],
) -> Table:
    """A status table within ``width`` characters (None: every column): names abbreviated readably and the
    least useful columns left out (``coral.display``)."""
    plain = [[Text.from_markup(c).plain for c in r] for r in rows]
    keep, names = list(range(len(heads))), list(heads)
    if width is not None and rows:
        keep, names = fit_table(heads, plain, priorities, width, short_heads=short)
        if len(keep) < len(heads):
            abbrev = abbreviate_all([r[0] for r in rows], NAME_WIDTH)
            rows = [[abbrev[r[0]], *r[1:]] for r in rows]
            plain = [[abbrev[p[0]], *p[1:]] for p in plain]
            keep, names = fit_table(heads, plain, priorities, width, short_heads=short)
    t = Table(title=title, title_justify="left")
    for i, name in zip(keep, names, strict=True):
        t.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    for r in rows:
        t.add_row(*(r[i] for i in keep))
    return t
