"""Options shared by every verb, and helpers that load the catalog and perf model from them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from coral.catalog import Catalog, load_catalog
from coral.perf import PerfModel, load_profiles


def parent_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--catalog",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="extra catalog TOML that adds or overrides entries (repeatable)",
    )
    p.add_argument(
        "--profiles",
        action="append",
        type=Path,
        default=[],
        metavar="CSV",
        help="measured profile table that overrides the roofline for its (model, GPU, TP) (repeatable)",
    )
    return p


def catalog_files(args: argparse.Namespace) -> list[Path]:
    """The extra catalog files of a command: those its scenario names (``catalog = [...]``; every one of a
    comma-separated ``--scenarios``), then ``--catalog``."""
    from coral.scenario import scenario_catalogs

    scenario = getattr(args, "scenario", None)
    names = [scenario] if isinstance(scenario, str) else []
    many = getattr(args, "scenarios", None)
    if isinstance(many, str):
        names += [s.strip() for s in many.split(",") if s.strip()]
    extra: list[Path] = []
    for name in names:
        extra += [f for f in scenario_catalogs(name) if f not in extra]
    return [*extra, *args.catalog]


def catalog_from(args: argparse.Namespace) -> Catalog:
    return load_catalog(catalog_files(args))


def perf_from(args: argparse.Namespace, catalog: Catalog | None = None) -> PerfModel:
    cat = catalog_from(args) if catalog is None else catalog
    tables = [t for path in args.profiles for t in load_profiles(path)]
    return PerfModel(cat, tables)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
