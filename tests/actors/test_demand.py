"""The demand monitor's change test: a constant Poisson stream does not re-plan; a step does, as fast as the
relative thresholds alone would; a small sustained one (+20%) within a couple of minutes (the accumulated
evidence), and a sustained fall too."""

from __future__ import annotations

import math

import numpy as np
import pytest

import coral.demand
from actors.demand import DemandMonitor
from coral.demand import DemandEstimator, moved
from coral.messages.demand import DemandUpdate
from coral.messages.mesh import DemandTuning
from coral.messages.requests import ArrivalCounts, DeploymentTraffic, RoutingStats

from .fake import attach, envelope

REPORT_S = 5.0


def relative_only(old: float, new: float, t: DemandTuning) -> bool:
    """The thresholds without the change test (the monitor's rule before it)."""
    rise = new > old and new - old > max(t.up * old, t.floor)
    return rise or (old > new and old - new > max(t.down * old, t.floor))


async def run(
    rates: list[float], seed: int, values: list[tuple[int, float]] | None = None
) -> tuple[list[int], list[int], float]:
    """Feed the monitor seeded Poisson counts, one report every 5 s at ``rates[k]`` for report k; return
    the reports after which it published an update (the initial one left out), those after which the
    relative thresholds alone would have, and its last published demand. ``values`` gets (report,
    published demand) of each update."""
    tuning = DemandTuning()
    mon = DemandMonitor(tick_s=1.0, deployments=["d"], prior={"d": rates[0]}, tuning=tuning, start=0.0)
    ctx = await attach(mon)
    rng = np.random.default_rng(seed)
    shadow = rates[0]
    new_rule: list[int] = []
    old_rule: list[int] = []
    for k, rate in enumerate(rates):
        at = (k + 1) * REPORT_S
        await mon.handle(envelope(ArrivalCounts(at, at - REPORT_S, {"d": int(rng.poisson(rate * REPORT_S))})))
        await ctx.run_until(at + REPORT_S - 0.5)  # applied at the tick after it came
        _, published = ctx.take()
        updates = [m for m in published if isinstance(m, DemandUpdate)]
        if updates and updates[0].reason != "initial":
            new_rule.append(k)
            if values is not None:
                values.append((k, updates[0].demand["d"]))
        v = mon.estimator.estimate()["d"]
        if relative_only(shadow, v, tuning):
            shadow = v
            old_rule.append(k)
    assert mon.published is not None
    return new_rule, old_rule, mon.published["d"]


@pytest.mark.parametrize("rate", [0.5, 2.0, 6.0, 12.0])
async def test_a_constant_poisson_stream_does_not_re_plan(rate: float) -> None:
    for seed in range(3):
        new_rule, old_rule, _ = await run([rate] * 720, seed)  # an hour
        assert new_rule == []
        if rate <= 6.0:
            assert old_rule  # the noise the test removes: the thresholds alone re-planned


@pytest.mark.parametrize(("before", "after", "later"), [(6.0, 12.0, 0), (2.0, 10.0, 0), (2.0, 6.0, 1), (12.0, 3.0, 1)])
async def test_a_step_re_plans_as_fast_as_the_thresholds_alone(before: float, after: float, later: int) -> None:
    """A large rise is seen at the same report as the thresholds alone see it; a smaller one or a fall
    (which the estimate's peak hold makes wait a minute either way) at most ``later`` reports after."""
    step = 120  # reports: the step at t = 600 s
    for seed in range(5):
        new_rule, old_rule, last = await run([before] * step + [after] * 120, seed)
        first_old = min((k for k in old_rule if k >= step), default=math.inf)
        assert new_rule and new_rule[0] >= step
        assert new_rule[0] <= first_old + later, (seed, new_rule[0], first_old)
        assert math.isclose(last, after, rel_tol=0.35)


