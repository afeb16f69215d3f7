"""The stage model: one pipeline stage's prefill time, decode step time and memory, from operator curves.

A stage is one node that holds ``layers`` (k) contiguous layers of a model with tensor parallelism ``tp``
(t) over that node's GPUs, using the curves of ``coral.perf.ops`` for its GPU and link
(``coral.perf.params``). An iteration over M tokens (decode: M = b sequences; prefill: M = b s prompt
tokens, run in chunks of at most ``PREFILL_CHUNK_TOKENS``) costs per layer, on one GPU of the stage:

- GEMMs (measured curve): QKV (M, H, (h + 2 h_kv) d / t), output (M, h d / t, H), gate+up (M, H, 2F / t),
  down (M, F / t, H). MoE, as before: of E routed experts with top-a routing, a batch of M tokens touches
  E_t = E (1 - (1 - a/E)^M) of them (uniform routing), each with M a / E_t tokens, in one fused kernel per
  projection (a grouped GEMM: the experts' tiles share the waves, the floor is paid once); shared experts
  see all M; the router is an (M, H, E) GEMM;
- streaming kernels (measured curves): two norms, rotary embedding, activation, residual add;
- attention (no measured curve, ``coral.perf.ops``): decode reads b c_eff tokens of KV and does
  4 b c_eff h d / t FLOPs in b (h / t) ceil(c_eff / P) blocks of min(c_eff, P) tokens' K and V rows
  (P = ``KV_PARTITION``), on the streaming bandwidth curve; prefill does 2 M s_eff h d / t FLOPs
  (causal) in blocks of ``Q_BLOCK`` query rows, the longest of which does 4 Q_BLOCK s_eff d FLOPs, and
  reads Q, K, V; c_eff and s_eff are sliding-window aware;
- two all-reduces of M H bf16 values when t > 1 (measured link curve).

The embedding lookup (over the M tokens) is charged to the stage that holds layer 0 and the LM head GEMM
(over the b sequences that sample a token) to the stage that holds the last layer, when the caller says
which ends the stage holds (``ends`` = (holds layer 0, holds the last layer), booleans or arrays of them).
Without ``ends`` both are spread over the layers, k / L of them per stage, so that a stage's time
depends only on how many layers it holds (exact for a stage of every layer, and for the sum over a
pipeline). An iteration takes ``max(GPU time, host floor)`` (``coral.perf.ops.HostFloor``, with its
per-iteration and per-sequence terms spread over the layers).

Memory of a stage (all t GPUs together): k layers' own weights, the ends it holds
(``ModelArch.end_bytes``: embedding with layer 0, LM head with the last layer), the KV cache of the
sequences it holds at the context, and an activation workspace: one prefill chunk's live activations on
each GPU, ``C (2 H + (h + 2 h_kv) d / t + 3 F_a / t) * 2 bytes`` (F_a: the FFN width a token passes
through, all active experts for MoE), plus fp32 logits of every held sequence over the vocabulary on the
stage with the LM head. Usable: ``t (memory * GPU_MEMORY_UTILIZATION - WORKSPACE_BYTES_PER_GPU)`` (the
fixed reserve for the CUDA context, NCCL and graphs). When the caller does not say which ends a stage holds
(``ends=None``), the conservative case is charged: both ends when k = L (the stage holds every layer),
else the larger of the two (a stage of k < L layers holds at most one end).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from coral.catalog.types import ModelArch, NodeType
from coral.perf.ops import GpuCurve, HostFloor, LinkCurve

GPU_MEMORY_UTILIZATION = 0.90
WORKSPACE_BYTES_PER_GPU = 1.5e9
PREFILL_CHUNK_TOKENS = 8192
NET_LATENCY_S = 2e-4
LOGIT_BYTES = 4.0
KV_PARTITION = 512
"""Tokens of one decode attention block (vLLM's paged attention v2 partition)."""
Q_BLOCK = 128
"""Query rows of one prefill attention block (flash attention's tile)."""

F = NDArray[np.float64]
Ends = tuple[bool, bool] | None
"""(holds layer 0, holds the last layer), or None for the conservative case (module docstring)."""
TimeEnds = tuple[ArrayLike, ArrayLike] | None
"""(holds layer 0, holds the last layer) per stage, or None to spread the ends' time over the layers."""


def _arr(x: ArrayLike) -> F:
    return np.asarray(x, dtype=np.float64)


def _kv_tokens(m: ModelArch, context: F) -> F:
    """Mean tokens of KV per layer for a sequence of ``context`` tokens (sliding-window aware)."""
    full = m.num_layers if m.kv_full_layers is None else m.kv_full_layers
    if m.sliding_window is None or full >= m.num_layers:
        return context
    local = m.num_layers - full
    out: F = (full * context + local * np.minimum(context, m.sliding_window)) / m.num_layers
    return out


def _ffn_width(m: ModelArch) -> float:
    """FFN width one token passes through (all active experts for MoE)."""
    return float(m.intermediate) if not m.is_moe else float((m.experts_active + m.shared_experts) * m.moe_intermediate)


def _layer_gpu_s(m: ModelArch, g: GpuCurve, link: LinkCurve, tp: int, tokens: F) -> F:
    """Seconds of one layer's non-attention work over ``tokens`` tokens on one GPU of the stage."""
    h, d = m.hidden, m.head_dim
    t = _arr(tokens)
    qkv = g.gemm_s(t, h, (m.heads + 2 * m.kv_heads) * d / tp)
    out = g.gemm_s(t, m.heads * d / tp, h)
    if not m.is_moe:
        mlp = g.gemm_s(t, h, 2.0 * m.intermediate / tp) + g.gemm_s(t, m.intermediate / tp, h)
    else:
        e, a, fm, eb = m.num_experts, m.experts_active, m.moe_intermediate, m.expert_weight_bytes
        touched = e * (1.0 - np.power(1.0 - a / e, np.maximum(t, 1.0)))
        per = t * a / touched
        experts = g.gemm_s(per, h, 2.0 * fm / tp, eb, touched) + g.gemm_s(per, fm / tp, h, eb, touched)
        shared = m.shared_experts * (g.gemm_s(t, h, 2.0 * fm / tp, eb) + g.gemm_s(t, fm / tp, h, eb))
        mlp = experts + shared + g.gemm_s(t, h, e)
    rope, ffn = (m.heads + m.kv_heads) * d / tp, _ffn_width(m) / tp
    stream = (
        2.0 * g.stream_s("input_layernorm", 4.0 * t * h, t, h)
        + g.stream_s("attn_rope", 4.0 * t * rope, t, rope)
        + g.stream_s("mlp_act", 6.0 * t * ffn, t, ffn)
        + g.stream_s("add", 6.0 * t * h, t, h)
    )
    ar = 2.0 * link.allreduce_s(t * h * m.dtype_bytes, tp)
    res: F = qkv + out + mlp + stream + ar
    return res


def _ends_s(m: ModelArch, g: GpuCurve, tp: int, tokens: F, sampled: F, k: F, ends: TimeEnds) -> F:
    """Embedding lookup of ``tokens`` and LM head over ``sampled`` rows, as far as the stage holds them."""
    emb = g.stream_s("emb", 4.0 * tokens * m.hidden, tokens, m.hidden)
    head = g.gemm_s(sampled, m.hidden, m.vocab / tp)
    if ends is None:
        spread: F = k / m.num_layers * (emb + head)
        return spread
    out: F = _arr(ends[0]) * emb + _arr(ends[1]) * head
    return out


def _host_s(m: ModelArch, host: HostFloor, tp: int, k: F, seqs: F) -> F:
    spread = k / m.num_layers
    ar = 2 if tp > 1 else 0
    out: F = spread * (host.per_iter_s + host.per_seq_s * seqs) + k * (host.per_layer_s + ar * host.per_allreduce_s)
    return out


def decode_step_s(
    m: ModelArch, g: GpuCurve, link: LinkCurve, host: HostFloor, tp: int,
    layers: ArrayLike, batch: ArrayLike, context: ArrayLike, ends: TimeEnds = None,
) -> F:  # fmt: skip
    """Seconds of one decode iteration of ``batch`` sequences at ``context`` tokens over ``layers`` layers."""
    k, b, c = _arr(layers), _arr(batch), _arr(context)
    c_eff = np.maximum(_kv_tokens(m, c), 1.0)
    d, hq = m.head_dim, m.heads / tp
    attn = g.decode_attention_s(
        (b * c_eff * m.kv_bytes_per_token_layer + 4.0 * b * m.heads * d * m.dtype_bytes) / tp,
        4.0 * b * c_eff * hq * d,
        b * np.ceil(hq) * np.ceil(c_eff / KV_PARTITION),
        2.0 * np.minimum(c_eff, KV_PARTITION) * d,
    )
    gpu = k * (_layer_gpu_s(m, g, link, tp, b) + attn) + _ends_s(m, g, tp, b, b, k, ends)
    out: F = np.maximum(gpu, _host_s(m, host, tp, k, b))
    return out


def prefill_s(
    m: ModelArch, g: GpuCurve, link: LinkCurve, host: HostFloor, tp: int,
    layers: ArrayLike, batch: ArrayLike, prompt: ArrayLike, ends: TimeEnds = None,
) -> F:  # fmt: skip
    """Seconds of one prompt pass of ``batch`` prompts of ``prompt`` tokens over ``layers`` layers."""
    k, b, s = _arr(layers), _arr(batch), _arr(prompt)
    tokens = np.maximum(b * s, 1.0)
    chunks = np.ceil(tokens / PREFILL_CHUNK_TOKENS)
    per_chunk = tokens / chunks
    s_eff = _kv_tokens(m, s)
    attn = g.prefill_attention_s(
        2.0 * tokens * s_eff * m.heads * m.head_dim / tp,
        4.0 * np.minimum(Q_BLOCK, np.maximum(s, 1.0)) * s_eff * m.head_dim,
        tokens * 2.0 * (m.heads + 2 * m.kv_heads) * m.head_dim * m.dtype_bytes / tp,
    )
    gpu = k * (chunks * _layer_gpu_s(m, g, link, tp, per_chunk) + attn)
    gpu = gpu + _ends_s(m, g, tp, tokens, b, k, ends)
    out: F = np.maximum(gpu, _host_s(m, host, tp, k, b))
    return out


def usable_bytes(node: NodeType, memory_bytes: float, tp: int) -> float:
    """Bytes a stage may use on ``tp`` GPUs of the node, after the utilisation cap and fixed reserve."""
    return tp * (memory_bytes * GPU_MEMORY_UTILIZATION - WORKSPACE_BYTES_PER_GPU)


def end_bytes(m: ModelArch, layers: ArrayLike, ends: Ends) -> F:
    """Weight bytes of the ends a stage of ``layers`` layers holds (``ends=None``: the conservative case)."""
    k = _arr(layers)
    if ends is not None:
        return np.full_like(k, m.end_bytes(*ends))
    one = max(m.end_bytes(True, False), m.end_bytes(False, True))
    out: F = np.where(k >= m.num_layers, m.end_bytes(True, True), one)
    return out


def workspace_bytes(m: ModelArch, tp: int, seqs: ArrayLike, holds_head: ArrayLike) -> F:
    """Activation workspace of a stage on all its GPUs (module docstring)."""
    per_gpu = (
        PREFILL_CHUNK_TOKENS
        * (2.0 * m.hidden + ((m.heads + 2 * m.kv_heads) * m.head_dim + 3.0 * _ffn_width(m)) / tp)
        * m.dtype_bytes
    )
    logits = _arr(holds_head) * _arr(seqs) * m.vocab * LOGIT_BYTES
    out: F = tp * per_gpu + logits
    return out


def stage_bytes(
    m: ModelArch, layers: ArrayLike, seqs: ArrayLike, context: ArrayLike, tp: int = 1, ends: Ends = None
) -> F:
    """Memory of a stage: its layers' weights, its ends, KV of ``seqs`` sequences at ``context``, workspace."""
    k, b, c = _arr(layers), _arr(seqs), _arr(context)
    head = True if ends is None else ends[1]
    kv = k * b * _kv_tokens(m, c) * m.kv_bytes_per_token_layer
    out: F = k * m.block_weight_bytes + end_bytes(m, k, ends) + kv + workspace_bytes(m, tp, b, head)
    return out


def max_layers(m: ModelArch, usable: float, tp: int, seqs: float, context: float) -> int:
    """Most layers a stage can hold (conservative ends) with the KV cache of ``seqs`` sequences."""
    k = np.arange(1, m.num_layers + 1)
    fits = np.flatnonzero(stage_bytes(m, k, seqs, context, tp) <= usable)
    # the whole model charges both ends: a stage may fit L - 1 layers and not L, but never L and not L - 1
    return int(k[fits].max()) if fits.size else 0


def kv_capacity_tokens(m: ModelArch, usable: float, tp: int, layers: int) -> int:
    """Tokens of KV cache that fit beside ``layers`` layers (conservative ends; 0 when the weights do not)."""
    if layers <= 0:
        return 0
    free = usable - float(stage_bytes(m, layers, 1, 0, tp))
    if free <= 0:
        return 0
    return int(free // (layers * m.kv_bytes_per_token_layer))


def activation_bytes_per_token(m: ModelArch) -> float:
    """Bytes of hidden state passed between pipeline stages per token."""
    return float(m.hidden * m.dtype_bytes)


def transfer_s(m: ModelArch, a: NodeType, b: NodeType, tokens: ArrayLike) -> F:
    """Seconds to pass ``tokens`` tokens of activations from node ``a`` to node ``b`` over their NICs."""
    bw = min(a.nic_bytes_per_s, b.nic_bytes_per_s)
    out: F = NET_LATENCY_S + _arr(tokens) * activation_bytes_per_token(m) / bw
    return out


def as_float(x: Any) -> float:
    """A scalar numpy result as a Python float."""
    return float(np.asarray(x).reshape(-1)[0])
