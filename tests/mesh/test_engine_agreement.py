"""One engine model: the mesh's simulated engines and ``coral simulate`` agree on the same scenario, seed and
planner. ``steady``: one demand from the start, so that both plan once, at the start, for the same demand,
and serve from a warm fleet. ``step``: no demand for 300 s, then 6 req/s: both see the step through the
mesh's demand monitor (its estimator, re-planning as the estimate rises), wait for the new nodes (the
cloud's ``provision_s``) and engines (weight load plus ``startup_s``) while the first requests time out,
so the two agree only if the simulator models the same monitor and delays (``SimConfig.for_cloud``), the
supervisor's bridges (the estimate climbs over eight re-plans, and each start would otherwise be stopped
before it serves) and the router's queues (each instance is given up to its bound; the rest waits at the
router, which is the monitor's backlog). The
default scenario (one hour, demand steps, its own template library) is too long for a test: ``just bench
mesh --compare`` runs both on it and prints each deployment's attainment side by side. Both run on the same
requests (``deployment_arrivals``, the mesh's traffic for the seed): with their own draws, the step case
compared two samples whose demand estimates crossed a plan boundary on one side only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.compose import RunOptions
from coral.cli.planning import make_planner
from coral.cli.up_cmd import summarize
from coral.scenario import load_scenario
from coral.sim import SimConfig, simulate
from coral.sim.arrivals import deployment_arrivals
from coral.store import TemplateStore
from solvers.allocation import SolverEffort, solve_allocation

from .helpers import World

SCENARIO = """name = "agree"
description = "engine agreement: one 8B chat deployment near its fleet's capacity"
regions = ["aws-us-east-1"]
node_types = ["g6.xlarge", "g6e.xlarge", "g5.xlarge"]
duration_s = {duration:g}

[planner]
nmax = 2
deadline_s = 1.0
replan_interval_s = 3600

[[deployment]]
name = "chat-8b"
model = "llama-3.1-8b"
slo = {{ ttft_s = 2.0, tpot_s = 0.1, attainment = 0.9 }}
shape = {{ mean_in = 512, mean_out = 128 }}
demand = {demand}
"""


def _to_completion(prob: Any, **kw: Any) -> Any:
    """The simulator's solves to completion, as the mesh's (``deterministic``): under the scenario's 1 s
    deadline a loaded machine would change its plans."""
    kw["effort"] = SolverEffort()
    return solve_allocation(prob, **kw)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("demand", "duration"),
    [("6.0", 600.0), ("{ series = [[0, 0.0], [300, 6.0]] }", 1200.0)],
    ids=["steady", "step"],
)
async def test_mesh_and_simulator_agree_on_attainment_and_throughput(
    world: World, tmp_path: Path, demand: str, duration: float
) -> None:
    path = tmp_path / "agree.toml"
    path.write_text(SCENARIO.format(duration=duration, demand=demand))
    sc = load_scenario(str(path), world.catalog)
    opts = RunOptions(seed=7, deterministic=True)
    setup = world.setup("agree", opts, sc)
    with TemplateStore(world.store, readonly=True) as store:
        plan_fn, templates = make_planner("coral", sc, world.catalog, world.perf, store, solve=_to_completion)
    cfg = SimConfig.for_cloud(setup.cloud, monitor=setup.demand)
    arrivals = deployment_arrivals(
        sc, seed=7, end_s=sc.duration_s, length_dist=cfg.length_dist, cv_in=cfg.cv_in, cv_out=cfg.cv_out
    )
    sim = simulate(sc, templates, world.perf, plan_fn, seed=7, config=cfg, arrivals=arrivals).to_json()
    res = await world.run("agree", scenario=sc, options=opts)
    mesh = summarize(setup, res.state, res.end, res.reason, res.wall_s, None)
    if duration > 600:  # the first requests after the step wait out the start and time out, in both
        assert mesh["deployments"]["chat-8b"]["failed_by"].get("no_capacity", 0) > 0
        assert sim["per_model"]["chat-8b"]["completed"] < sim["per_model"]["chat-8b"]["requests"]
    for name, m in mesh["deployments"].items():
        s = sim["per_model"][name]
        assert m["slo_attainment"] == pytest.approx(s["attainment"]["both"], abs=0.01), name
        # throughput: the share of the requests served
        assert m["completed"] / m["arrivals"] == pytest.approx(s["completed"] / s["requests"], abs=0.01), name
