"""Prometheus metrics of a running mesh, fed from the bus (``coral up --metrics HOST:PORT``).

Per deployment (labels ``deployment`` and ``model``), from the messages the actors publish:

===========================================  =======  ==================================================
metric                                       type     from
===========================================  =======  ==================================================
``coral_demand_requests_per_second``         gauge    ``dem.update`` (what the allocator plans for)
``coral_capacity_requests_per_second``       gauge    ``fleet.update`` (``coral.capacity``: routable
                                                      aggregated instances plus min(prefill, decode)
                                                      per region)
``coral_goodput_requests_per_second``        gauge    ``req.stats`` (SLO-meeting completions per second
                                                      over the last report window)
``coral_requests_arrived_total``             counter  ``req.stats``
``coral_requests_completed_total``           counter  ``req.stats``
``coral_requests_failed_total``              counter  ``req.stats`` (label ``reason``)
``coral_requests_slo_met_total``             counter  ``req.stats``
``coral_slo_attainment_ratio``               gauge    ``req.stats`` (SLO-meeting share of the finished)
``coral_ttft_seconds``                       hist.    ``req.latency`` (time to first token)
``coral_tpot_seconds``                       hist.    ``req.latency`` (time per output token after it)
``coral_cost_dollars_per_hour``              gauge    ``plan.new`` (planned: the plan's instances of it)
``coral_instances``                          gauge    ``fleet.update`` (label ``state``)
===========================================  =======  ==================================================

Fleet-wide: two costs, ``coral_fleet_cost_dollars_per_hour`` (running now: the nodes rented, from
``fleet.update``) and ``coral_plan_cost_dollars_per_hour`` (planned: the latest plan's instances, from
``plan.new``), which differ while a transition holds old and new nodes or starts wait for nodes;
``coral_spent_dollars_total`` (``fleet.update``),
``coral_plan_solve_seconds`` (histogram of the allocator's solve times, ``plan.new``) and
``coral_kernel_time_seconds`` (the kernel clock of the latest report). Times are kernel-clock seconds.

With the HTTP gateway in the same process (``GatewayCollector``): ``coral_gateway_responses_total``
(labels ``path`` and ``code``), ``coral_gateway_shed_total`` (429s for a full queue),
``coral_gateway_retries_total`` (requests retried on a second instance), ``coral_gateway_active_requests``
and ``coral_gateway_waiting_requests``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coral.capacity import serving_capacity
from coral.kernel import Envelope
from coral.messages.demand import DemandUpdate
from coral.messages.fleet import INSTANCE_STATES, FleetUpdate
from coral.messages.plan import NewPlan
from coral.messages.requests import LatencySamples, RoutingStats

if TYPE_CHECKING:
    from coral.gateway import Gateway

TOPICS = ("dem.update", "fleet.update", "req.stats", "req.latency", "plan.new")
"""The bus topics the metrics are fed from."""
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
SOLVE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_L = ("deployment", "model")


class MeshMetrics:
    """The metrics of one mesh in their own registry; ``update`` takes each bus message of ``TOPICS``."""

    def __init__(self, deployments: Mapping[str, str]) -> None:
        self.models = dict(deployments)
        r = self.registry = CollectorRegistry()
        self.demand = Gauge("coral_demand_requests_per_second", "Demand the allocator plans for", _L, registry=r)
        self.capacity = Gauge(
            "coral_capacity_requests_per_second", "Capacity of the routable instances", _L, registry=r
        )
        self.goodput = Gauge(
            "coral_goodput_requests_per_second", "SLO-meeting completions per second, last window", _L, registry=r
        )
        self.arrived = Counter("coral_requests_arrived", "Requests arrived", _L, registry=r)
        self.completed = Counter("coral_requests_completed", "Requests completed", _L, registry=r)
        self.failed = Counter("coral_requests_failed", "Requests failed", (*_L, "reason"), registry=r)
        self.slo_met = Counter("coral_requests_slo_met", "Completions within both SLO targets", _L, registry=r)
        self.attainment = Gauge(
            "coral_slo_attainment_ratio", "Share of finished requests that met the SLO", _L, registry=r
        )
        self.ttft = Histogram("coral_ttft_seconds", "Time to first token", _L, buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(
            "coral_tpot_seconds", "Time per output token after the first", _L, buckets=TPOT_BUCKETS, registry=r
        )
        self.cost = Gauge("coral_cost_dollars_per_hour", "Planned cost of the deployment's instances", _L, registry=r)
        self.instances = Gauge("coral_instances", "Instances by state", (*_L, "state"), registry=r)
        self.fleet_cost = Gauge(
            "coral_fleet_cost_dollars_per_hour", "Running cost: the nodes rented now, whole fleet", registry=r
        )
        self.plan_cost = Gauge(
            "coral_plan_cost_dollars_per_hour", "Planned cost: the latest plan's instances, whole fleet", registry=r
        )
        self.spent = Counter("coral_spent_dollars", "What the fleet has cost so far", registry=r)
        self.solve = Histogram("coral_plan_solve_seconds", "Allocator solve time", buckets=SOLVE_BUCKETS, registry=r)
        self.now = Gauge("coral_kernel_time_seconds", "Kernel clock at the latest report", registry=r)
        self.seen: dict[tuple[str, ...], float] = {}
        self.last_stats: RoutingStats | None = None
        self.spent_seen = 0.0
        for d, m in self.models.items():
            self.demand.labels(d, m)
            self.capacity.labels(d, m)

    def _model(self, d: str) -> str:
        return self.models.setdefault(d, "")

    def _total(self, counter: Counter, name: str, key: tuple[str, ...], value: float) -> None:
        """Advance a counter to a cumulative total reported on the bus."""
        k = (name, *key)
        last = self.seen.get(k)
        if last is None or value > last:
            counter.labels(*key).inc(value - (last or 0.0))
            self.seen[k] = value

    def update(self, env: Envelope) -> None:
        """Take one bus message."""
        msg = env.msg
        if isinstance(msg, DemandUpdate):
            for d, v in msg.demand.items():
                self.demand.labels(d, self._model(d)).set(v)
        elif isinstance(msg, FleetUpdate):
            cap = dict.fromkeys(self.models, 0.0) | serving_capacity(msg.instances)
            states = {d: dict.fromkeys(INSTANCE_STATES, 0) for d in self.models}
            for i in msg.instances:
                self._model(i.deployment)
                states.setdefault(i.deployment, dict.fromkeys(INSTANCE_STATES, 0))[i.state] += 1
            for d, v in cap.items():
                self.capacity.labels(d, self._model(d)).set(v)
            for d, per in states.items():
                for s, n in per.items():
                    self.instances.labels(d, self._model(d), s).set(n)
            self.fleet_cost.set(msg.cost_per_hour)
            if msg.spent_usd > self.spent_seen:
                self.spent.inc(msg.spent_usd - self.spent_seen)
                self.spent_seen = msg.spent_usd
        elif isinstance(msg, RoutingStats):
            prev = {t.deployment: t for t in self.last_stats.deployments} if self.last_stats else {}
            dt = msg.at - self.last_stats.at if self.last_stats else 0.0
            for t in msg.deployments:
                key = (t.deployment, self._model(t.deployment))
                self._total(self.arrived, "arrived", key, t.arrivals)
                self._total(self.completed, "completed", key, t.completed)
                self._total(self.slo_met, "slo_met", key, t.slo_met)
                for reason, n in t.failed_by.items():
                    self._total(self.failed, "failed", (*key, reason), n)
                self.attainment.labels(*key).set(t.attainment)
                p = prev.get(t.deployment)
                if p is not None and dt > 0:
                    self.goodput.labels(*key).set((t.slo_met - p.slo_met) / dt)
            self.last_stats = msg
            self.now.set(msg.at)
        elif isinstance(msg, LatencySamples):
            for d, xs in msg.ttft.items():
                h = self.ttft.labels(d, self._model(d))
                for x in xs:
                    h.observe(x)
            for d, xs in msg.tpot.items():
                h = self.tpot.labels(d, self._model(d))
                for x in xs:
                    h.observe(x)
        elif isinstance(msg, NewPlan):
            plan = msg.plan
            cost = dict.fromkeys(self.models, 0.0)
            for pi in plan.instances:
                cost[pi.deployment] = cost.get(pi.deployment, 0.0) + pi.count * pi.cost_per_hour
            for d, v in cost.items():
                self.cost.labels(d, self._model(d)).set(v)
            self.plan_cost.set(plan.cost_per_hour)
            self.solve.observe(plan.solve_s)

    def asgi(self) -> object:
        """An ASGI application serving the exposition text (any path)."""
        return make_asgi_app(self.registry)


class GatewayCollector(Collector):
    """The gateway's counters, read at each scrape."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def collect(self) -> Iterator[Metric]:
        gw = self.gateway
        resp = CounterMetricFamily(
            "coral_gateway_responses", "Gateway responses by path and status", labels=("path", "code")
        )
        for (path, code), n in sorted(gw.responses.items()):
            resp.add_metric((path, str(code)), n)
        yield resp
        yield CounterMetricFamily("coral_gateway_shed", "Requests shed with 429 (queue full)", value=gw.shed)
        yield CounterMetricFamily("coral_gateway_retries", "Requests retried on a second instance", value=gw.retried)
        active = gw.max_active - gw.slots.value
        yield GaugeMetricFamily("coral_gateway_active_requests", "Requests being served", value=active)
        yield GaugeMetricFamily("coral_gateway_waiting_requests", "Requests waiting for a slot", value=gw.waiting)
