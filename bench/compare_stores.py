"""Whether two template stores hold the same outcomes and templates (every column and every field of
each template's body, its ``solve_s`` timing aside): ``python bench/compare_stores.py A.sqlite B.sqlite``.

Prints the counts of each and every difference (at most ``--show`` of them); exits 1 when they differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from coral.store import TemplateStore

TIMING = ("solve_s",)
"""Template body fields that measure the solve's wall time, so differ between identical builds."""


def contents(path: Path) -> tuple[dict[str, tuple[Any, ...]], dict[str, tuple[Any, ...]]]:
    """The store's outcome rows by key and its template rows by id (the body's timings dropped)."""
    if not path.is_file():
        raise SystemExit(f"store: no such file {path}")
    with TemplateStore(path, readonly=True) as store:
        outcomes = {r[0]: tuple(r) for r in store.db.execute("SELECT * FROM outcomes")}
        cols = [d[1] for d in store.db.execute("PRAGMA table_info(templates)")]
        templates = {}
        for r in store.db.execute("SELECT * FROM templates"):
            row = dict(zip(cols, r, strict=True))
            body = {k: v for k, v in json.loads(row.pop("body")).items() if k not in TIMING}
            templates[row["id"]] = (*row.values(), json.dumps(body, sort_keys=True))
    return outcomes, templates


def diff(a: dict[str, tuple[Any, ...]], b: dict[str, tuple[Any, ...]]) -> list[str]:
    """One line per key missing from either side or whose rows differ."""
    out = [f"only in A: {k}" for k in sorted(a.keys() - b.keys())]
    out += [f"only in B: {k}" for k in sorted(b.keys() - a.keys())]
    out += [f"differs: {k}\n  A {a[k]}\n  B {b[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--show", type=int, default=10, help="most differences to print")
    args = ap.parse_args(argv)
    (oa, ta), (ob, tb) = contents(args.a), contents(args.b)
    print(f"A {args.a}: {len(oa)} outcomes, {len(ta)} templates")
    print(f"B {args.b}: {len(ob)} outcomes, {len(tb)} templates")
    bad = diff(oa, ob) + diff(ta, tb)
    for line in bad[: args.show]:
        print(line)
    print("identical (outcomes and templates, solve_s aside): " + ("yes" if not bad else f"NO ({len(bad)} differ)"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
