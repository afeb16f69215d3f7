"""``coral simulate`` end to end: template build, the allocation planner, JSON, CSV and plot outputs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from coral.cli import common, simulate_cmd
from coral.errors import CoralError

SCENARIO = """
name = "sim-cli"
regions = ["aws-us-east-1"]
node_types = ["g6e.xlarge", "p5.4xlarge"]
duration_s = 300

[planner]
nmax = 1
replan_interval_s = 120

[[deployment]]
name = "chat"
model = "llama-3.1-8b"
slo = { ttft_s = 2.0, tpot_s = 0.1, attainment = 0.9 }
shape = { mean_in = 1155, mean_out = 211 }
demand = { series = [[0, 3.0], [150, 6.0]] }

[[event]]
at = 200
kind = "node_loss"
region = "aws-us-east-1"
node = "g6e.xlarge"
"""


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    simulate_cmd.add(sub, common.parent_parser())
    return p.parse_args(["simulate", *argv])


@pytest.mark.slow
def test_simulate_command_json_csv_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = tmp_path / "s.toml"
    sc.write_text(SCENARIO)
    store = tmp_path / "t.sqlite"
    csv_path, png = tmp_path / "s.csv", tmp_path / "s.png"
    argv = ["--scenario", str(sc), "--store", str(store), "--seed", "2", "--json", "--csv", str(csv_path),
            "--plot", str(png)]  # fmt: skip
    args = parse(argv)
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"requests", "completed", "failed", "goodput_rps", "attainment", "cost", "per_model", "latency",
                        "cost_per_million_tokens", "replans", "failed_by_reason", "faults", "retries",
                        "preemptions"}  # fmt: skip
    assert out["requests"] == out["completed"] + out["failed"] > 500
    assert out["cost"] > 0
    assert csv_path.read_text().startswith("t_start,t_end,model,")
    assert png.stat().st_size > 10_000
    args = parse([*argv[:-4], "--no-build"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out) == out
    args = parse(["--scenario", str(sc), "--store", str(store), "--no-build", "--duration", "120"])
    assert args.func(args) == 0
    assert "chat" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["--rate-scale", "0"], "--rate-scale must be positive"),
        (["--trace", "/nonexistent.csv"], "file not found"),
        (["--plot", "out.svg"], "must name a .png file"),
        (["--interval", "0"], "--interval must be positive"),
    ],
)
def test_simulate_command_rejects_bad_arguments(argv: list[str], msg: str) -> None:
    args = parse(argv)
    with pytest.raises(CoralError, match=msg):
        args.func(args)


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 200])
def test_the_summary_is_never_cut_off(tmp_path: Path, width: int) -> None:
    """At 80 columns the per-deployment table becomes one block per deployment: every figure is whole."""
    from rich.console import Console

    sc = tmp_path / "s.toml"
    sc.write_text(SCENARIO)
    args = parse(["--scenario", str(sc), "--store", str(tmp_path / "t.sqlite"), "--duration", "60", "--json"])
    assert args.func(args) == 0
    from coral.catalog import load_catalog
    from coral.cli.planning import make_planner
    from coral.perf import PerfModel
    from coral.scenario import load_scenario
    from coral.sim import simulate
    from coral.store import TemplateStore

    cat = load_catalog()
    perf = PerfModel(cat)
    scen = load_scenario(str(sc), cat)
    with TemplateStore(tmp_path / "t.sqlite") as store:
        plan_fn, tpls = make_planner("coral", scen, cat, perf, store)
        res = simulate(scen, tpls, perf, plan_fn, duration_s=60.0)
    con = Console(width=width, record=True)
    simulate_cmd.print_result(res, con)
    text = con.export_text()
    assert "…" not in text
    assert all(len(line) <= width for line in text.splitlines())
    pm = res.summary()["per_model"]["chat"]
    assert f"{pm['attainment']['both']:.1%}" in text and f"{pm['cost']:,.2f}" in text
