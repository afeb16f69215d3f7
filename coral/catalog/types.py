"""The catalog vocabulary: GPU types, node types, regions with offers, and model architectures.

All types are frozen attrs classes. Units are in the field names: ``_gb`` is 10^9 bytes, ``_gbs`` is
10^9 bytes per second, ``_gbps`` is 10^9 bits per second, ``_s`` is seconds, prices are USD per hour.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

GB = 1e9


@attrs.frozen
class GpuType:
    """A GPU chip with dense BF16 throughput, memory and bandwidth, plus perf-model efficiency factors."""

    name: str
    vendor: str
    tflops_bf16: float
    memory_gb: float
    mem_bw_gbs: float
    source: str
    mem_efficiency: float = 0.8
    compute_efficiency: float = 0.5
    iter_overhead_s: float = 0.004

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GB


@attrs.frozen
class NodeType:
    """A rentable machine shape: GPU type x count, NIC, intra-node link and disk read bandwidth."""

    name: str
    cloud: str
    gpu: str
    gpu_count: int
    nic_gbps: float
    intra_link: str
    intra_link_gbs: float
    disk_gbs: float
    source: str

    @property
    def nic_bytes_per_s(self) -> float:
        return self.nic_gbps * GB / 8.0


@attrs.frozen
class Offer:
    """What one region charges for one node type, and how many nodes are obtainable now.

    ``source`` says where the price comes from (listed, or derived and how).
    """

    node: str
    price: float
    availability: int
    spot: float | None = None
    source: str = ""


@attrs.frozen
class Region:
    """A place where nodes are rented, with its offers keyed by node type name."""

    name: str
    cloud: str
    location: str
    source: str
    offers: Mapping[str, Offer] = attrs.field(factory=dict)


@attrs.frozen
class ModelArch:
    """A model's architecture, as in its HF ``config.json``.

    ``num_experts == 0`` means a dense model. ``kv_full_layers`` is the number of layers that keep the
    full context in their KV cache; the rest keep at most ``sliding_window`` tokens.
    """

    name: str
    hf_id: str
    num_layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params_official_b: float
    source: str
    num_experts: int = 0
    experts_active: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0
    tied_embeddings: bool = False
    dtype_bytes: float = 2.0
    expert_bytes_per_param: float | None = None
    sliding_window: int | None = None
    kv_full_layers: int | None = None
    max_context: int = 32768

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o + 2 * self.hidden

    @property
    def expert_params(self) -> int:
        """Parameters of one expert (gated MLP: gate, up, down)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def mlp_params_per_layer(self) -> int:
        if not self.is_moe:
            return 3 * self.hidden * self.intermediate
        router = self.hidden * self.num_experts
        return (self.num_experts + self.shared_experts) * self.expert_params + router

    @property
    def active_mlp_params_per_layer(self) -> int:
        if not self.is_moe:
            return self.mlp_params_per_layer
        return (self.experts_active + self.shared_experts) * self.expert_params + self.hidden * self.num_experts

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def total_params(self) -> int:
        return self.num_layers * (self.attn_params_per_layer + self.mlp_params_per_layer) + self.embedding_params

    @property
    def active_params(self) -> int:
        per_layer = self.attn_params_per_layer + self.active_mlp_params_per_layer
        return self.num_layers * per_layer + self.vocab * self.hidden

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights, with experts at their own precision when it differs."""
        ebytes = self.expert_bytes_per_param if self.expert_bytes_per_param is not None else self.dtype_bytes
        expert = self.num_layers * (self.num_experts + self.shared_experts) * self.expert_params if self.is_moe else 0
        return (self.total_params - expert) * self.dtype_bytes + expert * ebytes

    @property
    def block_weight_bytes(self) -> float:
        """Weight bytes of one transformer layer alone (no embedding or LM head)."""
        return (self.weight_bytes - self.embedding_params * self.dtype_bytes) / self.num_layers

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes per expert weight (the experts' own precision, else ``dtype_bytes``)."""
        return self.expert_bytes_per_param if self.expert_bytes_per_param is not None else self.dtype_bytes

    def end_bytes(self, first: bool, last: bool) -> float:
        """Weight bytes of the model's ends on a stage: the embedding with layer 0, the LM head with the last
        layer (a tied head is the embedding itself on a stage that holds both, a copy on any other)."""
        one = self.vocab * self.hidden * self.dtype_bytes
        if first and last:
            return one * (1 if self.tied_embeddings else 2)
        return one if first or last else 0.0

    @property
    def layer_weight_bytes(self) -> float:
        """Weight bytes per layer, with embeddings and head spread evenly over the layers."""
        return self.weight_bytes / self.num_layers

    @property
    def active_layer_weight_bytes(self) -> float:
        """Bytes of one layer's weights touched by a single token (all of them for a dense model)."""
        if not self.is_moe:
            return self.layer_weight_bytes
        ebytes = self.expert_bytes_per_param if self.expert_bytes_per_param is not None else self.dtype_bytes
        shared = (self.attn_params_per_layer + self.hidden * self.num_experts) * self.dtype_bytes
        emb = self.embedding_params * self.dtype_bytes / self.num_layers
        return shared + emb + (self.experts_active + self.shared_experts) * self.expert_params * ebytes

    @property
    def kv_bytes_per_token_layer(self) -> float:
        """KV-cache bytes per token per full-attention layer (K and V)."""
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes per token over all layers at full context (every layer keeps the token)."""
        return self.num_layers * self.kv_bytes_per_token_layer

    def kv_layer_tokens(self, context: float) -> float:
        """Mean KV tokens held per layer for one sequence of ``context`` tokens (sliding-window aware)."""
        full = self.num_layers if self.kv_full_layers is None else self.kv_full_layers
        if self.sliding_window is None or full >= self.num_layers:
            return float(context)
        local = self.num_layers - full
        return (full * context + local * min(context, self.sliding_window)) / self.num_layers

    def moe_experts_touched(self, batch: float) -> float:
        """Expected distinct routed experts a batch of tokens touches in one layer (uniform routing)."""
        if not self.is_moe:
            return 0.0
        e, a = self.num_experts, self.experts_active
        return e * (1.0 - math.pow(1.0 - a / e, batch))


@attrs.frozen
class Catalog:
    """Everything the catalog knows, keyed by name."""

    gpus: Mapping[str, GpuType]
    nodes: Mapping[str, NodeType]
    regions: Mapping[str, Region]
    models: Mapping[str, ModelArch]

    def gpu_of(self, node: str | NodeType) -> GpuType:
        n = self.nodes[node] if isinstance(node, str) else node
        return self.gpus[n.gpu]