def _stats(seq: int, at: float, queued: int) -> RoutingStats:
    row = DeploymentTraffic("d", 0, 0, 0, 0, {}, 0, 0, queued, 0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
    return RoutingStats(seq, at, (row,))


async def test_requests_waiting_for_an_instance_keep_their_demand() -> None:
    """A burst of 10 req/s for 20 s, then nothing arrives while 8 requests still wait in the router (their
    instance is loading): the published demand does not fall; once nothing waits it falls."""
    tuning = DemandTuning()
    mon = DemandMonitor(tick_s=1.0, deployments=["d"], prior={"d": 0.0}, tuning=tuning, start=0.0)
    ctx = await attach(mon)
    floor = 8 / tuning.avg_s
    for k in range(40):
        at = (k + 1) * REPORT_S
        await mon.handle(envelope(ArrivalCounts(at, at - REPORT_S, {"d": 50 if k < 4 else 0}), source="router"))
        await mon.handle(envelope(_stats(k + 1, at, 8 if k < 30 else 0), source="router", kind="publish"))
        await ctx.run_until(at + 1.0)
        assert mon.published is not None
        if 4 <= k < 30:
            assert mon.published["d"] >= floor, (k, mon.published)
    assert mon.published["d"] < floor  # nothing waits any more: the demand fell


def test_a_published_demand_below_the_backlog_moves() -> None:
    est = DemandEstimator(["d"], {"d": 0.0}, DemandTuning(), 0.0)
    est.observe(0.0, 5.0, {"d": 0})
    assert not moved({"d": 0.0}, est.estimate(), est)
    est.backlog({"d": 1})  # one request waits: 0.05 req/s, below the thresholds' floor, and still a change
    assert est.estimate() == {"d": 1 / DemandTuning().avg_s}
    assert moved({"d": 0.0}, est.estimate(), est)
    assert not moved(est.estimate(), est.estimate(), est)
    assert not moved({"d": 5.0}, est.estimate(), est)  # no fall while a request waits
    est.backlog({})
    assert moved({"d": 5.0}, est.estimate(), est)  # nothing waits: the fall is taken


async def _covered_after(before: float, after: float, seeds: range) -> list[float]:
    """Seconds from a step ``before`` -> ``after`` (at report 120) until the published demand has moved
    past half the step, per seed (inf: not in 20 min)."""
    step, out = 120, []
    for seed in seeds:
        values: list[tuple[int, float]] = []
        await run([before] * step + [after] * 240, 100 + seed, values)
        mid = (before + after) / 2
        now = [v for k, v in values if k < step][-1:] or [before]  # the demand in force at the step
        at = [(k, v) for k, v in values if k >= step]
        k = next((k for k, v in [(step, now[0]), *at] if (v - mid) * (after - before) >= 0), None)
        out.append((k - step + 1) * REPORT_S if k is not None else math.inf)
    return out


@pytest.mark.parametrize(("before", "after", "median_s"), [(5.0, 6.0, 200.0), (6.0, 3.6, 120.0)])
async def test_a_sustained_small_change_is_published_within_minutes(
    before: float, after: float, median_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A +20% step (or -40%) is published after the accumulated evidence passes ``CUSUM_H``: the median
    over 9 seeds is within ``median_s``, and no step is missed. The single-window tests alone (the
    evidence switched off) take longer on the rise: a median 275 s, and one step not in 20 min."""
    delays = await _covered_after(before, after, range(9))
    assert float(np.median(delays)) <= median_s, delays
    assert max(delays) < math.inf, delays
    if after > before:
        monkeypatch.setattr(coral.demand, "CUSUM_H", math.inf)
        alone = await _covered_after(before, after, range(9))
        assert float(np.median(alone)) > float(np.median(delays)), (alone, delays)


def test_the_evidence_restarts_at_each_publication() -> None:
    """Evidence against the old rate is dropped when a new rate is published, and kept when it is not."""
    est = DemandEstimator(["d", "e"], {"d": 5.0, "e": 5.0}, DemandTuning(), 0.0)
    for k in range(10):
        est.observe(5.0 * k, 5.0 * (k + 1), {"d": 40, "e": 40})  # 8 req/s against 5
    assert est.rise["d"] > coral.demand.CUSUM_H and est.fall["d"] == 0.0
    est.published({"d": 8.0, "e": 5.0})
    assert est.rise["d"] == 0.0 and est.rise["e"] > coral.demand.CUSUM_H
