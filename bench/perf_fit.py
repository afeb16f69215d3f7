"""`just bench perf-fit`: fit the operator curves to Vidur's measurements and score them on held-out models.

Fits (``coral.perf.fit``) every measured GPU's GEMM and streaming curves on the models not in
``coral.perf.fit.HELD_OUT`` and every interconnect's all-reduce curve, then prints median and p90 |error|:

1. per GPU and operator group (GEMM, streaming) and for whole layers (the sum of a measurement's
   operators), on the fit models (in-sample) and the held-out models, next to the previous model
   (``roofline-1``: max of bytes and FLOPs at the catalog's old per-GPU efficiencies, no floor; A40, not a
   catalog type, at the factors the old catalog gave its GDDR class) on the same rows;
2. the derivation rule for unmeasured GPUs (``coral.perf.params.derive_curve``): each measured GPU
   predicted from another's curve scaled by datasheet ratios, on the held-out models' rows;
3. all-reduce curves per interconnect;
4. whole decode and prefill steps of every Vidur model (held out or not), without attention (not in the
   data): the embedding once plus L layers of the measured operators and, at TP > 1 on the NVSwitch
   machines, two all-reduces of the layer's M H bf16 values per layer (measured: the machine's
   ``all_reduce.csv`` interpolated log-log at that size; predicted: the fitted link curve). Decode-sized
   steps have M <= 256 tokens (a batch of at most 256 sequences), prefill-sized ones more;
5. whole decode and prefill steps end to end: the points of ``coral/perf/calibration.toml`` (which also fit
   the host floor).

``--write`` stores the fitted parameters in ``coral/catalog/data/perf_fit.toml`` (keeping its hand-kept
[class], [sm_count], [l2_mb] and [clock_mhz] tables); without it the file is untouched and the printed
figures are those of a fresh fit. ``--data`` points at another copy of the profiling folder (default
``$CORAL_VIDUR_DIR`` or ``../shared/reference/vidur-profiling`` beside the repository). ``--json`` prints the
tables as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from coral.catalog import load_catalog
from coral.perf import PerfModel
from coral.perf.calibration import evaluate, fit_host
from coral.perf.fit import (
    HELD_OUT,
    LINK_SETUPS,
    Spec,
    abs_err,
    comm_rows,
    fit_gpu,
    fit_link,
    layer_sums,
    link_predict,
    op_rows,
    predict_rows,
    render_toml,
    roofline_rows,
)
from coral.perf.ops import HostFloor
from coral.perf.params import PARAMS_FILE, derive_curve, load_params
from coral.perf.vidur import GPU_DIRS, default_root, load_vidur

SPECS = {
    # dense BF16 FLOP/s, bytes/s, SMs, L2, boost clock: coral/catalog/data/gpus.toml for the first two; A40:
    # NVIDIA A40 datasheet (149.7 TF dense BF16 tensor, 696 GB/s GDDR6), 84 SMs (GA102 as configured for
    # A40); L2: 40 MB (A100), 50 MB (H100 SXM), 6 MB (GA102) from NVIDIA's architecture whitepapers; boost
    # clocks 1,410 (A100), 1,980 (H100 SXM), 1,740 MHz (A40) from the same datasheets
    "a100-80g": Spec(312e12, 2039e9, 108, 40e6, 1410.0),
    "h100-80g": Spec(989.4e12, 3350e9, 132, 50e6, 1980.0),
    "a40-48g": Spec(149.7e12, 696e9, 84, 6e6, 1740.0),
}
OLD_FACTORS = {"a100-80g": (0.625, 0.525), "h100-80g": (0.625, 0.4), "a40-48g": (0.85, 0.5)}
"""roofline-1's (mem_efficiency, compute_efficiency) from gpus.toml; a40 takes l40s-48g's (its GDDR class)."""
DERIVE_CHECK = (("a40-48g", "a100-80g"), ("a100-80g", "h100-80g"), ("h100-80g", "a100-80g"))
LAYERS = {
    # num_hidden_layers of each profiled model's Hugging Face config
    "Llama-2-7b-hf": 32, "Llama-2-70b-hf": 80, "Meta-Llama-3-8B": 32, "Meta-Llama-3-70B": 80,
    "CodeLlama-34b-Instruct-hf": 48, "internlm-20b": 60, "Qwen-72B": 80, "phi-2": 32,
}  # fmt: skip
STEP_LINKS = {"a100-80g": ("a100_dgx", "nvswitch-a100"), "h100-80g": ("h100_dgx", "nvswitch-h100")}
"""Per GPU: the 8-GPU machine whose measured all-reduce completes a TP step, and its fitted curve."""
DECODE_MAX_TOKENS = 256


def _measured_allreduce(data: Any, setup: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per worker count: (sizes, median seconds) of a machine's all-reduce rows, sorted by size."""
    out = {}
    for t in data.network:
        if t.setup == setup and t.collective == "all_reduce":
            for w in np.unique(t.num_workers):
                keep = (t.num_workers == w) & (t.devices_per_node == w) & (t.times_s > 0)
                order = np.argsort(t.size_bytes[keep])
                out[int(w)] = (t.size_bytes[keep][order], t.times_s[keep][order])
    return out


