"""``coral catalog`` and ``coral perf``."""

from __future__ import annotations

import argparse
from typing import Any

import attrs
from rich.console import Console
from rich.table import Table

from coral.catalog import catalog_to_dict
from coral.cli.common import catalog_from, perf_from, print_json

KINDS = ("gpus", "nodes", "regions", "models")


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser("catalog", parents=[parent], help="list GPU types, node types, regions or models")
    p.add_argument("kind", nargs="?", choices=KINDS, default=None, help="what to list (default: a summary)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_catalog)

    q = sub.add_parser("perf", parents=[parent], help="query the performance model for one stage")
    q.add_argument("--model", required=True, help="catalog model name (see `coral catalog models`)")
    q.add_argument("--node", required=True, help="node type, e.g. g6e.12xlarge")
    q.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (default: all GPUs of the node)")
    q.add_argument("--layers", type=int, default=None, help="layers held (default: the whole model)")
    q.add_argument("--batch", type=int, default=1, help="sequences in the batch (default: 1)")
    q.add_argument(
        "--prompt", type=float, default=1024, help="prompt tokens per sequence for prefill_s (a mean may be fractional)"
    )
    q.add_argument(
        "--context", type=float, default=1024, help="KV context per sequence for decode_step_s (a mean, e.g. 1260.5)"
    )
    q.add_argument("--json", action="store_true", help="print the prediction as JSON")
    q.set_defaults(func=run_perf)


def run_catalog(args: argparse.Namespace) -> int:
    cat = catalog_from(args)
    data = catalog_to_dict(cat)
    if args.json:
        print_json(data if args.kind is None else data[args.kind])
        return 0
    con = Console()
    if args.kind is None:
        t = Table(title="Coral catalog")
        t.add_column("kind")
        t.add_column("count", justify="right")
        t.add_column("names")
        for kind in KINDS:
            names = sorted(data[kind]) if isinstance(data[kind], dict) else [e["name"] for e in data[kind]]
            t.add_row(kind, str(len(names)), ", ".join(names))
        con.print(t)
        return 0
    if args.kind == "gpus":
        t = Table(title="GPU types")
        for c in ("name", "TFLOPS bf16", "memory GB", "BW GB/s", "eta_mem", "eta_cmp", "overhead ms"):
            t.add_column(c, justify="left" if c == "name" else "right")
        for g in cat.gpus.values():
            t.add_row(
                g.name,
                f"{g.tflops_bf16:g}",
                f"{g.memory_gb:g}",
                f"{g.mem_bw_gbs:g}",
                f"{g.mem_efficiency:.3f}",
                f"{g.compute_efficiency:.3f}",
                f"{g.iter_overhead_s * 1e3:.2f}",
            )
    elif args.kind == "nodes":
        t = Table(title="Node types")
        for c in ("name", "cloud", "GPUs", "NIC Gbps", "link", "disk GB/s"):
            t.add_column(c)
        for n in cat.nodes.values():
            t.add_row(
                n.name,
                n.cloud,
                f"{n.gpu_count} x {n.gpu}",
                f"{n.nic_gbps:g}",
                f"{n.intra_link} {n.intra_link_gbs:g} GB/s",
                f"{n.disk_gbs:g}",
            )
    elif args.kind == "regions":
        t = Table(title="Regions (on-demand USD/h, availability)")
        for c in ("region", "cloud", "location", "offers"):
            t.add_column(c)
        for r in cat.regions.values():
            offers = ", ".join(f"{o.node} ${o.price:.2f} x{o.availability}" for o in r.offers.values())
            t.add_row(r.name, r.cloud, r.location, offers)
    else:
        t = Table(title="Models")
        for c in ("name", "layers", "hidden", "params B", "active B", "weights GB", "KV KiB/token"):
            t.add_column(c, justify="left" if c == "name" else "right")
        for m in cat.models.values():
            t.add_row(
                m.name,
                str(m.num_layers),
                str(m.hidden),
                f"{m.total_params / 1e9:.1f}",
                f"{m.active_params / 1e9:.1f}",
                f"{m.weight_bytes / 1e9:.1f}",
                f"{m.kv_bytes_per_token / 1024:.0f}",
            )
    con.print(t)
    return 0


def run_perf(args: argparse.Namespace) -> int:
    perf = perf_from(args)
    pred = perf.predict(
        args.model,
        args.node,
        batch=args.batch,
        prompt=args.prompt,
        context=args.context,
        tp=args.tp,
        layers=args.layers,
    )
    if args.json:
        print_json(attrs.asdict(pred))
        return 0
    t = Table(title=f"{pred.model} on {pred.node} ({pred.tp} x {pred.gpu}), {pred.layers} layers")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_row(f"prefill_s ({pred.batch} x {pred.prompt:g} tokens)", f"{pred.prefill_s * 1e3:.2f} ms")
    t.add_row(f"decode_step_s (batch {pred.batch}, context {pred.context:g})", f"{pred.decode_step_s * 1e3:.2f} ms")
    t.add_row("decode tokens/s", f"{pred.batch / pred.decode_step_s:,.0f}")
    t.add_row("max_layers (this batch and context)", str(pred.max_layers))
    t.add_row("kv_capacity_tokens (these layers)", f"{pred.kv_capacity_tokens:,}")
    t.add_row(
        "memory (weights, ends held, KV, workspace)",
        f"{pred.memory_bytes / 1e9:.1f} GB" + ("" if pred.fits else "  (does not fit)"),
    )
    t.add_row("source", pred.source)
    Console().print(t)
    return 0
