"""Fit the operator curves of ``coral.perf.ops`` to Vidur's measurements, and score them on held-out models.

Rows: every (GPU, model, operator, tokens, TP) median of ``compute/*/mlp.csv``. A GEMM row has
M = tokens and the shard's (K, N): QKV (H, (h + 2 h_kv) d / TP), output (h d / TP, H), up/gate
(H, g F / TP, g = 2 when gated), down (F / TP, H). A streaming row has the bytes it moves on one shard:
norms 4 M H, residual add 6 M H, embedding 4 M H, rotary 4 M (h + h_kv) d / TP, activation
(2 g + 2) M F / TP. A whole layer is the sum of one (GPU, model, tokens, TP) row's operators.

Formulation: per GPU, the GEMM parameters (e_m, e_c, t0, p, pen) minimise sum over the fit rows of
log(predicted / measured)^2 (``scipy.optimize.least_squares``, parameters in log space), and per streaming
operator (e_s, t0_s, a_s, q, g) likewise over its rows, for each r in ``ROWS_PER_SM``; the r of least cost
is kept. Bounds: e_s <= 1 (the datasheet bandwidth) and q >= 2. With many rows the wave term grows like
the bytes, so at q = 1 (no overlap of the two) the split between them is not identified: A40's
input_layernorm went to e_s = 1.0 there, while q >= 2 gives 0.64 beside post_attention_layernorm's 0.58 at
the same held-out error. A streaming row also has its row width w (``coral.perf.ops``). Per interconnect,
(a0, a1, bw) minimise the same over ``all_reduce.csv`` rows with one node (devices_per_node ==
num_workers); the 4-GPU rows of the pairwise-NVLink machines cross PCIe between the pairs and fit the
PCIe curves. Rows of the held-out models
are never seen by the fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares

from coral.perf.ops import GpuCurve, HostFloor, LinkCurve
from coral.perf.vidur import GEMM_OPS, OpTable, VidurData

F = NDArray[np.float64]
HELD_OUT = ("Meta-Llama-3-8B", "internlm-20b", "Qwen-72B")
"""Whole models left out of every fit (3 of 8: a small, a mid-size and a large one)."""
STREAM_OPS = ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
LINK_SETUPS = {
    # curve name: (setup folder, workers, nominal per-GPU one-way GB/s of that link in nodes.toml terms)
    "nvswitch-h100": ("h100_dgx", (2, 4, 8), 450.0),
    "nvswitch-a100": ("a100_dgx", (2, 4, 8), 300.0),
    "nvlink-pair-h100": ("h100_pairwise_nvlink", (2,), 450.0),
    "nvlink-pair-a100": ("a100_pairwise_nvlink", (2,), 300.0),
    "pcie-gen5": ("h100_pairwise_nvlink", (4,), 64.0),
    "pcie-gen4": ("a100_pairwise_nvlink", (4,), 32.0),
}


@attrs.frozen
class Spec:
    """Datasheet figures a curve is fitted against: dense BF16 FLOP/s, bytes/s, SM count, L2 bytes, SM boost
    clock (MHz)."""

    peak_flops: float
    mem_bw: float
    sm_count: int
    l2_bytes: float
    clock_mhz: float = 0.0


@attrs.frozen(eq=False)
class OpRows:
    """All operator rows of one GPU, flattened."""

    model: NDArray[np.str_]
    op: NDArray[np.str_]
    key: NDArray[np.int64]
    """Index of the (model, tokens, TP) measurement the row belongs to (for whole layers)."""
    m: F
    k: F
    n: F
    nbytes: F
    width: F
    """A streaming row's row width in elements (0 for GEMMs)."""
    measured_s: F

    @property
    def is_gemm(self) -> NDArray[np.bool_]:
        return np.isin(self.op, GEMM_OPS)


def _dims(t: OpTable) -> dict[str, tuple[F, F]]:
    h, f, d = float(t.n_embd), float(t.n_expanded_embd), float(t.head_dim)
    tp = t.tp
    g = 2.0 if t.gated else 1.0
    return {
        "attn_pre_proj": (np.full_like(tp, h), (t.n_head + 2 * t.n_kv_head) * d / tp),
        "attn_post_proj": (t.n_head * d / tp, np.full_like(tp, h)),
        "mlp_up_proj": (np.full_like(tp, h), g * f / tp),
        "mlp_down_proj": (f / tp, np.full_like(tp, h)),
    }


