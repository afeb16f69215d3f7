"""Scenarios: TOML files that name deployments (model + SLO + shape + demand), regions and market changes.

Format (every key is documented in ``fixtures/scenarios/README.md``)::

    name = "core"
    catalog = ["my-catalog.toml"]                        # optional: extra catalog files (relative paths)
    regions = ["aws-us-east-1", "gcp-us-central1"]     # catalog regions
    node_types = ["g6e.xlarge", ...]                     # optional: default, every type the regions offer
    duration_s = 3600

    [planner]                                            # optional
    nmax = 3
    rho = 12.0
    utilisation = 0.85
    churn_factor = 1.0
    deadline_s = 1.0
    replan_interval_s = 300

    [[deployment]]
    name = "chat-70b"                                    # unique; several may share one model
    model = "llama-3.3-70b"
    slo = { ttft_s = 2.0, tpot_s = 0.1, attainment = 0.9 }
    shape = { mean_in = 1155, mean_out = 211 }           # optional when demand is a trace
    demand = 4.0                                         # req/s; or { series = [[t, rps], ...] };
                                                         # or { trace = "path.csv", scale = 1.0 }
    priority = 1.0                                       # optional: weight of its unmet demand when scarce

    [[market]]                                           # a change from time `at` on
    at = 600
    region = "aws-us-east-1"
    node = "p5.48xlarge"
    availability = 0                                     # and/or price = 50.0

    [[event]]                                            # faults for the simulator and the mesh
    at = 900
    kind = "node_loss"                                   # or "preemption"
    region = "aws-us-east-1"
    node = "g6e.12xlarge"
    count = 1
"""

from __future__ import annotations

import bisect
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from coral.catalog.types import Catalog
from coral.errors import CoralError
from coral.traces import TraceError, trace_stats
from coral.workload import Slo, WorkloadShape

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "scenarios"
PLANNER_KEYS = {
    "nmax": int,
    "rho": float,
    "utilisation": float,
    "churn_factor": float,
    "deadline_s": float,
    "replan_interval_s": float,
}
EVENT_KINDS = ("node_loss", "preemption")


class ScenarioError(CoralError):
    """A scenario file is invalid; the message names the file, table and key."""


@attrs.frozen
class Demand:
    """Demand in requests/s over time: a step series of (time, rps), or a trace file scaled by ``scale``."""

    series: tuple[tuple[float, float], ...]
    trace: Path | None = None
    scale: float = 1.0

    def at(self, t: float) -> float:
        times = [p[0] for p in self.series]
        i = bisect.bisect_right(times, t) - 1
        return self.series[max(i, 0)][1]


@attrs.frozen
class Deployment:
    """One served model: a catalog model with its own SLO, request shape and demand."""

    name: str
    model: str
    slo: Slo
    shape: WorkloadShape
    demand: Demand
    priority: float = 1.0
    """Weight of this deployment's unmet req/s when demand cannot all be served (serve first: higher first)."""


@attrs.frozen
class MarketChange:
    at: float
    region: str
    node: str
    availability: int | None = None
    price: float | None = None


@attrs.frozen
class FaultEvent:
    at: float
    kind: str
    region: str
    node: str
    count: int = 1


@attrs.frozen
class Planner:
    nmax: int = 3
    rho: float = 12.0
    utilisation: float = 0.85
    churn_factor: float = 1.0
    deadline_s: float = 1.0
    replan_interval_s: float = 300.0


@attrs.frozen
class Scenario:
    """A validated scenario."""

    name: str
    path: Path
    regions: tuple[str, ...]
    node_types: tuple[str, ...]
    deployments: tuple[Deployment, ...]
    duration_s: float
    planner: Planner
    market: tuple[MarketChange, ...]
    events: tuple[FaultEvent, ...]
    description: str = ""

    def market_at(self, catalog: Catalog, t: float) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], int]]:
        """Prices and availability per (region, node type) at time ``t``."""
        price: dict[tuple[str, str], float] = {}
        avail: dict[tuple[str, str], int] = {}
        for r in self.regions:
            for n, offer in catalog.regions[r].offers.items():
                if n in self.node_types:
                    price[(r, n)] = offer.price
                    avail[(r, n)] = offer.availability
        for ch in sorted(self.market, key=lambda c: c.at):
            if ch.at <= t:
                if ch.price is not None:
                    price[(ch.region, ch.node)] = ch.price
                if ch.availability is not None:
                    avail[(ch.region, ch.node)] = ch.availability
        return price, avail


def resolve_scenario_path(name_or_file: str) -> Path:
    """A bundled scenario name (``core``) or a path to a TOML file."""
    p = Path(name_or_file)
    if p.suffix == ".toml" or p.exists():
        if not p.exists():
            raise ScenarioError(f"{p}: scenario file not found")
        return p
    bundled = SCENARIO_DIR / f"{name_or_file}.toml"
    if not bundled.exists():
        known = sorted(q.stem for q in SCENARIO_DIR.glob("*.toml"))
        raise ScenarioError(f"unknown scenario {name_or_file!r}; bundled: {', '.join(known)}; or give a .toml path")
    return bundled


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: TOML syntax error: {e}") from None


