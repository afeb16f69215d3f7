"""Turn (model, node multiset, mode, SLO, workload shape) into a numeric PlacementProblem.

Per node, the option menu is every (k layers, batch b) on the grid ``k = 1..K_b``, ``b in BATCH_GRID``
whose memory fits. ``b`` is the micro-batch a stage steps at once (one b for all the stages of a
template: see ``solvers.library``). A path of p stages keeps p micro-batches in flight (vLLM's virtual
engines), so every stage holds the KV cache of p * b sequences; since p is at
most the number of nodes n, the memory check is k * layer weights + KV for n * b sequences at the shape's
maximum context <= usable memory (``coral.perf``): exact for chains through all n nodes, conservative for
shorter paths. For each option the perf model gives:

- ``tau``: decode step time of the stage at batch b and the mean context;
- ``pre_1`` / ``pre_b``: prompt time of the stage for one prompt / for b prompts batched together;
- capacity in flow units/s: aggregated = requests/s at the reference shape: b requests take the node
  ``pre_b + out * tau`` seconds (prompts batched as chunked prefill does, then ``out`` decode steps at
  batch b), so ``b / (pre_b + out * tau)``; prefill = prompt tokens/s, ``b * in / pre_b``; decode =
  tokens/s, ``b / tau``.

Latency metrics: aggregated has TPOT (sum of ``tau + pre_b / out``: prompts are time-shared with decode
steps, so each output token also waits for its share of the batch's prompt work) and TTFT (sum of
``pre_1 + tau``: a request's own prompt plus one decode step of the batch it joins); prefill has TTFT
(sum of ``2 pre_b``: a request waits for the batch in progress, then runs in the next); decode has TPOT,
plus, on the source edge, the KV-cache transfer of the mean prompt over the decode node's NIC spread over
the mean output (the second token waits for it).

The TPOT of a loaded pipeline: vLLM keeps p micro-batches in flight on a path of p stages, and each of
them visits the slowest stage once per token, so a token takes p * max_i t_i (t_i: the stage's per-token
time above), not the sum of the t_i, which holds only while one micro-batch is alone (an unbalanced
7 + 57-layer split of qwen3-32b was estimated at 87 ms and simulated at 101 ms). The path constraint
keeps the sum (with the links); in addition every TPOT option must satisfy n * t <= TPOT target, which
bounds p * max_i t_i for every path (p <= n): exact for chains through all n nodes, conservative for
shorter paths, as the memory check.

Edges between nodes add the NIC transfer of one token's activations (TPOT) or one prompt's (TTFT) and carry
at most NIC bandwidth / activation bytes per flow unit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coral.perf import PerfModel
from coral.perf.roofline import activation_bytes_per_token
from coral.workload import MODES, Slo, WorkloadShape
from solvers.problem import NodeMenu, PlacementProblem

BATCH_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FORMULATION = "options-5"
"""Bumped whenever menus or metrics change meaning; part of every template's content key."""


