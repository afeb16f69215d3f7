"""Operator-level time curves: GEMMs and streaming kernels per GPU, all-reduce per interconnect, host floor.

GEMM of M tokens through a K x N weight (bf16), on a GPU with peak P FLOP/s, memory bandwidth W bytes/s and
S streaming multiprocessors::

    t_c  = min over tiles (tm, tn) of  ceil(ceil(M/tm) ceil(N/tn) / S) * S * tm * tn * 2K / (P e_c) * pen^(2-i)
    t_m  = (w K N + 2 (M K + M N)) / (W e_m)            (w: bytes per weight, 2 for bf16)
    t    = t0 + (t_c^p + t_m^p)^(1/p)

The tile sizes (16x128, 64x64, 128x128, 128x256; i = 0..3) stand for the kernel library's choice: a GEMM
runs in whole waves of S tiles (wave quantisation), and smaller tiles waste fewer slots but run ``pen``
times slower per FLOP. The 16-row tile is the skinny kernel a decode batch gets: without it a batch of a
few tokens pays a 64-row tile's FLOPs, and the fit made up for that compute by reading weights faster than
the datasheet bandwidth (H100 e_m 1.005). ``p`` blends the compute and memory limits (p -> inf is the
roofline's max); ``t0`` is the kernel's fixed floor.

Streaming kernels (norms, rotary embedding, activation, residual add, embedding lookup) run one thread
block per token row of ``w`` elements (the row's width: H for norms, (h + h_kv) d / t for rotary, F / t for
the activation), ``r`` blocks resident per SM::

    t_w  = ceil(M / (r S)) * w * a_s                    (waves of rows; a_s: seconds per element of a row)
    t_b  = (max(bytes - C, 0) + min(bytes, C) / g) / (W e_s)
    t    = t0_s + (t_w^q + t_b^q)^(1/q)

with (e_s, t0_s, a_s, q, r, g) per operator: their kernels differ (a gather reaches a third of the bandwidth
a fused add does), and ``r``, the blocks resident per SM, follows from the kernel's block size and the SM's
thread limit (1,024-thread blocks: 2 on A100 and H100, 1 on A40's 1,536 threads per SM). A few rows wait on
one block's latency across the row; many rows stream at bandwidth. The bytes that fit the GPU's L2 cache
(C bytes) move g times faster: a streaming kernel reads what the kernel before it just wrote (in the
measurements, what its own previous run wrote), so a small batch's activations are served from L2. Without
this term the residual add fitted e_s = 1.10 on H100, above the datasheet bandwidth; beyond 3x the L2 it
reaches 0.97 of it.

Attention has no measured curve. Decode attention (a paged-attention kernel: one thread block per
sequence, query head on the GPU and partition of ``coral.perf.roofline.KV_PARTITION`` tokens) streams the
batch's KV cache and is priced on the bandwidth curve of the residual add (``PURE_STREAM_OP``, the measured
kernel that only streams), waves of blocks included, without the L2 gain: the KV a step reads was written
in earlier steps and evicted by the layers in between. Query heads that share a KV head (GQA) run side by
side and read it once from memory. Prefill attention (a flash-attention kernel: one block per 128 query
rows of a prompt and query head) runs at the GEMM compute efficiency, and no faster than its longest
block on one SM: the last query rows of a causal prompt attend to all ``s`` keys, so a short prompt's
few blocks leave most SMs idle.

A ring all-reduce of B bytes over n GPUs takes ``a0 + a1 (n - 1) + 2 (n - 1) / n * B / bw``.

The host floor: a decode or prefill iteration's CPU work (scheduling, kernel launches) runs ahead of the
GPU and overlaps it, so an iteration takes ``max(gpu, host)`` with ``host = h0 + k (h_layer + h_ar * ar)
+ h_seq * b`` (k layers, ar all-reduces per layer, b sequences).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

F = NDArray[np.float64]
TILES = ((16, 128), (64, 64), (128, 128), (128, 256))
PURE_STREAM_OP = "add"
"""The measured streaming kernel that only streams (it reaches the bandwidth): decode attention's KV reads
take its curve, and a derived GPU's streaming kernels its efficiency as their cap (``coral.perf.params``)."""


def _arr(x: ArrayLike) -> F:
    return np.asarray(x, dtype=np.float64)


