"""Shared by the mesh and actor tests: the mesh-* fixture scenarios, their template store, runs, recordings.

Re-record the committed journals (after a deliberate change of behaviour) with::

    python -m tests.mesh.helpers record
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import attrs

from actors.compose import CoralMesh, RunOptions, RunResult, library_for, make_setup, run_mesh
from actors.feed import Feed, Input, ListFeed, MergedFeed
from coral.catalog import Catalog, load_catalog
from coral.cli.build import build_library
from coral.cli.jobs import scenario_jobs
from coral.kernel import Endpoints, Mesh
from coral.messages import MeshSetup
from coral.perf import PerfModel
from coral.scenario import Scenario, load_scenario
from coral.store import TemplateStore

ROOT = Path(__file__).resolve().parents[2]
JOURNALS = ROOT / "fixtures" / "journals"
SCENARIOS = ("mesh-steady", "mesh-surge", "mesh-stockout")
RECORD_OPTIONS = RunOptions(seed=7, deterministic=True)
"""How the committed journals were recorded (solves without a deadline: reproducible anywhere)."""


def journal_path(name: str) -> Path:
    return JOURNALS / f"{name}.journal"


def build_store(path: Path, perf: PerfModel, catalog: Catalog) -> Path:
    """Build the templates of every mesh-* scenario into ``path`` (N_max 2: about a second)."""
    with TemplateStore(path) as store:
        for name in SCENARIOS:
            sc = load_scenario(name, catalog)
            build_library(perf, store, scenario_jobs(sc), list(sc.node_types), nmax=sc.planner.nmax, rho=sc.planner.rho)
    return path


@attrs.frozen
class World:
    """The catalog, perf model and template store the mesh tests run on."""

    catalog: Catalog
    perf: PerfModel
    store: Path

    def scenario(self, name: str) -> Scenario:
        return load_scenario(name, self.catalog)

    def setup(self, name: str, options: RunOptions = RECORD_OPTIONS, scenario: Scenario | None = None) -> MeshSetup:
        sc = scenario or self.scenario(name)
        with TemplateStore(self.store, readonly=True) as store:
            lib = library_for(store, sc)
        return make_setup(sc, self.catalog, self.perf, lib, options)

    async def run(
        self,
        name: str,
        *,
        options: RunOptions = RECORD_OPTIONS,
        inputs: Sequence[Input] = (),
        journal: Path | None = None,
        until: float | None = None,
        on_start: Callable[[Mesh, CoralMesh], Awaitable[None]] | None = None,
        on_step: Callable[[float], Awaitable[None] | None] | None = None,
        scenario: Scenario | None = None,
        endpoints: Endpoints | None = None,
    ) -> RunResult:
        """Run a scenario on a virtual clock, with extra inputs merged into the scenario's feed."""
        sc = scenario or self.scenario(name)
        setup = self.setup(name, options, sc)
        feed: Feed | None = None
        if inputs:
            cm = CoralMesh(setup, sc, self.catalog, self.perf)
            feed = MergedFeed(cm.feed(), ListFeed(sorted(inputs, key=lambda i: i.at)))
        return await run_mesh(
            setup, sc, self.catalog, self.perf, journal=journal, feed=feed, until=until, on_start=on_start,
            on_step=on_step, endpoints=endpoints,
        )  # fmt: skip

    async def record(self, name: str, path: Path) -> RunResult:
        """Record a scenario's run to a journal as the committed fixtures are."""
        return await self.run(name, journal=path)


def record_fixtures() -> None:
    """Re-record fixtures/journals/mesh-*.journal."""
    catalog = load_catalog()
    perf = PerfModel(catalog)
    with tempfile.TemporaryDirectory() as tmp:
        world = World(catalog, perf, build_store(Path(tmp) / "templates.sqlite", perf, catalog))
        JOURNALS.mkdir(parents=True, exist_ok=True)
        for name in SCENARIOS:
            path = journal_path(name)
            path.unlink(missing_ok=True)
            res = anyio.run(world.record, name, path)
            print(f"{path}: t={res.end:g}, {res.state.plans} plans, {path.stat().st_size:,} bytes")


if __name__ == "__main__" and sys.argv[1:] == ["record"]:
    record_fixtures()
