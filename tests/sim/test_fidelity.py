"""The simulator against the perf model's closed-form figures, for one instance at steady load."""

from __future__ import annotations

import numpy as np
import pytest

from coral.perf import PerfModel
from coral.sim import LengthDist, PoissonArrivals, SimConfig, SimResult, simulate
from coral.sim.handmade import FixedPlanner, single, stage, template
from coral.templates import SINK, SOURCE, Template
from tests.sim import helpers as h

M, NODE, L = "llama-3.1-8b", "g6e.xlarge", 32
P_IN, P_OUT = 1155, 211


def run_one(
    perf: PerfModel, tpl: Template, rate: float, duration: float, *, seed: int = 0, interval: float = 100.0
) -> SimResult:
    sc = h.scenario([h.deployment(rps=rate)], duration_s=duration)
    src = PoissonArrivals(rate, LengthDist(P_IN, P_OUT, "fixed"), np.random.default_rng(seed), end_s=duration)
    plan = FixedPlanner({tpl.id: tpl}, {("chat", tpl.id, h.REGION): 1})
    return simulate(
        sc,
        {tpl.id: tpl},
        perf,
        plan,
        arrivals={"chat": src},
        config=SimConfig(queue_timeout_s=1e6),
        interval_s=interval,
    )


def steady_served(res: SimResult, t0: float) -> float:
    return float(np.mean([row[5] for row in res.series if t0 <= row[0] and row[1] <= res.duration_s]))


@pytest.mark.parametrize("batch", [16, 64])
def test_saturated_throughput_and_tpot_match_closed_form(perf: PerfModel, batch: int) -> None:
    tpl = single(perf, M, NODE, batch)
    pre = float(perf.prefill_s(M, NODE, layers=L, batch=1, prompt=P_IN))
    tau = float(perf.decode_step_s(M, NODE, layers=L, batch=batch, context=P_IN + P_OUT / 2))
    closed = 1.0 / (pre + P_OUT * tau / batch)
    assert closed == pytest.approx(tpl.requests_per_s(P_IN, P_OUT), rel=1e-9)
    res = run_one(perf, tpl, 1.5 * closed, 600.0)
    assert steady_served(res, 200.0) == pytest.approx(closed, rel=0.05)
    # Every iteration carries `batch` sequences, and on average batch/P_OUT of them are new prompts.
    tpot = res.stats["chat"].tpot.mean
    assert tpot == pytest.approx(tau + pre * batch / P_OUT, rel=0.05)
    assert res.stage_utilisation[f"{tpl.id}/0"] > 0.98


def test_light_load_latencies_match_closed_form(perf: PerfModel) -> None:
    tpl = single(perf, M, NODE, 64)
    res = run_one(perf, tpl, 0.02, 3000.0, interval=600.0)
    st = res.stats["chat"]
    assert st.completed == st.requests > 30
    pre = float(perf.prefill_s(M, NODE, layers=L, batch=1, prompt=P_IN))
    tpot1 = float(perf.decode_step_s(M, NODE, layers=L, batch=1, context=P_IN + P_OUT / 2))
    assert st.ttft.quantile(0.5) == pytest.approx(pre, rel=0.05)
    assert st.tpot.quantile(0.5) == pytest.approx(tpot1, rel=0.05)
    assert st.e2e.quantile(0.5) == pytest.approx(pre + (P_OUT - 1) * tpot1, rel=0.05)
    assert res.to_json()["attainment"]["both"] == 1.0


def test_pipeline_bottleneck_and_idle_stage(perf: PerfModel) -> None:
    """An unbalanced two-stage pipeline runs at its slow stage's rate; the light stage's idle time shows."""
    node, batch = "g6e.12xlarge", 64
    sts = [stage(perf, M, node, 0, 8, batch, index=0, tp=1), stage(perf, M, node, 8, L, batch, index=1, tp=1)]
    tpl = template(perf, M, sts)
    rates = []
    for k in (8, 24):
        pre = float(perf.prefill_s(M, node, layers=k, batch=1, prompt=P_IN, tp=1))
        tau = float(perf.decode_step_s(M, node, layers=k, batch=batch, context=P_IN + P_OUT / 2, tp=1))
        rates.append(1.0 / (pre + P_OUT * tau / batch))
    closed = min(rates)
    res = run_one(perf, tpl, 1.5 * closed, 600.0)
    assert steady_served(res, 200.0) == pytest.approx(closed, rel=0.05)
    light, heavy = res.stage_utilisation[f"{tpl.id}/0"], res.stage_utilisation[f"{tpl.id}/1"]
    assert heavy > 0.95
    assert light == pytest.approx(heavy * 8 / 24, rel=0.1)


def test_fork_charges_each_path_its_own_micro_batches(perf: PerfModel) -> None:
    """A fork (layers 0-8 on one stage feeding two stages of 8-32): each 2-stage path keeps 2 micro-batches
    in flight, so the shared stage steps 2 + 2 and each branch 2 (``solvers.options``'s rule, d_i = the
    summed stage counts of the paths through stage i). The branches are the bottleneck: saturated, each
    serves its own rate, and a token takes max over its path of d_i t_i = 2 t_branch (the n = 3 rule of
    the multiset would say 3 t_branch)."""
    node, batch = "g6e.12xlarge", 16
    sts = [
        stage(perf, M, node, 0, 8, batch, index=0, tp=1),
        stage(perf, M, node, 8, L, batch, index=1, tp=1),
        stage(perf, M, node, 8, L, batch, index=2, tp=1),
    ]
    routes = [(-1, 0, 2.0), (0, 1, 1.0), (0, 2, 1.0), (1, -2, 1.0), (2, -2, 1.0)]
    tpl = template(perf, M, sts, routes=[(SOURCE if a == -1 else a, SINK if b == -2 else b, f) for a, b, f in routes])
    t = {}
    rate = {}
    for k in (8, 24):
        pre = float(perf.prefill_s(M, node, layers=k, batch=1, prompt=P_IN, tp=1))
        tau = float(perf.decode_step_s(M, node, layers=k, batch=batch, context=P_IN + P_OUT / 2, tp=1))
        t[k] = tau + pre * batch / P_OUT
        rate[k] = 1.0 / (pre + P_OUT * tau / batch)
    assert 4 * t[8] < 2 * t[24]  # the branches, not the shared stage, set the pace
    closed = min(rate[8], 2 * rate[24])
    res = run_one(perf, tpl, 1.5 * closed, 600.0)
    assert steady_served(res, 200.0) == pytest.approx(closed, rel=0.05)
    assert res.stats["chat"].tpot.mean == pytest.approx(2 * t[24], rel=0.05)
