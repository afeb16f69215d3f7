"""The performance model: (model, node type, TP, layers, batch, context) -> step times and memory.

The stage model (``coral.perf.roofline``) over operator curves fitted to measurements
(``coral.perf.ops``, ``coral.perf.params``, fitted by ``coral.perf.fit``) is the default; a measured
profile table (``coral.perf.profile``) for a (model, GPU type, TP) overrides its timings. Memory always
comes from the architecture.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

from coral.catalog.types import Catalog, GpuType, ModelArch, NodeType
from coral.errors import CoralError
from coral.perf import roofline
from coral.perf.ops import GpuCurve, LinkCurve
from coral.perf.params import PerfParams, load_params
from coral.perf.profile import ProfileError, ProfileTable, index_profiles, load_profiles
from coral.perf.roofline import Ends, TimeEnds

MODEL_VERSION = "opcurve-5"
"""Bumped whenever the stage model's formulas change; with the fitted parameters' digest it makes
``PerfModel.version``, part of every template's key (a changed model rebuilds the store)."""

__all__ = ["PerfError", "PerfModel", "ProfileError", "ProfileTable", "StagePrediction", "load_profiles"]


class PerfError(CoralError):
    """A perf-model query names something unknown or asks for an impossible stage."""


@attrs.frozen
class StagePrediction:
    """One stage's predicted timings and memory, as ``coral perf`` prints them."""

    model: str
    node: str
    gpu: str
    tp: int
    layers: int
    batch: int
    prompt: float
    context: float
    prefill_s: float
    decode_step_s: float
    max_layers: int
    kv_capacity_tokens: int
    memory_bytes: float
    fits: bool
    source: str


