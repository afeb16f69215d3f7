"""Turn (model, node multiset, mode, SLO, workload shape) into a numeric PlacementProblem.

Per node, the option menu is every (k layers, batch b, role) on the grid ``k = 1..L``, ``b in BATCH_GRID``
whose memory fits. ``b`` is the micro-batch a stage steps at once (one b for all the stages of a
template: see ``solvers.library``). The role (``solvers.problem``) is what the option is charged for:

- d micro-batches in flight through the stage. A path of p stages keeps p micro-batches in flight
  (vLLM's batch queue of PP entries, one per virtual engine; a request is in one micro-batch at a
  time), and each of them passes every stage of the path; a stage that several paths cross holds the
  micro-batches of all of them, so stage i holds d_i = sum over the paths P through it of |P| (p for
  every stage of a chain of p; 2 + 2 on the shared node of a fork into two). ``depths(n)`` lists every
  d_i that a placement of at most n nodes can give (1..4 for n = 3), and the menu holds each.
- the model's ends: the embedding on the stage holding layer 0, the LM head (and its logits workspace)
  on the stage holding the last layer: one option per set of ends the stage may hold (none, first or
  last for k < L; both for k = L).

The placers let node i run option o only where d_i <= d_o and the ends it holds are among o's (a
one-sided test: charging more is safe, and an option charged for more is never better), so the rule is
exact for every shape, not only for chains through all n nodes. Memory of an option is ``coral.perf``'s
stage memory at its exact ends (k layers' weights, KV for d * b sequences at the shape's maximum
context, the activation workspace on the node's GPUs) <= usable memory. The vLLM measurements of issue
21 (``just bench pipeline``, vLLM 0.32 on CPU, PP = 2) support the count: every stage held the KV of
every running sequence of its pipeline (0.75-1.00 of n b in count), so a stage of a shorter path holds
only its own paths' sequences. vLLM formed fewer and unequal micro-batches at those loads (1.1-4.8
decode sequences per step with 2-16 in flight), so d * b is what a stage holds at most, the safe side.
For each option the perf model gives, at the option's ends (the embedding lookup charged to the stage
holding layer 0, the LM head's GEMM to the stage holding the last layer):

- ``tau``: decode step time of the stage at batch b and the mean context;
- ``pre_1`` / ``pre_b``: prompt time of the stage for one prompt / for b prompts batched together;
- capacity in flow units/s: aggregated = requests/s at the reference shape: b requests take the node
  ``g * pre_b + out * tau`` seconds (prompts batched as chunked prefill does, then ``out`` decode steps at
  batch b; g: the pipeline prefill bubble below), so ``b / (g * pre_b + out * tau)``; prefill = prompt
  tokens/s, ``b * in / pre_b``; decode = tokens/s, ``b / tau``.

Latency metrics: aggregated has TPOT (sum of ``tau + x_q * pre_b / b``: prompts are time-shared with
decode steps, so each output token also waits for the prompts that join its batch, x_q per step, below)
and TTFT (sum of ``pre_1(in_q) + tau``: a request's own prompt plus one decode step of the batch it
joins); prefill has TTFT (sum of ``2 pre_b + pre_1(in_q) - pre_1(in)``: a request waits for the batch in
progress, then runs in the next, with its own prompt at in_q); in_q is the prompt length at the
attainment quantile (below);
decode has TPOT, plus, on the source edge, the KV-cache transfer of the mean prompt spread over the
decode steps of the request at the attainment quantile (below).

The TPOT of a loaded pipeline: stage i steps its d_i micro-batches in turn, one step each per round,
so a micro-batch on path P gets a token every max over i in P of d_i * t_i (t_i: the stage's per-token
time above; on a chain of p stages p * max_i t_i), not the sum of the t_i, which holds only while one
micro-batch is alone (an unbalanced 7 + 57-layer split of qwen3-32b was estimated at 87 ms and simulated
at 101 ms). The path constraint keeps the sum (with the links); in addition an option charged for d
micro-batches is kept only if d * t <= TPOT target (``_pipeline_tpot``), which with d_i <= d bounds
max_i d_i t_i on every path: exact for every path length.

Pipeline prefill bubble (g). The micro-batches of a pipeline are not alike: one carries a prompt chunk, the
others only decode steps. Micro-batch j loops through every stage once per token, so a round of the d
micro-batches through a stage takes at least the heaviest one's loop, sum_i (tau_i + K_max pre_1,i),
where K_max is the largest prompt count among them, not the mean K (vLLM schedules each micro-batch
(virtual engine / batch queue entry) on its own; the simulator does the same and served 2-stage
pipelines at 0.83-0.94 of the options-6 capacity). Each micro-batch admits about m = b / out prompts per
step (as many as finish), a Poisson count, so a stage's prompt work per round is g = E[max of d
Poisson(m)] / m times its mean, d the option's micro-batches (``prefill_bubble``: 1 for d = 1, near d for
sparse prompts, towards 1 for many): exact for balanced chains, conservative for unbalanced ones (their
lighter stages idle anyway).

Tail margins at the SLO's attainment quantile q. TTFT grows with the request's own prompt, so TTFT counts
the prompt in_q at the quantile 1 - (1 - q) / 2, prompts taken exponential with the shape's mean
(``long_prompt``: 3.0 times the mean at q = 0.9; the Azure conversation trace's 95th percentile is 3.5 times
its mean, with 8% of its prompts near 4,100 tokens); the other half of the miss budget is the queue's
(``ttft_share``; the planner holds the wait to the same quantile). At the mean prompt, options-6 let every
prompt above about twice the mean miss a 2 s target (12% of that trace), before any queueing. A template's
TPOT must hold for q of the requests, not on average: a request's TPOT is its mean step time over its own o'
= out - 1 steps, and the prompts that land in those steps (or, in a pipeline, the heaviest micro-batch's)
vary. The shape gives only the mean output, so o' is taken geometric with that mean (the maximum-entropy
law; it has more short requests than the Azure traces, CV 0.77, so it errs safe), and the prompt count over
o' steps Poisson(mu o'), mu = E[max] over the option's d micro-batches (the request's own holds b - 1 others).
``prefill_tail`` gives x_q: the prompts per step that at most 1 - q of the requests exceed; the aggregated
TPOT counts ``x_q * pre_b / b`` (0 for b = 1, about 1.1-1.4 times the mean m for one stage). A decode
template's KV transfer is a fixed delay per request, so it is spread over o'_q steps, the (1 - q) quantile
of o' (``short_output_steps``: 22 steps for the conversation shape at q = 0.9, not 211); and it crosses the
slower of the two NICs (the simulator's rule). The sending prefill instance is not known when the template
is built, so a decode problem is solved per sender class s (``build_problem``'s ``sender_nic``): the source
edge into node i is priced at min(s, node i's NIC) (s = None: node i's own NIC, a sender at least as fast).
The build solves each multiset at every NIC speed of the scenario's node types below its fastest node's,
fastest first, and keeps a slower class's template only when the next faster one does not already hold
behind it (``coral.cli.build``). Each template records the slowest sender it holds for
(``solvers.library.kv_min_nic``: the least sender NIC whose transfer still fits the TPOT slack of every
path that carries flow); the allocation pairs a decode template only with prefill instances whose slowest
NIC reaches that (``solvers.allocation.columns``). A placement holds behind sender s exactly when it is
feasible in the class-s problem, so behind every prefill class the best decode template of a multiset is
in the library, and the two stages stay lossless. So the transfer
is priced by the pair that will run, not by the slowest NIC of the catalog (8 Gbps, a node type that need
not even be in the scenario: code-14b needed 120 ms per token for it against a 50 ms TPOT).

Edges between nodes add the NIC transfer of one token's activations (TPOT) or one prompt's (TTFT) and carry
at most NIC bandwidth / activation bytes per flow unit.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from coral.perf import PerfModel
from coral.perf.roofline import activation_bytes_per_token
from coral.workload import MODES, Slo, WorkloadShape
from solvers.problem import BOTH, FIRST, LAST, NodeMenu, PlacementProblem
from solvers.reduce import subset_menu
from solvers.shapes.catalogue import skeletons

BATCH_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FORMULATION = "options-11"
"""Bumped whenever menus or metrics change meaning; part of every template's content key (with
``MODE_FORMULATION``: ``formulation``)."""
MODE_FORMULATION = {"decode": "kv-pair-2"}
"""Per mode, a version of the rules that only that mode's problems have (the decode source edge's KV
transfer), so that a change to them rebuilds only that mode's templates."""


