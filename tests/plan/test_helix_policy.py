"""`coral plan --policy helix` and the helix row of `coral bench` on a tiny two-node-type scenario.

The scenario serves a 4-layer model on two CPU node types (2 of each), so that Coral's plan uses several
instances in one region and Helix's one placement over all their nodes is small enough for brute force.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from actors.solver_process import SolverProcess
from coral.catalog import load_catalog
from coral.cli import main
from coral.errors import CoralError
from coral.perf import PerfModel
from coral.plan import PlanRequest
from coral.scenario import load_scenario
from coral.store import TemplateStore
from coral.workload import Slo, WorkloadShape
from solvers.brute import brute_force_place
from solvers.helix import helix_plan, helix_template
from solvers.library import place_one_batch, restrict_batch
from solvers.options import build_problem
from solvers.placement import milp_place
from solvers.planning import Planner, policy_admits, request_at
from tests.conftest import FIXTURES
from tests.solvers.instances import random_tiny_problem

SLOW_NODE = """
[region.offers."cpu-slow"]
price = 0.02
availability = 2

[[gpu]]
name = "cpu-avx2"
vendor = "intel"
tflops_bf16 = 0.2
memory_gb = 2
mem_bw_gbs = 5
mem_efficiency = 0.5
compute_efficiency = 0.3
iter_overhead_s = 0.005
source = "test: a slower CPU"

