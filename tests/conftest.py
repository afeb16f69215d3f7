"""Shared fixtures: the bundled catalog, the perf model, the mesh-* scenarios' template store (the mesh, actor
and gateway tests' ``world``), plus the path of ../shared when present."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from coral.catalog import Catalog, load_catalog
from coral.perf import PerfModel

if TYPE_CHECKING:
    from tests.mesh.helpers import World

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
FIXTURES = ROOT / "fixtures"


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="session")
def perf(catalog: Catalog) -> PerfModel:
    return PerfModel(catalog)


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, catalog: Catalog, perf: PerfModel) -> World:
    """The catalog, perf model and a template store of every mesh-* scenario, built once per session."""
    # imported here, not at the top: tests.mesh.helpers loads the actors and the CLI (measured 7.6 s at
    # load 7 on two cores), which a run of the solver or catalog tests alone should not pay
    from tests.mesh.helpers import World, build_store

    store = build_store(tmp_path_factory.mktemp("mesh") / "templates.sqlite", perf, catalog)
    return World(catalog, perf, store)


def shared_path(*parts: str) -> Path:
    """A path under ../shared/, skipping the test with a reason when it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent (the shared reference folder is not next to this checkout)")
    return p