def scenario_catalogs(name_or_file: str) -> list[Path]:
    """The catalog files a scenario names (top-level ``catalog = [FILE, ...]``, relative to the scenario);
    they load after the bundled catalog and before any ``--catalog`` file."""
    path = resolve_scenario_path(name_or_file)
    data = _read_toml(path)
    files = data.get("catalog", [])
    if not isinstance(files, list) or not all(isinstance(x, str) and x for x in files):
        raise _err(path, "key 'catalog'", f"must be a list of catalog file paths, got {files!r}")
    out = []
    for x in files:
        p = (path.parent / x).resolve()
        if not p.is_file():
            raise _err(path, "key 'catalog'", f"catalog file {x!r} not found (looked at {p})")
        out.append(p)
    return out


def load_scenario(name_or_file: str, catalog: Catalog) -> Scenario:
    """Load and validate a scenario against the catalog."""
    path = resolve_scenario_path(name_or_file)
    data = _read_toml(path)
    return _parse(path, data, catalog)


def _err(path: Path, where: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{path}: {where}: {msg}")


def _num(path: Path, where: str, v: Any, *, positive: bool = False, nonneg: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _err(path, where, f"must be a number, got {v!r}")
    if not math.isfinite(v):
        raise _err(path, where, f"must be a finite number, got {v}")
    if positive and not v > 0:
        raise _err(path, where, f"must be positive, got {v}")
    if nonneg and v < 0:
        raise _err(path, where, f"must not be negative, got {v}")
    return float(v)


def _known(path: Path, where: str, d: Mapping[str, Any], allowed: Sequence[str]) -> None:
    extra = sorted(set(d) - set(allowed))
    if extra:
        raise _err(path, where, f"unknown key {extra[0]!r} (allowed: {', '.join(allowed)})")


def _parse(path: Path, data: Mapping[str, Any], cat: Catalog) -> Scenario:
    _known(
        path,
        "top level",
        data,
        [
            "name",
            "description",
            "catalog",
            "regions",
            "node_types",
            "duration_s",
            "planner",
            "deployment",
            "market",
            "event",
        ],
    )
    regions = data.get("regions")
    if not isinstance(regions, list) or not regions:
        raise _err(path, "key 'regions'", "must be a non-empty list of catalog region names")
    for r in regions:
        if r not in cat.regions:
            raise _err(path, "key 'regions'", f"unknown region {r!r}; known: {', '.join(sorted(cat.regions))}")
    offered = sorted({n for r in regions for n in cat.regions[r].offers})
    node_types = data.get("node_types", offered)
    for n in node_types:
        if n not in cat.nodes:
            raise _err(path, "key 'node_types'", f"unknown node type {n!r}")
    planner_d = data.get("planner", {})
    _known(path, "table [planner]", planner_d, list(PLANNER_KEYS))
    pk: dict[str, Any] = {}
    for k, v in planner_d.items():
        where = f"[planner] key '{k}'"
        num = _num(path, where, v, nonneg=True) if k == "churn_factor" else _num(path, where, v, positive=True)
        if k == "utilisation" and num > 1:
            raise _err(path, where, f"must be at most 1 (a fraction of capacity), got {v}")
        if PLANNER_KEYS[k] is int and num != int(num):
            raise _err(path, where, f"must be an integer, got {v}")
        pk[k] = PLANNER_KEYS[k](num)
    deployments = []
    names: set[str] = set()
    for i, d in enumerate(data.get("deployment", [])):
        where = f"[[deployment]] #{i + 1} ({d.get('name', '?')})"
        deployments.append(_deployment(path, where, d, cat))
        if deployments[-1].name in names:
            raise _err(path, where, f"duplicate deployment name {deployments[-1].name!r}")
        names.add(deployments[-1].name)
    if not deployments:
        raise _err(path, "[[deployment]]", "a scenario needs at least one deployment")
    market = []
    for i, m in enumerate(data.get("market", [])):
        where = f"[[market]] #{i + 1}"
        _known(path, where, m, ["at", "region", "node", "availability", "price"])
        reg, node = _region_node(path, where, m, regions, cat)
        av = m.get("availability")
        if av is not None and (not isinstance(av, int) or av < 0):
            raise _err(path, where + " key 'availability'", f"must be an integer >= 0, got {av!r}")
        pr = m.get("price")
        if pr is not None:
            pr = _num(path, where + " key 'price'", pr, positive=True)
        market.append(MarketChange(_num(path, where + " key 'at'", m.get("at"), nonneg=True), reg, node, av, pr))
    events = []
    for i, e in enumerate(data.get("event", [])):
        where = f"[[event]] #{i + 1}"
        _known(path, where, e, ["at", "kind", "region", "node", "count"])
        if e.get("kind") not in EVENT_KINDS:
            raise _err(path, where + " key 'kind'", f"must be one of {', '.join(EVENT_KINDS)}, got {e.get('kind')!r}")
        reg, node = _region_node(path, where, e, regions, cat)
        count = e.get("count", 1)
        if not isinstance(count, int) or count < 1:
            raise _err(path, where + " key 'count'", f"must be an integer >= 1, got {count!r}")
        events.append(
            FaultEvent(_num(path, where + " key 'at'", e.get("at"), nonneg=True), e["kind"], reg, node, count)
        )
    return Scenario(
        name=str(data.get("name", path.stem)),
        path=path,
        regions=tuple(regions),
        node_types=tuple(node_types),
        deployments=tuple(deployments),
        duration_s=_num(path, "key 'duration_s'", data.get("duration_s", 3600), positive=True),
        planner=Planner(**pk),
        market=tuple(market),
        events=tuple(events),
        description=str(data.get("description", "")),
    )


def _region_node(path: Path, where: str, d: Mapping[str, Any], regions: Sequence[str], cat: Catalog) -> tuple[str, str]:
    reg, node = d.get("region"), d.get("node")
    if reg not in regions:
        raise _err(path, where + " key 'region'", f"unknown region {reg!r} (scenario regions: {', '.join(regions)})")
    if node not in cat.regions[str(reg)].offers:
        raise _err(path, where + " key 'node'", f"region {reg} does not offer node type {node!r}")
    return str(reg), str(node)


def _deployment(path: Path, where: str, d: Mapping[str, Any], cat: Catalog) -> Deployment:
    _known(path, where, d, ["name", "model", "slo", "shape", "demand", "priority"])
    model = d.get("model")
    if model not in cat.models:
        raise _err(path, where + " key 'model'", f"unknown model {model!r}; known: {', '.join(sorted(cat.models))}")
    slo_d = d.get("slo")
    if not isinstance(slo_d, dict):
        raise _err(path, where + " key 'slo'", "missing (a table with ttft_s, tpot_s and optional attainment)")
    _known(path, where + " key 'slo'", slo_d, ["ttft_s", "tpot_s", "attainment"])
    try:
        slo = Slo(
            ttft_s=_num(path, where + " slo.ttft_s", slo_d.get("ttft_s"), positive=True),
            tpot_s=_num(path, where + " slo.tpot_s", slo_d.get("tpot_s"), positive=True),
            attainment=_num(path, where + " slo.attainment", slo_d.get("attainment", 0.9), positive=True),
        )
    except ValueError as e:
        if isinstance(e, ScenarioError):
            raise
        raise _err(path, where + " key 'slo'", str(e)) from None
    demand, trace_shape = _demand(path, where, d.get("demand"))
    shape_d = d.get("shape")
    if shape_d is None:
        if trace_shape is None:
            raise _err(path, where + " key 'shape'", "missing (mean_in and mean_out), and demand is not a trace")
        shape = trace_shape
    else:
        _known(path, where + " key 'shape'", shape_d, ["mean_in", "mean_out"])
        shape = WorkloadShape(
            _num(path, where + " shape.mean_in", shape_d.get("mean_in"), positive=True),
            _num(path, where + " shape.mean_out", shape_d.get("mean_out"), positive=True),
        )
    name = d.get("name", model)
    if not isinstance(name, str) or not name:
        raise _err(path, where + " key 'name'", "must be a non-empty string")
    priority = _num(path, where + " key 'priority'", d.get("priority", 1.0), positive=True)
    return Deployment(name, str(model), slo, shape, demand, priority)


def _demand(path: Path, where: str, v: Any) -> tuple[Demand, WorkloadShape | None]:
    w = where + " key 'demand'"
    if isinstance(v, int | float) and not isinstance(v, bool):
        return Demand(((0.0, _num(path, w, v, nonneg=True)),)), None
    if not isinstance(v, dict):
        raise _err(
            path, w, f"must be a number (req/s), {{ series = [[t, rps], ...] }} or {{ trace = FILE }}, got {v!r}"
        )
    if "series" in v:
        _known(path, w, v, ["series"])
        pts = []
        for j, p in enumerate(v["series"]):
            if not isinstance(p, list) or len(p) != 2:
                raise _err(path, f"{w} series[{j}]", f"must be [time_s, rps], got {p!r}")
            pts.append(
                (
                    _num(path, f"{w} series[{j}] time", p[0], nonneg=True),
                    _num(path, f"{w} series[{j}] rps", p[1], nonneg=True),
                )
            )
        if not pts or [p[0] for p in pts] != sorted(p[0] for p in pts):
            raise _err(path, w, "series must be non-empty with increasing times")
        return Demand(tuple(pts)), None
    if "trace" in v:
        _known(path, w, v, ["trace", "scale"])
        tp = (path.parent / str(v["trace"])).resolve()
        scale = _num(path, w + " scale", v.get("scale", 1.0), positive=True)
        try:
            st = trace_stats(tp)
        except TraceError as e:
            raise _err(path, w, str(e)) from None
        return Demand(((0.0, st.rate * scale),), tp, scale), WorkloadShape(st.mean_in, st.mean_out)
    raise _err(path, w, "a table must have 'series' or 'trace'")
