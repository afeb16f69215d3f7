"""Queueing headroom of the planner (``solvers.planning``): Erlang C, the safe utilisation, and its use."""

from __future__ import annotations

import math

import attrs
import pytest

from coral.templates import Route, Stage, Template
from coral.workload import Slo, WorkloadShape
from solvers.planning import erlang_c, queueing_utilisation, safe_utilisation, template_chains


def test_erlang_c_known_values() -> None:
    assert erlang_c(1, 0.7) == pytest.approx(0.7)  # M/M/1: P(wait) = utilisation
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)  # M/M/2 at one erlang
    assert erlang_c(64, 32.0) < 1e-6 < erlang_c(64, 60.0) < 1.0


def test_safe_utilisation_meets_the_quantile_exactly() -> None:
    own, s, target, q = 0.2, 0.1, 1.0, 0.9
    u = safe_utilisation(own, s, 1, target, q)
    wait = s * math.log(u / (1 - q)) / (1 - u)  # M/M/1: C = u
    assert 0.1 < u < 0.9 and own + wait == pytest.approx(target, rel=1e-6)
    assert safe_utilisation(own, s, 1, 2.0, q) > u  # more slack, more load
    assert safe_utilisation(own, s, 1, target, 0.99) < u  # a stricter quantile, less load
    assert safe_utilisation(own, s, 8, target, q) > u  # more servers queue less
    assert safe_utilisation(1.5, s, 1, target, q) == 0.0  # an idle instance already misses
    assert safe_utilisation(own, s, 1, target, 0.05) >= 0.95  # 95% may miss: waits count from u = 0.95 on


def _template(mode: str, ttft: float, tpot: float, batch: int, nodes: int = 1) -> Template:
    stages = tuple(Stage(i, "g6e.xlarge", "l40s-48g", 1, i * 4, i * 4 + 4, batch, 1e9, 0.01, 0.1) for i in range(nodes))
    routes = [Route(-1, 0, 1.0), *(Route(i, i + 1, 1.0) for i in range(nodes - 1)), Route(nodes - 1, -2, 1.0)]
    return Template(
        "t", "m", 4 * nodes, mode, Slo(1.0, 0.05, 0.9), WorkloadShape(1000, 100), tuple(s.node for s in stages),
        stages, tuple(routes), 1e4, 1e3, ttft, tpot, "v", "optimal", 0.0, 0.0, "hand", 0.0,
    )  # fmt: skip


def test_templates_are_loaded_by_their_queue() -> None:
    from coral.scenario import Demand, Deployment

    dep = Deployment("d", "m", Slo(1.0, 0.05, 0.9), WorkloadShape(1000, 100), Demand(((0.0, 1.0),)))
    slow_prefill = _template("prefill", 1.0, 0.0, 1)  # pre_b = 0.5 s of a 1 s target
    fast_prefill = _template("prefill", 0.2, 0.0, 1)
    assert 0 < queueing_utilisation(slow_prefill, dep) < queueing_utilisation(fast_prefill, dep) < 1
    small = _template("aggregated", 0.2, 0.04, 4)
    big = attrs.evolve(small, stages=tuple(attrs.evolve(s, batch=64) for s in small.stages))
    assert queueing_utilisation(small, dep) < queueing_utilisation(big, dep)
    pipe = _template("aggregated", 0.2, 0.04, 4, nodes=2)
    assert template_chains(pipe) == [[0, 1]]
    assert queueing_utilisation(pipe, dep) > queueing_utilisation(small, dep)  # 2 micro-batches in flight
    assert queueing_utilisation(_template("decode", 0.0, 0.04, 4), dep) == 1.0