def _stream_bytes(t: OpTable, op: str) -> tuple[F, F]:
    """(bytes moved, row width in elements) of a streaming operator's rows."""
    m, h, f, d, tp = t.tokens, float(t.n_embd), float(t.n_expanded_embd), float(t.head_dim), t.tp
    g = 2.0 if t.gated else 1.0
    rope = (t.n_head + t.n_kv_head) * d / tp
    per = {
        "emb": (4.0 * m * h, np.full_like(m, h)),
        "input_layernorm": (4.0 * m * h, np.full_like(m, h)),
        "post_attention_layernorm": (4.0 * m * h, np.full_like(m, h)),
        "add": (6.0 * m * h, np.full_like(m, h)),
        "attn_rope": (4.0 * m * rope, rope),
        "mlp_act": ((2.0 * g + 2.0) * m * f / tp, f / tp),
    }
    return per[op]


def op_rows(tables: Iterable[OpTable]) -> OpRows:
    """Flatten ``tables`` (one GPU's) into operator rows."""
    names: list[NDArray[np.str_]] = []
    ops: list[NDArray[np.str_]] = []
    keys: list[NDArray[np.int64]] = []
    cols: dict[str, list[F]] = {c: [] for c in ("m", "k", "n", "nbytes", "width", "measured_s")}
    base = 0
    for t in tables:
        dims = _dims(t)
        key = base + np.arange(len(t.tokens))
        base += len(t.tokens)
        for op, times in t.times_s.items():
            if op in dims:
                k, n = dims[op]
                nb = w = np.zeros_like(k)
            else:
                k = n = np.zeros_like(t.tokens)
                nb, w = _stream_bytes(t, op)
            names.append(np.full(len(times), t.model))
            ops.append(np.full(len(times), op))
            keys.append(key)
            for c, v in (("m", t.tokens), ("k", k), ("n", n), ("nbytes", nb), ("width", w), ("measured_s", times)):
                cols[c].append(v)
    f = {c: np.concatenate(v) for c, v in cols.items()}
    return OpRows(
        np.concatenate(names), np.concatenate(ops), np.concatenate(keys),
        f["m"], f["k"], f["n"], f["nbytes"], f["width"], f["measured_s"],
    )  # fmt: skip


