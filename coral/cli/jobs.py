"""Which template libraries a CLI call asks for: from a scenario's deployments and/or --models."""

from __future__ import annotations

import argparse

from coral.catalog.types import Catalog
from coral.cli.build import BuildJob
from coral.errors import CoralError
from coral.scenario import Scenario, load_scenario
from coral.workload import MODES, Slo, WorkloadShape

DEFAULT_SCENARIO = "default"
DEFAULT_SLO = Slo(ttft_s=2.0, tpot_s=0.1, attainment=0.9)
DEFAULT_SHAPE = WorkloadShape(mean_in=1155.0, mean_out=211.0)


def scenario_jobs(sc: Scenario, modes: tuple[str, ...] = MODES) -> list[BuildJob]:
    """One job per distinct (model, mode, SLO, shape) among the scenario's deployments."""
    seen: dict[tuple[str, str, Slo, WorkloadShape], BuildJob] = {}
    for d in sc.deployments:
        for mode in modes:
            seen.setdefault((d.model, mode, d.slo, d.shape), BuildJob(d.model, mode, d.slo, d.shape))
    return list(seen.values())


def jobs_from_args(args: argparse.Namespace, cat: Catalog) -> tuple[list[BuildJob], list[str], int, float]:
    """Jobs, node types, N_max and rho from --scenario/--models/--modes/--nodes/--nmax/--rho."""
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    for m in modes:
        if m not in MODES:
            raise CoralError(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
    sc = load_scenario(args.scenario or DEFAULT_SCENARIO, cat)
    if args.models:
        jobs: list[BuildJob] = []
        for name in (s.strip() for s in args.models.split(",") if s.strip()):
            if name not in cat.models:
                raise CoralError(f"--models: unknown model {name!r}; known: {', '.join(sorted(cat.models))}")
            deps = [d for d in sc.deployments if d.model == name]
            pairs = {(d.slo, d.shape) for d in deps} or {(DEFAULT_SLO, DEFAULT_SHAPE)}
            for slo, shape in sorted(pairs, key=repr):
                jobs.extend(BuildJob(name, mode, slo, shape) for mode in modes)
    else:
        jobs = scenario_jobs(sc, modes)
    nodes = [s.strip() for s in args.nodes.split(",")] if args.nodes else list(sc.node_types)
    for n in nodes:
        if n not in cat.nodes:
            raise CoralError(f"--nodes: unknown node type {n!r}; known: {', '.join(sorted(cat.nodes))}")
    nmax = args.nmax if args.nmax is not None else sc.planner.nmax
    rho = args.rho if args.rho is not None else sc.planner.rho
    if nmax < 1:
        raise CoralError(f"--nmax must be at least 1, got {nmax}")
    if not rho > 0:
        raise CoralError(f"--rho must be positive, got {rho}")
    return jobs, nodes, nmax, rho
