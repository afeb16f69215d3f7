"""Bad input gets one clear error: traces, plans, arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coral.perf import PerfModel
from coral.plan import Plan, PlanRequest
from coral.sim import SimConfig, SimError, SimResult, simulate
from coral.sim.handmade import FixedPlanner, make_plan, single
from coral.traces import TraceError
from tests.sim import helpers as h

M = "llama-3.1-8b"
GOOD = [
    "2023-11-16 18:15:46.680590,374,44",
    "2023-11-16 18:15:50.995169,396,109",
    "2023-11-16 18:15:51.222467,879,55",
    "2023-11-16 18:15:52.391017,91,16",
]


def write_trace(tmp_path: Path, rows: list[str]) -> Path:
    p = tmp_path / "trace.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return p


def run(perf: PerfModel, trace: Path, *, on_bad_row: str = "stop", rate_scale: float = 1.0) -> SimResult:
    tpl = single(perf, M, "g6e.xlarge", 32)
    sc = h.scenario([h.deployment(rps=1.0)], duration_s=20)
    plan = FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1})
    return simulate(sc, {tpl.id: tpl}, perf, plan, trace=trace, on_bad_row=on_bad_row, rate_scale=rate_scale)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("2023-11-16 18:15:51.300000,12,abc", "GeneratedTokens 'abc' is not an integer"),
        ("2023-11-16 18:15:51.300000,-5,10", "ContextTokens -5 is negative"),
        ("2023-11-16 18:15:40.000000,10,10", "out of order"),
        ("2023-11-16 18:15:51.300000,10", "expected 3 fields"),
        ("yesterday,10,10", "is not a timestamp"),
    ],
)
def test_bad_trace_row_stops_with_line_and_reason(perf: PerfModel, tmp_path: Path, bad: str, reason: str) -> None:
    trace = write_trace(tmp_path, [*GOOD[:3], bad, GOOD[3]])
    with pytest.raises(TraceError, match=rf"trace.csv:5: .*{reason}"):
        run(perf, trace)


def test_bad_trace_row_skipped_and_counted(perf: PerfModel, tmp_path: Path) -> None:
    trace = write_trace(tmp_path, [*GOOD[:3], "2023-11-16 18:15:51.300000,-5,10", GOOD[3]])
    res = run(perf, trace, on_bad_row="skip", rate_scale=3.0)
    assert res.skipped_rows == 1
    s = res.stats["chat"]
    assert s.requests > 0
    assert s.completed == s.requests


def test_missing_trace_and_bad_header(perf: PerfModel, tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot open trace"):
        run(perf, tmp_path / "nope.csv")
    p = tmp_path / "h.csv"
    p.write_text("time,in,out\n1,2,3\n")
    with pytest.raises(TraceError, match=r"h\.csv:1: header must be"):
        run(perf, p)


def test_empty_plan_is_a_clear_error(perf: PerfModel) -> None:
    tpl = single(perf, M, "g6e.xlarge", 32)
    sc = h.scenario([h.deployment(rps=2.0)], duration_s=60)
    with pytest.raises(SimError, match=r"empty plan at t=0 .*chat=2 req/s"):
        simulate(sc, {tpl.id: tpl}, perf, FixedPlanner({tpl.id: tpl}, {}))


def test_plan_naming_unknown_template_or_wrong_model(perf: PerfModel) -> None:
    tpl = single(perf, M, "g6e.xlarge", 32)
    other = single(perf, "qwen3-14b", "p5.4xlarge", 32)
    sc = h.scenario([h.deployment(rps=1.0)], duration_s=60)

    def bad(req: PlanRequest) -> Plan:
        plan = make_plan(req, {tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1}, "bad")
        return plan

    with pytest.raises(SimError, match="is not among the templates given"):
        simulate(sc, {}, perf, bad)
    with pytest.raises(SimError, match=r"template .* is for qwen3-14b, deployment chat serves llama-3\.1-8b"):
        simulate(sc, {other.id: other}, perf, FixedPlanner({other.id: other}, {("chat", other.id, h.REGION): 1}))
    with pytest.raises(SimError, match="does not offer node type"):
        simulate(sc, {tpl.id: tpl}, perf, FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, "gcp-us-central1"): 1}))


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"rate_scale": 0.0}, "rate_scale must be a positive number"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"interval_s": 0.0}, "interval_s must be positive"),
        ({"on_bad_row": "ignore"}, "on_bad_row must be 'stop' or 'skip'"),
        ({"duration_s": -5.0}, "duration_s must be positive"),
    ],
)
def test_bad_arguments(perf: PerfModel, kw: dict[str, Any], msg: str) -> None:
    tpl = single(perf, M, "g6e.xlarge", 32)
    sc = h.scenario([h.deployment(rps=1.0)], duration_s=60)
    with pytest.raises(SimError, match=msg):
        simulate(sc, {tpl.id: tpl}, perf, FixedPlanner({tpl.id: tpl}, {}), **kw)


def test_bad_config_and_custom_source_errors(perf: PerfModel) -> None:
    with pytest.raises(SimError, match="token_budget must be at least 1"):
        SimConfig(token_budget=0)
    tpl = single(perf, M, "g6e.xlarge", 32)
    sc = h.scenario([h.deployment(rps=1.0)], duration_s=60)
    plan = FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1})

    class Backwards:
        def rate_at(self, t: float) -> float:
            return 1.0

        def __iter__(self):  # type: ignore[no-untyped-def]
            yield from [(5.0, 10, 10), (3.0, 10, 10)]

    class Negative(Backwards):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield from [(1.0, -3, 10)]

    with pytest.raises(SimError, match="out of order"):
        simulate(sc, {tpl.id: tpl}, perf, plan, arrivals={"chat": Backwards()})
    with pytest.raises(SimError, match="negative token count"):
        simulate(sc, {tpl.id: tpl}, perf, plan, arrivals={"chat": Negative()})
    with pytest.raises(SimError, match="unknown deployment 'nope'"):
        simulate(sc, {tpl.id: tpl}, perf, plan, arrivals={"nope": Negative()})
    assert np.isfinite(1.0)
