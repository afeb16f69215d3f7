"""The discrete-event fleet simulator: request-level, event-driven, re-planning over a scenario.

``simulate(scenario, templates, perf, plan_fn, ...) -> SimResult``; see ``coral.sim.engine`` for the
model and ``coral.sim.report`` for the outputs.
"""

from coral.sim.arrivals import (
    ArrivalError,
    ArrivalSource,
    BurstyArrivals,
    DiurnalArrivals,
    LengthDist,
    PoissonArrivals,
    ShareSplitter,
    TraceArrivals,
    TraceLengths,
)
from coral.sim.engine import simulate
from coral.sim.report import DepStats, LogHist, SimResult
from coral.sim.state import PlanFn, SimConfig, SimError, template_paths

__all__ = [
    "ArrivalError",
    "ArrivalSource",
    "BurstyArrivals",
    "DepStats",
    "DiurnalArrivals",
    "LengthDist",
    "LogHist",
    "PlanFn",
    "PoissonArrivals",
    "ShareSplitter",
    "SimConfig",
    "SimError",
    "SimResult",
    "TraceArrivals",
    "TraceLengths",
    "simulate",
    "template_paths",
]
