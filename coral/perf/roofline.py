"""Roofline performance model of one pipeline stage: prefill time, decode step time and memory.

A stage is one node that holds ``layers`` contiguous layers of a model with tensor parallelism ``tp``
over that node's GPUs. With b sequences, prompt length s and context c (tokens already in the KV cache):

- decode step: ``max(bytes / (tp * BW * eta_mem), flops / (tp * peak * eta_c)) + allreduce + overhead``
  where bytes = weights touched (all of a dense layer; for MoE the expected distinct experts a batch of b
  tokens touches) + KV-cache reads (b * c_eff * KV bytes per token per layer), and flops =
  2 * active params * b + 4 * b * c_eff * heads * head_dim per layer; c_eff is sliding-window aware.
- prefill (b prompts of s tokens): flops = 2 * active params * b * s + 2 * b * s * s_eff * heads *
  head_dim per layer (causal attention), bytes = weights + KV written.
- tensor parallelism adds two ring all-reduces per layer over the intra-node link:
  ``latency + 2 (tp - 1) / tp * bytes / link_bw``.
- each iteration pays a fixed overhead (scheduler, kernel launches) proportional to the layers held.
- memory per GPU group: ``tp * memory * GPU_MEMORY_UTILIZATION`` must hold the stage's weights, the KV
  cache for its batch at the workload's context, and an activation workspace.

The embedding and LM head are spread evenly over the layers (as Helix does), so every layer weighs the
same and a stage's cost depends only on how many layers it holds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from coral.catalog.types import GpuType, ModelArch, NodeType

GPU_MEMORY_UTILIZATION = 0.90
WORKSPACE_BYTES_PER_GPU = 1.5e9
PREFILL_CHUNK_TOKENS = 8192
NET_LATENCY_S = 2e-4
BASE_OVERHEAD_S = 3e-4
# Per all-reduce latency. NVLink: set so that Llama-70B TP8 decode at batch 1 on H100 matches the
# measured 30.6 ms (calibration.toml); the others are scaled from it (no measured point).
ALLREDUCE_LATENCY_S = {"nvlink": 1.2e-4, "pcie": 1.5e-4, "infinity-fabric": 1.2e-4}

F = NDArray[np.float64]


def _arr(x: ArrayLike) -> F:
    return np.asarray(x, dtype=np.float64)


def _attn_dim(m: ModelArch) -> int:
    return m.heads * m.head_dim


def _active_params_per_layer(m: ModelArch) -> float:
    """Parameters one token multiplies through in one layer, with the LM head spread over layers."""
    return m.attn_params_per_layer + m.active_mlp_params_per_layer + m.vocab * m.hidden / m.num_layers


def _weight_bytes_touched(m: ModelArch, tokens: F) -> F:
    """Bytes of one layer's weights that a step over ``tokens`` tokens reads."""
    if not m.is_moe:
        return np.full_like(tokens, m.layer_weight_bytes)
    ebytes = m.expert_bytes_per_param if m.expert_bytes_per_param is not None else m.dtype_bytes
    routed = m.num_experts * m.expert_params * ebytes
    other = m.layer_weight_bytes - routed
    e, a = m.num_experts, m.experts_active
    touched = e * (1.0 - np.power(1.0 - a / e, np.maximum(tokens, 1.0)))
    return other + touched * m.expert_params * ebytes


def _allreduce_s(node: NodeType, tp: int, nbytes: F) -> F:
    if tp <= 1:
        return np.zeros_like(nbytes)
    lat = ALLREDUCE_LATENCY_S.get(node.intra_link, 4e-5)
    return lat + 2.0 * (tp - 1) / tp * nbytes / (node.intra_link_gbs * 1e9)


def _overhead_s(m: ModelArch, gpu: GpuType, layers: F) -> F:
    return BASE_OVERHEAD_S + gpu.iter_overhead_s * layers / m.num_layers


