"""Serving templates: the throughput-optimal placement of one model under its SLO on one node multiset."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs

from coral.workload import Slo, WorkloadShape

SOURCE = -1
SINK = -2


@attrs.frozen
class Stage:
    """One node of a template, holding layers ``[start, end)`` with TP ``tp`` and batch limit ``batch``.

    ``decode_step_s`` is one decode iteration at ``batch`` sequences and the shape's mean context;
    ``prefill_s`` one prompt pass of ``batch`` prompts of the shape's mean length.
    """

    index: int
    node: str
    gpu: str
    tp: int
    start: int
    end: int
    batch: int
    memory_bytes: float
    decode_step_s: float
    prefill_s: float

    @property
    def layers(self) -> int:
        return self.end - self.start


@attrs.frozen
class Route:
    """Flow on one edge: ``src``/``dst`` are stage indices, or SOURCE (-1) and SINK (-2)."""

    src: int
    dst: int
    flow: float


@attrs.frozen
class Template:
    """A solved placement with its capacities at the SLO.

    ``prefill_tok_s`` and ``decode_tok_s`` are the template's capacities: for ``prefill`` and ``decode``
    templates, their token rates; for ``aggregated`` ones, the prompt-only and decode-only rates P and D,
    so that it serves 1 / (in / P + out / D) req/s at a shape (in, out), and exactly its solved flow at the
    reference shape. ``ttft_s``/``tpot_s`` are the worst estimates over the paths that carry flow.
    ``status`` is ``optimal`` only when proven. ``formulation`` names the placement model that made it
    (``solvers.library.formulation_of``); a template of an older formulation is stale and not used.
    ``kv_min_nic`` (decode templates only, else 0): the slowest prefill-side NIC, in bytes/s, whose KV
    transfer still meets the TPOT target on every path of this placement; a decode instance pairs only
    with prefill instances whose slowest node's NIC reaches it. ``kv_sender`` (decode only): the sender
    NIC class, in bytes/s, the placement was solved behind (the KV transfer into each entry node crossing
    the slower of it and the node's NIC); 0 for no cap (each entry node's own NIC). A decode multiset may
    have one template per class.
    """

    id: str
    model: str
    num_layers: int
    mode: str
    slo: Slo
    shape: WorkloadShape
    nodes: tuple[str, ...]
    stages: tuple[Stage, ...]
    routes: tuple[Route, ...]
    prefill_tok_s: float
    decode_tok_s: float
    ttft_s: float
    tpot_s: float
    perf_version: str
    status: str
    gap: float
    bound: float
    method: str
    solve_s: float
    vllm_ok: bool = False
    vllm_reason: str = ""
    formulation: str = ""
    kv_min_nic: float = 0.0
    kv_sender: float = 0.0

    @property
    def node_counts(self) -> dict[str, int]:
        return dict(Counter(self.nodes))

    @property
    def proven(self) -> bool:
        return self.status == "optimal"

    def requests_per_s(self, mean_in: float, mean_out: float) -> float:
        """Requests per second at a shape: 1 / (in / P + out / D) for aggregated templates."""
        if self.prefill_tok_s <= 0 or self.decode_tok_s <= 0:
            return 0.0
        return 1.0 / (mean_in / self.prefill_tok_s + mean_out / self.decode_tok_s)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON shape other programs read (see README)."""
        return {
            "id": self.id,
            "model": self.model,
            "num_layers": self.num_layers,
            "mode": self.mode,
            "slo": {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s, "attainment": self.slo.attainment},
            "shape": {"mean_in": self.shape.mean_in, "mean_out": self.shape.mean_out},
            "nodes": list(self.nodes),
            "stages": [
                {
                    "node": s.node,
                    "gpu": s.gpu,
                    "tp": s.tp,
                    "layers": [s.start, s.end],
                    "batch": s.batch,
                    "memory_gb": round(s.memory_bytes / 1e9, 3),
                    "decode_step_s": s.decode_step_s,
                    "prefill_s": s.prefill_s,
                }
                for s in self.stages
            ],
            "routes": [{"src": _end(r.src), "dst": _end(r.dst), "flow": r.flow} for r in self.routes],
            "prefill_tok_s": self.prefill_tok_s,
            "decode_tok_s": self.decode_tok_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "perf_version": self.perf_version,
            "status": self.status,
            "gap": self.gap,
            "bound": self.bound,
            "method": self.method,
            "solve_s": self.solve_s,
            "vllm_ok": self.vllm_ok,
            "vllm_reason": self.vllm_reason,
            "formulation": self.formulation,
            "kv_min_nic": self.kv_min_nic,
            "kv_sender": self.kv_sender,
        }


def chain_order(stages: Sequence[Stage], routes: Sequence[Route]) -> list[int]:
    """The stage indices in the order the route runs through them, when the routes form one chain
    (source -> s -> ... -> sink through every stage once); empty otherwise."""
    nxt: dict[int, list[int]] = {}
    for r in routes:
        nxt.setdefault(r.src, []).append(r.dst)
    order: list[int] = []
    cur = SOURCE
    while True:
        outs = nxt.get(cur, [])
        if len(outs) != 1:
            return []
        cur = outs[0]
        if cur == SINK:
            break
        if cur in order or not 0 <= cur < len(stages):
            return []
        order.append(cur)
    return order if len(order) == len(stages) and len(routes) == len(stages) + 1 else []


def vllm_compatibility(stages: Sequence[Stage], routes: Sequence[Route]) -> tuple[bool, str]:
    """Whether vLLM can run this placement as it is: one chain of stages with one TP degree (and why not)."""
    tps = {s.tp for s in stages}
    if len(tps) > 1:
        return False, f"stages use different TP degrees {sorted(tps)}; vLLM needs one TP degree for all stages"
    if not chain_order(stages, routes):
        return False, "the routes branch (data parallelism inside the replica); vLLM runs only a single chain"
    return True, ""


def _end(i: int) -> str | int:
    return "source" if i == SOURCE else "sink" if i == SINK else i
