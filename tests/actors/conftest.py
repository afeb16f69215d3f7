"""Fixtures of the actor tests: the mesh tests' template store."""

from __future__ import annotations

import pytest

from coral.catalog import Catalog
from coral.perf import PerfModel

from ..mesh.helpers import World, build_store


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, catalog: Catalog, perf: PerfModel) -> World:
    store = build_store(tmp_path_factory.mktemp("mesh") / "templates.sqlite", perf, catalog)
    return World(catalog, perf, store)