class PerfModel:
    """Stage timings and memory for a catalog, with optional profile-table overrides."""

    def __init__(
        self, catalog: Catalog, profiles: Iterable[ProfileTable] = (), params: PerfParams | None = None
    ) -> None:
        self.catalog = catalog
        self.params = load_params() if params is None else params
        self.profiles = index_profiles(profiles)
        self.base_version = f"{MODEL_VERSION}+{self.params.digest}"
        h = hashlib.sha256(self.base_version.encode())
        for key in sorted(self.profiles):
            h.update(self.profiles[key].digest().encode())
        self.version = f"{self.base_version}+{h.hexdigest()[:12]}" if self.profiles else self.base_version
        self._gpu: dict[str, GpuCurve] = {}
        self._link: dict[str, LinkCurve] = {}

    def gpu_curve(self, gpu: str) -> GpuCurve:
        """The GEMM and streaming curves of a catalog GPU type (measured, or derived: ``curve.derived``)."""
        if gpu not in self._gpu:
            self._gpu[gpu] = self.params.gpu_curve(self.catalog.gpus[gpu])
        return self._gpu[gpu]

    def link_curve(self, node: str) -> LinkCurve:
        """The all-reduce curve of a node type's intra-node link."""
        if node not in self._link:
            n = self.catalog.nodes[node]
            self._link[node] = self.params.link_curve(n, self.catalog.gpus[n.gpu])
        return self._link[node]

    def resolve(self, model: str, node: str) -> tuple[ModelArch, NodeType, GpuType]:
        if model not in self.catalog.models:
            raise PerfError(f"unknown model {model!r}; known: {', '.join(sorted(self.catalog.models))}")
        if node not in self.catalog.nodes:
            raise PerfError(f"unknown node type {node!r}; known: {', '.join(sorted(self.catalog.nodes))}")
        n = self.catalog.nodes[node]
        return self.catalog.models[model], n, self.catalog.gpus[n.gpu]

    def _tp(self, n: NodeType, tp: int | None) -> int:
        t = n.gpu_count if tp is None else tp
        if t < 1 or t > n.gpu_count:
            raise PerfError(f"tp must be between 1 and {n.gpu_count} for {n.name}, got {t}")
        return t

    def profile_for(self, model: str, node: str, tp: int | None = None) -> ProfileTable | None:
        n = self.catalog.nodes[node]
        return self.profiles.get((model, n.gpu, self._tp(n, tp)))

    def decode_step_s(
        self,
        model: str,
        node: str,
        *,
        layers: ArrayLike,
        batch: ArrayLike,
        context: ArrayLike,
        tp: int | None = None,
        ends: TimeEnds = None,
    ) -> NDArray[np.float64]:
        """Seconds of one decode iteration of the stage (vectorised over layers, batch, context and ``ends``
        = (holds layer 0, holds the last layer): the embedding and LM head on the stages that hold them;
        None spreads them over the layers, ``coral.perf.roofline``)."""
        m, n, g = self.resolve(model, node)
        t = self._tp(n, tp)
        prof = self.profiles.get((model, n.gpu, t))
        if prof is not None:
            out: NDArray[np.float64] = np.asarray(layers, dtype=np.float64) * prof.decode_layer_s(batch)
            return out + 0.0 * np.asarray(context, dtype=np.float64)
        curves = self.gpu_curve(g.name), self.link_curve(n.name), self.params.host
        return roofline.decode_step_s(m, *curves, t, layers, batch, context, ends)

    def prefill_s(
        self,
        model: str,
        node: str,
        *,
        layers: ArrayLike,
        batch: ArrayLike,
        prompt: ArrayLike,
        tp: int | None = None,
        ends: TimeEnds = None,
    ) -> NDArray[np.float64]:
        """Seconds of one prompt pass of ``batch`` prompts of ``prompt`` tokens through the stage (``ends`` as
        for ``decode_step_s``)."""
        m, n, g = self.resolve(model, node)
        t = self._tp(n, tp)
        prof = self.profiles.get((model, n.gpu, t))
        if prof is not None:
            tokens = np.asarray(batch, dtype=np.float64) * np.asarray(prompt, dtype=np.float64)
            out: NDArray[np.float64] = np.asarray(layers, dtype=np.float64) * prof.prefill_layer_s(tokens)
            return out
        curves = self.gpu_curve(g.name), self.link_curve(n.name), self.params.host
        return roofline.prefill_s(m, *curves, t, layers, batch, prompt, ends)

    def max_layers(self, model: str, node: str, *, batch: float, context: float, tp: int | None = None) -> int:
        """Most layers a stage on ``node`` can hold with the KV cache of ``batch`` sequences at ``context``
        (ends charged conservatively: ``coral.perf.roofline``)."""
        m, n, _ = self.resolve(model, node)
        t = self._tp(n, tp)
        return roofline.max_layers(m, self.usable_bytes(node, t), t, batch, context)

    def kv_capacity_tokens(self, model: str, node: str, *, layers: int, tp: int | None = None) -> int:
        m, n, _ = self.resolve(model, node)
        t = self._tp(n, tp)
        return roofline.kv_capacity_tokens(m, self.usable_bytes(node, t), t, layers)

    def usable_bytes(self, node: str, tp: int | None = None) -> float:
        n = self.catalog.nodes[node]
        return roofline.usable_bytes(n, self.catalog.gpus[n.gpu].memory_bytes, self._tp(n, tp))

    def stage_bytes(
        self,
        model: str,
        *,
        layers: ArrayLike,
        batch: ArrayLike,
        context: ArrayLike,
        node: str | None = None,
        tp: int | None = None,
        ends: Ends = None,
    ) -> NDArray[np.float64]:
        """Memory of a stage holding ``layers`` layers and the KV cache of ``batch`` sequences (every
        micro-batch it holds) at ``context``: weights, the ends it holds (``ends`` = (layer 0, last
        layer); None charges the conservative case), KV and activation workspace on its ``tp`` GPUs
        (``node``'s GPU count when not given; 1 without a node)."""
        t = self._tp(self.catalog.nodes[node], tp) if node is not None else (tp or 1)
        return roofline.stage_bytes(self.catalog.models[model], layers, batch, context, t, ends)

    def _source(self, gpu: str, node: str) -> str:
        g, lk = self.gpu_curve(gpu), self.link_curve(node)
        return f"{self.base_version}; gpu {g.source or 'measured'}; link {lk.name}: {lk.source or 'measured'}"

    def transfer_s(self, model: str, src: str, dst: str, tokens: ArrayLike) -> NDArray[np.float64]:
        """Seconds to send ``tokens`` tokens of activations between two nodes' NICs."""
        m = self.catalog.models[model]
        return roofline.transfer_s(m, self.catalog.nodes[src], self.catalog.nodes[dst], tokens)

    def load_s(self, model: str, node: str, layers: int | None = None) -> float:
        """Seconds to read a stage's weights from disk (the start-up cost of a new instance)."""
        m, n, _ = self.resolve(model, node)
        k = m.num_layers if layers is None else layers
        return k * m.layer_weight_bytes / (n.disk_gbs * 1e9)

    def predict(
        self,
        model: str,
        node: str,
        *,
        batch: int,
        prompt: float,
        context: float,
        tp: int | None = None,
        layers: int | None = None,
    ) -> StagePrediction:
        """Everything ``coral perf`` reports for one stage."""
        m, n, g = self.resolve(model, node)
        t = self._tp(n, tp)
        k = m.num_layers if layers is None else layers
        if not 1 <= k <= m.num_layers:
            raise PerfError(f"layers must be between 1 and {m.num_layers} for {model}, got {k}")
        for name, v in (("batch", batch), ("prompt", prompt), ("context", context)):
            if not (math.isfinite(v) and v >= 1):
                raise PerfError(f"{name} must be a number of at least 1, got {v}")
        ends = None if k < m.num_layers else (True, True)
        mem = float(roofline.stage_bytes(m, k, batch, context, t, ends))
        prof = self.profiles.get((model, n.gpu, t))
        return StagePrediction(
            model=model,
            node=node,
            gpu=n.gpu,
            tp=t,
            layers=k,
            batch=batch,
            prompt=prompt,
            context=context,
            prefill_s=roofline.as_float(self.prefill_s(model, node, layers=k, batch=batch, prompt=prompt, tp=t)),
            decode_step_s=roofline.as_float(
                self.decode_step_s(model, node, layers=k, batch=batch, context=context, tp=t)
            ),
            max_layers=self.max_layers(model, node, batch=batch, context=context, tp=t),
            kv_capacity_tokens=self.kv_capacity_tokens(model, node, layers=k, tp=t),
            memory_bytes=mem,
            fits=mem <= self.usable_bytes(node, t),
            source=f"profile {prof.source}" if prof is not None else self._source(g.name, node),
        )
