"""End-to-end measured step times (``calibration.toml``): the check of whole decode and prefill steps, and
the fit of the host floor.

The operator curves come from Vidur's per-operator measurements (``coral.perf.fit``); what those GPU-side
timings cannot show is the host's per-iteration work, which overlaps them. ``fit_host`` finds the
``HostFloor`` (h0, h_layer, h_ar, h_seq >= 0) that minimises the sum over the points not held out of
log(max(gpu, host) / measured)^2, with the GPU times of the curves held fixed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import attrs
import numpy as np
from scipy.optimize import least_squares

from coral.catalog.types import Catalog
from coral.perf import PerfModel
from coral.perf.ops import HostFloor
from coral.perf.params import PerfParams

POINTS_FILE = Path(__file__).with_name("calibration.toml")

MEM_GRID = np.round(np.arange(0.40, 0.96, 0.025), 3)
CMP_GRID = np.round(np.arange(0.20, 0.81, 0.025), 3)
OVH_GRID = np.round(np.arange(0.0, 0.0201, 0.0005), 4)


@attrs.frozen
class Point:
    """One measured stage time."""

    model: str
    node: str
    phase: str
    batch: int
    measured_s: float
    source: str
    context: int = 1024
    prompt: int = 0
    held_out: str = ""


@attrs.frozen
class Row:
    """A point with its prediction and relative error."""

    point: Point
    gpu: str
    predicted_s: float

    @property
    def error(self) -> float:
        return (self.predicted_s - self.point.measured_s) / self.point.measured_s


def load_points(path: Path = POINTS_FILE) -> list[Point]:
    with path.open("rb") as f:
        data = tomllib.load(f)
    return [Point(**p) for p in data["point"]]


def _predict(perf: PerfModel, p: Point) -> float:
    m = perf.catalog.models[p.model]
    if p.phase == "decode":
        t = perf.decode_step_s(p.model, p.node, layers=m.num_layers, batch=p.batch, context=p.context)
    else:
        t = perf.prefill_s(p.model, p.node, layers=m.num_layers, batch=p.batch, prompt=p.prompt)
    return float(t)


def evaluate(cat: Catalog, points: list[Point] | None = None, perf: PerfModel | None = None) -> list[Row]:
    """Predicted vs measured for every calibration point (the catalog's perf model unless ``perf``)."""
    pts = load_points() if points is None else points
    pm = PerfModel(cat) if perf is None else perf
    return [Row(p, cat.nodes[p.node].gpu, _predict(pm, p)) for p in pts]


def fit_host(cat: Catalog, params: PerfParams, points: list[Point] | None = None) -> HostFloor:
    """The host floor that fits the points not held out best, the curves of ``params`` held fixed."""
    pts = [p for p in (load_points() if points is None else points) if not p.held_out]
    zero = attrs.evolve(params, host=HostFloor(0.0, 0.0, 0.0, 0.0, ""))
    perf = PerfModel(cat, params=zero)
    gpu = np.array([_predict(perf, p) for p in pts])
    meas = np.array([p.measured_s for p in pts])
    layers = np.array([cat.models[p.model].num_layers for p in pts], dtype=float)
    ar = np.array([2.0 if cat.nodes[p.node].gpu_count > 1 else 0.0 for p in pts])
    seqs = np.array([p.batch for p in pts], dtype=float)

    def host(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = x[0] + layers * (x[1] + ar * x[2]) + x[3] * seqs
        return out * 1e-3

    def r(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.log(np.maximum(gpu, host(x)) / meas)
        return out

    x = least_squares(r, np.array([0.5, 0.2, 0.01, 0.01]), bounds=(0.0, np.inf)).x
    src = (
        f"fitted to the {len(pts)} end-to-end points of coral/perf/calibration.toml not held out, "
        "GPU times from the operator curves held fixed"
    )
    h0, hl, ha, hs = (round(float(v) * 1e-3, 7) for v in x)
    return HostFloor(h0, hl, ha, hs, source=src)