def formulation(mode: str) -> str:
    """The formulation of ``mode``'s problems: ``FORMULATION``, with the mode's own rules' version."""
    own = MODE_FORMULATION.get(mode)
    return FORMULATION if own is None else f"{FORMULATION}+{own}"


def _poisson_cdf(k: int, lam: float) -> float:
    """P(N <= k) for N ~ Poisson(lam) (exact up to lam = 50, normal with continuity correction above)."""
    if k < 0:
        return 0.0
    if lam <= 0.0:
        return 1.0
    if lam > 50.0:
        return 0.5 * math.erfc(-(k + 0.5 - lam) / math.sqrt(2.0 * lam))
    term = total = math.exp(-lam)
    for i in range(1, k + 1):
        term *= lam / i
        total += term
    return min(total, 1.0)


_ERFC = np.vectorize(math.erfc, otypes=[float])


def _poisson_sf(k: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """P(N > k) elementwise for N ~ Poisson(lam) (as ``_poisson_cdf``)."""
    out = np.empty_like(lam)
    big = lam > 50.0
    if big.any():
        out[big] = 0.5 * _ERFC((k[big] + 0.5 - lam[big]) / np.sqrt(2.0 * lam[big]))
    small = ~big
    if small.any():
        ks, ls = k[small], lam[small]
        top = int(ks.max()) if ks.size else 0
        j = np.arange(top + 1)
        logpmf = -ls[:, None] + j[None, :] * np.log(ls[:, None]) - np.array([math.lgamma(i + 1.0) for i in j])[None, :]
        pmf = np.where(j[None, :] <= ks[:, None], np.exp(logpmf), 0.0)
        out[small] = np.clip(1.0 - pmf.sum(axis=1), 0.0, 1.0)
    return out


def _heaviest_mean(n: int, own: float, other: float) -> float:
    """E[max] of one Poisson(own) and n - 1 Poisson(other) prompt counts: the prefill count of a round's
    heaviest micro-batch."""
    total, k = 0.0, 0
    while True:
        f = _poisson_cdf(k, own) * _poisson_cdf(k, other) ** (n - 1)
        if 1.0 - f < 1e-12 or k > 10_000:
            return total
        total += 1.0 - f
        k += 1


@functools.lru_cache(maxsize=4096)
def prefill_bubble(n: int, batch: int, mean_out: float) -> float:
    """Factor g >= 1 on a stage's prompt work with n full micro-batches of ``batch`` in flight through it
    (its role's d; see the module docstring): E[max of n Poisson(m)] / m, m = batch / mean_out; 1 for n = 1."""
    if n <= 1:
        return 1.0
    m = batch / mean_out
    return _heaviest_mean(n, m, m) / m


def output_geometric(mean_out: float) -> tuple[float, int]:
    """The assumed distribution of a request's decode steps o' = out - 1 >= 1: geometric with mean
    max(mean_out - 1, 1); returns (its success probability, a support bound holding all but ~e^-12)."""
    mean = max(mean_out - 1.0, 1.0)
    p = 1.0 / mean
    return p, max(1, math.ceil(12.0 * mean))


@functools.lru_cache(maxsize=4096)
def prefill_tail(n: int, batch: int, mean_out: float, attainment: float) -> float:
    """Prompts per decode step that a request sees at the SLO's attainment quantile (see the module
    docstring): the smallest x such that at most 1 - attainment of the requests (o' geometric, the
    round count over o' steps Poisson(mu o'), mu = E[max] over the n micro-batches, one of which holds
    the request and batch - 1 others) see more than x prompts per step. 0 for a batch of one."""
    own = (batch - 1) / mean_out
    if own <= 0.0:
        return 0.0
    mu = _heaviest_mean(n, own, batch / mean_out)
    p, top = output_geometric(mean_out)
    steps = np.arange(1, top + 1)
    w = p * (1.0 - p) ** (steps - 1)
    w /= w.sum()
    miss_budget = 1.0 - attainment
    lam = mu * steps

    def miss(x: float) -> float:
        return float(np.dot(w, _poisson_sf(np.floor(x * steps), lam)))

    lo, hi = mu, mu
    while miss(hi) > miss_budget:
        lo, hi = hi, 2.0 * hi
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if miss(mid) <= miss_budget else (mid, hi)
    return hi


def ttft_share(attainment: float) -> float:
    """The quantile each of a request's two TTFT risks is held to: its own prompt's length (here) and its
    wait in the instance's queue (``solvers.planning``) each get half of the miss budget 1 - attainment,
    so that by the union bound at most 1 - attainment of the requests miss TTFT."""
    return 1.0 - (1.0 - attainment) / 2.0


def long_prompt(mean_in: float, attainment: float) -> float:
    """The prompt length at the ``ttft_share`` quantile, prompts taken exponential with mean ``mean_in``:
    mean_in * ln(1 / (1 - share)) (3.0 times the mean at attainment 0.9; the Azure conversation trace's
    95th percentile is 3.5 times its mean). At least one token."""
    return max(1.0, mean_in * math.log(1.0 / max(1.0 - ttft_share(attainment), 1e-9)))


def short_output_steps(mean_out: float, attainment: float) -> float:
    """Decode steps o'_q of the request at the attainment quantile from the short end: P(o' <= o'_q) =
    1 - attainment under ``output_geometric`` (a fixed per-request delay, such as a KV transfer, spread
    over fewer steps than this misses TPOT for at most 1 - attainment of the requests)."""
    p, _top = output_geometric(mean_out)
    if p >= 1.0:
        return 1.0
    return max(1.0, math.log(attainment) / math.log(1.0 - p))


def node_menu(
    perf: PerfModel,
    model: str,
    node: str,
    mode: str,
    shape: WorkloadShape,
    *,
    inflight: int = 1,
    attainment: float = 0.5,
) -> NodeMenu:
    """Every memory-feasible option of one node charged for ``inflight`` micro-batches (its role's d):
    per (k, b), one option per set of model ends it may hold (none, the embedding or the LM head when
    k < L; both when k = L), each kept when its exact memory fits (see the module docstring).

    ``attainment`` is the SLO's quantile at which TTFT counts the prompt length and an aggregated option's
    TPOT its prompt share.
    """
    L = perf.catalog.models[model].num_layers
    kk = np.tile(np.arange(1, L + 1, dtype=np.int64), len(BATCH_GRID))
    bb = np.repeat(np.asarray(BATCH_GRID, dtype=np.int64), L)
    usable = perf.usable_bytes(node)
    pick: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    mems: list[np.ndarray] = []
    for code in (0, FIRST, LAST, BOTH):
        held = (bool(code & FIRST), bool(code & LAST))
        mem = perf.stage_bytes(model, layers=kk, batch=bb * inflight, context=shape.max_context, node=node, ends=held)
        ok = (mem <= usable) & ((kk == L) == (code == BOTH))
        pick.append(np.flatnonzero(ok))
        ends.append(np.full(int(ok.sum()), code, np.int64))
        mems.append(mem[ok])
    idx = np.concatenate(pick)
    code_all = np.concatenate(ends)
    order = np.lexsort((code_all, kk[idx], bb[idx]))
    idx, code_all, mem_all = idx[order], code_all[order], np.concatenate(mems)[order]
    k, b = kk[idx], bb[idx]
    d = np.full(k.size, inflight, np.int64)
    if k.size == 0:
        empty = np.zeros(0)
        return NodeMenu(k, b, empty, np.zeros((_metrics(mode), 0)), empty, d, code_all)
    long_in = long_prompt(shape.mean_in, attainment)
    at = (code_all & FIRST > 0, code_all & LAST > 0)
    if mode == "prefill":
        pre_b = perf.prefill_s(model, node, layers=k, batch=b, prompt=shape.mean_in, ends=at)
        extra = perf.prefill_s(model, node, layers=k, batch=1, prompt=long_in, ends=at) - perf.prefill_s(
            model, node, layers=k, batch=1, prompt=shape.mean_in, ends=at
        )
        return NodeMenu(k, b, b * shape.mean_in / pre_b, (2.0 * pre_b + extra)[None, :], mem_all, d, code_all)
    tau = perf.decode_step_s(model, node, layers=k, batch=b, context=shape.mean_context, ends=at)
    if mode == "decode":
        return NodeMenu(k, b, b / tau, tau[None, :], mem_all, d, code_all)
    pre1 = perf.prefill_s(model, node, layers=k, batch=1, prompt=long_in, ends=at)
    pre_b = perf.prefill_s(model, node, layers=k, batch=b, prompt=shape.mean_in, ends=at)
    bubble = np.array([prefill_bubble(inflight, int(x), shape.mean_out) for x in b])
    tail = np.array([prefill_tail(inflight, int(x), shape.mean_out, attainment) for x in b])
    cap = b / (bubble * pre_b + shape.mean_out * tau)
    return NodeMenu(k, b, cap, np.vstack([tau + tail * pre_b / b, pre1 + tau]), mem_all, d, code_all)


def _pipeline_tpot(menu: NodeMenu, d: int, tpot_s: float, mode: str) -> NodeMenu:
    """Keep the options whose per-token time, times the d micro-batches in flight through the stage,
    meets the TPOT target (see the module docstring); prefill menus have no TPOT and stay whole."""
    if mode == "prefill" or d == 1 or menu.size == 0:
        return menu
    return subset_menu(menu, np.flatnonzero(d * menu.lat[0] <= tpot_s * (1.0 + 1e-12)))


@functools.cache
def depths(n: int) -> tuple[int, ...]:
    """Every count of micro-batches that a node of a placement of at most ``n`` nodes can have in flight
    (the summed stage counts of the paths through it, over every connected shape of up to n nodes:
    1..4 for n = 3, 1..6 for n = 4, up to 18 for n = 6)."""
    out = {1}
    for size in range(2, n + 1):
        for sk in skeletons(size):
            count = [0] * size
            for path in sk.paths:
                for i in path:
                    count[i] += len(path)
            out.update(count)
    return tuple(sorted(out))


def depth_menu(perf: PerfModel, model: str, node: str, mode: str, slo: Slo, shape: WorkloadShape, d: int) -> NodeMenu:
    """The options of one node charged for ``d`` micro-batches: ``node_menu``, kept by ``_pipeline_tpot``."""
    menu = node_menu(perf, model, node, mode, shape, inflight=d, attainment=slo.attainment)
    return _pipeline_tpot(menu, d, slo.tpot_s, mode)


def role_menu(perf: PerfModel, model: str, node: str, mode: str, slo: Slo, shape: WorkloadShape, n: int) -> NodeMenu:
    """The menu of one node in a multiset of ``n`` nodes: the options of every role it can have there
    (``depth_menu`` of each of ``depths(n)`` micro-batches, with every set of ends)."""
    return concat_menus([depth_menu(perf, model, node, mode, slo, shape, d) for d in depths(n)])


def concat_menus(parts: Sequence[NodeMenu]) -> NodeMenu:
    """The options of ``parts``, in order, as one menu."""
    return NodeMenu(
        np.concatenate([m.k for m in parts]),
        np.concatenate([m.b for m in parts]),
        np.concatenate([m.cap for m in parts]),
        np.concatenate([m.lat for m in parts], axis=1),
        np.concatenate([m.mem for m in parts]),
        np.concatenate([m.d for m in parts]),
        np.concatenate([m.ends for m in parts]),
    )


def _metrics(mode: str) -> int:
    return 2 if mode == "aggregated" else 1


def build_problem(
    perf: PerfModel,
    model: str,
    nodes: Sequence[str],
    mode: str,
    slo: Slo,
    shape: WorkloadShape,
    sender_nic: float | None = None,
) -> PlacementProblem:
    """The placement problem of ``model`` on the node multiset ``nodes`` (sorted for symmetry).

    ``sender_nic`` (decode only, bytes/s): the KV transfer into entry node i crosses min(sender_nic,
    node i's NIC); None prices it at node i's own NIC (a sender at least as fast as every node)."""
    kinds = tuple(sorted(nodes))
    link_lat, link_cap, limits = problem_links(perf, model, kinds, mode, slo, shape, sender_nic)
    return PlacementProblem(
        num_layers=perf.catalog.models[model].num_layers,
        kinds=kinds,
        menus=tuple(role_menu(perf, model, nd, mode, slo, shape, len(kinds)) for nd in kinds),
        link_lat=link_lat,
        link_cap=link_cap,
        lat_limit=limits,
    )


def problem_links(
    perf: PerfModel,
    model: str,
    kinds: Sequence[str],
    mode: str,
    slo: Slo,
    shape: WorkloadShape,
    sender_nic: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``build_problem``'s link latencies, link capacities and latency limits on the node types ``kinds``
    (in the order given: node i is ``kinds[i]``)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if sender_nic is not None and (mode != "decode" or not 0.0 < sender_nic < math.inf):
        raise ValueError(f"sender_nic must be a finite positive NIC speed of a decode problem, got {sender_nic!r}")
    cap = math.inf if sender_nic is None else sender_nic
    n = len(kinds)
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
        steps = short_output_steps(shape.mean_out, slo.attainment)
        for i, a in enumerate(kinds):
            link_lat[0, n, i] = kv_bytes / min(cap, nodes_cat[a].nic_bytes_per_s) / steps
    for i, a in enumerate(kinds):
        for j, bnode in enumerate(kinds):
            if i == j:
                continue
            bw = min(nodes_cat[a].nic_bytes_per_s, nodes_cat[bnode].nic_bytes_per_s)
            link_cap[i, j] = bw / per_unit
            for mi, tok in enumerate(metric_tokens):
                link_lat[mi, i, j] = float(perf.transfer_s(model, a, bnode, tok))
    return link_lat, link_cap, np.asarray(limits, dtype=np.float64)
