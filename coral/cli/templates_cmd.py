"""``coral templates build | list | show``."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from contextlib import closing, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from coral.cli.common import catalog_files, catalog_from, open_store, perf_from, print_json, store_path
from coral.display import abbreviate, abbreviate_all, fit_table
from coral.errors import CoralError
from coral.store import TemplateStore
from coral.templates import SINK, SOURCE, Template
from coral.workload import MODES

if TYPE_CHECKING:
    from coral.cli.build import Solver
    from coral.perf import PerfModel

GPU_COLOURS = {
    "h100": "bright_green",
    "h200": "green",
    "a100": "cyan",
    "l40s": "magenta",
    "l40": "magenta",
    "l4": "yellow",
    "a10g": "bright_red",
    "a10": "red",
    "t4": "blue",
    "v100": "bright_blue",
    "mi300x": "bright_white",
}


def gpu_colour(gpu: str) -> str:
    """The colour of a GPU type in stage bars."""
    return GPU_COLOURS.get(gpu.split("-")[0], "white")


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser("templates", help="build, list and show serving templates")
    tsub = p.add_subparsers(dest="templates_command", metavar="ACTION", required=True)

    b = tsub.add_parser("build", parents=[parent], help="build the template library (resumable)")
    b.add_argument("--scenario", default=None, help="scenario NAME or FILE whose deployments to build")
    b.add_argument("--models", default=None, help="comma-separated model names (default: the scenario's)")
    b.add_argument("--modes", default="aggregated,prefill,decode", help="comma-separated modes")
    b.add_argument("--nodes", default=None, help="comma-separated node types (default: the scenario's)")
    b.add_argument("--nmax", type=int, default=None, help="most nodes per template (default: scenario, else 6)")
    b.add_argument("--rho", type=float, default=None, help="memory ratio cap (default: scenario, else 12)")
    b.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count)")
    b.add_argument(
        "--ray", nargs="?", const="", default=None, metavar="ADDRESS",
        help="solve on a Ray cluster instead of local processes: ADDRESS is HOST:PORT (the head's GCS), "
        "ray://HOST:PORT (Ray Client) or auto; without it RAY_ADDRESS, else a new local Ray instance "
        '(needs the ray extra: pip install -e ".[ray]")',
    )  # fmt: skip
    b.add_argument("--time-limit", type=float, default=10.0, help="seconds per MILP solve")
    b.add_argument("--store", type=Path, default=None, help="template store (default: the user data dir)")
    b.add_argument("--json", action="store_true", help="print the build report as JSON")
    b.set_defaults(func=run_build)

    ls = tsub.add_parser("list", parents=[parent], help="list templates in the store")
    ls.add_argument("--model", default=None, help="only this catalog model's templates")
    ls.add_argument("--mode", default=None, choices=MODES, help="only templates of this mode")
    ls.add_argument("--store", type=Path, default=None, help="template store (default: the user data dir)")
    ls.add_argument("--json", action="store_true", help="print every template in full as JSON")
    ls.set_defaults(func=run_list)

    sh = tsub.add_parser("show", help="show one template: stages, routes and capacities")
    sh.add_argument("id", nargs="?", default=None, help="template id (a unique prefix is enough)")
    sh.add_argument("--model", default=None, help="instead of an id: the template of this model ...")
    sh.add_argument(
        "--nodes", default=None, help="... on these node types, comma-separated (e.g. g6e.xlarge,p5.4xlarge)"
    )
    sh.add_argument("--mode", default="aggregated", choices=MODES, help="... in this mode (default: aggregated)")
    sh.add_argument("--store", type=Path, default=None, help="template store (default: the user data dir)")
    sh.add_argument("--json", action="store_true", help="print the template as JSON")
    sh.set_defaults(func=run_show)


def run_build(args: argparse.Namespace) -> int:
    from coral.cli.build import build_library, default_workers
    from coral.cli.jobs import jobs_from_args

    cat = catalog_from(args)
    perf = perf_from(args, cat)
    if not (args.time_limit > 0 and math.isfinite(args.time_limit)):
        raise CoralError(f"--time-limit: seconds per solve must be positive, got {args.time_limit:g}")
    jobs, node_types, nmax, rho = jobs_from_args(args, cat)
    workers = args.workers if args.workers is not None else default_workers()
    if workers < 1:
        raise CoralError(f"--workers must be at least 1, got {workers}")
    if args.ray is not None and args.workers is not None:
        raise CoralError("--workers: not with --ray (the Ray cluster's CPUs are the workers)")
    path = store_path(args)
    solver = ray_solver(args.ray or None, perf, args.time_limit) if args.ray is not None else None
    con = Console(stderr=True)
    with (
        closing(solver) if solver is not None else nullcontext(),
        TemplateStore(path) as store,
        Progress(
            TextColumn("[bold]templates"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=con,
            transient=False,
            disable=args.json,
        ) as bar,
    ):
        task = bar.add_task("build", total=None, rate="")

        def progress(done: int, total: int) -> None:
            el = bar.tasks[0].elapsed or 0.0
            bar.update(task, completed=done, total=total, rate=f"{done / el:,.1f}/s" if el > 0 else "")

        try:
            report = build_library(
                perf,
                store,
                jobs,
                node_types,
                nmax=nmax,
                rho=rho,
                workers=workers,
                time_limit=args.time_limit,
                catalog_files=catalog_files(args),
                profile_files=args.profiles,
                progress=progress,
                solver=solver,
            )
        except ValueError as e:
            raise CoralError(str(e)) from None
    summary = {
        "store": str(path),
        "jobs": len(jobs),
        "enumerated": report.enumerated,
        "reused": report.reused,
        "solved": report.solved,
        "kept": report.kept,
        "infeasible": report.infeasible,
        "dominated": report.dominated,
        "split": report.split,
        "bound_skipped": report.bound_skipped,
        "class_problems": report.class_problems,
        "class_held": report.class_held,
        "by_path": report.by_path,
        "proven": report.proven,
        "unproven": len(report.gaps),
        "max_gap": max(report.gaps, default=0.0),
        "wall_s": round(report.wall_s, 3),
        "workers": report.workers,
    }
    if args.json:
        print_json(summary)
    else:
        Console().print(
            f"built {summary['kept']} templates for {len(jobs)} jobs in {report.wall_s:.1f} s: "
            f"{report.enumerated} multisets, {report.reused} already in the store, {report.solved} solved, "
            f"{report.infeasible} infeasible, pruned {report.dominated} dominated + {report.split} split "
            f"({report.bound_skipped} by bound without solving); store {path}"
        )
    return 0


def ray_solver(address: str | None, perf: PerfModel, time_limit: float) -> Solver:
    """Connect to a Ray cluster for a build, or refuse in one line (Ray missing, bad address)."""
    try:
        from coral.cli.build_ray import RaySolver  # optional dependency: the `ray` extra
    except ModuleNotFoundError as e:
        if e.name != "ray":
            raise
        raise CoralError('--ray: Ray is not installed; install the extra: pip install -e ".[ray]"') from None
    return RaySolver(address, perf, time_limit)


LIST_HEADS = ("id", "model", "mode", "nodes", "stages", "prefill tok/s", "decode tok/s", "TTFT", "TPOT", "status")
LIST_PRIORITY = (9, 8, 8, 7, 4, 6, 6, 3, 3, 2)
"""Which columns of ``templates list`` stay longest as the terminal narrows (higher stays)."""
LIST_SHORT = {"prefill tok/s": "pre tok/s", "decode tok/s": "dec tok/s"}
BAR = 24
NARROW_BAR = 10
NODES_WRAP = 18
"""The width of the nodes column when the table is too wide: a template of many nodes takes two lines."""


def run_list(args: argparse.Namespace) -> int:
    if args.model is not None:
        known = catalog_from(args).models
        if args.model not in known:
            raise CoralError(f"--model: unknown model {args.model!r}; known: {', '.join(sorted(known))}")
    with open_store(args, readonly=True) as store:
        tpls = store.query(model=args.model, mode=args.mode)
    if args.json:
        print_json([t.to_json() for t in tpls])
        return 0
    con = Console()
    rows = list_rows(tpls, short=False)
    if rows and not fits(LIST_HEADS, rows, con.width - 1):
        rows = list_rows(tpls, short=True)
    keep, heads = fit_table(LIST_HEADS, [[str(c) for c in r] for r in rows], LIST_PRIORITY, con.width,
                            short_heads=LIST_SHORT, wrap={3: NODES_WRAP})  # fmt: skip
    t = Table(title=f"{len(tpls)} templates")
    for i, h in zip(keep, heads, strict=True):
        wraps = i == 3 and max((len(r[3]) for r in rows), default=0) > NODES_WRAP
        t.add_column(h, justify="right" if "tok" in h else "left", no_wrap=not wraps,
                     max_width=NODES_WRAP if wraps else None)  # fmt: skip
    for r in rows:
        t.add_row(*(r[i] for i in keep))
    con.print(t)
    return 0


def fits(heads: Sequence[str], rows: Sequence[Sequence[Any]], width: int) -> bool:
    """Whether a table of these cells fits ``width`` with every column."""
    widths = [max(len(h), *(len(str(r[i])) for r in rows)) for i, h in enumerate(heads)]
    return sum(widths) + 3 * len(widths) + 1 <= width


def list_rows(tpls: Sequence[Template], *, short: bool) -> list[list[Any]]:
    """The cells of ``templates list`` (``short``: names abbreviated and a narrower stage bar)."""
    models = abbreviate_all([t.model for t in tpls], 10) if short else {}
    nodes = abbreviate_all([n for t in tpls for n in t.node_counts], 9) if short else {}
    rows: list[list[Any]] = []
    for tpl in tpls:
        status = tpl.status if tpl.proven else f"{tpl.status} gap {tpl.gap:.2%}"
        rows.append([
            tpl.id[:8] if short else tpl.id[:10],
            models.get(tpl.model, tpl.model),
            abbreviate(tpl.mode, 3) if short else tpl.mode,
            " + ".join(
                f"{c}x{nodes.get(n, n)}" if short else f"{c} x {n}" for n, c in sorted(tpl.node_counts.items())
            ),
            stage_bar(tpl, NARROW_BAR if short else BAR),
            f"{tpl.prefill_tok_s:,.0f}",
            f"{tpl.decode_tok_s:,.0f}",
            f"{tpl.ttft_s * 1e3:.0f} ms" if tpl.mode != "decode" else "-",
            f"{tpl.tpot_s * 1e3:.1f} ms",
            abbreviate(status, 9) if short and tpl.proven else status,
        ])  # fmt: skip
    return rows


def _nodes_text(tpl: Template) -> str:
    return " + ".join(f"{c} x {n}" for n, c in sorted(tpl.node_counts.items()))


def stage_bar(tpl: Template, width: int) -> Text:
    """The layer ranges of a template as one bar, each range in its GPU's colour.

    Stages that hold the same range in parallel share one segment; consecutive segments alternate
    between two glyphs so that boundaries show even between stages of the same GPU type.
    """
    groups: dict[tuple[int, int], list[str]] = {}
    for s in sorted(tpl.stages, key=lambda s: (s.start, s.end, s.index)):
        groups.setdefault((s.start, s.end), []).append(s.gpu)
    spans = sorted(groups)
    cuts = [round(width * end / tpl.num_layers) for _start, end in spans]
    txt = Text(no_wrap=True, overflow="crop")
    prev = 0
    for i, ((_start, _end), cut) in enumerate(zip(spans, cuts, strict=True)):
        n = max(1, cut - prev)
        prev = prev + n
        txt.append(("█" if i % 2 == 0 else "▓") * n, style=gpu_colour(groups[spans[i]][0]))
    return txt


def find_template(store: TemplateStore, model: str, nodes: str, mode: str) -> Template:
    """The one template of ``model`` in ``mode`` on exactly these node types (a query, not a pasted id)."""
    want = sorted(n.strip() for n in nodes.split(",") if n.strip())
    found = [t for t in store.query(model=model, mode=mode) if sorted(t.nodes) == want]
    if not found:
        raise CoralError(
            f"--model {model} --nodes {','.join(want)}: no {mode} template in {store.path} "
            "(see `coral templates list --model ...`)"
        )
    if len({t.id for t in found}) > 1:
        ids = ", ".join(t.id[:10] for t in found)
        raise CoralError(f"--model {model} --nodes {','.join(want)}: several {mode} templates ({ids}); give an id")
    return found[0]


def run_show(args: argparse.Namespace) -> int:
    if (args.id is None) == (args.model is None or args.nodes is None):
        raise CoralError("templates show: give a template id, or --model and --nodes (not both)")
    with open_store(args, readonly=True) as store:
        tpl = store.get(args.id) if args.id is not None else find_template(store, args.model, args.nodes, args.mode)
    if args.json:
        print_json(tpl.to_json())
        return 0
    con = Console()
    con.print(
        f"[bold]{tpl.id}[/]  {tpl.model} ({tpl.num_layers} layers), mode {tpl.mode}, "
        f"SLO TTFT {tpl.slo.ttft_s:g} s / TPOT {tpl.slo.tpot_s * 1e3:g} ms"
    )
    con.print(f"nodes: {_nodes_text(tpl)}")
    width = max(16, min(60, con.width - 62))
    for s in tpl.stages:
        bar = Text(" " * round(width * s.start / tpl.num_layers))
        bar.append("█" * max(1, round(width * s.layers / tpl.num_layers)), style=gpu_colour(s.gpu))
        con.print(
            Text(f"  [{s.index}] {s.node:<16} {s.tp} x {s.gpu:<12} layers {s.start:>3}-{s.end - 1:<3} b={s.batch:<4}")
            + bar
        )
    con.print("routes:")
    total = sum(r.flow for r in tpl.routes if r.src == SOURCE) or 1.0
    for r in sorted(tpl.routes, key=lambda r: (r.src != SOURCE, r.dst == SINK, r.src, r.dst)):
        src = "source" if r.src == SOURCE else f"[{r.src}]"
        dst = "sink" if r.dst == SINK else f"[{r.dst}]"
        con.print(f"  {src:>7} -> {dst:<7} flow {r.flow:,.3f} ({r.flow / total:.0%})")
    if tpl.mode == "aggregated":
        rps = tpl.requests_per_s(tpl.shape.mean_in, tpl.shape.mean_out)
        con.print(
            f"capacity: {rps:,.2f} req/s at {tpl.shape.mean_in:g} in / {tpl.shape.mean_out:g} out tokens "
            f"(prompt-only {tpl.prefill_tok_s:,.0f} tok/s, decode-only {tpl.decode_tok_s:,.0f} tok/s)"
        )
    else:
        rate = tpl.prefill_tok_s if tpl.mode == "prefill" else tpl.decode_tok_s
        con.print(f"capacity: {rate:,.0f} {tpl.mode} tok/s")
    con.print(f"worst path: TTFT {tpl.ttft_s * 1e3:.0f} ms, TPOT {tpl.tpot_s * 1e3:.1f} ms")
    gap = "" if tpl.proven else f", gap {tpl.gap:.2%} (bound {tpl.bound:,.3f})"
    con.print(
        f"status: {tpl.status} by {tpl.method}{gap}; perf {tpl.perf_version}; "
        f"vLLM: {'yes' if tpl.vllm_ok else 'no: ' + tpl.vllm_reason}"
    )
    return 0