[[node]]
name = "cpu-slow"
cloud = "local"
gpu = "cpu-avx2"
gpu_count = 1
nic_gbps = 10
intra_link = "pcie"
intra_link_gbs = 16
disk_gbs = 1.0
source = "test"
"""

SCENARIO = """
name = "tiny-helix"
catalog = ["cat.toml"]
regions = ["local"]
node_types = ["cpu-local", "cpu-slow"]
[planner]
nmax = 2
rho = 5000
deadline_s = 5.0
[[deployment]]
name = "tiny"
model = "tiny-llama"
slo = { ttft_s = 5.0, tpot_s = 0.5, attainment = 0.9 }
shape = { mean_in = 512, mean_out = 64 }
demand = DEMAND
"""

Env = tuple[Path, Path]

pytestmark = pytest.mark.xdist_group("helix-policy")  # the module's store (``env``) is built once a run, not per worker


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    """The scenario at 60 req/s (Coral needs 3 of the 4 nodes) and a store built for it."""
    d = tmp_path_factory.mktemp("helix")
    base = (FIXTURES / "catalog" / "tiny-cpu.toml").read_text()
    marker = '[region.offers."cpu-local"]\nprice = 0.05\navailability = 2\n'
    assert marker in base
    (d / "cat.toml").write_text(base.replace(marker, marker + SLOW_NODE))
    sc = d / "sc.toml"
    sc.write_text(SCENARIO.replace("DEMAND", "60.0"))
    store = d / "store.sqlite"
    assert main(["templates", "build", "--scenario", str(sc), "--store", str(store), "--workers", "1", "--json"]) == 0
    return sc, store


_PLANS: dict[tuple[str, str, str], dict[str, Any]] = {}
"""``plan``'s answers on the module's own scenario, kept for the run: two tests read the same helix plan."""


def plan(sc: Path, store: Path, capsys: pytest.CaptureFixture[str], policy: str) -> dict[str, Any]:
    key = (str(sc), str(store), policy)
    if key in _PLANS:
        return _PLANS[key]
    capsys.readouterr()
    argv = ["plan", "--scenario", str(sc), "--store", str(store), "--no-build", "--json", "--policy", policy]
    if policy == "helix":  # a time limit that a loaded machine cannot hit: the tests ask for a proven optimum
        argv += ["--helix-limit", "300"]
    assert main(argv) == 0
    _PLANS[key] = json.loads(capsys.readouterr().out)
    return _PLANS[key]


def with_demand(env: Env, tmp_path: Path, demand: float) -> Path:
    sc = tmp_path / "sc.toml"
    (tmp_path / "cat.toml").write_text((env[0].parent / "cat.toml").read_text())
    sc.write_text(SCENARIO.replace("DEMAND", str(demand)))
    return sc


def coral_clusters(p: dict[str, Any]) -> tuple[dict[tuple[str, str], list[str]], dict[tuple[str, str], float]]:
    """Per (deployment, region) of a Coral plan: its nodes and its capacity in req/s."""
    nodes: dict[tuple[str, str], list[str]] = defaultdict(list)
    agg: dict[tuple[str, str], float] = defaultdict(float)
    pd: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for i in p["instances"]:
        key = (i["deployment"], i["region"])
        nodes[key] += i["nodes"] * i["count"]
        if i["mode"] == "aggregated":
            agg[key] += i["count"] * i["capacity_rps"]
        else:
            pd[key][0 if i["mode"] == "prefill" else 1] += i["count"] * i["capacity_rps"]
    cap = {k: agg[k] + (min(pd[k]) if k in pd else 0.0) for k in nodes}
    return {k: sorted(v) for k, v in nodes.items()}, cap


def test_helix_places_every_node_of_corals_clusters(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    sc, store = env
    coral, helix = plan(sc, store, capsys, "coral"), plan(sc, store, capsys, "helix")
    nodes, cap = coral_clusters(coral)
    assert max(len(v) for v in nodes.values()) >= 3  # the case does exercise a multi-instance cluster
    assert helix["policy"] == "helix" and helix["status"] == "optimal" and helix["gap"] == 0
    assert helix["cost_per_hour"] == pytest.approx(coral["cost_per_hour"], rel=1e-12)
    held: dict[tuple[str, str], list[str]] = defaultdict(list)
    helix_cap: dict[tuple[str, str], float] = defaultdict(float)
    for i in helix["instances"]:
        key = (i["deployment"], i["region"])
        held[key] += i["nodes"]
        helix_cap[key] += i["capacity_rps"]
        assert i["mode"] == "aggregated" and i["count"] == 1
        if i["template_id"].startswith("idle:"):
            assert i["capacity_rps"] == 0
            continue
        assert i["template_id"].startswith("helix-") and i["capacity_rps"] > 0
        tpl = helix["templates"][i["template_id"]]
        assert sorted(s["node"] for s in tpl["stages"]) == sorted(i["nodes"])  # every node of its group
        assert len({s["batch"] for s in tpl["stages"]}) == 1
        assert tpl["status"] == "optimal" and tpl["mode"] == "aggregated"
    assert {k: sorted(v) for k, v in held.items()} == nodes  # the groups and idle nodes are Coral's cluster
    # Coral's aggregated instances on a cluster are groups Helix may choose, each placed at its optimum:
    # Helix's best split reaches at least their capacity (before the groups it fell short here)
    for key, c in cap.items():
        assert helix_cap[key] >= c * (1 - 1e-6)
    assert all(s["unmet_rps"] == 0 for s in coral["serving"])
    for s in helix["serving"]:
        assert 0 <= s["unmet_rps"] <= s["demand_rps"] and s["capacity_rps"] > 0


def test_helix_throughput_is_the_brute_force_optimum(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    sc, store = env
    helix = plan(sc, store, capsys, "helix")
    cat = load_catalog([env[0].parent / "cat.toml"])
    perf = PerfModel(cat)
    slo, shape = Slo(5.0, 0.5, 0.9), WorkloadShape(512, 64)
    for i in helix["instances"]:
        if i["template_id"].startswith("idle:"):
            continue
        problem = build_problem(perf, "tiny-llama", i["nodes"], "aggregated", slo, shape)
        best = 0.0
        for b in sorted({int(x) for m in problem.menus for x in m.b}):
            sub = restrict_batch(problem, b)
            if sub is not None:
                best = max(best, brute_force_place(sub).value)
        assert best > 0
        assert i["capacity_rps"] == pytest.approx(best, rel=1e-6)


@pytest.mark.slow
def test_helix_reports_unmet_demand(env: Env, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sc = with_demand(env, tmp_path, 500.0)
    coral, helix = plan(sc, env[1], capsys, "coral"), plan(sc, env[1], capsys, "helix")
    cu = sum(s["unmet_rps"] for s in coral["serving"])
    hu = sum(s["unmet_rps"] for s in helix["serving"])
    assert cu > 0 and hu >= cu - 1e-6
    (s,) = helix["serving"]
    assert s["demand_rps"] == 500.0 and s["unmet_rps"] < 500.0 and s["capacity_rps"] > 0


def test_helix_milp_per_batch_is_exact() -> None:
    """The placement MILP per micro-batch, as Helix runs it, reaches brute force's optimum per instance."""
    rng = np.random.default_rng(4242)
    for _ in range(25):
        p = random_tiny_problem(rng, max_options=int(rng.integers(2, 6)))
        best = 0.0
        for b in sorted({int(x) for m in p.menus for x in m.b}):
            sub = restrict_batch(p, b)
            if sub is not None:
                ref = brute_force_place(sub)
                best = max(best, ref.value if ref.status == "optimal" else 0.0)
        _, res = place_one_batch(p, time_limit=30.0, placer=milp_place)
        assert res.status in ("optimal", "infeasible")
        assert res.value == pytest.approx(best, rel=1e-6, abs=1e-12)