def step_errors(data: Any, gpu: str, curve: Any, link: Any) -> dict[str, dict[str, list[float]]]:
    """|error| of whole (non-attention) steps per phase ("decode", "prefill") and use ("in", "held_out")."""
    ar = _measured_allreduce(data, STEP_LINKS[gpu][0]) if gpu in STEP_LINKS else {}
    out: dict[str, dict[str, list[float]]] = {ph: {"in": [], "held_out": []} for ph in ("decode", "prefill")}
    for t in data.compute:
        if t.gpu != gpu:
            continue
        rows = op_rows([t])
        pred = predict_rows(curve, rows)
        n = len(t.tokens)
        meas_layer, pred_layer = np.zeros(n), np.zeros(n)
        np.add.at(meas_layer, rows.key - rows.key.min(), rows.measured_s)
        np.add.at(pred_layer, rows.key - rows.key.min(), pred)
        emb = rows.op == "emb"
        meas_emb, pred_emb = np.zeros(n), np.zeros(n)
        meas_emb[rows.key[emb] - rows.key.min()] = rows.measured_s[emb]
        pred_emb[rows.key[emb] - rows.key.min()] = pred[emb]
        L = LAYERS[t.model]
        use = "held_out" if t.model in HELD_OUT else "in"
        for i in range(n):
            tp = int(t.tp[i])
            ar_m = ar_p = 0.0
            if tp > 1:
                if tp not in ar:
                    continue
                size = t.tokens[i] * t.n_embd * 2.0
                sizes, times = ar[tp]
                if not sizes[0] <= size <= sizes[-1]:
                    continue
                ar_m = float(np.exp(np.interp(np.log(size), np.log(sizes), np.log(times))))
                ar_p = float(link.allreduce_s(size, tp))
            m_step = meas_emb[i] + L * (meas_layer[i] - meas_emb[i] + 2.0 * ar_m)
            p_step = pred_emb[i] + L * (pred_layer[i] - pred_emb[i] + 2.0 * ar_p)
            phase = "decode" if t.tokens[i] <= DECODE_MAX_TOKENS else "prefill"
            out[phase][use].append(abs(p_step / m_step - 1.0))
    return out


