"""``coral bench --sweep``: the savings study (``solvers.study``) over demand scales x availability settings.

Wiring and printing only: the cells and columns are ``solvers.study``'s, the heatmap ``coral.sweep_plot``'s.
Standard output (table or ``--json``) holds no wall-clock figure, so identical inputs print identically
whenever every solve finishes within its deadline; progress and the sweep's wall time go to stderr.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from coral.cli.common import catalog_from, check_plot, open_store, perf_from, print_json
from coral.errors import CoralError
from coral.scenario import load_scenario

AVAILABILITY = ("catalog", "scarce", "cap4", "quota")
"""``solvers.study.AVAILABILITY``, repeated so that checking the arguments does not import the solvers."""


def parse_scales(text: str) -> tuple[float, ...]:
    """``--scales``: comma-separated positive finite numbers."""
    out = []
    for part in (x.strip() for x in text.split(",")):
        try:
            v = float(part)
        except ValueError:
            raise CoralError(f"--scales: {part!r} is not a number (give e.g. 0.25,1,5,50)") from None
        if not (math.isfinite(v) and v > 0):
            raise CoralError(f"--scales: every scale must be a positive finite number, got {part}")
        out.append(v)
    return tuple(out)


def parse_availability(text: str) -> tuple[str, ...]:
    """``--availability``: comma-separated settings of ``AVAILABILITY``."""
    out = tuple(x.strip() for x in text.split(","))
    for a in out:
        if a not in AVAILABILITY:
            raise CoralError(f"--availability: unknown setting {a!r}; choose from {', '.join(AVAILABILITY)}")
    return out


def run_sweep(args: argparse.Namespace) -> int:
    from coral.cli.plan_cmd import ensure_templates
    from coral.cli.planning import check_coverage, deployment_templates, request_at
    from solvers.planning import Planner
    from solvers.study import COLUMNS, QUICK_AVAILABILITY, QUICK_SCALES, SCALES, cell_request, column_templates
    from solvers.study import sweep_cell as solve_cell

    names = [s.strip() for s in (args.scenarios or "core").split(",") if s.strip()]
    if len(names) != 1:
        raise CoralError(f"--sweep takes one scenario, got --scenarios {args.scenarios}")
    if args.deadline is not None and not (math.isfinite(args.deadline) and args.deadline > 0):
        raise CoralError(f"--deadline must be positive, got {args.deadline}")
    if args.seed < 0:
        raise CoralError(f"--seed must be >= 0, got {args.seed}")
    scales = parse_scales(args.scales) if args.scales else QUICK_SCALES if args.quick else SCALES
    settings = parse_availability(args.availability) if args.availability else (
        QUICK_AVAILABILITY if args.quick else AVAILABILITY
    )  # fmt: skip
    if args.plot is not None:
        check_plot(args.plot)
    cat = catalog_from(args)
    perf = perf_from(args, cat)
    sc = load_scenario(names[0], cat)
    deadline = args.deadline or sc.planner.deadline_s
    started = time.perf_counter()
    cells = []
    with open_store(args, readonly=args.no_build, scenario=names[0]) as store:
        if not args.no_build:
            ensure_templates(sc, cat, perf, store, args, quiet=False)
        tpls = deployment_templates(store, sc, "coral", perf_version=perf.version)
        check_coverage(sc, tpls, "coral", str(store.path))
        planners = {c: Planner("coral", sc, cat, perf, column_templates(c, tpls), deadline) for c in COLUMNS}
        base = request_at(sc, cat, 0.0, trigger="sweep")
        work = [(s, a) for a in settings for s in scales]
        err = Console(stderr=True)
        with Progress(TextColumn("[bold]sweep {task.fields[cell]}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err) as bar:  # fmt: skip
            task = bar.add_task("sweep", total=len(work) * len(COLUMNS), cell="")
            for i, (scale, setting) in enumerate(work):
                req = cell_request(base, scale, setting, cat, args.seed)

                def step(column: str, scale: float = scale, setting: str = setting) -> None:
                    bar.update(task, advance=1, cell=f"{scale:g}x {setting} ({column} done)")

                bar.update(task, cell=f"{scale:g}x {setting}")
                cells.append(solve_cell(planners, sc, req, scale, setting, on_column=step))
                if not err.is_terminal:  # a log: one line per cell instead of the bar
                    err.print(f"sweep: cell {i + 1}/{len(work)} ({scale:g}x {setting}) done at "
                              f"{time.perf_counter() - started:.0f} s", highlight=False)  # fmt: skip
    wall = time.perf_counter() - started
    worse = [c for c in cells if c.worse_than]
    unproven = sum(any(r.status != "optimal" for r in c.results) for c in cells)
    if args.json:
        print_json({
            "scenario": sc.name, "deadline_s": deadline, "seed": args.seed, "scales": list(scales),
            "availability": list(settings), "columns": list(COLUMNS), "cells": [c.to_json() for c in cells],
            "coral_never_worse": not worse, "cells_not_proven_optimal": unproven,
        })  # fmt: skip
    else:
        print_sweep(sc.name, deadline, cells, unproven, Console())
    if args.plot is not None:
        from coral.sweep_plot import plot_sweep

        plot_sweep([c.to_json() for c in cells], args.plot, title=f"Coral vs the best baseline on {sc.name}")
    Console(stderr=True).print(f"sweep: {len(cells)} cells x {len(COLUMNS)} columns in {wall:.0f} s")
    if worse:
        where = ", ".join(f"{c.scale:g}x {c.availability} ({'+'.join(c.worse_than)})" for c in worse)
        raise CoralError(f"Coral's plan was worse than another column's in {len(worse)} of {len(cells)} cells: {where}")
    return 0


def _tokens(x: float) -> str:
    return f"{x / 1e3:,.1f}k" if x >= 1e3 else f"{x:,.0f}"


def print_sweep(name: str, deadline: float, cells: list[Any], unproven: int, con: Console) -> None:
    """One table per availability setting: rows are demand scales, columns the template subsets."""
    from solvers.study import BASELINES, COLUMNS

    for setting in dict.fromkeys(c.availability for c in cells):
        t = Table(
            title=f"{name}, availability {setting}: $/h, served, goodput (output tok/s within the SLO)",
            caption=f"deadline {deadline:g} s per solve; vs best: Coral against the best of {', '.join(BASELINES)}",
        )
        t.add_column("demand", justify="right")
        for col in COLUMNS:
            t.add_column(col, justify="right")
        t.add_column("Coral vs best", justify="right")
        for c in (c for c in cells if c.availability == setting):
            row = [f"{c.scale:g}x"]
            for col in COLUMNS:
                r = c.result(col)
                row.append(f"{r.cost_per_hour:,.0f}\n{r.served_fraction:.1%}\n{_tokens(r.goodput_tok_s)}")
            row.append(_versus(c))
            t.add_row(*row, end_section=True)
        con.print(t)
    never = all(not c.worse_than for c in cells)
    con.print(
        f"Coral never worse than any column: {'yes' if never else 'NO'} ({len(cells)} cells); "
        f"{unproven} cells with a plan not proven optimal within the deadline (their figures may vary between runs)"
    )


def _versus(c: Any) -> str:
    """Coral against the best baseline: the cost saved at equal service, else the goodput gained."""
    base = c.best_baseline.column
    if c.saving is not None:
        return f"{c.saving:+.1%} saved\nvs {base}"
    gain = c.goodput_gain
    return f"{gain:+.1%} goodput\nvs {base}" if gain is not None else f"serves more\nvs {base}"
