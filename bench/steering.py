"""Make-before-break benchmark: steering sequences in the simulated mesh and the least serving capacity
each deployment kept through them.

Scenario ``mesh-steer`` (an 8B and a 14B deployment competing for few small nodes), templates built into
a temporary store (or ``--store``). Sequences (``tests/mesh/steering.py``): forbid the template a
deployment serves with (and allow it again), pin and unpin, a stockout of the node type in use, demand
steps, a node loss, and all of them mixed. Per sequence and deployment: the least serving capacity
(``coral.capacity``) once the deployment first served, the kernel seconds at zero capacity with no node
of it lost (the target: 0), the seconds at zero after a node loss, and the ``fleet.unmet`` warnings.

Run ``python bench/steering.py [--json] [--store PATH] [--only NAME ...]`` (``just bench steering``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coral.catalog import load_catalog  # noqa: E402
from coral.cli.build import build_library  # noqa: E402
from coral.cli.jobs import scenario_jobs  # noqa: E402
from coral.perf import PerfModel  # noqa: E402
from coral.scenario import load_scenario  # noqa: E402
from coral.store import TemplateStore  # noqa: E402
from tests.mesh.steering import SCENARIO, library, run_sequence, sequences  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--store", type=Path)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    catalog = load_catalog()
    perf = PerfModel(catalog)
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp) / "templates.sqlite"
        if args.store is None or not store.exists():
            sc = load_scenario(SCENARIO, catalog)
            with TemplateStore(store) as s:
                build_library(perf, s, scenario_jobs(sc), list(sc.node_types), nmax=sc.planner.nmax, rho=sc.planner.rho)
        seqs = sequences(library(store, catalog))
        out = []
        for name, steps in seqs.items():
            if args.only and name not in args.only:
                continue
            o = anyio.run(run_sequence, name, steps, catalog, perf, store, Path(tmp) / f"{name}.journal")
            out.append(o)
            if not args.json:
                for d in sorted(o.min_capacity):
                    print(
                        f"{name:12} {d:9} min capacity {o.min_capacity[d]:6.2f} req/s  "
                        f"zero {o.zero_s.get(d, 0.0):5.0f} s  "
                        f"zero after loss {o.zero_after_loss_s.get(d, 0.0):5.0f} s  "
                        f"warnings {o.warnings}"
                    )
                print(f"{'':12} sent: {'; '.join(f't={t:g} {m}' for t, m in o.sent)}")
    if args.json:
        print(json.dumps([
            {"sequence": o.name, "min_capacity": o.min_capacity, "zero_s": o.zero_s,
             "zero_after_loss_s": o.zero_after_loss_s, "warnings": o.warnings, "sent": o.sent}
            for o in out
        ], indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
