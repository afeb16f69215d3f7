"""The fitted perf-model parameters (``coral/catalog/data/perf_fit.toml``) and their use for every catalog type.

The file holds the curves fitted to measurements (``[gpu.NAME]`` with the datasheet figures they were
fitted against, ``[link.NAME]``, ``[host]``) and per catalog GPU type its class (the measured type it is
scaled from), SM count, L2 size and SM clock (``[class]``, ``[sm_count]``, ``[l2_mb]``, ``[clock_mhz]``).

A catalog GPU type with its own curve uses it. Any other takes its class's curve with its own datasheet
peak FLOP/s, bandwidth, SM count, L2 size and SM clock (``derive_curve``), and is marked derived. The
GEMM efficiencies, floors and L2 gains are the class's. A streaming kernel's byte rate is not: most of the
measured ones (norms, rotary, activation, embedding) run far below the bandwidth, at a rate per SM and
clock cycle that the GPUs share, so on the derived GPU a kernel moves its class's bytes/s times the ratio
of SMs x clock, capped at the derived GPU's bandwidth at the class's ``PURE_STREAM_OP`` efficiency (the
kernel that reaches the bandwidth); a row's latency scales with the clock. Fallback, stated in the
curve's ``source``: a GPU type with no class entry takes the measured type whose bandwidth-to-FLOP ratio
is nearest its own, one with no SM count takes the class's scaled by the FLOP/s ratio, and one with no
L2 size or clock the class's.

Links: NVLink on 4 or more GPUs uses the NVSwitch curve of the node's GPU generation (H100 class for
Hopper and newer, A100 class otherwise), NVLink on 2 GPUs the NVLink-pair curve, PCIe the Gen5 curve at
48 GB/s and above and the Gen4 curve below, Infinity Fabric the H100 NVSwitch curve; the bandwidth is
scaled by the node's ``intra_link_gbs`` over the curve's nominal figure, and any scaled or borrowed curve
is marked derived.
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from pathlib import Path
from typing import Any

import attrs

from coral.catalog.loader import DATA_DIR
from coral.catalog.types import GpuType, NodeType
from coral.errors import CoralError
from coral.perf.ops import PURE_STREAM_OP, GpuCurve, HostFloor, LinkCurve

PARAMS_FILE = DATA_DIR / "perf_fit.toml"
GPU_FIELDS = ("mem_eff", "cmp_eff", "floor_s", "blend", "small_tile")
STREAM_FIELDS = ("eff", "floor_s", "row_elem_s", "blend", "l2_gain")
LINK_FIELDS = ("latency_s", "latency_per_peer_s", "bw_gbs", "nominal_gbs")
HOST_FIELDS = ("per_iter_s", "per_layer_s", "per_allreduce_s", "per_seq_s")


class ParamsError(CoralError):
    """The fitted-parameter file is missing a table or holds a bad value; the message names file and key."""


@attrs.frozen
class LinkEntry:
    curve: LinkCurve
    nominal_gbs: float


@attrs.frozen(eq=False)
class PerfParams:
    """Everything ``perf_fit.toml`` holds, checked."""

    path: Path
    digest: str
    source: str
    held_out: tuple[str, ...]
    gpus: dict[str, GpuCurve]
    classes: dict[str, str]
    sm_counts: dict[str, int]
    l2_mb: dict[str, float]
    clocks: dict[str, float]
    links: dict[str, LinkEntry]
    host: HostFloor

    def gpu_curve(self, gpu: GpuType) -> GpuCurve:
        """The curve of a catalog GPU type: its own, or derived from its class (module docstring)."""
        peak, bw = gpu.tflops_bf16 * 1e12, gpu.mem_bw_gbs * 1e9
        if gpu.name in self.gpus:
            return self.gpus[gpu.name]
        why = ""
        cls = self.classes.get(gpu.name)
        if cls is None:
            cls = min(
                self.gpus, key=lambda c: abs(math.log((bw / peak) / (self.gpus[c].mem_bw / self.gpus[c].peak_flops)))
            )
            why = " (no class given: nearest bandwidth/FLOP ratio)"
        base = self.gpus[cls]
        sm = self.sm_counts.get(gpu.name)
        if sm is None:
            sm = max(1, round(base.sm_count * peak / base.peak_flops))
            why += " (no SM count given: scaled by FLOP/s)"
        l2 = self.l2_mb.get(gpu.name)
        if l2 is None:
            why += " (no L2 size given: the class's)"
        l2_bytes = base.l2_bytes if l2 is None else l2 * 1e6
        clock = self.clocks.get(gpu.name)
        if clock is None:
            why += " (no clock given: the class's)"
        clock = base.clock_mhz if clock is None else clock
        src = f"derived from {cls} by datasheet ratios{why}"
        return derive_curve(base, gpu.name, peak, bw, sm, l2_bytes, clock, src)

    def link_curve(self, node: NodeType, gpu: GpuType) -> LinkCurve:
        """The all-reduce curve of a node's intra-node link (module docstring)."""
        hopper = self.gpu_curve(gpu).peak_flops >= 0.5 * self.gpus["h100-80g"].peak_flops
        if node.intra_link == "nvlink":
            kind = "nvswitch" if node.gpu_count >= 4 else "nvlink-pair"
            name = f"{kind}-{'h100' if hopper else 'a100'}"
        elif node.intra_link == "pcie":
            name = "pcie-gen5" if node.intra_link_gbs >= 48 else "pcie-gen4"
        else:
            name = "nvswitch-h100"
        e = self.links[name]
        scale = node.intra_link_gbs / e.nominal_gbs
        if node.intra_link in ("nvlink", "pcie") and abs(scale - 1.0) < 1e-9:
            return e.curve
        return attrs.evolve(
            e.curve, bw=e.curve.bw * scale, derived=True,
            source=f"derived from {name} with bandwidth x {scale:.3g} ({node.intra_link} {node.intra_link_gbs:g} GB/s)",
        )  # fmt: skip


