"""Seeded synthetic allocation instances at the solver study's sizes.

``core``: 6 models, 4 regions, 20 node types; ``extended``: 24 models, 12 regions, 20 node types; each
with a chosen number of templates per model (50-400 in the study). Node types are 5 GPU types x
{1, 2, 4, 8} GPUs with public-price-like hourly prices; templates are node multisets of 1-6 nodes whose
memory holds the model, with capacities from a roofline-like estimate (prefill: compute bound; decode:
memory-bandwidth bound) and seeded noise. A fraction of models also has prefill and decode templates.
"""

from __future__ import annotations

import attrs
import numpy as np

from solvers.allocation import AllocationProblem, AllocTemplate

# name, dense BF16 TFLOPS, memory GB, memory GB/s, price USD per GPU-hour
GPUS = (
    ("h100", 989.0, 80.0, 3350.0, 6.9),
    ("a100-80g", 312.0, 80.0, 2039.0, 3.4),
    ("l40s", 362.0, 48.0, 864.0, 1.9),
    ("a10g", 70.0, 24.0, 600.0, 1.0),
    ("l4", 121.0, 24.0, 300.0, 0.8),
)
GPU_COUNTS = (1, 2, 4, 8)
# model params (billions), mean input / output tokens, KV bytes per token
MODEL_SHAPES = (
    (8.0, 1000.0, 250.0, 131072.0),
    (14.0, 1500.0, 300.0, 196608.0),
    (32.0, 800.0, 200.0, 262144.0),
    (70.0, 2000.0, 400.0, 327680.0),
    (120.0, 1200.0, 300.0, 368640.0),
    (235.0, 1000.0, 500.0, 491520.0),
)
SIZES = {"core": (6, 4), "extended": (24, 12)}


@attrs.frozen
class NodeCatalog:
    """The 20 synthetic node types: per type GPU index, count, TFLOPS, memory, bandwidth, price, NIC."""

    names: tuple[str, ...]
    tflops: np.ndarray
    mem_gb: np.ndarray
    bw_gbs: np.ndarray
    price: np.ndarray
    nic_bytes_s: np.ndarray


def node_catalog() -> NodeCatalog:
    names, tflops, mem, bw, price, nic = [], [], [], [], [], []
    for gname, tf, mgb, bwg, pr in GPUS:
        for n in GPU_COUNTS:
            names.append(f"{gname}x{n}")
            tflops.append(tf * n)
            mem.append(mgb * n)
            bw.append(bwg * n)
            price.append(pr * n * (1.0 + 0.04 * (n == 8)))
            nic.append((25e9 if n == 1 else 50e9 * n if n < 8 else 400e9) / 8 * (4 if gname == "h100" else 1))
    return NodeCatalog(
        names=tuple(names),
        tflops=np.array(tflops),
        mem_gb=np.array(mem),
        bw_gbs=np.array(bw),
        price=np.array(price),
        nic_bytes_s=np.array(nic),
    )


def _capacities(cat: NodeCatalog, counts: np.ndarray, params_b: float, rng: np.random.Generator) -> tuple[float, float]:
    n_nodes = int(counts.sum())
    eff = 0.92 ** (n_nodes - 1) * rng.uniform(0.85, 1.15)
    weights_gb = 2.0 * params_b
    mem = float(counts @ cat.mem_gb)
    kv_room = max(mem - 1.1 * weights_gb, 0.0) / weights_gb
    batch = min(64.0, 4.0 + 24.0 * kv_room)
    prefill = 0.45 * float(counts @ cat.tflops) * 1e12 / (2 * params_b * 1e9) * eff
    decode = 0.6 * float(counts @ cat.bw_gbs) / weights_gb * batch * eff
    return prefill, decode


