"""``coral simulate``: run the fleet simulator over a scenario with a planning policy."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from coral.cli.common import add_policy, catalog_from, check_output, check_plot, open_store, perf_from, print_json
from coral.errors import CoralError
from coral.scenario import load_scenario
from coral.sim import SimResult, simulate


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser("simulate", parents=[parent], help="simulate a scenario request by request")
    p.add_argument("--scenario", default="default", help="scenario NAME (bundled) or FILE (default: default)")
    add_policy(p)
    p.add_argument("--trace", type=Path, default=None, help="Azure-format trace CSV that drives every deployment")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply every arrival rate (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrivals, lengths and faults (default: 0)")
    p.add_argument("--duration", type=float, default=None, help="seconds to simulate (default: the scenario's)")
    p.add_argument("--interval", type=float, default=60.0, help="seconds per row of the time series")
    p.add_argument("--on-bad-row", choices=("stop", "skip"), default="stop", help="what a malformed trace row does")
    p.add_argument("--store", type=Path, default=None, help="template store (default: the user data dir)")
    p.add_argument("--no-build", action="store_true", help="fail instead of building missing templates")
    p.add_argument("--csv", type=Path, default=None, metavar="FILE", help="write the per-interval series")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="plot demand, cost and SLO")
    p.add_argument("--json", action="store_true", help="print the stable JSON result")
    p.set_defaults(func=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from coral.cli.plan_cmd import ensure_templates
    from coral.cli.planning import make_planner

    if args.rate_scale <= 0:
        raise CoralError(f"--rate-scale must be positive, got {args.rate_scale}")
    if args.seed < 0:
        raise CoralError(f"--seed must be >= 0, got {args.seed}")
    if args.duration is not None and not args.duration > 0:
        raise CoralError(f"--duration must be positive, got {args.duration}")
    if not args.interval > 0:
        raise CoralError(f"--interval must be positive, got {args.interval}")
    if args.trace is not None and not args.trace.exists():
        raise CoralError(f"--trace {args.trace}: file not found")
    if args.plot is not None:
        check_plot(args.plot)
    if args.csv is not None:
        check_output(args.csv, "--csv")
    cat = catalog_from(args)
    perf = perf_from(args, cat)
    sc = load_scenario(args.scenario, cat)
    with open_store(args, readonly=args.no_build, scenario=args.scenario) as store:
        if not args.no_build:
            ensure_templates(sc, cat, perf, store, args, quiet=args.json)
        plan_fn, templates = make_planner(args.policy, sc, cat, perf, store)
        with Progress(TextColumn(f"[bold]simulating {sc.name}"), BarColumn(), TextColumn("{task.fields[at]}"),
                      TimeElapsedColumn(), console=Console(stderr=True), disable=args.json) as bar:  # fmt: skip
            task = bar.add_task("sim", total=1.0, at="")

            def progress(t: float, total: float) -> None:
                bar.update(task, completed=t / total, at=f"t={t:,.0f}/{total:,.0f} s")

            res = simulate(
                sc,
                templates,
                perf,
                plan_fn,
                seed=args.seed,
                trace=args.trace,
                rate_scale=args.rate_scale,
                duration_s=args.duration,
                interval_s=args.interval,
                on_bad_row=args.on_bad_row,
                progress=progress,
            )
    if args.csv is not None:
        res.write_csv(args.csv)
    if args.plot is not None:
        res.plot(args.plot)
    if args.json:
        print_json(result_json(res))
        return 0
    print_result(res, Console())
    return 0


def result_json(res: SimResult) -> dict[str, Any]:
    """``--json``: the stable result (``SimResult.to_json``) with, in total and per deployment, the latency
    percentiles and the cost per million tokens, and the re-plan, fault, retry and preemption counts (no
    wall-clock figures: identical input gives identical output)."""
    out = res.to_json()
    s = res.summary()
    for key in ("latency", "cost_per_million_tokens"):
        out[key] = s[key]
        for name, m in out["per_model"].items():
            m[key] = s["per_model"][name][key]
    out["replans"] = {"count": s["replans"]["count"], "plan_changes": s["replans"]["plan_changes"]}
    for key in ("failed_by_reason", "faults", "retries", "preemptions"):
        out[key] = s[key]
    return out


def print_result(res: SimResult, con: Console) -> None:
    """The summary and the per-deployment table (one block per deployment when the terminal is too
    narrow for the table, so that no figure is cut off)."""
    s = res.summary()
    title = f"simulated {s['duration_s']:,.0f} s: {s['requests']:,} requests, ${s['cost']:,.2f}"
    heads = ("deployment", "requests", "failed", "goodput/s", "TTFT ok", "TPOT ok", "both", "TTFT p50/p99",
             "TPOT p50/p99", "cost $", "$/M tok")  # fmt: skip
    rows = []
    for name, m in [*s["per_model"].items(), ("all", s)]:
        lat, att = m["latency"], m["attainment"]
        rows.append(
            (
                name,
                f"{m['requests']:,}",
                f"{m['failed']:,}",
                f"{m['goodput_rps']:.2f}",
                f"{att['ttft']:.1%}",
                f"{att['tpot']:.1%}",
                f"{att['both']:.1%}",
                f"{lat['ttft']['p50']:.2f}/{lat['ttft']['p99']:.2f} s",
                f"{lat['tpot']['p50'] * 1e3:.0f}/{lat['tpot']['p99'] * 1e3:.0f} ms",
                f"{m['cost']:,.2f}",
                f"{m['cost_per_million_tokens']:.3f}",
            )
        )
    t = Table(title=title)
    for c in heads:
        t.add_column(c, justify="left" if c == "deployment" else "right", no_wrap=True)
    for r in rows:
        t.add_row(*r)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    if sum(widths) + 3 * len(widths) + 1 <= con.width:
        con.print(t)
    else:
        con.print(title, style="italic")
        for r in rows:
            con.print(f"[bold]{r[0]}[/bold]: {r[1]} requests, {r[2]} failed, goodput {r[3]}/s")
            con.print(f"  SLO ok: TTFT {r[4]}, TPOT {r[5]}, both {r[6]}")
            con.print(f"  TTFT p50/p99 {r[7]}, TPOT p50/p99 {r[8]}")
            con.print(f"  cost ${r[9]}, ${r[10]} per million tokens")
    rp = s["replans"]
    con.print(
        f"replans: {rp['count']} ({rp['plan_changes']} changed the fleet), solve {rp['solve_s_total']:.2f} s total, "
        f"{rp['solve_s_max']:.2f} s max; faults: {s['faults']}; retries: {s['retries']}; "
        f"preemptions: {s['preemptions']}; skipped trace rows: {s['skipped_rows']}; "
        f"wall {s['wall_s']:.1f} s for {s['events']:,} events"
    )
    reasons = s["failed_by_reason"]
    if reasons:
        con.print("failed: " + ", ".join(f"{k} {v:,}" for k, v in reasons.items()))
