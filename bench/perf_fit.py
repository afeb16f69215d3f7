"""`just bench perf-fit`: predicted vs measured stage times, per point, with the median and worst error.

With --fit it also searches the per-GPU efficiency factors that fit the points best (the values that
``coral/catalog/data/gpus.toml`` records).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from rich.console import Console
from rich.table import Table

from coral.catalog import load_catalog
from coral.perf.calibration import evaluate, fit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fit", action="store_true", help="also search the best factors per GPU type")
    args = ap.parse_args()
    cat = load_catalog()
    rows = evaluate(cat)
    t = Table(title="perf model vs measured (catalog factors)")
    for c in ("model", "node", "gpu", "phase", "batch", "tokens", "measured ms", "predicted ms", "error", "use"):
        t.add_column(c, justify="right" if c not in ("model", "node", "gpu", "phase", "use") else "left")
    for r in rows:
        p = r.point
        t.add_row(
            p.model,
            p.node,
            r.gpu,
            p.phase,
            str(p.batch),
            str(p.context if p.phase == "decode" else p.prompt),
            f"{p.measured_s * 1e3:.2f}",
            f"{r.predicted_s * 1e3:.2f}",
            f"{r.error:+.1%}",
            "held out" if p.held_out else "fit",
        )
    con = Console(width=140)
    con.print(t)
    for r in rows:
        if r.point.held_out:
            con.print(f"held out ({r.point.model} {r.point.node} b={r.point.batch}): {r.point.held_out}")
    errs = np.abs([r.error for r in rows if not r.point.held_out])
    con.print(
        f"calibration points: {len(errs)}   median |error|: {np.median(errs):.1%}   worst |error|: {errs.max():.1%}"
        f"   targets: median <= 15%, worst <= 35%"
    )
    if args.fit:
        for gpu, (me, ce, ov) in fit(cat).items():
            con.print(f"fit {gpu}: mem_efficiency = {me}, compute_efficiency = {ce}, iter_overhead_s = {ov}")
    return 0 if np.median(errs) <= 0.15 and errs.max() <= 0.35 else 1


if __name__ == "__main__":
    sys.exit(main())