@attrs.frozen
class GpuCurve:
    """A GPU's fitted GEMM and streaming curves; ``source`` says measured (and where) or derived (from what)."""

    name: str
    peak_flops: float
    mem_bw: float
    sm_count: int
    mem_eff: float
    cmp_eff: float
    floor_s: float
    blend: float
    small_tile: float
    stream: Mapping[str, tuple[float, float, float, float, int, float]]
    """Per streaming operator: (e_s, t0_s, a_s, q, r, g)."""
    source: str
    l2_bytes: float = 0.0
    derived: bool = False
    clock_mhz: float = 0.0
    """SM boost clock (0: not known)."""

    def gemm_s(self, m: ArrayLike, k: ArrayLike, n: ArrayLike, weight_bytes: float = 2.0, groups: ArrayLike = 1.0) -> F:
        """Seconds of an (m x k) @ (k x n) GEMM with bf16 activations and ``weight_bytes`` per weight; m may
        be fractional (a mean), taken at least 1. ``groups`` such GEMMs in one kernel (MoE experts) share
        its waves and its floor."""
        mm, kk, nn, gg = np.maximum(_arr(m), 1.0), _arr(k), _arr(n), _arr(groups)
        tc: F | None = None
        for i, (tm, tn) in enumerate(TILES):
            tiles = gg * np.ceil(mm / tm) * np.ceil(nn / tn)
            waves = np.ceil(tiles / self.sm_count)
            t = waves * self.sm_count * tm * tn * 2.0 * kk / (self.peak_flops * self.cmp_eff)
            t = t * self.small_tile ** (len(TILES) - 1 - i)
            tc = t if tc is None else np.minimum(tc, t)
        assert tc is not None
        tmem = gg * (weight_bytes * kk * nn + 2.0 * (mm * kk + mm * nn)) / (self.mem_bw * self.mem_eff)
        p = self.blend
        out: F = self.floor_s + (tc**p + tmem**p) ** (1.0 / p)
        return out

    def stream_s(self, op: str, nbytes: ArrayLike, rows: ArrayLike, width: ArrayLike) -> F:
        """Seconds of the streaming kernel ``op`` over ``rows`` token rows of ``width`` elements that reads and
        writes ``nbytes`` in all (rows may be a fractional mean, taken at least 1)."""
        eff, floor, per_elem, q, r, gain = self.stream[op]
        b, c = _arr(nbytes), self.l2_bytes
        tb = (np.maximum(b - c, 0.0) + np.minimum(b, c) / gain) / (self.mem_bw * eff)
        tw = np.ceil(np.maximum(_arr(rows), 1.0) / (r * self.sm_count)) * _arr(width) * per_elem
        out: F = floor + (tb**q + tw**q) ** (1.0 / q)
        return out

    def decode_attention_s(self, kv_bytes: ArrayLike, flops: ArrayLike, blocks: ArrayLike, width: ArrayLike) -> F:
        """Seconds of a decode attention kernel (no measured curve) that streams ``kv_bytes`` of KV cache in
        ``blocks`` thread blocks of ``width`` elements each and does ``flops``: the streaming curve of
        ``PURE_STREAM_OP`` without its L2 gain, or the compute time at the GEMM efficiency if longer."""
        eff, floor, per_elem, q, r, _ = self.stream[PURE_STREAM_OP]
        tb = _arr(kv_bytes) / (self.mem_bw * eff)
        tw = np.ceil(np.maximum(_arr(blocks), 1.0) / (r * self.sm_count)) * _arr(width) * per_elem
        tc = _arr(flops) / (self.peak_flops * self.cmp_eff)
        out: F = floor + np.maximum((tb**q + tw**q) ** (1.0 / q), tc)
        return out

    def prefill_attention_s(self, flops: ArrayLike, longest_block_flops: ArrayLike, nbytes: ArrayLike) -> F:
        """Seconds of a prefill attention kernel (no measured curve) of ``flops`` in all, whose longest thread
        block does ``longest_block_flops`` on one SM, reading and writing ``nbytes``: the largest of the
        balanced compute time, the longest block's time and the memory time, at the GEMM efficiencies,
        plus the GEMM floor."""
        rate = self.peak_flops * self.cmp_eff
        tc = np.maximum(_arr(flops) / rate, _arr(longest_block_flops) * self.sm_count / rate)
        tm = _arr(nbytes) / (self.mem_bw * self.mem_eff)
        out: F = self.floor_s + np.maximum(tc, tm)
        return out


@attrs.frozen
class LinkCurve:
    """A fitted all-reduce latency-bandwidth curve of one interconnect."""

    name: str
    latency_s: float
    latency_per_peer_s: float
    bw: float
    source: str
    derived: bool = False

    def allreduce_s(self, nbytes: ArrayLike, n: int) -> F:
        """Seconds of one all-reduce of ``nbytes`` over ``n`` GPUs (0 for one GPU)."""
        b = _arr(nbytes)
        if n <= 1:
            return np.zeros_like(b)
        out: F = self.latency_s + self.latency_per_peer_s * (n - 1) + 2.0 * (n - 1) / n * b / self.bw
        return out


@attrs.frozen
class HostFloor:
    """The per-iteration CPU floor that overlaps GPU time (see the module docstring)."""

    per_iter_s: float
    per_layer_s: float
    per_allreduce_s: float
    per_seq_s: float
    source: str

    def host_s(self, layers: ArrayLike, allreduces_per_layer: int, seqs: ArrayLike) -> F:
        k, b = _arr(layers), _arr(seqs)
        out: F = self.per_iter_s + k * (self.per_layer_s + self.per_allreduce_s * allreduces_per_layer)
        return out + self.per_seq_s * b
