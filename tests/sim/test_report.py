"""Outputs: summary fields, the interval CSV, the plot, histogram percentiles; Azure trace replay."""

from __future__ import annotations

import csv
import itertools
import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from coral.perf import PerfModel
from coral.scenario import FaultEvent
from coral.sim import LogHist, simulate
from coral.sim.handmade import FixedPlanner, GreedyPlanner, single
from coral.sim.report import SERIES_FIELDS
from tests.conftest import shared_path
from tests.sim import helpers as h

M = "llama-3.1-8b"


def test_log_hist_percentiles_are_close() -> None:
    x = np.random.default_rng(0).lognormal(0.0, 1.5, 50_000)
    hist = LogHist()
    for v in x.tolist():
        hist.add(v)
    for q in (0.5, 0.9, 0.99):
        assert hist.quantile(q) == pytest.approx(float(np.quantile(x, q)), rel=0.01)
    assert hist.mean == pytest.approx(float(x.mean()), rel=1e-9)
    assert LogHist().quantile(0.5) == 0.0


def test_summary_csv_and_plot(perf: PerfModel, tmp_path: Path) -> None:
    tpl = single(perf, M, "g6e.xlarge", 64)
    sc = h.scenario(
        [h.deployment(rps=[(0.0, 3.0), (200.0, 6.0)]), h.deployment("other", rps=1.0)],
        duration_s=400,
        events=(FaultEvent(at=300.0, kind="node_loss", region=h.REGION, node="g6e.xlarge"),),
    )
    planner = GreedyPlanner({tpl.id: tpl}, {"chat": [(tpl.id, h.REGION)], "other": [(tpl.id, h.REGION)]})
    res = simulate(sc, {tpl.id: tpl}, perf, planner, interval_s=50)
    s = res.summary()
    for key in (
        "requests",
        "completed",
        "failed",
        "goodput_rps",
        "attainment",
        "latency",
        "cost",
        "cost_per_million_tokens",
        "replans",
        "per_model",
    ):
        assert key in s
    for metric in ("ttft", "tpot", "e2e"):
        lat = s["latency"][metric]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"]
    assert s["replans"]["count"] == len(planner.requests) == 4  # t=0, demand step, interval, fault
    assert set(s["per_model"]) == {"chat", "other"}
    assert s["cost_per_million_tokens"] == pytest.approx(s["cost"] / s["tokens"] * 1e6)
    assert s["goodput_rps"] <= s["completed"] / 400

    out = tmp_path / "series.csv"
    res.write_csv(out)
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == SERIES_FIELDS
    assert len(rows) == 2 * math.ceil(res.end_s / 50)
    chat = [r for r in rows if r["model"] == "chat"]
    arrived = sum(float(r["demand_rps"]) * (float(r["t_end"]) - float(r["t_start"])) for r in chat)
    assert arrived == pytest.approx(res.stats["chat"].requests)
    assert float(chat[0]["cost_per_hour"]) > 0

    png = tmp_path / "sim.png"
    res.plot(png)
    assert png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replays_a_slice_of_the_azure_conversation_trace(perf: PerfModel, tmp_path: Path) -> None:
    src = shared_path("traces", "azure-llm-2023-conv.csv")
    with src.open() as f:
        head = list(itertools.islice(f, 1 + 2000))
    first = datetime.strptime(head[1].split(",")[0][:26], "%Y-%m-%d %H:%M:%S.%f")
    last = datetime.strptime(head[-1].split(",")[0][:26], "%Y-%m-%d %H:%M:%S.%f")
    span = (last - first).total_seconds()
    sl = tmp_path / "conv-slice.csv"
    sl.write_text("".join(head))
    tpl = single(perf, M, "g6e.xlarge", 64)
    sc = h.scenario([h.deployment(rps=1.0)], duration_s=span)
    res = simulate(
        sc, {tpl.id: tpl}, perf, FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 4}), trace=sl, rate_scale=2.0
    )
    s = res.stats["chat"]
    assert s.requests == 2 * 1999
    assert s.completed == s.requests
    assert res.to_json()["attainment"]["both"] > 0.9
    assert s.tokens_in / s.completed == pytest.approx(1155, rel=0.25)