def test_bench_has_a_helix_row(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    sc, store = env
    capsys.readouterr()
    args = ["bench", "--scenarios", str(sc), "--store", str(store), "--no-build", "--resolves", "2", "--json"]
    assert main(args) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"coral", "homo", "pd-homo", "helix"}
    h, c = rows["helix"], rows["coral"]
    for key in ("scenario", "cost_per_hour", "served_fraction", "solve_p50_s", "solve_p99_s", "capacity_rps"):
        assert key in h
    assert h["cost_per_hour"] == pytest.approx(c["cost_per_hour"], rel=1e-12)
    assert 0 < h["capacity_rps"] <= c["capacity_rps"] * (1 + 1e-9)
    # the best baseline is a cost-choosing one: helix costs what Coral costs by construction
    full = [rows[p]["cost_per_hour"] for p in ("homo", "pd-homo") if rows[p]["served_fraction"] >= 1 - 1e-6]
    if full:
        assert c["cost_ratio_vs_best_baseline"] == pytest.approx(min(full) / c["cost_per_hour"])


def test_bench_runs_the_policies_asked_for(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    sc, store = env
    base = ["bench", "--scenarios", str(sc), "--store", str(store), "--no-build", "--resolves", "1", "--json"]
    capsys.readouterr()
    assert main([*base, "--policies", "homo"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["coral", "homo"]  # coral always runs: the ratios need it
    assert main([*base, "--policies", "homo,helics"]) == 2
    assert "--policies: unknown policy 'helics'" in capsys.readouterr().err


def test_helix_without_templates_names_the_build_command(
    env: Env, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    empty = tmp_path / "empty.sqlite"
    assert main(["plan", "--scenario", str(env[0]), "--store", str(empty), "--no-build", "--policy", "helix"]) == 2
    err = capsys.readouterr().err
    assert "no template store here" in err and "coral templates build --scenario" in err


def test_helix_rejects_negative_demand_and_unknown_policies(env: Env) -> None:
    sc_path, store_path = env
    cat = load_catalog([sc_path.parent / "cat.toml"])
    perf = PerfModel(cat)
    sc = load_scenario(str(sc_path), cat)
    with TemplateStore(store_path) as store:
        tpls = {d.name: [t for t in store.query(model=d.model, slo=d.slo)] for d in sc.deployments}
    planner = Planner("helix", sc, cat, perf, tpls, 5.0)
    base = request_at(sc, cat, 0.0)
    bad = PlanRequest(0.0, {"tiny": -1.0}, base.prices, base.availability, {})
    with pytest.raises(CoralError, match="'tiny' is negative"):
        planner(bad)
    with pytest.raises(CoralError, match=r"unknown policy 'helics'.*helix"):
        policy_admits("helics", tpls["tiny"][0])


@pytest.mark.parametrize("verb", ["plan", "bench"])
def test_helix_limit_must_be_positive(env: Env, capsys: pytest.CaptureFixture[str], verb: str) -> None:
    sc, store = env
    where = ["--scenario", str(sc), "--policy", "helix"] if verb == "plan" else ["--scenarios", str(sc)]
    assert main([verb, *where, "--store", str(store), "--no-build", "--helix-limit", "0"]) == 2
    assert "--helix-limit must be positive, got 0" in capsys.readouterr().err


def test_helix_in_the_solver_process_matches_in_process(env: Env) -> None:
    perf = PerfModel(load_catalog([env[0].parent / "cat.toml"]))
    args = (perf, "tiny-llama", ("cpu-local", "cpu-slow", "cpu-slow"), Slo(5.0, 0.5, 0.9), WorkloadShape(512, 64))
    here, res = helix_template(*args, time_limit=30.0)
    with SolverProcess() as proc:
        there, res2 = proc.call(functools.partial(helix_template, *args, time_limit=30.0), 120.0)
        plan_here = helix_plan(*args, time_limit=30.0)
        plan_there = proc.call(functools.partial(helix_plan, *args, time_limit=30.0), 120.0)
    assert here is not None and there is not None and res.status == res2.status == "optimal"
    assert there.requests_per_s(512, 64) == pytest.approx(here.requests_per_s(512, 64), rel=1e-12)
    assert there.stages == here.stages and there.id == here.id
    assert plan_there.value == plan_here.value and [g for g, _t in plan_there.groups] == [
        g for g, _t in plan_here.groups
    ]