def node_menu(
    perf: PerfModel, model: str, node: str, mode: str, shape: WorkloadShape, *, inflight: int = 1
) -> NodeMenu:
    """Every memory-feasible (k, b) option of one node, with its capacity and latencies.

    ``inflight`` micro-batches of b sequences share the node's KV cache (the number of pipeline stages).
    """
    ks: list[np.ndarray] = []
    bs: list[np.ndarray] = []
    for batch in BATCH_GRID:
        kmax = perf.max_layers(model, node, batch=batch * inflight, context=shape.max_context)
        if kmax >= 1:
            ks.append(np.arange(1, kmax + 1, dtype=np.int64))
            bs.append(np.full(kmax, batch, dtype=np.int64))
    if not ks:
        empty = np.zeros(0)
        return NodeMenu(np.zeros(0, np.int64), np.zeros(0, np.int64), empty, np.zeros((_metrics(mode), 0)), empty)
    k = np.concatenate(ks)
    b = np.concatenate(bs)
    mem = perf.stage_bytes(model, layers=k, batch=b * inflight, context=shape.max_context)
    if mode == "prefill":
        pre_b = perf.prefill_s(model, node, layers=k, batch=b, prompt=shape.mean_in)
        return NodeMenu(k, b, b * shape.mean_in / pre_b, 2.0 * pre_b[None, :], mem)
    tau = perf.decode_step_s(model, node, layers=k, batch=b, context=shape.mean_context)
    if mode == "decode":
        return NodeMenu(k, b, b / tau, tau[None, :], mem)
    pre1 = perf.prefill_s(model, node, layers=k, batch=1, prompt=shape.mean_in)
    pre_b = perf.prefill_s(model, node, layers=k, batch=b, prompt=shape.mean_in)
    cap = b / (pre_b + shape.mean_out * tau)
    return NodeMenu(k, b, cap, np.vstack([tau + pre_b / shape.mean_out, pre1 + tau]), mem)


def _pipeline_tpot(menu: NodeMenu, n: int, tpot_s: float, mode: str) -> NodeMenu:
    """Keep the options whose per-token time, times the n micro-batches in flight, meets the TPOT target
    (see the module docstring); prefill menus have no TPOT and stay whole."""
    if mode == "prefill" or n == 1 or menu.size == 0:
        return menu
    keep = np.flatnonzero(n * menu.lat[0] <= tpot_s * (1.0 + 1e-12))
    return NodeMenu(menu.k[keep], menu.b[keep], menu.cap[keep], menu.lat[:, keep], menu.mem[keep])


def _metrics(mode: str) -> int:
    return 2 if mode == "aggregated" else 1


def build_problem(
    perf: PerfModel, model: str, nodes: Sequence[str], mode: str, slo: Slo, shape: WorkloadShape
) -> PlacementProblem:
    """The placement problem of ``model`` on the node multiset ``nodes`` (sorted for symmetry)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    kinds = tuple(sorted(nodes))
    n = len(kinds)
    menus = tuple(
        _pipeline_tpot(node_menu(perf, model, nd, mode, shape, inflight=n), n, slo.tpot_s, mode) for nd in kinds
    )
    m = perf.catalog.models[model]
    act = activation_bytes_per_token(m)
    per_unit = {"aggregated": (shape.mean_in + shape.mean_out) * act, "prefill": act, "decode": act}[mode]
    metric_tokens = {"aggregated": (1.0, shape.mean_in), "prefill": (shape.mean_in,), "decode": (1.0,)}[mode]
    limits = {"aggregated": (slo.tpot_s, slo.ttft_s), "prefill": (slo.ttft_s,), "decode": (slo.tpot_s,)}[mode]
    nm = len(limits)
    link_lat = np.zeros((nm, n + 1, n + 1))
    link_cap = np.full((n + 1, n + 1), np.inf)
    nodes_cat = perf.catalog.nodes
    if mode == "decode":
        kv_bytes = shape.mean_in * m.kv_bytes_per_token
        for i, a in enumerate(kinds):
            link_lat[0, n, i] = kv_bytes / nodes_cat[a].nic_bytes_per_s / shape.mean_out
    for i, a in enumerate(kinds):
        for j, bnode in enumerate(kinds):
            if i == j:
                continue
            bw = min(nodes_cat[a].nic_bytes_per_s, nodes_cat[bnode].nic_bytes_per_s)
            link_cap[i, j] = bw / per_unit
            for mi, tok in enumerate(metric_tokens):
                link_lat[mi, i, j] = float(perf.transfer_s(model, a, bnode, tok))
    return PlacementProblem(
        num_layers=m.num_layers,
        kinds=kinds,
        menus=menus,
        link_lat=link_lat,
        link_cap=link_cap,
        lat_limit=np.asarray(limits, dtype=np.float64),
    )
