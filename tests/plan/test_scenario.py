"""Scenario loading: bundled scenarios validate, and every bad input names the file, table and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral.catalog import Catalog
from coral.scenario import ScenarioError, load_scenario
from coral.traces import TraceError, iter_trace, trace_stats
from tests.conftest import shared_path

BASE = """
name = "t"
regions = ["aws-us-east-1"]
node_types = ["g6e.xlarge", "g6.xlarge"]
[[deployment]]
name = "a"
model = "llama-3.1-8b"
slo = { ttft_s = 2.0, tpot_s = 0.1 }
shape = { mean_in = 1000, mean_out = 200 }
demand = 1.0
"""


PLANNER = "demand = 1.0\n[planner]\n"


@pytest.mark.parametrize("name", ["default", "core", "scarce"])
def test_bundled_scenarios_load(catalog: Catalog, name: str) -> None:
    sc = load_scenario(name, catalog)
    assert sc.deployments and sc.regions
    assert len({d.name for d in sc.deployments}) == len(sc.deployments)


def test_core_and_scarce_shape(catalog: Catalog) -> None:
    core = load_scenario("core", catalog)
    assert len(core.deployments) == 6 and len(core.node_types) == 20 and len(core.regions) == 4
    assert sum(catalog.models[d.model].is_moe for d in core.deployments) >= 2
    sizes = [catalog.models[d.model].total_params for d in core.deployments]
    assert min(sizes) >= 14e9 and max(sizes) >= 200e9
    scarce = load_scenario("scarce", catalog)
    _, avail = scarce.market_at(catalog, 0.0)
    _, core_avail = core.market_at(catalog, 0.0)
    assert avail[("aws-us-east-1", "p5.48xlarge")] == 1 < core_avail[("aws-us-east-1", "p5.48xlarge")]


def test_series_demand_and_market_changes(catalog: Catalog, tmp_path: Path) -> None:
    p = tmp_path / "s.toml"
    text = BASE.replace("demand = 1.0", "demand = { series = [[0, 1.0], [60, 3.0]] }")
    p.write_text(text + '\n[[market]]\nat = 30\nregion = "aws-us-east-1"\nnode = "g6e.xlarge"\navailability = 0\n')
    sc = load_scenario(str(p), catalog)
    d = sc.deployments[0].demand
    assert (d.at(0), d.at(59.9), d.at(60), d.at(1e6)) == (1.0, 1.0, 3.0, 3.0)
    _, before = sc.market_at(catalog, 10)
    _, after = sc.market_at(catalog, 30)
    assert before[("aws-us-east-1", "g6e.xlarge")] > 0 and after[("aws-us-east-1", "g6e.xlarge")] == 0


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ('regions = ["aws-us-east-1"]', 'regions = ["mars-1"]', "key 'regions': unknown region 'mars-1'"),
        ('model = "llama-3.1-8b"', 'model = "gpt-9"', "key 'model': unknown model 'gpt-9'"),
        ("demand = 1.0", "demand = -1.0", "key 'demand': must not be negative"),
        ("ttft_s = 2.0", "ttft_s = -2.0", "slo.ttft_s: must be positive"),
        ("mean_in = 1000", "mean_in = 0", "shape.mean_in: must be positive"),
        ('name = "a"', 'name = "a"\ncolour = "red"', "unknown key 'colour'"),
        ("demand = 1.0", "demand = { series = [[10, 1.0], [5, 2.0]] }", "increasing times"),
        ("demand = 1.0", 'demand = { trace = "missing.csv" }', "cannot open trace"),
        ('node_types = ["g6e.xlarge", "g6.xlarge"]', 'node_types = ["warp"]', "unknown node type 'warp'"),
        ("demand = 1.0", "demand = nan", "key 'demand': must be a finite number, got nan"),
        ("demand = 1.0", "demand = inf", "key 'demand': must be a finite number, got inf"),
        ("demand = 1.0", PLANNER + "utilisation = 1.5", r"\[planner\] key 'utilisation': must be at most 1"),
        ("demand = 1.0", PLANNER + "utilisation = 0", r"\[planner\] key 'utilisation': must be positive"),
        ("demand = 1.0", PLANNER + "churn_factor = -1", r"\[planner\] key 'churn_factor': must not be negative"),
        ("demand = 1.0", PLANNER + "deadline_s = inf", r"\[planner\] key 'deadline_s': must be a finite"),
        ("demand = 1.0", "demand = 1.0\npriority = 0", "key 'priority': must be positive, got 0"),
        ("demand = 1.0", "demand = 1.0\npriority = -2", "key 'priority': must be positive, got -2"),
        ("demand = 1.0", 'demand = 1.0\npriority = "high"', "key 'priority': must be a number, got 'high'"),
        ("demand = 1.0", "demand = 1.0\npriority = nan", "key 'priority': must be a finite number, got nan"),
    ],
)
def test_bad_scenarios(catalog: Catalog, tmp_path: Path, old: str, new: str, needle: str) -> None:
    p = tmp_path / "bad.toml"
    assert old in BASE
    p.write_text(BASE.replace(old, new, 1))
    with pytest.raises(ScenarioError, match=needle) as e:
        load_scenario(str(p), catalog)
    assert str(p) in str(e.value)


def test_priority_defaults_to_one(catalog: Catalog, tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text(BASE.replace("demand = 1.0", "demand = 1.0\npriority = 2.5", 1))
    assert load_scenario(str(p), catalog).deployments[0].priority == 2.5
    p.write_text(BASE)
    assert load_scenario(str(p), catalog).deployments[0].priority == 1.0


def test_zero_churn_factor_is_allowed(catalog: Catalog, tmp_path: Path) -> None:
    p = tmp_path / "z.toml"
    p.write_text(BASE.replace("demand = 1.0", PLANNER + "churn_factor = 0", 1))
    assert load_scenario(str(p), catalog).planner.churn_factor == 0.0


def test_bad_market_and_events(catalog: Catalog, tmp_path: Path) -> None:
    p = tmp_path / "m.toml"
    p.write_text(BASE + '\n[[market]]\nat = 0\nregion = "aws-us-east-1"\nnode = "g6e.xlarge"\navailability = -1\n')
    with pytest.raises(ScenarioError, match=r"\[\[market\]\] #1 key 'availability': must be an integer >= 0"):
        load_scenario(str(p), catalog)
    p.write_text(BASE + '\n[[market]]\nat = 0\nregion = "gcp-us-central1"\nnode = "g6e.xlarge"\nprice = 1.0\n')
    with pytest.raises(ScenarioError, match="unknown region 'gcp-us-central1'"):
        load_scenario(str(p), catalog)
    p.write_text(BASE + '\n[[event]]\nat = 5\nkind = "meteor"\nregion = "aws-us-east-1"\nnode = "g6e.xlarge"\n')
    with pytest.raises(ScenarioError, match="key 'kind': must be one of"):
        load_scenario(str(p), catalog)


def test_unknown_scenario_name(catalog: Catalog) -> None:
    with pytest.raises(ScenarioError, match=r"unknown scenario 'nope'; bundled: .*core"):
        load_scenario("nope", catalog)
    with pytest.raises(ScenarioError, match="TOML syntax error"):
        p = Path(__file__).with_name("_broken.toml")
        try:
            p.write_text("name = [")
            load_scenario(str(p), catalog)
        finally:
            p.unlink()


def test_trace_reader_bad_rows(tmp_path: Path) -> None:
    good = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0000000,10,5\n"
    cases = {
        "2023-11-16 18:00:01.0000000,abc,5\n": "ContextTokens 'abc' is not an integer",
        "2023-11-16 18:00:01.0000000,10,-5\n": "GeneratedTokens -5 is negative",
        "2023-11-16 17:00:00.0000000,10,5\n": "out of order",
        "yesterday,10,5\n": "not a timestamp",
        "2023-11-16 18:00:01.0000000,10\n": "expected 3 fields",
    }
    for row, needle in cases.items():
        p = tmp_path / "t.csv"
        p.write_text(good + row + "2023-11-16 18:00:02.0000000,20,7\n")
        with pytest.raises(TraceError, match=f"{p}:3: .*{needle}"):
            list(iter_trace(p))
        skipped: list[int] = []
        rows = list(iter_trace(p, on_bad_row="skip", skipped=skipped))
        assert skipped == [3] and [r[1] for r in rows] == [10, 20]
    (tmp_path / "h.csv").write_text("a,b,c\n")
    with pytest.raises(TraceError, match="header"):
        list(iter_trace(tmp_path / "h.csv"))


def test_azure_trace_stats() -> None:
    st = trace_stats(shared_path("traces", "azure-llm-2023-conv.csv"))
    assert st.requests == 19366
    assert st.mean_in == pytest.approx(1155, rel=0.01) and st.mean_out == pytest.approx(211, rel=0.01)
    assert st.rate == pytest.approx(5.53, rel=0.02)
