"""`just bench options`: the cheapest way each deployment of a scenario can be served, per option kind.

Builds the scenario's template library (every deployment, all three modes) at the scenario's own N_max
and rho into a store under /tmp (``--store`` to reuse one: a store that already holds the library solves
nothing), then prints, per deployment, the cost per served request/s of

- the best homogeneous aggregated template (one node type),
- the best mixed-type aggregated template (two or more node types),
- the best homogeneous prefill/decode pair (a prefill template and a decode template, each of one node
  type, possibly two different ones),
- the best prefill/decode pair of any templates (mixed types allowed on either side).

A pair counts only when its two sides may be paired: the prefill template's slowest NIC reaches the
decode template's ``kv_min_nic`` (the allocation's rule, ``solvers.allocation.columns``).

Cost per served req/s is $/h of the template's nodes divided by its request rate at the deployment's
shape: aggregated, ``Template.requests_per_s``; prefill, prompt tokens/s over the mean prompt; decode,
output tokens/s over the mean output; a pair is the sum of its two sides (fractional instances). Each node
type is priced at its cheapest on-demand price over the scenario's regions; the table of prices used
(and the region that gives it) is printed first. Only templates of the current perf model and formulation
count. ``--json`` prints the same as JSON. Load (``uptime``) and build time are reported with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from coral.catalog import load_catalog
from coral.cli.build import build_library
from coral.cli.jobs import scenario_jobs
from coral.perf import PerfModel
from coral.scenario import Deployment, load_scenario
from coral.store import TemplateStore
from coral.templates import Template
from solvers.library import distinct, is_current


def cheapest_prices(cat: Any, regions: tuple[str, ...], node_types: tuple[str, ...]) -> dict[str, tuple[float, str]]:
    """Per node type, its cheapest on-demand price over ``regions`` and the region that offers it."""
    out: dict[str, tuple[float, str]] = {}
    for r in regions:
        for n, offer in cat.regions[r].offers.items():
            if n in node_types and (n not in out or offer.price < out[n][0]):
                out[n] = (offer.price, r)
    return out


def _price(t: Template, prices: Mapping[str, tuple[float, str]]) -> float | None:
    if any(n not in prices for n in t.nodes):
        return None
    return sum(prices[n][0] for n in t.nodes)


def _rate(t: Template, d: Deployment) -> float:
    """Requests/s the template serves at the deployment's shape (one side of a pair for P or D)."""
    if t.mode == "aggregated":
        return t.requests_per_s(d.shape.mean_in, d.shape.mean_out)
    if t.mode == "prefill":
        return t.prefill_tok_s / d.shape.mean_in
    return t.decode_tok_s / d.shape.mean_out


def _best(
    tpls: list[Template], d: Deployment, prices: Mapping[str, tuple[float, str]], homogeneous: bool | None
) -> tuple[float, Template] | None:
    best: tuple[float, Template] | None = None
    for t in tpls:
        if homogeneous is not None and (len(set(t.nodes)) == 1) != homogeneous:
            continue
        p, r = _price(t, prices), _rate(t, d)
        if p is None or r <= 0:
            continue
        c = p / r
        if best is None or (c, t.id) < (best[0], best[1].id):
            best = (c, t)
    return best


def _best_pair(
    pre: list[Template],
    dec: list[Template],
    d: Deployment,
    prices: Mapping[str, tuple[float, str]],
    homogeneous: bool | None,
    cat: Any,
) -> tuple[tuple[float, Template], tuple[float, Template]] | None:
    """The cheapest compatible (prefill, decode) pair: for each decode template, the cheapest prefill
    template whose slowest NIC reaches its ``kv_min_nic``."""
    ps: list[tuple[float, str, Template]] = []
    for t in pre:
        b = _best([t], d, prices, homogeneous)
        if b is not None:
            ps.append((b[0], t.id, t))
    ps.sort()
    nic = {t.id: min(cat.nodes[n].nic_bytes_per_s for n in t.nodes) for _c, _i, t in ps}
    best: tuple[tuple[float, Template], tuple[float, Template]] | None = None
    for t in dec:
        q = _best([t], d, prices, homogeneous)
        if q is None:
            continue
        p = next(((c, tp) for c, _i, tp in ps if nic[tp.id] >= t.kv_min_nic * (1.0 - 1e-12)), None)
        if p is None:
            continue
        if best is None or (p[0] + q[0], p[1].id, q[1].id) < (best[0][0] + best[1][0], best[0][1].id, best[1][1].id):
            best = (p, q)
    return best


