"""A run's set-up: the options of a run, the templates a scenario may use, and the ``MeshSetup`` that a
journal records (``make_setup``) and a replay or resume rebuilds the world from (``world_of``)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from actors.allocator import servable
from coral.catalog import load_catalog
from coral.catalog.loader import catalog_to_dict
from coral.catalog.types import Catalog
from coral.errors import CoralError
from coral.messages.mesh import CloudSetup, DemandTuning, MeshSetup, MeshTiming
from coral.perf import PerfModel, load_profiles
from coral.scenario import Scenario, load_scenario
from coral.store import TemplateStore
from coral.templates import Template
from solvers.library import distinct, is_current
from solvers.planning import POLICIES, policy_admits


@attrs.frozen
class RunOptions:
    """How to run a scenario (everything but the scenario, templates, catalog and perf model)."""

    seed: int = 0
    policy: str = "coral"
    timing: MeshTiming = attrs.field(factory=MeshTiming)
    cloud: CloudSetup = attrs.field(factory=CloudSetup)
    demand: DemandTuning = attrs.field(factory=DemandTuning)
    warm_start: bool = True
    deterministic: bool = False
    duration_s: float | None = None
    deadline_s: float | None = None
    columns: str = "all"


def library_for(
    store: TemplateStore, scenario: Scenario, perf_version: str | None = None, *, vllm_only: bool = False
) -> dict[str, list[Template]]:
    """Per deployment, every current stored template of its model and shape on the scenario's node types
    (any SLO; stale ones of an older formulation or, when given, another perf model are left out; one per
    multiset and SLO, ``solvers.library.distinct``);
    ``vllm_only``: only those vLLM can run as they are."""
    allowed = set(scenario.node_types)
    out: dict[str, list[Template]] = {}
    for d in scenario.deployments:
        out[d.name] = distinct(
            sorted(
                (
                    t
                    for t in store.query(model=d.model)
                    if t.shape == d.shape
                    and set(t.nodes) <= allowed
                    and is_current(t, perf_version)
                    and (t.vllm_ok or not vllm_only)
                ),
                key=lambda t: t.id,
            )
        )
    return out


def catalog_digest(cat: Catalog) -> str:
    """A content hash of a catalog (a replay checks that it runs on the recording's catalog)."""
    blob = json.dumps(catalog_to_dict(cat), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def make_setup(
    scenario: Scenario,
    catalog: Catalog,
    perf: PerfModel,
    library: Mapping[str, Sequence[Template]],
    options: RunOptions = RunOptions(),
    *,
    catalog_files: Sequence[str | os.PathLike[str]] = (),
    profile_files: Sequence[str | os.PathLike[str]] = (),
) -> MeshSetup:
    """The setup record of a run; checks the options and that every deployment has templates to use."""
    if options.policy not in POLICIES:
        raise CoralError(f"policy: unknown {options.policy!r}; choose from {', '.join(POLICIES)}")
    if not isinstance(options.seed, int) or options.seed < 0:
        raise CoralError(f"seed: must be an integer >= 0, got {options.seed!r}")
    timing = options.timing.check()
    cloud = options.cloud.check()
    demand = options.demand.check()
    duration = scenario.duration_s if options.duration_s is None else options.duration_s
    if not (duration > 0 and math.isfinite(duration)):
        raise CoralError(f"duration_s: must be a positive number of seconds, got {duration!r}")
    if options.columns not in ("all", "generated"):
        raise CoralError(f"columns: must be 'all' or 'generated', got {options.columns!r}")
    deadline = scenario.planner.deadline_s if options.deadline_s is None else options.deadline_s
    if not deadline > 0:
        raise CoralError(f"deadline_s: must be positive, got {deadline!r}")
    for d in scenario.deployments:
        tpls = [t for t in library.get(d.name, ()) if t.slo == d.slo and policy_admits(options.policy, t)]
        if not servable(tpls):
            raise CoralError(
                f"deployment {d.name!r} (model {d.model}) has no templates that can serve it under policy "
                f"{options.policy!r}; run `coral templates build --scenario {scenario.path}`"
            )
    seen: dict[str, Template] = {}
    for ts in library.values():
        for t in ts:
            seen.setdefault(t.id, t)
    return MeshSetup(
        scenario_name=scenario.name,
        scenario_path=str(scenario.path),
        scenario_toml=Path(scenario.path).read_text() if Path(scenario.path).exists() else "",
        seed=options.seed,
        policy=options.policy,
        duration_s=float(duration),
        deadline_s=float(deadline),
        timing=timing,
        cloud=cloud,
        demand=demand,
        warm_start=options.warm_start,
        deterministic=options.deterministic,
        catalog_files=tuple(str(p) for p in catalog_files),
        profile_files=tuple(str(p) for p in profile_files),
        catalog_digest=catalog_digest(catalog),
        perf_version=perf.version,
        templates=tuple(seen[k] for k in sorted(seen)),
        columns=options.columns,
    )


def world_of(setup: MeshSetup) -> tuple[Scenario, Catalog, PerfModel]:
    """The scenario, catalog and perf model a setup was recorded with (checked by digest and version)."""
    cat = load_catalog(list(setup.catalog_files))
    digest = catalog_digest(cat)
    if digest != setup.catalog_digest:
        raise CoralError(
            f"the catalog differs from the recording's (digest {digest}, recorded {setup.catalog_digest}); "
            "a replay on another catalog would not reproduce the decisions"
        )
    perf = PerfModel(cat, [t for p in setup.profile_files for t in load_profiles(Path(p))])
    if perf.version != setup.perf_version:
        raise CoralError(f"the perf model is {perf.version}, the recording used {setup.perf_version}")
    path = Path(setup.scenario_path)
    if path.exists() and path.read_text() == setup.scenario_toml:
        return load_scenario(str(path), cat), cat, perf
    if not setup.scenario_toml:
        raise CoralError(f"the recording has no scenario text and {path} is not available")
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / (path.name if path.suffix == ".toml" else "scenario.toml")
        p.write_text(setup.scenario_toml)
        sc = load_scenario(str(p), cat)
    return attrs.evolve(sc, path=path), cat, perf