def _positive(rows: OpRows, mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    out: NDArray[np.bool_] = mask & (rows.measured_s > 0)
    return out


ROWS_PER_SM = (1, 2, 4)
"""Resident blocks per SM a streaming kernel's fit chooses from (blocks of 512-1,024 threads on SMs of
1,536-2,048 threads)."""


def fit_gpu(name: str, spec: Spec, rows: OpRows, fit_mask: NDArray[np.bool_], source: str) -> GpuCurve:
    """Least-squares fit of one GPU's GEMM and streaming curves on the rows in ``fit_mask``."""
    g = _positive(rows, fit_mask & rows.is_gemm)
    s = _positive(rows, fit_mask & ~rows.is_gemm)

    def curve(x: F, stream: dict[str, tuple[float, float, float, float, int, float]]) -> GpuCurve:
        em, ec, t0, p, pen = (float(v) for v in np.exp(x))
        return GpuCurve(
            name, spec.peak_flops, spec.mem_bw, spec.sm_count, em, ec, t0, p, pen, stream, source, spec.l2_bytes,
            clock_mhz=spec.clock_mhz,
        )  # fmt: skip

    x0 = np.log([0.8, 0.7, 3e-6, 2.0, 1.1])

    def rg(x: F) -> F:
        out: F = np.log(curve(x, {}).gemm_s(rows.m[g], rows.k[g], rows.n[g]) / rows.measured_s[g])
        return out

    xg = least_squares(rg, x0, bounds=(np.log([0.05, 0.05, 1e-8, 0.5, 1.0]), np.log([1.5, 1.5, 1e-3, 20.0, 4.0]))).x
    stream: dict[str, tuple[float, float, float, float, int, float]] = {}
    for op in STREAM_OPS:
        so = s & (rows.op == op)
        if not so.any():
            continue
        best: tuple[float, tuple[float, float, float, float, int, float]] | None = None
        for r in ROWS_PER_SM:

            def rs(y: F, so: NDArray[np.bool_] = so, op: str = op, r: int = r) -> F:
                e, t0s, a, q, gain = (float(v) for v in np.exp(y))
                c = curve(xg, {op: (e, t0s, a, q, r, gain)})
                out: F = np.log(c.stream_s(op, rows.nbytes[so], rows.m[so], rows.width[so]) / rows.measured_s[so])
                return out

            lo, hi = np.log([0.01, 1e-8, 1e-13, 2.0, 1.0]), np.log([1.0, 1e-3, 1e-7, 20.0, 10.0])
            sol = least_squares(rs, np.log([0.5, 2e-6, 5e-10, 3.0, 1.2]), bounds=(lo, hi))
            e, t0s, a, q, gain = (float(v) for v in np.exp(sol.x))
            if best is None or sol.cost < best[0]:
                par = (round(e, 4), round(t0s, 7), float(f"{a:.4g}"), round(q, 3), r, round(gain, 3))
                best = (float(sol.cost), par)
        assert best is not None
        stream[op] = best[1]
    c = curve(xg, stream)
    return attrs.evolve(
        c, mem_eff=round(c.mem_eff, 4), cmp_eff=round(c.cmp_eff, 4), floor_s=round(c.floor_s, 7),
        blend=round(c.blend, 4), small_tile=round(c.small_tile, 4),
    )  # fmt: skip


def predict_rows(curve: GpuCurve, rows: OpRows) -> F:
    """The curve's time for every row."""
    out = np.zeros(len(rows.m))
    g = rows.is_gemm
    out[g] = curve.gemm_s(rows.m[g], rows.k[g], rows.n[g])
    for op in np.unique(rows.op[~g]):
        s = rows.op == op
        out[s] = curve.stream_s(str(op), rows.nbytes[s], rows.m[s], rows.width[s])
    return out


def roofline_rows(mem_eff: float, cmp_eff: float, spec: Spec, rows: OpRows) -> F:
    """The previous model's operator time (``roofline-1``: max of bytes and FLOPs at fixed efficiencies, no
    floor) for the same rows, to compare."""
    flops = 2.0 * rows.m * rows.k * rows.n
    nbytes = np.where(rows.is_gemm, 2.0 * (rows.k * rows.n + rows.m * rows.k + rows.m * rows.n), rows.nbytes)
    out: F = np.maximum(nbytes / (spec.mem_bw * mem_eff), flops / (spec.peak_flops * cmp_eff))
    return out


def comm_rows(data: VidurData, setup: str, workers: Sequence[int]) -> tuple[F, F, F]:
    """(workers, bytes, seconds) of one setup's single-node all-reduce rows."""
    for t in data.network:
        if t.setup == setup and t.collective == "all_reduce":
            keep = (t.num_workers == t.devices_per_node) & np.isin(t.num_workers, workers) & (t.times_s > 0)
            return t.num_workers[keep], t.size_bytes[keep], t.times_s[keep]
    raise KeyError(setup)


def fit_link(name: str, n: F, nbytes: F, t: F, source: str) -> LinkCurve:
    """Least-squares fit of one interconnect's all-reduce curve."""

    def curve(x: F) -> LinkCurve:
        a0, a1, bw = np.exp(x)
        return LinkCurve(name, a0, a1, bw, source)

    def r(x: F) -> F:
        c = curve(x)
        pred = np.array([float(c.allreduce_s(b, int(w))) for w, b in zip(n, nbytes, strict=True)])
        out: F = np.log(pred / t)
        return out

    x = least_squares(r, np.log([2e-5, 2e-6, 1e11]), bounds=(np.log([1e-7, 1e-9, 1e8]), np.log([1e-2, 1e-3, 1e13]))).x
    c = curve(x)
    return attrs.evolve(c, latency_s=round(float(c.latency_s), 7),
                        latency_per_peer_s=round(float(c.latency_per_peer_s), 7), bw=float(f"{c.bw:.4g}"))  # fmt: skip


def link_predict(c: LinkCurve, n: F, nbytes: F) -> F:
    return np.array([float(c.allreduce_s(b, int(w))) for w, b in zip(n, nbytes, strict=True)])


def abs_err(pred: F, meas: F) -> F:
    out: F = np.abs(pred / meas - 1.0)
    return out


def layer_sums(rows: OpRows, values: F) -> tuple[F, NDArray[np.str_]]:
    """Per (model, tokens, TP) measurement: the sum of ``values`` over its operators, and its model."""
    keys, inv = np.unique(rows.key, return_inverse=True)
    total = np.zeros(len(keys))
    np.add.at(total, inv, values)
    model = np.empty(len(keys), dtype=rows.model.dtype)
    model[inv] = rows.model
    return total, model


def render_toml(
    gpus: Sequence[GpuCurve],
    links: dict[str, tuple[LinkCurve, float]],
    host: HostFloor,
    classes: dict[str, str],
    sm_counts: dict[str, int],
    l2_mb: dict[str, float],
    clocks: dict[str, float],
    source: str,
) -> str:
    """The text of ``perf_fit.toml`` for fitted curves (``coral.perf.params`` reads it)."""
    out = [
        "# Perf-model parameters fitted by `just bench perf-fit --write` (coral/perf/fit.py); do not edit the",
        "# [gpu], [link] and [host] tables by hand. [class], [sm_count], [l2_mb] and [clock_mhz] are facts",
        "# kept by hand: each catalog GPU type without its own curve is scaled from its class's",
        "# (coral/perf/params.py).",
        f"source = {_q(source)}",
        f"held_out = [{', '.join(_q(m) for m in HELD_OUT)}]",
        "",
    ]
    for g in gpus:
        out += [f'[gpu."{g.name}"]', f"source = {_q(g.source)}", f"tflops_bf16 = {g.peak_flops / 1e12:g}",
                f"mem_bw_gbs = {g.mem_bw / 1e9:g}", f"sm_count = {g.sm_count}"]  # fmt: skip
        out += [f"l2_mb = {g.l2_bytes / 1e6:g}", f"clock_mhz = {g.clock_mhz:g}"]
        out += [f"{f} = {getattr(g, f)!r}" for f in ("mem_eff", "cmp_eff", "floor_s", "blend", "small_tile")]
        out += [
            f"stream.{op} = {{ eff = {e!r}, floor_s = {t!r}, row_elem_s = {a!r}, blend = {q!r}, rows_per_sm = {r}, "
            f"l2_gain = {gain!r} }}"
            for op, (e, t, a, q, r, gain) in sorted(g.stream.items())
        ]
        out.append("")
    for name, (c, nominal) in links.items():
        out += [f'[link."{name}"]', f"source = {_q(c.source)}", f"nominal_gbs = {nominal:g}",
                f"latency_s = {c.latency_s!r}", f"latency_per_peer_s = {c.latency_per_peer_s!r}",
                f"bw_gbs = {c.bw / 1e9:.4g}", ""]  # fmt: skip
    out += ["[host]", f"source = {_q(host.source)}"]
    out += [f"{f} = {getattr(host, f)!r}" for f in ("per_iter_s", "per_layer_s", "per_allreduce_s", "per_seq_s")]
    out += ["", "# the measured GPU type each catalog type is scaled from (same vendor generation or memory kind)"]
    out += ["[class]"] + [f'"{k}" = "{v}"' for k, v in sorted(classes.items())]
    out += ["", "# SMs (AMD: compute units) as configured on each product: NVIDIA and AMD datasheets and whitepapers"]
    out += ["[sm_count]"] + [f'"{k}" = {v}' for k, v in sorted(sm_counts.items())]
    out += ["", "# L2 cache (AMD: the last-level Infinity Cache) in MB: the same datasheets and whitepapers"]
    out += ["[l2_mb]"] + [f'"{k}" = {v:g}' for k, v in sorted(l2_mb.items())]
    out += ["", "# SM (AMD: engine) boost clock in MHz: the same datasheets"]
    out += ["[clock_mhz]"] + [f'"{k}" = {v:g}' for k, v in sorted(clocks.items())]
    return "\n".join(out) + "\n"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