def _entry(parts: list[tuple[float, Template]]) -> dict[str, Any]:
    return {
        "usd_per_h_per_rps": sum(c for c, _ in parts),
        "templates": [{"mode": t.mode, "nodes": list(t.nodes), "usd_per_h_per_rps": c, "id": t.id} for c, t in parts],
    }


def options_table(store: TemplateStore, sc: Any, cat: Any, perf: PerfModel) -> dict[str, dict[str, Any]]:
    """Per deployment, the four best options (None where the library has no such option)."""
    prices = cheapest_prices(cat, sc.regions, sc.node_types)
    out: dict[str, dict[str, Any]] = {}
    for d in sc.deployments:
        by_mode: dict[str, list[Template]] = {"aggregated": [], "prefill": [], "decode": []}
        for t in store.query(model=d.model, slo=d.slo):
            if t.shape == d.shape and set(t.nodes) <= set(sc.node_types) and is_current(t, perf.version):
                by_mode[t.mode].append(t)
        by_mode = {k: distinct(v) for k, v in by_mode.items()}
        row: dict[str, Any] = {}
        for name, homo in (("aggregated_homogeneous", True), ("aggregated_mixed", False)):
            b = _best(by_mode["aggregated"], d, prices, homo)
            row[name] = _entry([b]) if b else None
        for name, same in (("pd_homogeneous", True), ("pd_any", None)):
            pair = _best_pair(by_mode["prefill"], by_mode["decode"], d, prices, same, cat)
            row[name] = _entry(list(pair)) if pair else None
        row["templates"] = {k: len(v) for k, v in by_mode.items()}
        out[d.name] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="core")
    ap.add_argument("--store", type=Path, default=None, help="store to build into (default: a new one under /tmp)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = ap.parse_args()
    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario(args.scenario, cat)
    path = args.store or Path(tempfile.mkdtemp(prefix="coral-options-")) / "store.sqlite"
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with TemplateStore(path) as store:
        rep = build_library(
            perf, store, scenario_jobs(sc), list(sc.node_types), nmax=sc.planner.nmax, rho=sc.planner.rho,
            workers=args.workers,
        )  # fmt: skip
        build_s = time.perf_counter() - t0
        table = options_table(store, sc, cat, perf)
    prices = cheapest_prices(cat, sc.regions, sc.node_types)
    meta = {
        "scenario": sc.name,
        "nmax": sc.planner.nmax,
        "rho": sc.planner.rho,
        "perf_version": perf.version,
        "store": str(path),
        "build_s": round(build_s, 1),
        "solved": rep.solved,
        "reused": rep.reused,
        "kept": rep.kept,
        "workers": args.workers,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "prices": {n: {"usd_per_h": p, "region": r} for n, (p, r) in sorted(prices.items())},
    }
    if args.json:
        print(json.dumps({"meta": meta, "deployments": table}, indent=1, sort_keys=True))
        return 0
    print(f"scenario {sc.name}, N_max {sc.planner.nmax}, rho {sc.planner.rho:g}, perf model {perf.version}")
    print(f"store {path}: built in {build_s:.1f} s on {args.workers} workers ({rep.solved} solved, "
          f"{rep.reused} reused, {rep.kept} kept)")  # fmt: skip
    print(f"load average before {meta['loadavg_before']}, after {meta['loadavg_after']}")
    print("prices: each node type at its cheapest on-demand price over the scenario's regions")
    for n, (p, r) in sorted(prices.items()):
        print(f"  {n:18s} ${p:8.3f}/h  {r}")
    print()
    print("cost per served req/s ($/h per req/s); the templates that give it")
    cols = ("aggregated_homogeneous", "aggregated_mixed", "pd_homogeneous", "pd_any")
    print(f"{'deployment':12s} " + " ".join(f"{c:>24s}" for c in cols))
    for name, row in table.items():
        cells = [f"{row[c]['usd_per_h_per_rps']:24.3f}" if row[c] else f"{'-':>24s}" for c in cols]
        print(f"{name:12s} " + " ".join(cells))
    print()
    for name, row in table.items():
        print(f"{name}: templates {row['templates']}")
        for c in cols:
            if row[c]:
                parts = " + ".join(
                    f"{t['mode']}[{','.join(t['nodes'])}] {t['usd_per_h_per_rps']:.3f}" for t in row[c]["templates"]
                )
                print(f"  {c:24s} {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
