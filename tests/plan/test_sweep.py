"""`coral bench --sweep`, the savings study: availability settings, never worse in every cell, deterministic
output, the heatmap, and one-line errors for bad input before any work."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coral.catalog import Catalog
from coral.plan import Plan, PlanRequest
from coral.scenario import load_scenario
from solvers.allocation import SolverEffort
from solvers.planning import request_at
from solvers.study import (
    AVAILABILITY,
    COLUMNS,
    SCALES,
    ColumnResult,
    availability,
    cell_request,
    not_worse,
    sweep_cell,
)
from tests.cli import conftest as cli
from tests.cli.conftest import Coral
from tests.plan.columns import column_planners

coral = cli.coral  # the CLI tests' fixture: run `coral` in this process


def test_scarce_setting_is_the_bundled_scarce_scenario(catalog: Catalog) -> None:
    core = load_scenario("core", catalog)
    scarce = load_scenario("scarce", catalog)
    _, core_avail = core.market_at(catalog, 0.0)
    _, scarce_avail = scarce.market_at(catalog, 0.0)
    assert availability("scarce", core_avail, catalog, 0) == scarce_avail


def test_cap_and_seeded_quota(catalog: Catalog) -> None:
    base = request_at(load_scenario("core", catalog), catalog, 0.0).availability
    cap = availability("cap4", base, catalog, 0)
    assert all(cap[k] == min(v, 4) for k, v in base.items()) and any(v > 4 for v in base.values())
    quota = availability("quota", base, catalog, 7)
    assert quota == availability("quota", base, catalog, 7) != availability("quota", base, catalog, 8)
    assert all(0 <= quota[k] <= min(v, 4) for k, v in base.items())
    assert {v for k, v in quota.items() if base[k] >= 4} == {0, 1, 2, 3, 4}


def test_not_worse_is_the_programs_order() -> None:
    def r(unmet: float, cost: float) -> ColumnResult:
        return ColumnResult("x", cost, 1.0, 0.0, unmet, "optimal", 0.0, {})

    assert not_worse(r(0.0, 10.0), r(0.0, 10.0), 9.0)
    churned = ColumnResult("x", 9.9, 1.0, 0.0, 0.0, "optimal", 0.0, {}, churn_cost=0.5)
    assert not not_worse(churned, r(0.0, 10.0), 9.0)  # cheaper per hour, dearer with its churn penalty
    assert not_worse(r(0.0, 10.0), churned, 9.0)
    assert not_worse(r(0.0, 100.0), r(1.0, 10.0), 9.0)  # serving more comes first
    assert not not_worse(r(1.0, 1.0), r(0.0, 10.0), 9.0)
    assert not not_worse(r(0.0, 10.1), r(0.0, 10.0), 9.0)


@pytest.mark.slow
def test_quick_sweep_never_worse_deterministic_and_plotted(
    small_env: tuple[Path, Path], coral: Coral, tmp_path: Path
) -> None:
    sc, store = small_env
    argv = ["bench", "--sweep", "--quick", "--scenarios", str(sc), "--store", str(store), "--no-build",
            "--deadline", "30", "--seed", "3"]  # fmt: skip
    plot = tmp_path / "sweep.png"
    first = coral(*argv, "--json", "--plot", str(plot))
    assert first.rc == 0, first.err
    out = json.loads(first.out)
    assert out["coral_never_worse"] is True
    assert [(c["scale"], c["availability"]) for c in out["cells"]] == [
        (0.5, "catalog"), (5.0, "catalog"), (0.5, "quota"), (5.0, "quota"),
    ]  # fmt: skip
    for cell in out["cells"]:
        cols = cell["columns"]
        assert list(cols) == list(COLUMNS)
        coral_unmet = cols["coral"]["weighted_unmet_rps"]
        coral_cost = cols["coral"]["cost_per_hour"] + cols["coral"]["churn_cost"]  # the program's objective
        for name, col in cols.items():  # independently of Cell.worse_than
            assert coral_unmet <= col["weighted_unmet_rps"] + 1e-6 * cell["demand_rps"], (cell["scale"], name)
            if col["weighted_unmet_rps"] <= coral_unmet + 1e-6 * cell["demand_rps"]:
                cost = col["cost_per_hour"] + col["churn_cost"]
                assert coral_cost <= cost * (1 + 1e-3) + 1e-9, (cell["scale"], name)
            assert 0.0 <= col["served_fraction"] <= 1.0
            served = cell["demand_rps"] * col["served_fraction"]
            assert col["goodput_tok_s"] <= served * 211 + 1e-6  # at most every served request's tokens
        assert cell["coral_worse_than"] == []
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if out["cells_not_proven_optimal"] == 0:  # identical output for identical input
        assert coral(*argv, "--json").out == first.out
    table = coral(*argv)
    assert table.rc == 0 and "availability quota" in table.out and "Coral never worse than any column: yes" in table.out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--scales", "0"], "--scales: every scale must be a positive finite number, got 0"),
        (["--scales", "1,-2"], "--scales: every scale must be a positive finite number, got -2"),
        (["--scales", "nan"], "--scales: every scale must be a positive finite number, got nan"),
        (["--scales", "1,lots"], "--scales: 'lots' is not a number"),
        (["--availability", "catalog,moon"], "--availability: unknown setting 'moon'"),
        (["--plot", "/no-such-dir/sweep.png"], "--plot: /no-such-dir/sweep.png: folder /no-such-dir does not exist"),
        (["--plot", "sweep.svg"], "--plot must name a .png file"),
        (["--deadline", "0"], "--deadline must be positive"),
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--scenarios", "core,scarce"], "--sweep takes one scenario"),
    ],
)
def test_bad_sweep_input_is_one_line_before_any_work(
    coral: Coral, tmp_path: Path, extra: list[str], needle: str
) -> None:
    store = tmp_path / "none.sqlite"  # never opened: the arguments are checked first
    r = coral("bench", "--sweep", "--store", str(store), "--no-build", *extra)
    assert r.rc == 2
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.err
    assert not store.exists() and list(tmp_path.iterdir()) == []


def test_unwritable_plot_path(coral: Coral, tmp_path: Path) -> None:
    store = str(tmp_path / "none.sqlite")
    taken = tmp_path / "taken.png"
    taken.mkdir()
    r = coral("bench", "--sweep", "--store", store, "--no-build", "--plot", str(taken))
    assert r.rc == 2 and r.err.strip() == f"coral: error: --plot: {taken} is a folder; give a file name", r.err
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        r = coral("bench", "--sweep", "--store", store, "--no-build", "--plot", str(folder / "x.png"))
    finally:
        folder.chmod(0o700)
    lines = r.err.strip().splitlines()
    if "--plot" not in r.err:  # root may write to the folder anyway: then the missing store is the error
        pytest.skip("the read-only folder is writable for this user (root)")
    assert r.rc == 2 and len(lines) == 1 and "--plot" in lines[0] and "not writable" in lines[0], r.err


def test_sweep_options_need_sweep(coral: Coral) -> None:
    r = coral("bench", "--scales", "1")
    assert r.rc == 2 and "--scales is an option of --sweep" in r.err


@pytest.mark.slow
def test_coral_is_never_worse_than_any_column_in_every_cell_of_the_sweep(small_env: tuple[Path, Path]) -> None:
    """Every demand scale x availability setting of the default sweep, on the small library, every column
    at a deadline of 8 s: Coral's plan is never worse than any other column's wherever its portfolio
    solved each restriction to the end (a restriction cut by its share of the deadline may lose to the
    same restriction solved alone with the whole deadline; on a loaded machine that happened at 2 s)."""
    sc, cat, made = column_planners(small_env, 8.0)
    planners: dict[str, Callable[[PlanRequest], Plan]] = dict(made)
    coral_plans: list[Plan] = []
    coral = planners["coral"]

    def kept(req: PlanRequest, **kw: Any) -> Plan:
        coral_plans.append(coral(req, **kw))
        return coral_plans[-1]

    planners["coral"] = kept
    base = request_at(sc, cat, 0.0, trigger="sweep")
    worse, complete = [], 0
    for setting in AVAILABILITY:
        for scale in SCALES:
            cell = sweep_cell(planners, sc, cell_request(base, scale, setting, cat, 0), scale, setting)
            if SolverEffort.from_mapping(coral_plans[-1].effort).restricted:
                continue  # a restriction was cut by the deadline
            complete += 1
            if cell.worse_than:
                worse.append((scale, setting, cell.worse_than))
    assert worse == []
    assert complete >= len(AVAILABILITY) * len(SCALES) // 2
