"""Shared fixtures: the bundled catalog and the perf model, plus the path of ../shared when present."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral.catalog import Catalog, load_catalog
from coral.perf import PerfModel

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
FIXTURES = ROOT / "fixtures"


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="session")
def perf(catalog: Catalog) -> PerfModel:
    return PerfModel(catalog)


def shared_path(*parts: str) -> Path:
    """A path under ../shared/, skipping the test with a reason when it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent (the shared reference folder is not next to this checkout)")
    return p
