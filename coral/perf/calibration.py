"""Calibration of the roofline's per-GPU efficiency factors against measured points.

``evaluate`` compares the perf model with the points in ``calibration.toml``. ``fit`` searches, per GPU
type, the (memory efficiency, compute efficiency, iteration overhead) grid that minimises the squared
log error of that GPU's points (the compute efficiency only where a prefill point identifies it); the
catalog's ``gpus.toml`` records the result, and GPU types without points take the factors of the
measured type of their class.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

import attrs
import numpy as np

from coral.catalog.types import Catalog

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


def _predict(cat: Catalog, p: Point) -> float:
    from coral.perf import PerfModel

    perf = PerfModel(cat)
    m = cat.models[p.model]
    if p.phase == "decode":
        t = perf.decode_step_s(p.model, p.node, layers=m.num_layers, batch=p.batch, context=p.context)
    else:
        t = perf.prefill_s(p.model, p.node, layers=m.num_layers, batch=p.batch, prompt=p.prompt)
    return float(t)


def evaluate(cat: Catalog, points: list[Point] | None = None) -> list[Row]:
    """Predicted vs measured for every calibration point under the catalog's current factors."""
    pts = load_points() if points is None else points
    return [Row(p, cat.nodes[p.node].gpu, _predict(cat, p)) for p in pts]


def fit(cat: Catalog, points: list[Point] | None = None) -> dict[str, tuple[float, float, float]]:
    """Best (mem_efficiency, compute_efficiency, iter_overhead_s) per GPU type that has points."""
    pts = load_points() if points is None else points
    by_gpu: dict[str, list[Point]] = {}
    for p in pts:
        if p.held_out:
            continue
        by_gpu.setdefault(cat.nodes[p.node].gpu, []).append(p)
    best: dict[str, tuple[float, float, float]] = {}
    for gpu, gpts in sorted(by_gpu.items()):
        scored: list[tuple[float, tuple[float, float, float]]] = []
        # decode points at small batch do not identify the compute efficiency: keep the GPU's own value
        cmp_grid = CMP_GRID if any(p.phase == "prefill" for p in gpts) else [cat.gpus[gpu].compute_efficiency]
        for me, ce, ov in itertools.product(MEM_GRID, cmp_grid, OVH_GRID):
            g = attrs.evolve(
                cat.gpus[gpu], mem_efficiency=float(me), compute_efficiency=float(ce), iter_overhead_s=float(ov)
            )
            trial = attrs.evolve(cat, gpus={**cat.gpus, gpu: g})
            errs = [np.log(_predict(trial, p) / p.measured_s) for p in gpts]
            scored.append((float(np.sum(np.square(errs))), (float(me), float(ce), float(ov))))
        best[gpu] = min(scored)[1]
    return best
