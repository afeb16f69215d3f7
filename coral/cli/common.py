"""Options shared by every verb, and helpers that load the catalog and perf model from them."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from coral.catalog import Catalog, load_catalog
from coral.errors import CoralError
from coral.perf import PerfModel, load_profiles
from coral.store import TemplateStore, default_store_path

FLEET_POLICIES = ("coral", "homo", "pd-homo")
"""The policies a fleet runs under (``coral simulate``, ``coral up``): ``solvers.planning.POLICIES``,
repeated so that building the parser does not import the solvers. ``coral plan`` and ``coral bench`` also
take ``helix``, a one-off placement over Coral's plan (``solvers.planning.PLAN_POLICIES``)."""

POLICY_HELP = (
    "who plans the fleet: coral (templates of mixed GPUs, prefill/decode split where it pays), homo (one "
    "GPU type per instance) or pd-homo (homo with prefill and decode apart) (default: coral)"
)


def add_policy(p: argparse.ArgumentParser) -> None:
    """``--policy`` of a command that runs a fleet."""
    p.add_argument("--policy", default="coral", choices=FLEET_POLICIES, help=POLICY_HELP)


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


def check_output(path: Path, flag: str, *, exist_ok: bool = True) -> None:
    """Refuse an output file that cannot be written, before any long work: its folder must exist and be
    writable, and the path must not be a folder (``exist_ok=False``: nor a non-empty file)."""
    if path.is_dir():
        raise CoralError(f"{flag}: {path} is a folder; give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise CoralError(f"{flag}: {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise CoralError(f"{flag}: {path}: not writable")
    if not exist_ok and path.exists() and path.stat().st_size > 0:
        raise CoralError(f"{flag}: {path} exists; give a new file")


def check_plot(path: Path, flag: str = "--plot") -> None:
    """Refuse a plot file that cannot be written (``check_output``), that is not a .png, or a missing
    matplotlib, before any long work."""
    if path.suffix.lower() != ".png":
        raise CoralError(f"{flag} must name a .png file, got {path}")
    check_output(path, flag)
    try:
        import matplotlib  # noqa: F401  (optional: the plot extra)
    except ImportError:
        raise CoralError(
            f"{flag} needs matplotlib, which is not installed; pip install matplotlib "
            "(or install Coral with its plot extra: pip install -e '.[plot]')"
        ) from None


def store_path(args: argparse.Namespace) -> Path:
    """The template store of a command: ``--store``, else the one in the user data dir."""
    return args.store if args.store is not None else default_store_path()


def open_store(args: argparse.Namespace, *, readonly: bool, scenario: str | None = None) -> TemplateStore:
    """The command's template store; read-only (``--no-build``, ``list``, ``show``) it must exist already,
    and the error says how to build it there (never creating a folder or an empty store)."""
    path = store_path(args)
    if readonly and not path.is_file():
        where = f" --store {path}" if args.store is not None else ""
        what = f" --scenario {scenario}" if scenario else ""
        raise CoralError(
            f"--store: {path}: no template store here; build one with `coral templates build{what}{where}`"
            + (" or drop --no-build" if getattr(args, "no_build", False) else "")
        )
    return TemplateStore(path, readonly=readonly)


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
    """The perf model of the catalog with ``--profiles``; a table that no catalog model or GPU type
    matches is warned about (the perf model never uses it)."""
    cat = catalog_from(args) if catalog is None else catalog
    tables = []
    for path in args.profiles:
        for t in load_profiles(path):
            if t.model not in cat.models:
                warn(
                    f"--profiles {path}: model {t.model!r} matches no catalog model, so its table is not used "
                    f"(known: {', '.join(sorted(cat.models))}; add one with --catalog FILE)"
                )
            elif t.gpu not in cat.gpus:
                warn(f"--profiles {path}: GPU type {t.gpu!r} is not in the catalog, so its {t.model} table is not used")
            tables.append(t)
    return PerfModel(cat, tables)


def warn(text: str) -> None:
    """One warning line on stderr."""
    print(f"coral: warning: {text}", file=sys.stderr)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


async def stop_on_signals(stop: anyio.Event) -> None:
    """Set ``stop`` at the first SIGINT or SIGTERM (a task of the caller's task group)."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as sigs:
        async for _ in sigs:
            stop.set()
            return
