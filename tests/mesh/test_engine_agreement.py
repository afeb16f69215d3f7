"""One engine model: the mesh's simulated engines and ``coral simulate`` agree on the same scenario, seed and
plan (a steady demand, so that both plan once, at the start, for the same demand). The default scenario
(one hour, demand steps, its own template library) is too long for a test: ``just bench mesh --compare``
runs both on it and prints each deployment's attainment side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.compose import RunOptions
from coral.cli.planning import make_planner
from coral.cli.up_cmd import summarize
from coral.scenario import load_scenario
from coral.sim import simulate
from coral.store import TemplateStore

from .helpers import World

DURATION_S = 600.0
SCENARIO = f"""name = "agree"
description = "engine agreement: one 8B chat deployment near its fleet's capacity, steady"
regions = ["aws-us-east-1"]
node_types = ["g6.xlarge", "g6e.xlarge", "g5.xlarge"]
duration_s = {DURATION_S:g}

[planner]
nmax = 2
deadline_s = 1.0
replan_interval_s = 3600

[[deployment]]
name = "chat-8b"
model = "llama-3.1-8b"
slo = {{ ttft_s = 2.0, tpot_s = 0.1, attainment = 0.9 }}
shape = {{ mean_in = 512, mean_out = 128 }}
demand = 6.0
"""


@pytest.mark.slow
async def test_mesh_and_simulator_agree_on_attainment_and_throughput(world: World, tmp_path: Path) -> None:
    path = tmp_path / "agree.toml"
    path.write_text(SCENARIO)
    sc = load_scenario(str(path), world.catalog)
    with TemplateStore(world.store, readonly=True) as store:
        plan_fn, templates = make_planner("coral", sc, world.catalog, world.perf, store)
    sim = simulate(sc, templates, world.perf, plan_fn, seed=7).to_json()
    opts = RunOptions(seed=7, deterministic=True)
    res = await world.run("agree", scenario=sc, options=opts)
    mesh = summarize(world.setup("agree", opts, sc), res.state, res.end, res.reason, res.wall_s, None)
    for name, m in mesh["deployments"].items():
        s = sim["per_model"][name]
        assert m["slo_attainment"] == pytest.approx(s["attainment"]["both"], abs=0.01), name
        # throughput: the share of the requests served (the two runs draw their own arrivals)
        assert m["completed"] / m["arrivals"] == pytest.approx(s["completed"] / s["requests"], abs=0.01), name
