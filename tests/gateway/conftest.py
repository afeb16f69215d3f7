"""Fixtures of the gateway tests: the mesh tests' template store for the mesh-* scenarios, built once."""

from __future__ import annotations

import pytest

from coral.catalog import Catalog
from coral.perf import PerfModel

from ..mesh.helpers import World, build_store


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, catalog: Catalog, perf: PerfModel) -> World:
    store = build_store(tmp_path_factory.mktemp("mesh") / "templates.sqlite", perf, catalog)
    return World(catalog, perf, store)