def generate(
    size: str = "core",
    templates_per_model: int = 50,
    *,
    seed: int = 0,
    disagg_fraction: float = 0.34,
    dup_fraction: float = 0.03,
    scarcity: float = 1.0,
    load: float = 0.35,
) -> AllocationProblem:
    """A seeded instance. ``scarcity`` scales availability down (> 1: scarcer); ``load`` sets demand as
    a fraction of what the cheapest templates could serve on all available nodes."""
    num_models, num_regions = SIZES[size]
    rng = np.random.default_rng(seed)
    cat = node_catalog()
    T = len(cat.names)
    regions = tuple(f"region-{i}" for i in range(num_regions))
    region_mult = rng.uniform(0.9, 1.35, size=num_regions)
    price = cat.price[None, :] * region_mult[:, None] * rng.uniform(0.95, 1.05, size=(num_regions, T))
    offered = rng.random((num_regions, T)) < 0.8
    max_nodes = np.where(np.array([int(n.split("x")[1]) for n in cat.names]) == 8, 6, 16)
    avail_full = np.where(offered, rng.integers(0, max_nodes + 1, size=(num_regions, T)), 0)
    avail = np.floor(avail_full / scarcity).astype(np.int64)
    price = np.where(offered, price, np.inf)

    models = tuple(f"model-{i}" for i in range(num_models))
    shapes = [MODEL_SHAPES[i % len(MODEL_SHAPES)] for i in range(num_models)]
    templates: list[AllocTemplate] = []
    best_rate = np.zeros(num_models)
    for m, (params_b, mean_in, mean_out, _kv) in enumerate(shapes):
        weights_gb = 2.0 * params_b
        disagg = rng.random() < disagg_fraction
        seen: set[bytes] = set()
        made = 0
        attempts = 0
        while made < templates_per_model and attempts < 50 * templates_per_model:
            attempts += 1
            n_nodes = int(rng.integers(1, 7))
            counts = np.bincount(rng.integers(0, T, size=n_nodes), minlength=T).astype(np.int64)
            mem = float(counts @ cat.mem_gb)
            if mem < 1.2 * weights_gb or mem > 12 * weights_gb:
                continue
            if counts.tobytes() in seen:
                continue
            seen.add(counts.tobytes())
            prefill, decode = _capacities(cat, counts, params_b, rng)
            load_s = 30.0 + weights_gb * 1e9 / 2e9
            mode = "aggregated"
            if disagg and made % 3:
                mode = "prefill" if made % 3 == 1 else "decode"
            key = f"m{m}-{mode}-{counts.tobytes().hex()}"
            t = AllocTemplate(m, mode, counts, prefill, decode, load_s, key)
            templates.append(t)
            made += 1
            if mode == "aggregated":
                rate = 1.0 / (mean_in / prefill + mean_out / decode)
                best_rate[m] = max(best_rate[m], rate / float(counts @ cat.price))
            if rng.random() < dup_fraction and made < templates_per_model:
                templates.append(attrs.evolve(t, key=key + "-dup"))
                made += 1
    # demand: a share of the fleet's value in req/s at each model's best req/s per USD/h
    fleet_usd = float(np.where(offered, avail_full * cat.price[None, :], 0.0).sum())
    share = rng.dirichlet(np.ones(num_models))
    demand = load * fleet_usd * share * best_rate
    demand = np.round(demand, 3)
    return AllocationProblem(
        models=models,
        demand_rps=demand,
        mean_in=np.array([s[1] for s in shapes]),
        mean_out=np.array([s[2] for s in shapes]),
        kv_bytes_per_token=np.array([s[3] for s in shapes]),
        node_types=cat.names,
        nic_bytes_s=cat.nic_bytes_s,
        regions=regions,
        price=price,
        avail=avail,
        templates=tuple(templates),
    )


def perturbed(problem: AllocationProblem, seed: int, sigma: float = 0.1) -> AllocationProblem:
    """The same instance with each model's demand scaled by a seeded lognormal factor."""
    rng = np.random.default_rng(seed)
    factor = np.exp(rng.normal(0.0, sigma, size=problem.num_models))
    return attrs.evolve(problem, demand_rps=np.round(problem.demand_rps * factor, 3))
