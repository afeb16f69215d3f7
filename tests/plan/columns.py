"""The savings study's column planners on the ``small_env`` library, for the sweep tests."""

from __future__ import annotations

from pathlib import Path

from coral.catalog import Catalog, load_catalog
from coral.cli.planning import deployment_templates
from coral.perf import PerfModel
from coral.scenario import Scenario, load_scenario
from coral.store import TemplateStore
from solvers.planning import Planner
from solvers.study import COLUMNS, column_templates


def column_planners(small_env: tuple[Path, Path], deadline_s: float) -> tuple[Scenario, Catalog, dict[str, Planner]]:
    """The scenario, the catalog and one planner per study column (each over its template subset) at
    ``deadline_s``."""
    sc_path, store_path = small_env
    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario(str(sc_path), cat)
    with TemplateStore(store_path, readonly=True) as store:
        tpls = deployment_templates(store, sc, "coral", perf_version=perf.version)
    return sc, cat, {c: Planner("coral", sc, cat, perf, column_templates(c, tpls), deadline_s) for c in COLUMNS}