def decode_step_s(
    m: ModelArch, node: NodeType, gpu: GpuType, tp: int, layers: ArrayLike, batch: ArrayLike, context: ArrayLike
) -> F:
    """Seconds for one decode iteration of ``batch`` sequences at ``context`` tokens over ``layers`` layers."""
    k, b, c = _arr(layers), _arr(batch), _arr(context)
    c_eff = _kv_tokens(m, c)
    wbytes = _weight_bytes_touched(m, b) * k
    kvbytes = b * c_eff * m.kv_bytes_per_token_layer * k
    flops = k * b * (2.0 * _active_params_per_layer(m) + 4.0 * c_eff * _attn_dim(m))
    t_mem = (wbytes + kvbytes) / (tp * gpu.mem_bw_gbs * 1e9 * gpu.mem_efficiency)
    t_cmp = flops / (tp * gpu.tflops_bf16 * 1e12 * gpu.compute_efficiency)
    t_ar = 2.0 * k * _allreduce_s(node, tp, b * m.hidden * m.dtype_bytes)
    out: F = np.maximum(t_mem, t_cmp) + t_ar + _overhead_s(m, gpu, k)
    return out


def prefill_s(
    m: ModelArch, node: NodeType, gpu: GpuType, tp: int, layers: ArrayLike, batch: ArrayLike, prompt: ArrayLike
) -> F:
    """Seconds for one prompt pass of ``batch`` prompts of ``prompt`` tokens over ``layers`` layers."""
    k, b, s = _arr(layers), _arr(batch), _arr(prompt)
    tokens = b * s
    s_eff = _kv_tokens(m, s)
    flops = k * tokens * (2.0 * _active_params_per_layer(m) + 2.0 * s_eff * _attn_dim(m))
    wbytes = _weight_bytes_touched(m, tokens) * k * np.ceil(np.maximum(tokens, 1.0) / PREFILL_CHUNK_TOKENS)
    kvbytes = tokens * m.kv_bytes_per_token_layer * k
    t_mem = (wbytes + kvbytes) / (tp * gpu.mem_bw_gbs * 1e9 * gpu.mem_efficiency)
    t_cmp = flops / (tp * gpu.tflops_bf16 * 1e12 * gpu.compute_efficiency)
    t_ar = 2.0 * k * _allreduce_s(node, tp, tokens * m.hidden * m.dtype_bytes)
    out: F = np.maximum(t_mem, t_cmp) + t_ar + _overhead_s(m, gpu, k)
    return out


def _kv_tokens(m: ModelArch, context: F) -> F:
    """Mean tokens of KV per layer for a sequence of ``context`` tokens (sliding-window aware)."""
    full = m.num_layers if m.kv_full_layers is None else m.kv_full_layers
    if m.sliding_window is None or full >= m.num_layers:
        return context
    local = m.num_layers - full
    out: F = (full * context + local * np.minimum(context, m.sliding_window)) / m.num_layers
    return out


def usable_bytes(node: NodeType, gpu: GpuType, tp: int) -> float:
    """Bytes a stage may use on ``tp`` GPUs of the node, after the utilisation cap and workspace."""
    return tp * (gpu.memory_bytes * GPU_MEMORY_UTILIZATION - WORKSPACE_BYTES_PER_GPU)


def stage_bytes(m: ModelArch, layers: ArrayLike, batch: ArrayLike, context: ArrayLike) -> F:
    """Weights plus KV cache of a stage holding ``layers`` layers with ``batch`` sequences of ``context``."""
    k, b, c = _arr(layers), _arr(batch), _arr(context)
    out: F = k * (m.layer_weight_bytes + b * _kv_tokens(m, c) * m.kv_bytes_per_token_layer)
    return out


def max_layers(m: ModelArch, node: NodeType, gpu: GpuType, tp: int, batch: float, context: float) -> int:
    """Most layers a stage can hold while keeping the KV cache of ``batch`` sequences at ``context``."""
    per_layer = float(stage_bytes(m, 1, batch, context))
    return int(min(m.num_layers, max(0.0, usable_bytes(node, gpu, tp)) // per_layer))


def kv_capacity_tokens(m: ModelArch, node: NodeType, gpu: GpuType, tp: int, layers: int) -> int:
    """Tokens of KV cache that fit beside ``layers`` layers of weights (0 when the weights do not fit)."""
    free = usable_bytes(node, gpu, tp) - layers * m.layer_weight_bytes
    if layers <= 0 or free <= 0:
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