def _stats(e: np.ndarray) -> dict[str, float]:
    if e.size == 0:
        return {"n": 0, "median": float("nan"), "p90": float("nan")}
    return {"n": int(e.size), "median": float(np.median(e)), "p90": float(np.percentile(e, 90))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--write", action="store_true", help=f"store the fit in {PARAMS_FILE}")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = args.data or default_root()
    if not root.is_dir():
        print(f"perf-fit: profiling folder {root} is missing (set CORAL_VIDUR_DIR or --data)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    data = load_vidur(root)
    source = f"Vidur profiling data (microsoft/vidur 7d47513, data/profiling), held out: {', '.join(HELD_OUT)}"
    curves, report = [], {"ops": [], "derived": [], "links": [], "steps": []}
    rows_by_gpu = {}
    for gpu, spec in SPECS.items():
        rows = op_rows([t for t in data.compute if t.gpu == gpu])
        rows_by_gpu[gpu] = rows
        fit_mask = ~np.isin(rows.model, HELD_OUT)
        folder = next(k for k, v in GPU_DIRS.items() if v == gpu)
        c = fit_gpu(gpu, spec, rows, fit_mask, f"fitted to {root.name}/compute/{folder}")
        curves.append(c)
        pred = predict_rows(c, rows)
        old = roofline_rows(*OLD_FACTORS[gpu], spec, rows)
        for group, gmask in (("gemm", rows.is_gemm), ("stream", ~rows.is_gemm)):
            ok = gmask & (rows.measured_s > 0)
            e, eo = abs_err(pred[ok], rows.measured_s[ok]), abs_err(old[ok], rows.measured_s[ok])
            held = ~fit_mask[ok]
            report["ops"].append({"gpu": gpu, "group": group, "in": _stats(e[~held]), "held_out": _stats(e[held]),
                                  "old_in": _stats(eo[~held]), "old_held_out": _stats(eo[held])})  # fmt: skip
        lp, lmod = layer_sums(rows, pred)
        lm, _ = layer_sums(rows, rows.measured_s)
        lo, _ = layer_sums(rows, old)
        held = np.isin(lmod, HELD_OUT)
        e, eo = abs_err(lp, lm), abs_err(lo, lm)
        report["ops"].append({"gpu": gpu, "group": "layer", "in": _stats(e[~held]), "held_out": _stats(e[held]),
                              "old_in": _stats(eo[~held]), "old_held_out": _stats(eo[held])})  # fmt: skip
    by_name = {c.name: c for c in curves}
    for target, base in DERIVE_CHECK:
        spec, rows = SPECS[target], rows_by_gpu[target]
        d = derive_curve(
            by_name[base], target, spec.peak_flops, spec.mem_bw, spec.sm_count, spec.l2_bytes, spec.clock_mhz, ""
        )
        held = np.isin(rows.model, HELD_OUT) & (rows.measured_s > 0)
        pred = predict_rows(d, rows)
        lp, lmod = layer_sums(rows, pred)
        lm, _ = layer_sums(rows, rows.measured_s)
        report["derived"].append({
            "gpu": target, "from": base,
            "gemm": _stats(abs_err(pred[held & rows.is_gemm], rows.measured_s[held & rows.is_gemm])),
            "layer": _stats(abs_err(lp[np.isin(lmod, HELD_OUT)], lm[np.isin(lmod, HELD_OUT)])),
        })  # fmt: skip
    links = {}
    for name, (setup, workers, nominal) in LINK_SETUPS.items():
        n, b, t = comm_rows(data, setup, workers)
        c = fit_link(name, n, b, t, f"fitted to {root.name}/network/{setup}/all_reduce.csv, {workers} GPUs")
        links[name] = (c, nominal)
        report["links"].append({"link": name, **_stats(abs_err(link_predict(c, n, b), t))})
    report["whole"] = []
    for c in curves:
        link = links[STEP_LINKS[c.name][1]][0] if c.name in STEP_LINKS else None
        for phase, by in step_errors(data, c.name, c, link).items():
            report["whole"].append({"gpu": c.name, "phase": phase, "in": _stats(np.array(by["in"])),
                                    "held_out": _stats(np.array(by["held_out"]))})  # fmt: skip
    cat = load_catalog()
    hand = tomllib.loads(PARAMS_FILE.read_text())
    classes, sms, l2, clocks = dict(hand["class"]), dict(hand["sm_count"]), dict(hand["l2_mb"]), dict(hand["clock_mhz"])
    draft = render_toml(curves, links, HostFloor(0.0, 0.0, 0.0, 0.0, ""), classes, sms, l2, clocks, source)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"perf_fit-{os.getpid()}.toml"
    tmp.write_text(draft)
    params = load_params(tmp)
    host = fit_host(cat, params)
    text = render_toml(curves, links, host, classes, sms, l2, clocks, source)
    tmp.write_text(text)
    params = load_params(tmp)
    tmp.unlink()
    new_rows = evaluate(cat, perf=PerfModel(cat, params=params))
    for r in new_rows:
        p = r.point
        report["steps"].append({"model": p.model, "node": p.node, "phase": p.phase, "batch": p.batch,
                                "measured_ms": p.measured_s * 1e3, "new_ms": r.predicted_s * 1e3,
                                "use": "held out" if p.held_out else "fit"})  # fmt: skip
    report["host"] = attrs.asdict(host)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    if args.write:
        PARAMS_FILE.write_text(text)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print(report, args.write)
    return 0


def _print(rep: dict[str, Any], wrote: bool) -> None:
    def f(s: dict[str, float]) -> str:
        return f"{s['median']:6.1%} {s['p90']:6.1%}" if s["n"] else "     -      -"

    print(f"held-out models: {', '.join(HELD_OUT)}   (median / p90 |error|)")
    cols = ("in-sample", "held-out", "old in", "old held-out")
    print(f"{'gpu':10s} {'group':7s} " + " ".join(f"{c:>13s}" for c in cols) + "   rows in/out")
    for r in rep["ops"]:
        print(f"{r['gpu']:10s} {r['group']:7s} {f(r['in'])} {f(r['held_out'])} {f(r['old_in'])} {f(r['old_held_out'])}"
              f"   {r['in']['n']}/{r['held_out']['n']}")  # fmt: skip
    print("\nderivation check (held-out models' rows, curve of another GPU scaled by datasheet ratios)")
    for r in rep["derived"]:
        print(f"  {r['gpu']:10s} from {r['from']:10s} gemm {f(r['gemm'])}   layer {f(r['layer'])}")
    print("\nall-reduce curves (in-sample)")
    for r in rep["links"]:
        print(f"  {r['link']:18s} {f(r)}   rows {r['n']}")
    print(f"\nwhole steps of the profiled models without attention (emb + L x (layer + TP all-reduces); decode: "
          f"M <= {DECODE_MAX_TOKENS} tokens; A40: TP 1 only)")  # fmt: skip
    print(f"{'gpu':10s} {'phase':8s} {'in-sample':>13s} {'held-out':>13s}   rows in/out")
    for r in rep["whole"]:
        print(f"{r['gpu']:10s} {r['phase']:8s} {f(r['in'])} {f(r['held_out'])}   {r['in']['n']}/{r['held_out']['n']}")
    print("\nwhole steps: coral/perf/calibration.toml (end-to-end; these also fit the host floor)")
    en = []
    for s in rep["steps"]:
        e = s["new_ms"] / s["measured_ms"] - 1
        where = f"{s['model']:14s} {s['node']:15s} {s['phase']:7s} b={s['batch']:<3d}"
        print(f"  {where} measured {s['measured_ms']:7.2f} ms  predicted {s['new_ms']:7.2f} ({e:+.1%})  {s['use']}")
        if s["use"] == "fit":
            en.append(abs(e))
    print(f"  points not held out: median |error| {np.median(en):.1%}, max {np.max(en):.1%}")
    h = rep["host"]
    print(f"host floor: {h['per_iter_s'] * 1e3:.3f} ms/iter + {h['per_layer_s'] * 1e3:.4f} ms/layer "
          f"+ {h['per_allreduce_s'] * 1e3:.4f} ms/all-reduce + {h['per_seq_s'] * 1e3:.4f} ms/sequence")  # fmt: skip
    print(
        f"\n{rep['seconds']} s, load average {rep['loadavg']}; parameters "
        + (f"written to {PARAMS_FILE}" if wrote else "not written (--write)")
    )


if __name__ == "__main__":
    sys.exit(main())