def derive_curve(
    base: GpuCurve, name: str, peak: float, bw: float, sm: int, l2_bytes: float, clock_mhz: float, source: str
) -> GpuCurve:
    """``base``'s curve on a GPU of these datasheet figures (module docstring), marked derived."""
    speed = sm * clock_mhz / (base.sm_count * base.clock_mhz) if base.clock_mhz and clock_mhz else sm / base.sm_count
    tick = base.clock_mhz / clock_mhz if base.clock_mhz and clock_mhz else 1.0
    cap = bw * base.stream[PURE_STREAM_OP][0]
    stream = {
        op: (min(cap, base.mem_bw * e * speed) / bw, t0, a * tick, q, r, g)
        for op, (e, t0, a, q, r, g) in base.stream.items()
    }
    return attrs.evolve(
        base, name=name, peak_flops=peak, mem_bw=bw, sm_count=sm, l2_bytes=l2_bytes, clock_mhz=clock_mhz,
        stream=stream, derived=True, source=source,
    )  # fmt: skip


def _num(path: Path, where: str, table: dict[str, Any], key: str) -> float:
    if key not in table:
        raise ParamsError(f"{path}: [{where}]: key '{key}' missing")
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ParamsError(f"{path}: [{where}]: key '{key}': must be a number >= 0, got {v!r}")
    return float(v)


def _table(path: Path, data: dict[str, Any], key: str) -> dict[str, Any]:
    v = data.get(key)
    if not isinstance(v, dict):
        raise ParamsError(f"{path}: table [{key}] missing")
    return v


def load_params(path: Path = PARAMS_FILE) -> PerfParams:
    """Read and check the fitted-parameter file."""
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode())
    except OSError as e:
        raise ParamsError(f"{path}: cannot read: {e.strerror}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ParamsError(f"{path}: not valid TOML: {e}") from e
    sm_counts = {
        k: int(_num(path, "sm_count", _table(path, data, "sm_count"), k)) for k in _table(path, data, "sm_count")
    }
    l2_mb = {k: _num(path, "l2_mb", _table(path, data, "l2_mb"), k) for k in _table(path, data, "l2_mb")}
    clocks = {k: _num(path, "clock_mhz", _table(path, data, "clock_mhz"), k) for k in _table(path, data, "clock_mhz")}
    gpus: dict[str, GpuCurve] = {}
    for name, t in _table(path, data, "gpu").items():
        w = f"gpu.{name}"
        vals = {f: _num(path, w, t, f) for f in GPU_FIELDS}
        stream = t.get("stream")
        if not isinstance(stream, dict) or not stream:
            raise ParamsError(f"{path}: [{w}]: key 'stream' missing")
        ops = {}
        for op, v in stream.items():
            eff, t0s, a, q, gain = (_num(path, f"{w}.stream.{op}", v, f) for f in STREAM_FIELDS)
            r = int(_num(path, f"{w}.stream.{op}", v, "rows_per_sm"))
            if q < 1 or r < 1 or gain < 1:
                got = f"got {q!r}, {r!r}, {gain!r}"
                raise ParamsError(f"{path}: [{w}.stream.{op}]: blend, rows_per_sm and l2_gain must be >= 1, {got}")
            ops[op] = (eff, t0s, a, q, r, gain)
        gpus[name] = GpuCurve(
            name, _num(path, w, t, "tflops_bf16") * 1e12, _num(path, w, t, "mem_bw_gbs") * 1e9,
            int(_num(path, w, t, "sm_count")),
            vals["mem_eff"], vals["cmp_eff"], vals["floor_s"], vals["blend"], vals["small_tile"], ops,
            str(t.get("source", "")), _num(path, w, t, "l2_mb") * 1e6, clock_mhz=_num(path, w, t, "clock_mhz"),
        )  # fmt: skip
    for must in ("h100-80g",):
        if must not in gpus:
            raise ParamsError(f"{path}: table [gpu.{must}] missing")
    classes = {k: str(v) for k, v in _table(path, data, "class").items()}
    for k, v in classes.items():
        if v not in gpus:
            raise ParamsError(f"{path}: [class]: key '{k}': {v!r} has no [gpu.{v}] curve")
    links: dict[str, LinkEntry] = {}
    for name, t in _table(path, data, "link").items():
        w = f"link.{name}"
        lv = {f: _num(path, w, t, f) for f in LINK_FIELDS}
        links[name] = LinkEntry(
            LinkCurve(name, lv["latency_s"], lv["latency_per_peer_s"], lv["bw_gbs"] * 1e9, str(t.get("source", ""))),
            lv["nominal_gbs"],
        )
    for must in ("nvswitch-h100", "nvswitch-a100", "nvlink-pair-h100", "nvlink-pair-a100", "pcie-gen5", "pcie-gen4"):
        if must not in links:
            raise ParamsError(f"{path}: table [link.{must}] missing")
    h = _table(path, data, "host")
    hv = [_num(path, "host", h, f) for f in HOST_FIELDS]
    host = HostFloor(hv[0], hv[1], hv[2], hv[3], source=str(h.get("source", "")))
    held = data.get("held_out", [])
    return PerfParams(
        path=path,
        digest=hashlib.sha256(raw).hexdigest()[:12],
        source=str(data.get("source", "")),
        held_out=tuple(str(x) for x in held),
        gpus=gpus,
        classes=classes,
        sm_counts=sm_counts,
        l2_mb=l2_mb,
        clocks=clocks,
        links=links,
        host=host,
    )
